#include "compress/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/status.h"

namespace bluefog {
namespace compress {
namespace {

std::vector<float> Normal(int64_t n, uint32_t seed, float spread = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> x(n);
  for (auto& v : x) v = d(gen);
  return x;
}

struct RoundTrip {
  std::vector<uint8_t> codes;
  std::vector<float> scales, out, error;
};

RoundTrip RoundTripOf(const std::vector<float>& x, const QuantizeOptions& o) {
  const int64_t n = static_cast<int64_t>(x.size());
  RoundTrip r{std::vector<uint8_t>(CodeBytes(n, o)), std::vector<float>(ScaleCount(n, o)),
              std::vector<float>(n), std::vector<float>(n)};
  Quantize(x.data(), n, o, r.codes.data(), r.scales.data(), r.error.data());
  Dequantize(r.codes.data(), r.scales.data(), n, o, r.out.data());
  return r;
}

// Every value within half a scale (nearest) or one scale (stochastic) of its block's scale,
// each scale the block's largest magnitude over the levels, and the error output exact.
void CheckBound(const std::vector<float>& x, const QuantizeOptions& o) {
  const RoundTrip r = RoundTripOf(x, o);
  const float levels = o.bits == 8 ? 127.0f : 7.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t b = static_cast<int64_t>(i) / o.block;
    float amax = 0.0f;
    for (int64_t j = b * o.block; j < std::min<int64_t>((b + 1) * o.block, x.size()); ++j) {
      amax = std::max(amax, std::fabs(x[j]));
    }
    ASSERT_FLOAT_EQ(r.scales[b], amax / levels) << "block " << b;
    const float bound = (o.stochastic ? 1.0f : 0.5f) * r.scales[b] * (1.0f + 1e-5f);
    ASSERT_LE(std::fabs(x[i] - r.out[i]), bound) << "element " << i << " bits " << o.bits;
    ASSERT_EQ(r.error[i], x[i] - r.out[i]) << "element " << i;
  }
}

TEST(Quantize, RoundTripWithinHalfAScalePerBlock) {
  for (int bits : {8, 4}) {
    for (bool stochastic : {false, true}) {
      for (int64_t n : {1, 2, 255, 256, 257, 1000, 4097}) {  // odd and short last blocks
        QuantizeOptions o;
        o.bits = bits;
        o.stochastic = stochastic;
        o.seed = 7;
        // Blocks of very different magnitudes: each gets its own scale.
        std::vector<float> x = Normal(n, static_cast<uint32_t>(n));
        for (int64_t i = 0; i < n; ++i)
          x[i] *= std::pow(10.0f, static_cast<float>(i / 256 % 5) - 2);
        CheckBound(x, o);
      }
    }
  }
}

TEST(Quantize, SmallBlocksAndCodesInRange) {
  QuantizeOptions o;
  o.bits = 4;
  o.block = 6;
  std::vector<float> x = {-3, -2, -1, 0, 1, 3, 0.5f, 7, -7};
  RoundTrip r = RoundTripOf(x, o);
  EXPECT_EQ(r.codes.size(), 5u);
  EXPECT_EQ(r.scales, (std::vector<float>{3.0f / 7, 1.0f}));
  EXPECT_EQ(r.out[0], -3.0f);
  EXPECT_EQ(r.out[5], 3.0f);
  EXPECT_EQ(r.out[7], 7.0f);
  EXPECT_EQ(r.out[8], -7.0f);
  EXPECT_EQ(r.out[6], 0.0f);  // 0.5 rounds to even
  CheckBound(x, o);
}

TEST(Quantize, ZerosAndTinyValues) {
  for (int bits : {8, 4}) {
    QuantizeOptions o;
    o.bits = bits;
    std::vector<float> zeros(300, 0.0f);
    RoundTrip r = RoundTripOf(zeros, o);
    for (float s : r.scales) EXPECT_EQ(s, 0.0f);
    for (float v : r.out) EXPECT_EQ(v, 0.0f);
    // Subnormal magnitudes: a scale that cannot be inverted in float32.
    std::vector<float> tiny = {1e-40f, -3e-41f, 0.0f, 2e-45f};
    RoundTrip t = RoundTripOf(tiny, o);
    for (size_t i = 0; i < tiny.size(); ++i) {
      EXPECT_TRUE(std::isfinite(t.out[i]));
      EXPECT_LE(std::fabs(tiny[i] - t.out[i]), 1e-40f);
    }
  }
}

TEST(Quantize, NonFiniteIsAnErrorNamingTheElement) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int bits : {8, 4}) {
      QuantizeOptions o;
      o.bits = bits;
      std::vector<float> x(700, 1.0f);
      x[513] = bad;
      std::vector<uint8_t> codes(CodeBytes(700, o));
      std::vector<float> scales(ScaleCount(700, o));
      try {
        Quantize(x.data(), 700, o, codes.data(), scales.data());
        FAIL() << "no error for " << bad;
      } catch (const BluefogError& e) {
        EXPECT_EQ(e.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("element 513"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Quantize, NonFiniteToNanPoisonsOnlyItsBlock) {
  for (int bits : {8, 4}) {
    QuantizeOptions o;
    o.bits = bits;
    o.block = 4;
    o.nonfinite_to_nan = true;
    std::vector<float> x = {1, 2, 3, 4, 5, std::numeric_limits<float>::infinity(), 7, 8, 9};
    RoundTrip r = RoundTripOf(x, o);
    EXPECT_FALSE(std::isnan(r.scales[0]));
    EXPECT_TRUE(std::isnan(r.scales[1]));
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(r.out[i], x[i], r.scales[0] / 2 * (1 + 1e-5f));
    for (int i = 4; i < 8; ++i) {
      EXPECT_TRUE(std::isnan(r.out[i])) << i;
      EXPECT_EQ(r.error[i], 0.0f) << i;  // no residual carried from a poisoned block
    }
    EXPECT_EQ(r.out[8], 9.0f);
  }
}

TEST(Quantize, BadOptionsAreErrors) {
  QuantizeOptions o;
  o.bits = 3;
  EXPECT_THROW(CheckOptions(o), BluefogError);
  o.bits = 4;
  o.block = 255;
  EXPECT_THROW(CheckOptions(o), BluefogError);
  o.block = 0;
  EXPECT_THROW(CheckOptions(o), BluefogError);
}

TEST(Quantize, StochasticRoundingIsUnbiasedAndSeeded) {
  QuantizeOptions o;
  o.stochastic = true;
  o.block = 4;
  // 0.3 of a step above zero in every block (the 127 sets the scale to 1).
  std::vector<float> x;
  for (int b = 0; b < 20000; ++b) x.insert(x.end(), {127.0f, 0.3f, 0.3f, 0.3f});
  RoundTrip a = RoundTripOf(x, o), b = RoundTripOf(x, o);
  EXPECT_EQ(a.codes, b.codes);
  double mean = 0;
  for (size_t i = 0; i < x.size(); i += 4) mean += a.out[i + 1] + a.out[i + 2] + a.out[i + 3];
  mean /= 60000.0;
  EXPECT_NEAR(mean, 0.3, 0.01);
  o.seed = 99;
  RoundTrip c = RoundTripOf(x, o);
  EXPECT_NE(a.codes, c.codes);
}

TEST(Quantize, DequantizeSumOfSourcesIsTheSumOfDequantized) {
  for (int bits : {8, 4}) {
    QuantizeOptions o;
    o.bits = bits;
    const int sources = 3;
    const int64_t n = 1001, stride_codes = CodeBytes(1024, o), stride_scales = ScaleCount(1024, o);
    std::vector<uint8_t> codes(stride_codes * sources);
    std::vector<float> scales(stride_scales * sources), expect(n, 0.0f), one(n), sum(n);
    for (int s = 0; s < sources; ++s) {
      std::vector<float> x = Normal(n, 100 + s, 1.0f + s);
      Quantize(x.data(), n, o, codes.data() + s * stride_codes, scales.data() + s * stride_scales);
      Dequantize(codes.data() + s * stride_codes, scales.data() + s * stride_scales, n, o,
                 one.data());
      for (int64_t i = 0; i < n; ++i) expect[i] += one[i];
    }
    DequantizeSum(codes.data(), stride_codes, scales.data(), stride_scales, sources, n, o,
                  1.0f / sources, sum.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(sum[i], expect[i] / sources, 1e-5f) << i;
  }
}

}  // namespace
}  // namespace compress
}  // namespace bluefog
