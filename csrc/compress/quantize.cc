#include "compress/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/status.h"

namespace bluefog {
namespace compress {
namespace {

// Adding and subtracting 1.5 * 2^23 rounds a float of magnitude below 2^22 to the nearest
// integer (ties to even) in the default rounding mode: unlike std::nearbyint, it vectorizes on
// the SSE2 baseline.
constexpr float kRoundMagic = 12582912.0f;
constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

inline float RoundNearest(float v) { return (v + kRoundMagic) - kRoundMagic; }

// A uniform value in [0, 1) from (seed, index): a counter-based hash, so the codes depend on
// the input and the seed only, not on how the work is split.
inline float Uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + index * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

// The largest magnitude's bit pattern: for non-negative floats the integer order of the bits is
// the float order, and NaN and infinity are at or above kInfBits, so one integer maximum finds
// both the scale and any non-finite value.
uint32_t MaxMagnitudeBits(const float* __restrict x, int64_t m) {
  uint32_t top = 0;
  for (int64_t i = 0; i < m; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= kAbsMask;
    top = bits > top ? bits : top;
  }
  return top;
}

[[noreturn]] void ThrowNonFinite(const float* x, int64_t m, int64_t offset) {
  for (int64_t i = 0; i < m; ++i) {
    if (!std::isfinite(x[i])) {
      throw BluefogError(
          StatusCode::kInvalidArgument,
          Concat("cannot quantize a non-finite value: element ", offset + i, " is ", x[i],
                 "; compressed collectives need finite floats (look "
                 "for a diverging loss or an overflow before this op)"));
    }
  }
  throw BluefogError(StatusCode::kInternal, "quantize: non-finite value not found");
}

// The codes of one block as floats in [-levels, levels], already rounded.
void BlockCodes(const float* __restrict x, int64_t m, float inv, float levels,
                const QuantizeOptions& o, int64_t offset, float* __restrict q) {
  if (!o.stochastic) {  // |x * inv| <= levels (to a rounding): no clamp needed
    for (int64_t i = 0; i < m; ++i) q[i] = RoundNearest(x[i] * inv);
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    float v = x[i] * inv + Uniform(o.seed, static_cast<uint64_t>(offset + i)) - 0.5f;
    q[i] = std::min(levels, std::max(-levels, RoundNearest(v)));
  }
}

}  // namespace

void CheckOptions(const QuantizeOptions& o) {
  BF_ENFORCE(o.bits == 8 || o.bits == 4, StatusCode::kInvalidArgument,
             "quantize: bits must be 8 or 4, got ", o.bits);
  BF_ENFORCE(o.block > 0 && (o.bits == 8 || o.block % 2 == 0), StatusCode::kInvalidArgument,
             "quantize: the block must be a positive number of values (even for 4 bits), got ",
             o.block);
}

int64_t ScaleCount(int64_t count, const QuantizeOptions& o) {
  return (count + o.block - 1) / o.block;
}

int64_t CodeBytes(int64_t count, const QuantizeOptions& o) {
  return o.bits == 8 ? count : (count + 1) / 2;
}

void Quantize(const float* x, int64_t count, const QuantizeOptions& o, uint8_t* codes,
              float* scales, float* error) {
  CheckOptions(o);
  const float levels = o.bits == 8 ? 127.0f : 7.0f;
  std::vector<float> q(static_cast<size_t>(std::min(count, o.block)));
  for (int64_t start = 0, b = 0; start < count; start += o.block, ++b) {
    const int64_t m = std::min(o.block, count - start);
    const float* xb = x + start;
    uint32_t top = MaxMagnitudeBits(xb, m);
    if (top >= kInfBits) {
      if (!o.nonfinite_to_nan) ThrowNonFinite(xb, m, start);
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      std::memset(codes + (o.bits == 8 ? start : start / 2), 0,
                  static_cast<size_t>(o.bits == 8 ? m : (m + 1) / 2));
      if (error != nullptr) std::fill(error + start, error + start + m, 0.0f);
      continue;
    }
    float amax;
    std::memcpy(&amax, &top, sizeof amax);
    float scale = amax / levels;
    // Tiny blocks (a subnormal scale) divide instead: levels / amax would overflow.
    float inv = amax == 0.0f ? 0.0f : (amax >= 1e-30f ? levels / amax : 0.0f);
    scales[b] = scale;
    if (inv == 0.0f && amax != 0.0f) {
      for (int64_t i = 0; i < m; ++i) {
        q[i] = static_cast<float>(std::nearbyint(static_cast<double>(xb[i]) * levels / amax));
      }
    } else if (o.bits == 8 && !o.stochastic) {  // the common case in one pass
      int8_t* out = reinterpret_cast<int8_t*>(codes) + start;
      for (int64_t i = 0; i < m; ++i) {
        out[i] = static_cast<int8_t>(static_cast<int32_t>(RoundNearest(xb[i] * inv)));
      }
      if (error != nullptr) {
        float* eb = error + start;
        for (int64_t i = 0; i < m; ++i) eb[i] = xb[i] - static_cast<float>(out[i]) * scale;
      }
      continue;
    } else {
      BlockCodes(xb, m, inv, levels, o, start, q.data());
    }
    if (o.bits == 8) {
      int8_t* out = reinterpret_cast<int8_t*>(codes) + start;
      for (int64_t i = 0; i < m; ++i) out[i] = static_cast<int8_t>(static_cast<int32_t>(q[i]));
    } else {
      uint8_t* out = codes + start / 2;
      for (int64_t j = 0; j < m / 2; ++j) {
        uint32_t lo = static_cast<uint32_t>(static_cast<int32_t>(q[2 * j])) & 15u;
        uint32_t hi = static_cast<uint32_t>(static_cast<int32_t>(q[2 * j + 1])) & 15u;
        out[j] = static_cast<uint8_t>(lo | (hi << 4));
      }
      if (m % 2) out[m / 2] = static_cast<uint8_t>(static_cast<int32_t>(q[m - 1]) & 15);
    }
    if (error != nullptr) {
      float* eb = error + start;
      for (int64_t i = 0; i < m; ++i) eb[i] = xb[i] - q[i] * scale;
    }
  }
}

namespace {

// out[i] (+)= factor * code[i] for one block's codes.
template <bool kAccumulate>
void Expand(const uint8_t* __restrict codes, int64_t start, int64_t m, int bits, float factor,
            float* __restrict out) {
  if (bits == 8) {
    const int8_t* c = reinterpret_cast<const int8_t*>(codes) + start;
    for (int64_t i = 0; i < m; ++i) {
      float v = static_cast<float>(c[i]) * factor;
      out[i] = kAccumulate ? out[i] + v : v;
    }
    return;
  }
  const uint8_t* c = codes + start / 2;
  for (int64_t j = 0; j < m / 2; ++j) {
    // The low nibble moves up through an unsigned byte (a left shift of a negative value is
    // undefined); the arithmetic right shifts then sign-extend each nibble.
    const int8_t byte = static_cast<int8_t>(c[j]);
    float lo =
        static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(c[j] << 4)) >> 4) * factor;
    float hi = static_cast<float>(byte >> 4) * factor;
    out[2 * j] = kAccumulate ? out[2 * j] + lo : lo;
    out[2 * j + 1] = kAccumulate ? out[2 * j + 1] + hi : hi;
  }
  if (m % 2) {
    float v =
        static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(c[m / 2] << 4)) >> 4) * factor;
    out[m - 1] = kAccumulate ? out[m - 1] + v : v;
  }
}

}  // namespace

void Dequantize(const uint8_t* codes, const float* scales, int64_t count, const QuantizeOptions& o,
                float* out) {
  CheckOptions(o);
  for (int64_t start = 0, b = 0; start < count; start += o.block, ++b) {
    Expand<false>(codes, start, std::min(o.block, count - start), o.bits, scales[b], out + start);
  }
}

void DequantizeSum(const uint8_t* codes, int64_t code_stride, const float* scales,
                   int64_t scale_stride, int sources, int64_t count, const QuantizeOptions& o,
                   float factor, float* out) {
  CheckOptions(o);
  BF_ENFORCE(sources >= 1, StatusCode::kInvalidArgument,
             "dequantize-sum: needs at least one source, got ", sources);
  for (int64_t start = 0, b = 0; start < count; start += o.block, ++b) {
    const int64_t m = std::min(o.block, count - start);
    float* ob = out + start;
    Expand<false>(codes, start, m, o.bits, scales[b], ob);
    for (int s = 1; s < sources; ++s) {
      Expand<true>(codes + s * code_stride, start, m, o.bits, scales[b + s * scale_stride], ob);
    }
    if (factor != 1.0f) {
      for (int64_t i = 0; i < m; ++i) ob[i] *= factor;
    }
  }
}

}  // namespace compress
}  // namespace bluefog
