#include "core/fingerprint.h"

#include <cstring>

namespace bluefog {
namespace {

// Odd multipliers (the 64-bit golden ratio and two from the usual finalizers): multiplying by
// an odd number is a bijection modulo 2^64, which the one-word guarantee rests on.
constexpr uint64_t kMulA = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMulB = 0xFF51AFD7ED558CCDULL;
constexpr uint64_t kMulC = 0xC4CEB9FE1A85EC53ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// For a fixed lane state, a bijection of the word; for a fixed word, a bijection of the state.
inline uint64_t Step(uint64_t lane, uint64_t word) {
  lane += word * kMulB;
  lane = Rotl(lane, 31);
  return lane * kMulA;
}

// A bijection that spreads every input bit over the whole result.
inline uint64_t Avalanche(uint64_t x) {
  x ^= x >> 33;
  x *= kMulB;
  x ^= x >> 33;
  x *= kMulC;
  x ^= x >> 33;
  return x;
}

inline uint64_t Load(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

}  // namespace

uint64_t Fingerprint64(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kMulA, kMulB, kMulC, kMulA ^ kMulB};
  size_t words = bytes / 8;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    lane[0] = Step(lane[0], Load(p + 8 * i));
    lane[1] = Step(lane[1], Load(p + 8 * i + 8));
    lane[2] = Step(lane[2], Load(p + 8 * i + 16));
    lane[3] = Step(lane[3], Load(p + 8 * i + 24));
  }
  for (; i < words; ++i) lane[i % 4] = Step(lane[i % 4], Load(p + 8 * i));
  size_t rest = bytes % 8;
  if (rest != 0) {
    uint64_t tail = 0;
    std::memcpy(&tail, p + 8 * words, rest);
    lane[words % 4] = Step(lane[words % 4], tail);
  }
  // Each lane enters through a bijection (given the others), so one changed lane changes the
  // sum; the count of bytes tells inputs apart that differ only in trailing zero bytes.
  uint64_t h = Rotl(lane[0], 1) + Rotl(lane[1], 7) + Rotl(lane[2], 12) + Rotl(lane[3], 18);
  h ^= static_cast<uint64_t>(bytes) * kMulC;
  return Avalanche(h);
}

}  // namespace bluefog
