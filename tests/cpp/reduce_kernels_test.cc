#include "core/reduce_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/status.h"

namespace bluefog {
namespace {

TEST(ReduceKernels, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00u) == 0x7c00u) continue;  // inf/nan checked below
    EXPECT_EQ(FloatToHalf(HalfToFloat(bits)), bits) << std::hex << h;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00u)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00u)));
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00u);                              // overflow to inf
  EXPECT_EQ(HalfToFloat(FloatToHalf(1.0f / 3.0f)), 0.333251953125f);  // round to nearest
}

TEST(ReduceKernels, BFloat16RoundTrips) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 16777216.0f, -0.0078125f})
    EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(f)), f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

template <typename T>
void CheckSumAndDivide(DataType dtype) {
  std::vector<T> a = {1, 2, 3, 7}, b = {4, 5, 6, 2};
  SumInto(a.data(), b.data(), 4, dtype);
  EXPECT_EQ(a, (std::vector<T>{5, 7, 9, 9}));
  DivideBy(a.data(), 4, dtype, 2);
  EXPECT_EQ(a, (std::vector<T>{2, 3, 4, 4}));  // truncating integer division
}

TEST(ReduceKernels, IntegerSumAndTruncatingAverage) {
  CheckSumAndDivide<uint8_t>(DataType::kUInt8);
  CheckSumAndDivide<int8_t>(DataType::kInt8);
  CheckSumAndDivide<int16_t>(DataType::kInt16);
  CheckSumAndDivide<int32_t>(DataType::kInt32);
  CheckSumAndDivide<int64_t>(DataType::kInt64);
}

TEST(ReduceKernels, FloatSumAndAverage) {
  std::vector<double> a = {1.5, -2}, b = {0.5, 1};
  SumInto(a.data(), b.data(), 2, DataType::kFloat64);
  DivideBy(a.data(), 2, DataType::kFloat64, 4);
  EXPECT_EQ(a, (std::vector<double>{0.5, -0.25}));
  std::vector<uint16_t> h = {FloatToHalf(1.5f), FloatToHalf(-3.0f)};
  std::vector<uint16_t> g = {FloatToHalf(2.5f), FloatToHalf(1.0f)};
  SumInto(h.data(), g.data(), 2, DataType::kFloat16);
  DivideBy(h.data(), 2, DataType::kFloat16, 2);
  EXPECT_EQ(HalfToFloat(h[0]), 2.0f);
  EXPECT_EQ(HalfToFloat(h[1]), -1.0f);
}

// SumOf must give exactly what SumInto then DivideBy give, in place or not, for every dtype.
template <typename T>
void CheckSumOfMatchesTwoPasses(DataType dtype, std::vector<T> a, const std::vector<T>& b) {
  const int64_t n = static_cast<int64_t>(a.size());
  for (int64_t divisor : {1, 3}) {
    std::vector<T> expected = a;
    SumInto(expected.data(), b.data(), n, dtype);
    DivideBy(expected.data(), n, dtype, divisor);
    std::vector<T> out(a.size());
    SumOf(out.data(), a.data(), b.data(), n, dtype, divisor);
    EXPECT_EQ(0, std::memcmp(out.data(), expected.data(), n * sizeof(T))) << divisor;
    std::vector<T> inplace = a;
    SumOf(inplace.data(), inplace.data(), b.data(), n, dtype, divisor);
    EXPECT_EQ(0, std::memcmp(inplace.data(), expected.data(), n * sizeof(T))) << divisor;
  }
}

TEST(ReduceKernels, SumOfMatchesSumThenDivide) {
  CheckSumOfMatchesTwoPasses<uint8_t>(DataType::kUInt8, {1, 200, 3}, {4, 100, 250});
  CheckSumOfMatchesTwoPasses<int8_t>(DataType::kInt8, {1, -100, 3}, {-4, -100, 120});
  CheckSumOfMatchesTwoPasses<uint16_t>(DataType::kUInt16, {1, 2, 3}, {4, 5, 65535});
  CheckSumOfMatchesTwoPasses<int16_t>(DataType::kInt16, {1, -7, 3}, {4, 5, 6});
  CheckSumOfMatchesTwoPasses<int32_t>(DataType::kInt32, {1, -7, 3}, {4, 5, 6});
  CheckSumOfMatchesTwoPasses<int64_t>(DataType::kInt64, {1, -7, 3}, {4, 5, 6});
  CheckSumOfMatchesTwoPasses<float>(DataType::kFloat32, {0.1f, -7.5f, 1e30f}, {0.2f, 5, 1e30f});
  CheckSumOfMatchesTwoPasses<double>(DataType::kFloat64, {0.1, -7.5, 3}, {0.2, 5, 1.0 / 3});
  CheckSumOfMatchesTwoPasses<uint16_t>(
      DataType::kFloat16, {FloatToHalf(0.1f), FloatToHalf(-7.5f), FloatToHalf(60000.0f)},
      {FloatToHalf(0.2f), FloatToHalf(5.0f), FloatToHalf(60000.0f)});
  CheckSumOfMatchesTwoPasses<uint16_t>(
      DataType::kBFloat16, {FloatToBFloat16(0.1f), FloatToBFloat16(-7.5f), FloatToBFloat16(3)},
      {FloatToBFloat16(0.2f), FloatToBFloat16(5.0f), FloatToBFloat16(1.0f / 3)});
  bool a[1] = {true}, b[1] = {true};
  EXPECT_THROW(SumOf(a, a, b, 1, DataType::kBool, 1), BluefogError);
}

// The 16-bit kernels run 8 elements at a time where the CPU allows (AVX2 + F16C) and element by
// element otherwise; both must give exactly the element-wise formula, for every bit pattern
// (including subnormals, infinities, overflow to inf and NaN) and for a count that leaves a tail.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void CheckSixteenBitKernelsMatchTheFormula(DataType dtype) {
  const int64_t n = 0x10000 + 5;
  std::vector<uint16_t> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = static_cast<uint16_t>(i);
    b[i] = static_cast<uint16_t>(i * 7919 + 13);
  }
  auto same = [](uint16_t got, float want_float, uint16_t want) {
    return std::isnan(want_float) ? std::isnan(ToFloat(got)) : got == want;
  };
  auto check = [&](const std::vector<uint16_t>& got, auto formula, const char* what) {
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      const float f = formula(i);
      if (!same(got[i], f, FromFloat(f))) {
        ++bad;
        ADD_FAILURE() << what << " " << DataTypeName(dtype) << " at " << i << ": a=0x" << std::hex
                      << a[i] << " b=0x" << b[i] << " got 0x" << got[i] << " want 0x"
                      << FromFloat(f);
      }
    }
  };
  for (int64_t divisor : {1, 3}) {
    std::vector<uint16_t> out(n);
    SumOf(out.data(), a.data(), b.data(), n, dtype, divisor);
    check(
        out,
        [&](int64_t i) {
          const float sum = ToFloat(FromFloat(ToFloat(a[i]) + ToFloat(b[i])));
          return divisor > 1 ? sum / static_cast<float>(divisor) : sum;
        },
        "SumOf");
  }
  std::vector<uint16_t> inout = a;
  SumInto(inout.data(), b.data(), n, dtype);
  check(inout, [&](int64_t i) { return ToFloat(a[i]) + ToFloat(b[i]); }, "SumInto");
  inout = a;
  DivideBy(inout.data(), n, dtype, 5);
  check(inout, [&](int64_t i) { return ToFloat(a[i]) / 5.0f; }, "DivideBy");
  for (bool accumulate : {false, true}) {
    inout = a;
    ScaleAdd(inout.data(), b.data(), n, dtype, 0.3, accumulate);
    check(
        inout,
        [&](int64_t i) { return (accumulate ? ToFloat(a[i]) : 0.0f) + 0.3f * ToFloat(b[i]); },
        accumulate ? "ScaleAdd(accumulate)" : "ScaleAdd");
  }
}

TEST(ReduceKernels, HalfKernelsMatchTheElementwiseFormula) {
  CheckSixteenBitKernelsMatchTheFormula<HalfToFloat, FloatToHalf>(DataType::kFloat16);
}

TEST(ReduceKernels, BFloat16KernelsMatchTheElementwiseFormula) {
  CheckSixteenBitKernelsMatchTheFormula<BFloat16ToFloat, FloatToBFloat16>(DataType::kBFloat16);
}

TEST(ReduceKernels, MinMaxProduct) {
  std::vector<int32_t> a = {1, -5, 3}, b = {2, -7, -1}, out(3);
  ReduceOf(out.data(), a.data(), b.data(), 3, DataType::kInt32, ReduceOp::kMin);
  EXPECT_EQ(out, (std::vector<int32_t>{1, -7, -1}));
  ReduceOf(out.data(), a.data(), b.data(), 3, DataType::kInt32, ReduceOp::kMax);
  EXPECT_EQ(out, (std::vector<int32_t>{2, -5, 3}));
  ReduceOf(out.data(), a.data(), b.data(), 3, DataType::kInt32, ReduceOp::kProduct);
  EXPECT_EQ(out, (std::vector<int32_t>{2, 35, -3}));
  // NaN wins min and max whichever side it is on, for float and the 16-bit types.
  const float nan = std::nanf("");
  std::vector<float> x = {nan, 1.0f}, y = {2.0f, nan}, f(2);
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    ReduceOf(f.data(), x.data(), y.data(), 2, DataType::kFloat32, op);
    EXPECT_TRUE(std::isnan(f[0]) && std::isnan(f[1])) << ReduceOpName(op);
    std::vector<uint16_t> hx = {FloatToHalf(nan), FloatToHalf(1.0f)};
    std::vector<uint16_t> hy = {FloatToHalf(2.0f), FloatToHalf(nan)}, h(2);
    ReduceOf(h.data(), hx.data(), hy.data(), 2, DataType::kFloat16, op);
    EXPECT_TRUE(std::isnan(HalfToFloat(h[0])) && std::isnan(HalfToFloat(h[1])));
  }
  std::vector<uint16_t> p = {FloatToBFloat16(1.5f)}, q = {FloatToBFloat16(-4.0f)}, r(1);
  ReduceOf(r.data(), p.data(), q.data(), 1, DataType::kBFloat16, ReduceOp::kProduct);
  EXPECT_EQ(BFloat16ToFloat(r[0]), -6.0f);
  bool t[1] = {true};
  EXPECT_THROW(ReduceOf(t, t, t, 1, DataType::kBool, ReduceOp::kMax), BluefogError);
}

TEST(ReduceKernels, BoolHasNoSum) {
  bool a[1] = {true}, b[1] = {true};
  EXPECT_THROW(SumInto(a, b, 1, DataType::kBool), BluefogError);
}

// Every destination alignment within a line and every length up to a few lines (head, whole
// streamed lines, tail), and a large copy: the bytes memcpy would write, none outside them.
TEST(ReduceKernels, StreamCopyWritesExactlyTheBytes) {
  std::vector<unsigned char> src(4096 + 64), dst(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t at = 0; at < 64; ++at) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{127},
                         size_t{200}, size_t{4096}}) {
      std::fill(dst.begin(), dst.end(), 0xEE);
      StreamCopy(dst.data() + 64 + at, src.data() + (at * 5) % 64, bytes);
      for (size_t i = 0; i < dst.size(); ++i) {
        const bool inside = i >= 64 + at && i < 64 + at + bytes;
        ASSERT_EQ(dst[i], inside ? src[(at * 5) % 64 + i - 64 - at] : 0xEE)
            << "at " << at << " bytes " << bytes << " index " << i;
      }
    }
  }
}

// A joined rank's stand-in: reducing with the identity leaves the other value unchanged.
TEST(ReduceKernels, IdentityLeavesTheOtherValue) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    float f[2], fo[2];
    const float fv[2] = {-5.0f, 3.0e38f};
    FillIdentity(f, 2, DataType::kFloat32, op);
    ReduceOf(fo, fv, f, 2, DataType::kFloat32, op);
    EXPECT_EQ(fo[0], fv[0]) << ReduceOpName(op);
    EXPECT_EQ(fo[1], fv[1]) << ReduceOpName(op);
    int32_t i[2], io[2];
    const int32_t iv[2] = {-5, 2147483647};
    FillIdentity(i, 2, DataType::kInt32, op);
    ReduceOf(io, iv, i, 2, DataType::kInt32, op);
    EXPECT_EQ(io[0], iv[0]) << ReduceOpName(op);
    EXPECT_EQ(io[1], iv[1]) << ReduceOpName(op);
    uint16_t h[1], ho[1];
    const uint16_t hv[1] = {FloatToHalf(-60000.0f)};
    FillIdentity(h, 1, DataType::kFloat16, op);
    ReduceOf(ho, hv, h, 1, DataType::kFloat16, op);
    EXPECT_EQ(ho[0], hv[0]) << ReduceOpName(op);
    uint8_t u[1], uo[1];
    const uint8_t uv[1] = {200};
    FillIdentity(u, 1, DataType::kUInt8, op);
    ReduceOf(uo, uv, u, 1, DataType::kUInt8, op);
    EXPECT_EQ(uo[0], uv[0]) << ReduceOpName(op);
  }
  bool b[1];
  EXPECT_THROW(FillIdentity(b, 1, DataType::kBool, ReduceOp::kMin), BluefogError);
}

}  // namespace
}  // namespace bluefog
