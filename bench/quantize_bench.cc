// The per-block quantizers of compressed collectives (csrc/compress/) on one core: GB/s of
// float32 input for quantize + dequantize (8 and 4 bits, round to nearest and stochastic) and
// for the dequantize-and-sum of 4 sources. Prints one JSON line; the median of --reps runs.
// Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID): what one core takes, also on a
// machine whose cores are shared with other work; "wall_round_trip_gbs" is the wall-clock one.
//   build/cpp/quantize_bench [MiB] [reps]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "compress/quantize.h"

namespace {

using bluefog::compress::QuantizeOptions;
using Clock = std::chrono::steady_clock;

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

template <typename F>
double MedianSeconds(int reps, F&& f, bool wall = false) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto start = Clock::now();
    double cpu = ThreadSeconds();
    f();
    t.push_back(wall ? std::chrono::duration<double>(Clock::now() - start).count()
                     : ThreadSeconds() - cpu);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const double mib = argc > 1 ? std::atof(argv[1]) : 64.0;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t n = static_cast<int64_t>(mib * (1 << 20) / sizeof(float));
  std::vector<float> x(n), y(n), error(n);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(gen);
  const double bytes = static_cast<double>(n) * sizeof(float);
  std::printf("{\"mib\": %.1f", mib);
  for (int bits : {8, 4}) {
    for (bool stochastic : {false, true}) {
      QuantizeOptions o;
      o.bits = bits;
      o.stochastic = stochastic;
      std::vector<uint8_t> codes(bluefog::compress::CodeBytes(n, o));
      std::vector<float> scales(bluefog::compress::ScaleCount(n, o));
      double q = MedianSeconds(
          reps, [&] { bluefog::compress::Quantize(x.data(), n, o, codes.data(), scales.data()); });
      double d = MedianSeconds(reps, [&] {
        bluefog::compress::Dequantize(codes.data(), scales.data(), n, o, y.data());
      });
      double qe = MedianSeconds(reps, [&] {
        bluefog::compress::Quantize(x.data(), n, o, codes.data(), scales.data(), error.data());
      });
      double wall = MedianSeconds(
          reps,
          [&] {
            bluefog::compress::Quantize(x.data(), n, o, codes.data(), scales.data());
            bluefog::compress::Dequantize(codes.data(), scales.data(), n, o, y.data());
          },
          true);
      std::printf(
          ", \"int%d%s\": {\"quantize_gbs\": %.2f, \"dequantize_gbs\": %.2f, "
          "\"round_trip_gbs\": %.2f, \"quantize_with_error_gbs\": %.2f, "
          "\"wall_round_trip_gbs\": %.2f}",
          bits, stochastic ? "_stochastic" : "", bytes / q / 1e9, bytes / d / 1e9,
          bytes / (q + d) / 1e9, bytes / qe / 1e9, bytes / wall / 1e9);
    }
  }
  // Dequantize-and-sum of 4 sources of n / 4 values each (a chunk owner at 4 ranks).
  QuantizeOptions o;
  const int sources = 4;
  const int64_t chunk = n / sources;
  std::vector<uint8_t> codes(n);
  std::vector<float> scales(bluefog::compress::ScaleCount(chunk, o) * sources);
  for (int s = 0; s < sources; ++s) {
    bluefog::compress::Quantize(x.data() + s * chunk, chunk, o, codes.data() + s * chunk,
                                scales.data() + s * bluefog::compress::ScaleCount(chunk, o));
  }
  double ds = MedianSeconds(reps, [&] {
    bluefog::compress::DequantizeSum(codes.data(), chunk, scales.data(),
                                     bluefog::compress::ScaleCount(chunk, o), sources, chunk, o,
                                     0.25f, y.data());
  });
  std::printf(", \"int8_dequantize_sum_4_gbs\": %.2f}\n", bytes / ds / 1e9);
  return 0;
}
