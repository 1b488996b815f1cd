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
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00u);  // overflow to inf
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

TEST(ReduceKernels, BoolHasNoSum) {
  bool a[1] = {true}, b[1] = {true};
  EXPECT_THROW(SumInto(a, b, 1, DataType::kBool), BluefogError);
}

}  // namespace
}  // namespace bluefog
