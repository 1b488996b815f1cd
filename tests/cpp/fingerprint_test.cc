// Fingerprint64: the one-word guarantee, bit by bit, and the cases that a careless hash gets
// wrong (trailing zeros, lengths, unaligned starts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/fingerprint.h"

namespace bluefog {
namespace {

std::vector<unsigned char> Pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 37 + 11);
  return v;
}

TEST(Fingerprint, EveryBitFlipChangesIt) {
  // Lengths around the 32-byte block and the 8-byte word, so the lanes, the leftover words and
  // the tail are all covered.
  for (size_t n : {1, 7, 8, 9, 31, 32, 33, 100}) {
    auto v = Pattern(n);
    const uint64_t base = Fingerprint64(v.data(), n);
    for (size_t bit = 0; bit < 8 * n; ++bit) {
      v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
      EXPECT_NE(Fingerprint64(v.data(), n), base) << "n=" << n << " bit=" << bit;
      v[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    }
  }
}

TEST(Fingerprint, OneUlpOfAFloat) {
  std::vector<float> x(1000, 0.25f);
  const uint64_t base = Fingerprint64(x.data(), x.size() * sizeof(float));
  for (size_t i : {0, 1, 517, 999}) {
    float saved = x[i];
    x[i] = std::nextafter(saved, 1.0f);
    EXPECT_NE(Fingerprint64(x.data(), x.size() * sizeof(float)), base) << i;
    x[i] = saved;
  }
  EXPECT_EQ(Fingerprint64(x.data(), x.size() * sizeof(float)), base);
}

TEST(Fingerprint, LengthCountsAndZerosAreNotEmpty) {
  std::vector<unsigned char> zeros(64, 0);
  std::set<uint64_t> seen;
  for (size_t n = 0; n <= 64; ++n) seen.insert(Fingerprint64(zeros.data(), n));
  EXPECT_EQ(seen.size(), 65u);
}

TEST(Fingerprint, DependsOnlyOnTheBytes) {
  auto v = Pattern(200);
  std::vector<unsigned char> shifted(201);
  std::memcpy(shifted.data() + 1, v.data(), v.size());  // an unaligned copy
  EXPECT_EQ(Fingerprint64(v.data(), v.size()), Fingerprint64(shifted.data() + 1, v.size()));
}

TEST(Fingerprint, SwappedWordsDiffer) {
  auto v = Pattern(64);
  const uint64_t base = Fingerprint64(v.data(), v.size());
  std::vector<unsigned char> w(v);
  std::memcpy(w.data(), v.data() + 8, 8);
  std::memcpy(w.data() + 8, v.data(), 8);
  EXPECT_NE(Fingerprint64(w.data(), w.size()), base);
}

}  // namespace
}  // namespace bluefog
