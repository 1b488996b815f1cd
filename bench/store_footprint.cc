// What keeping the input costs a reduction, with no communication at all: one process sums two
// buffers of `bytes` with the core's kernels (SumOf, StreamCopy), in place (a = a + b, as
// in-place MPI_Allreduce may), out of place with plain stores (o = a + b, as any allreduce that
// keeps its input must: o's lines are read before they are written, and a third buffer
// competes for the cache), and out of place with streaming stores (summed 64 KiB at a time in
// cache, streamed into o: BLUEFOG_STREAMING_STORES), each alone and followed by a reader of the
// result (as an optimizer reads a gradient). Every variant has buffers of its own; repetitions
// interleave the variants in a fresh order. One JSON line per size with the median seconds of
// each. Built with the C++ tests (make cpp-build); see docs/benchmarks.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/reduce_kernels.h"

namespace {

using bluefog::DataType;

constexpr int64_t kPiece = int64_t{64} << 10;

enum Kind { kInPlace, kPlain, kStreamed };
struct Variant {
  const char* name;
  Kind kind;
  bool read_after;
};
constexpr Variant kVariants[] = {
    {"in_place", kInPlace, false},  {"plain", kPlain, false},
    {"streamed", kStreamed, false}, {"in_place_read", kInPlace, true},
    {"plain_read", kPlain, true},   {"streamed_read", kStreamed, true},
};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

volatile float g_sink;

}  // namespace

int main() {
  constexpr int kReps = 15;
  std::vector<float> piece(kPiece / 4);
  for (int64_t bytes : {int64_t{1} << 20, int64_t{4} << 20, int64_t{8} << 20, int64_t{16} << 20,
                        int64_t{64} << 20}) {
    const int64_t count = bytes / 4;
    std::vector<std::vector<float>> a, b, o;
    for (int v = 0; v < kNumVariants; ++v) {
      a.emplace_back(count, 1.0f);
      b.emplace_back(count, 2.0f);
      o.emplace_back(kVariants[v].kind == kInPlace ? 0 : count, 0.0f);
    }
    const int iters = static_cast<int>(std::clamp(100e6 / static_cast<double>(bytes), 2.0, 100.0));
    std::vector<std::vector<double>> times(kNumVariants);
    for (int rep = 0; rep <= kReps; ++rep) {  // rep 0 warms up
      std::vector<int> order(kNumVariants);
      for (int v = 0; v < kNumVariants; ++v) order[v] = v;
      std::shuffle(order.begin(), order.end(), std::mt19937(rep));
      for (int v : order) {
        const Variant& var = kVariants[v];
        float* out = var.kind == kInPlace ? a[v].data() : o[v].data();
        const double t0 = Now();
        for (int i = 0; i < iters; ++i) {
          if (var.kind == kStreamed) {
            for (int64_t lo = 0; lo < count; lo += kPiece / 4) {
              const int64_t len = std::min(kPiece / 4, count - lo);
              bluefog::SumOf(piece.data(), a[v].data() + lo, b[v].data() + lo, len,
                             DataType::kFloat32, 1);
              bluefog::StreamCopy(out + lo, piece.data(), static_cast<size_t>(len) * 4);
            }
          } else {
            bluefog::SumOf(out, a[v].data(), b[v].data(), count, DataType::kFloat32, 1);
          }
          if (var.read_after) {
            float sum = 0;
            for (int64_t k = 0; k < count; k += 16) sum += out[k];  // one load per line
            g_sink = sum;
          }
        }
        if (rep > 0) times[v].push_back((Now() - t0) / iters);
      }
    }
    std::string line = "{\"impl\":\"store_footprint\",\"bytes\":" + std::to_string(bytes);
    for (int v = 0; v < kNumVariants; ++v) {
      std::sort(times[v].begin(), times[v].end());
      char field[96];
      std::snprintf(field, sizeof(field), ",\"%s_s\":%.9g", kVariants[v].name, times[v][kReps / 2]);
      line += field;
    }
    std::printf("%s}\n", line.c_str());
  }
  return 0;
}
