// A fresh job's first "steps" of one-host allreduces against its steady state, without
// TensorFlow: each step allreduces the gradients of bench/fw_step.py's MLP (3 of 1024 x 1024
// floats, one of 784 x 1024, one of 1024 x 10; the biases stay under the one-host threshold),
// out of place into blocks of the shared heap as TensorFlow's outputs are. Run by
// bench/first_steps.py --program cxx (which alternates empty and warm cache directories) as
// `mpirun -np N first_calls_bench STEPS` (the cache as the runtime finds it: BLUEFOG_CACHE_DIR
// and the rest, docs/env.md); rank 0 prints one JSON line like the Python
// worker's: the mean of steps 1-60 over the mean of steps 100-250 (each step's time its slowest
// rank's) and the calls spent learning (steps 0-60, and all).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <vector>

#include "core/config.h"
#include "core/logging.h"
#include "transport/mpi/mpi_communicator.h"
#include "transport/options.h"
#include "transport/shared_heap.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s STEPS\n", argv[0]);
    return 2;
  }
  const int steps = std::max(251, std::atoi(argv[1]));
  const bluefog::Config config = bluefog::Config::FromEnvironment();
  bluefog::SetLogContext(config.log_level, 0);  // BLUEFOG_LOG_LEVEL=debug: every choice
  bluefog::MpiCommunicator transport(bluefog::TransportOptions::FromConfig(config));
  const bluefog::TransportInfo info = transport.Init();
  bluefog::SetLogContext(config.log_level, info.rank);
  const std::vector<int64_t> counts = {784 * 1024, 1024 * 1024, 1024 * 1024, 1024 * 1024,
                                       1024 * 10};
  const std::shared_ptr<bluefog::SharedHeap> heap = transport.shared_heap();
  std::vector<std::vector<float>> in;
  std::vector<float*> out;
  for (int64_t count : counts) {
    in.emplace_back(count, static_cast<float>(info.rank + 1));
    const size_t bytes = (static_cast<size_t>(count) * 4 + 4095) / 4096 * 4096;
    float* block = heap ? static_cast<float*>(heap->Take(bytes)) : nullptr;
    out.push_back(block ? block : new float[count]);
  }
  using Clock = std::chrono::steady_clock;
  std::vector<double> seconds(steps);
  uint64_t learning_first = 0;
  for (int step = 0; step < steps; ++step) {
    if (step == 61) learning_first = transport.tuning().learning_calls.load();
    const Clock::time_point start = Clock::now();
    for (size_t t = 0; t < counts.size(); ++t)
      transport.AllreduceSum(in[t].data(), out[t], counts[t], bluefog::DataType::kFloat32);
    seconds[step] = std::chrono::duration<double>(Clock::now() - start).count();
  }
  const double want = info.size * (info.size + 1) / 2.0;
  for (size_t t = 0; t < counts.size(); ++t)
    if (out[t][counts[t] - 1] != want) {
      std::fprintf(stderr, "rank %d: wrong sum %f (want %f)\n", info.rank, out[t][0], want);
      return 1;
    }
  std::vector<double> slowest(steps);
  MPI_Reduce(seconds.data(), slowest.data(), steps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  const auto mean = [&](int from, int to) {
    return std::accumulate(slowest.begin() + from, slowest.begin() + to, 0.0) / (to - from);
  };
  const auto median = [&](int from, int to) {
    std::vector<double> part(slowest.begin() + from, slowest.begin() + to);
    std::nth_element(part.begin(), part.begin() + part.size() / 2, part.end());
    return part[part.size() / 2];
  };
  if (info.rank == 0) {
    const double first = mean(1, 61), steady = mean(100, 251);
    std::printf(
        "{\"model\": \"mlp-grads-cxx\", \"ranks\": %d, \"step0_s\": %.6g, \"first60_s\": %.6g, "
        "\"steady_s\": %.6g, \"ratio\": %.4f, \"median_ratio\": %.4f, "
        "\"learning_calls_first60\": %llu, \"learning_calls\": %llu}\n",
        info.size, slowest[0], first, steady, first / steady, median(1, 61) / median(100, 251),
        static_cast<unsigned long long>(learning_first),
        static_cast<unsigned long long>(transport.tuning().learning_calls.load()));
  }
  for (size_t t = 0; t < counts.size(); ++t) {
    if (heap && heap->OffsetOf(out[t], 4) >= 0)
      heap->Give(out[t], (static_cast<size_t>(counts[t]) * 4 + 4095) / 4096 * 4096);
    else
      delete[] out[t];
  }
  transport.Shutdown();
  return 0;
}
