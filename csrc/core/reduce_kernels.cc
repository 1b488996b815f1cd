#include "core/reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "core/status.h"

namespace bluefog {

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise into a float exponent
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)  // inf or nan
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds past the largest half: inf
  if (abs < 0x38800000u) {               // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return sign;  // under half the smallest subnormal
    uint32_t exp = abs >> 23;            // 102..112 here
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // value / 2^-24 == mant >> shift
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // may carry into the smallest normal
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);  // round half to even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round half to even
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Vector loops for the 16-bit floats: 8 elements at a time through float32, with exactly the
// scalar code's arithmetic (convert, one float op, round to nearest even), so results do not
// depend on which path ran. x86-64 with AVX2 and F16C (checked at run time); each returns how
// many leading elements it handled, and the scalar loops finish the rest.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BF_SIMD_TARGET __attribute__((target("avx2,f16c")))

bool CpuHasHalfSimd() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return has;
}

struct HalfFormat {
  BF_SIMD_TARGET static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  BF_SIMD_TARGET static void Store(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

struct BFloat16Format {
  BF_SIMD_TARGET static __m256 Load(const uint16_t* p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  // FloatToBFloat16, 8 at a time: round half to even; NaN keeps its sign and stays quiet.
  BF_SIMD_TARGET static void Store(uint16_t* p, __m256 v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i high = _mm256_srli_epi32(x, 16);
    const __m256i bias =
        _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(high, _mm256_set1_epi32(1)));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
    const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    // Eight 32-bit values below 0x10000 to eight 16-bit ones, in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

template <typename F>
BF_SIMD_TARGET int64_t SumOfVector(uint16_t* o, const uint16_t* x, const uint16_t* y, int64_t count,
                                   int64_t divisor) {
  const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 sum = _mm256_add_ps(F::Load(x + i), F::Load(y + i));
    F::Store(o + i, sum);
    if (divisor > 1) F::Store(o + i, _mm256_div_ps(F::Load(o + i), d));  // rounded sum / d
  }
  return i;
}

template <typename F>
BF_SIMD_TARGET int64_t DivideVector(uint16_t* a, int64_t count, int64_t divisor) {
  const __m256 d = _mm256_set1_ps(static_cast<float>(divisor));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) F::Store(a + i, _mm256_div_ps(F::Load(a + i), d));
  return i;
}

template <typename F>
BF_SIMD_TARGET int64_t ScaleAddVector(uint16_t* o, const uint16_t* x, int64_t count, float weight,
                                      bool accumulate) {
  const __m256 w = _mm256_set1_ps(weight);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256 base = accumulate ? F::Load(o + i) : _mm256_setzero_ps();
    F::Store(o + i, _mm256_add_ps(base, _mm256_mul_ps(w, F::Load(x + i))));
  }
  return i;
}

template <float (*ToFloat)(uint16_t)>
struct VectorFormat;
template <>
struct VectorFormat<HalfToFloat> {
  using type = HalfFormat;
};
template <>
struct VectorFormat<BFloat16ToFloat> {
  using type = BFloat16Format;
};

template <float (*ToFloat)(uint16_t)>
int64_t SumOfFast(uint16_t* o, const uint16_t* x, const uint16_t* y, int64_t count,
                  int64_t divisor) {
  if (!CpuHasHalfSimd()) return 0;
  return SumOfVector<typename VectorFormat<ToFloat>::type>(o, x, y, count, divisor);
}
template <float (*ToFloat)(uint16_t)>
int64_t DivideFast(uint16_t* a, int64_t count, int64_t divisor) {
  if (!CpuHasHalfSimd()) return 0;
  return DivideVector<typename VectorFormat<ToFloat>::type>(a, count, divisor);
}
template <float (*ToFloat)(uint16_t)>
int64_t ScaleAddFast(uint16_t* o, const uint16_t* x, int64_t count, float w, bool accumulate) {
  if (!CpuHasHalfSimd()) return 0;
  return ScaleAddVector<typename VectorFormat<ToFloat>::type>(o, x, count, w, accumulate);
}
#else
template <float (*ToFloat)(uint16_t)>
int64_t SumOfFast(uint16_t*, const uint16_t*, const uint16_t*, int64_t, int64_t) {
  return 0;
}
template <float (*ToFloat)(uint16_t)>
int64_t DivideFast(uint16_t*, int64_t, int64_t) {
  return 0;
}
template <float (*ToFloat)(uint16_t)>
int64_t ScaleAddFast(uint16_t*, const uint16_t*, int64_t, float, bool) {
  return 0;
}
#endif

template <typename T>
void SumTyped(void* inout, const void* in, int64_t count) {
  T* a = static_cast<T*>(inout);
  const T* b = static_cast<const T*>(in);
  for (int64_t i = 0; i < count; ++i) a[i] = static_cast<T>(a[i] + b[i]);
}

template <typename T>
void SumOfTyped(void* out, const void* a, const void* b, int64_t count, int64_t divisor) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (divisor <= 1) {
    for (int64_t i = 0; i < count; ++i) o[i] = static_cast<T>(x[i] + y[i]);
    return;
  }
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < count; ++i) o[i] = static_cast<T>(static_cast<T>(x[i] + y[i]) / d);
}

// Also SumInto for the 16-bit floats (out == a, divisor 1).
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void SumOfHalfLike(void* out, const void* a, const void* b, int64_t count, int64_t divisor) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  const float d = static_cast<float>(divisor);
  for (int64_t i = SumOfFast<ToFloat>(o, x, y, count, divisor); i < count; ++i) {
    const uint16_t sum = FromFloat(ToFloat(x[i]) + ToFloat(y[i]));
    o[i] = divisor <= 1 ? sum : FromFloat(ToFloat(sum) / d);
  }
}

template <typename T>
void DivideTyped(void* data, int64_t count, int64_t divisor) {
  T* a = static_cast<T*>(data);
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < count; ++i) a[i] = static_cast<T>(a[i] / d);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void DivideHalfLike(void* data, int64_t count, int64_t divisor) {
  uint16_t* a = static_cast<uint16_t*>(data);
  const float d = static_cast<float>(divisor);
  for (int64_t i = DivideFast<ToFloat>(a, count, divisor); i < count; ++i)
    a[i] = FromFloat(ToFloat(a[i]) / d);
}

template <typename T>
void ScaleAddTyped(void* out, const void* in, int64_t count, double weight, bool accumulate) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(in);
  const T w = static_cast<T>(weight);
  if (accumulate) {
    for (int64_t i = 0; i < count; ++i) o[i] += w * x[i];
  } else {
    for (int64_t i = 0; i < count; ++i) o[i] = w * x[i];
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ScaleAddHalfLike(void* out, const void* in, int64_t count, double weight, bool accumulate) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(in);
  const float w = static_cast<float>(weight);
  for (int64_t i = ScaleAddFast<ToFloat>(o, x, count, w, accumulate); i < count; ++i)
    o[i] = FromFloat((accumulate ? ToFloat(o[i]) : 0.0f) + w * ToFloat(x[i]));
}

template <typename T>
struct MinOp {
  static T Apply(T x, T y) {
    // x != x: NaN (floating point only; never true for integers).
    if constexpr (std::is_floating_point_v<T>) return (x < y || x != x) ? x : y;
    return x < y ? x : y;
  }
};
template <typename T>
struct MaxOp {
  static T Apply(T x, T y) {
    if constexpr (std::is_floating_point_v<T>) return (x > y || x != x) ? x : y;
    return x > y ? x : y;
  }
};
template <typename T>
struct ProductOp {
  static T Apply(T x, T y) { return static_cast<T>(x * y); }
};

template <template <typename> class Op, typename T>
void ReduceTyped(void* out, const void* a, const void* b, int64_t count) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t i = 0; i < count; ++i) o[i] = Op<T>::Apply(x[i], y[i]);
}

template <template <typename> class Op, float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceHalfLike(void* out, const void* a, const void* b, int64_t count) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (int64_t i = 0; i < count; ++i)
    o[i] = FromFloat(Op<float>::Apply(ToFloat(x[i]), ToFloat(y[i])));
}

template <template <typename> class Op>
void ReduceDispatch(void* out, const void* a, const void* b, int64_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return ReduceTyped<Op, uint8_t>(out, a, b, count);
    case DataType::kInt8: return ReduceTyped<Op, int8_t>(out, a, b, count);
    case DataType::kUInt16: return ReduceTyped<Op, uint16_t>(out, a, b, count);
    case DataType::kInt16: return ReduceTyped<Op, int16_t>(out, a, b, count);
    case DataType::kInt32: return ReduceTyped<Op, int32_t>(out, a, b, count);
    case DataType::kInt64: return ReduceTyped<Op, int64_t>(out, a, b, count);
    case DataType::kFloat16: return ReduceHalfLike<Op, HalfToFloat, FloatToHalf>(out, a, b, count);
    case DataType::kBFloat16:
      return ReduceHalfLike<Op, BFloat16ToFloat, FloatToBFloat16>(out, a, b, count);
    case DataType::kFloat32: return ReduceTyped<Op, float>(out, a, b, count);
    case DataType::kFloat64: return ReduceTyped<Op, double>(out, a, b, count);
    case DataType::kBool: break;
  }
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("reductions are not defined for dtype ", DataTypeName(dtype)));
}

}  // namespace

void ReduceOf(void* out, const void* a, const void* b, int64_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return SumOf(out, a, b, count, dtype, 1);
    case ReduceOp::kMin: return ReduceDispatch<MinOp>(out, a, b, count, dtype);
    case ReduceOp::kMax: return ReduceDispatch<MaxOp>(out, a, b, count, dtype);
    case ReduceOp::kProduct: return ReduceDispatch<ProductOp>(out, a, b, count, dtype);
  }
  throw BluefogError(StatusCode::kInternal, "unknown reduce op");
}

namespace {

template <typename T>
T IdentityOf(ReduceOp op) {
  using Limits = std::numeric_limits<T>;
  switch (op) {
    case ReduceOp::kSum: return T(0);
    case ReduceOp::kProduct: return T(1);
    case ReduceOp::kMin: return Limits::has_infinity ? Limits::infinity() : Limits::max();
    case ReduceOp::kMax: return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
  }
  return T(0);
}

template <typename T>
void FillTyped(void* data, int64_t count, T value) {
  std::fill_n(static_cast<T*>(data), count, value);
}

}  // namespace

void FillIdentity(void* data, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: return FillTyped(data, count, IdentityOf<uint8_t>(op));
    case DataType::kInt8: return FillTyped(data, count, IdentityOf<int8_t>(op));
    case DataType::kUInt16: return FillTyped(data, count, IdentityOf<uint16_t>(op));
    case DataType::kInt16: return FillTyped(data, count, IdentityOf<int16_t>(op));
    case DataType::kInt32: return FillTyped(data, count, IdentityOf<int32_t>(op));
    case DataType::kInt64: return FillTyped(data, count, IdentityOf<int64_t>(op));
    case DataType::kFloat16: return FillTyped(data, count, FloatToHalf(IdentityOf<float>(op)));
    case DataType::kBFloat16: return FillTyped(data, count, FloatToBFloat16(IdentityOf<float>(op)));
    case DataType::kFloat32: return FillTyped(data, count, IdentityOf<float>(op));
    case DataType::kFloat64: return FillTyped(data, count, IdentityOf<double>(op));
    case DataType::kBool: break;
  }
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat(ReduceOpName(op), " is not defined for dtype ", DataTypeName(dtype)));
}

void ScaleAdd(void* out, const void* in, int64_t count, DataType dtype, double weight,
              bool accumulate) {
  switch (dtype) {
    case DataType::kFloat32: return ScaleAddTyped<float>(out, in, count, weight, accumulate);
    case DataType::kFloat64: return ScaleAddTyped<double>(out, in, count, weight, accumulate);
    case DataType::kFloat16:
      return ScaleAddHalfLike<HalfToFloat, FloatToHalf>(out, in, count, weight, accumulate);
    case DataType::kBFloat16:
      return ScaleAddHalfLike<BFloat16ToFloat, FloatToBFloat16>(out, in, count, weight, accumulate);
    default: break;
  }
  throw BluefogError(
      StatusCode::kInvalidArgument,
      Concat("weighted sums need a floating-point dtype, not ", DataTypeName(dtype)));
}

void SumInto(void* inout, const void* in, int64_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return SumTyped<uint8_t>(inout, in, count);
    case DataType::kInt8: return SumTyped<int8_t>(inout, in, count);
    case DataType::kUInt16: return SumTyped<uint16_t>(inout, in, count);
    case DataType::kInt16: return SumTyped<int16_t>(inout, in, count);
    case DataType::kInt32: return SumTyped<int32_t>(inout, in, count);
    case DataType::kInt64: return SumTyped<int64_t>(inout, in, count);
    case DataType::kFloat16:
      return SumOfHalfLike<HalfToFloat, FloatToHalf>(inout, inout, in, count, 1);
    case DataType::kBFloat16:
      return SumOfHalfLike<BFloat16ToFloat, FloatToBFloat16>(inout, inout, in, count, 1);
    case DataType::kFloat32: return SumTyped<float>(inout, in, count);
    case DataType::kFloat64: return SumTyped<double>(inout, in, count);
    case DataType::kBool: break;
  }
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("sum is not defined for dtype ", DataTypeName(dtype)));
}

void SumOf(void* out, const void* a, const void* b, int64_t count, DataType dtype,
           int64_t divisor) {
  switch (dtype) {
    case DataType::kUInt8: return SumOfTyped<uint8_t>(out, a, b, count, divisor);
    case DataType::kInt8: return SumOfTyped<int8_t>(out, a, b, count, divisor);
    case DataType::kUInt16: return SumOfTyped<uint16_t>(out, a, b, count, divisor);
    case DataType::kInt16: return SumOfTyped<int16_t>(out, a, b, count, divisor);
    case DataType::kInt32: return SumOfTyped<int32_t>(out, a, b, count, divisor);
    case DataType::kInt64: return SumOfTyped<int64_t>(out, a, b, count, divisor);
    case DataType::kFloat16:
      return SumOfHalfLike<HalfToFloat, FloatToHalf>(out, a, b, count, divisor);
    case DataType::kBFloat16:
      return SumOfHalfLike<BFloat16ToFloat, FloatToBFloat16>(out, a, b, count, divisor);
    case DataType::kFloat32: return SumOfTyped<float>(out, a, b, count, divisor);
    case DataType::kFloat64: return SumOfTyped<double>(out, a, b, count, divisor);
    case DataType::kBool: break;
  }
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("sum is not defined for dtype ", DataTypeName(dtype)));
}

void DivideBy(void* data, int64_t count, DataType dtype, int64_t divisor) {
  if (divisor == 1) return;
  switch (dtype) {
    case DataType::kUInt8: return DivideTyped<uint8_t>(data, count, divisor);
    case DataType::kInt8: return DivideTyped<int8_t>(data, count, divisor);
    case DataType::kUInt16: return DivideTyped<uint16_t>(data, count, divisor);
    case DataType::kInt16: return DivideTyped<int16_t>(data, count, divisor);
    case DataType::kInt32: return DivideTyped<int32_t>(data, count, divisor);
    case DataType::kInt64: return DivideTyped<int64_t>(data, count, divisor);
    case DataType::kFloat16: return DivideHalfLike<HalfToFloat, FloatToHalf>(data, count, divisor);
    case DataType::kBFloat16:
      return DivideHalfLike<BFloat16ToFloat, FloatToBFloat16>(data, count, divisor);
    case DataType::kFloat32: return DivideTyped<float>(data, count, divisor);
    case DataType::kFloat64: return DivideTyped<double>(data, count, divisor);
    case DataType::kBool: break;
  }
  throw BluefogError(StatusCode::kInvalidArgument,
                     Concat("average is not defined for dtype ", DataTypeName(dtype)));
}

void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Up to the destination's first 64-byte boundary with a plain copy, so that every streamed
  // line is written whole (a partly written line would be merged in memory, slowly).
  size_t head = (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

void ReduceStep(void* out, const void* a, const void* b, int64_t count, DataType dtype, ReduceOp op,
                int64_t divisor) {
  if (op == ReduceOp::kSum) {
    SumOf(out, a, b, count, dtype, divisor);
  } else {
    ReduceOf(out, a, b, count, dtype, op);
  }
}

}  // namespace bluefog
