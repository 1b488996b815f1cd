// The runtime's own cost per allreduce, without TensorFlow: Runtime::Enqueue of one tensor and
// a wait for its completion (as an eager kernel waits), run by the calling thread ("drive",
// Channel::Enqueue's eager path) or handed to the background thread ("handoff"), also in place
// ("drive_inplace": output = input, as when TensorFlow forwards a temporary), against raw
// MPI_Allreduce on buffers allocated once, in place and out of place. Batches interleaved
// repetition by repetition; rank 0 prints one JSON line per size with the median seconds per
// call of each (the slowest rank's batch time) and bytes touched by bluefog's algorithm.
//
//   mpirun -np 4 build/cpp/runtime_latency_bench [reps]
#include <mpi.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace {

using bluefog::Request;
using bluefog::Runtime;
using bluefog::Status;

// One completion, waited for the way TensorFlow's eager executor waits for a kernel.
struct Waiter {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Status status;
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [this] { return done; });
    done = false;
  }
};

// In place (in == out) the values grow each call; only the out-of-place results are checked.
void BluefogAllreduce(const float* in, float* out, long long count, bool drive, Waiter* w) {
  Request r;
  r.meta.op = bluefog::OpType::kAllreduce;
  r.meta.name = "bench." + std::to_string(count);
  r.meta.dtype = bluefog::DataType::kFloat32;
  r.meta.shape = {count};
  r.input = in;
  r.output = out;
  r.done = [w](const Status& s) {
    std::lock_guard<std::mutex> lock(w->mutex);
    w->status = s;
    w->done = true;
    w->cv.notify_one();
  };
  Status q = Runtime::Get().Enqueue(std::move(r),
                                    drive ? bluefog::Drive::kUntilDone : bluefog::Drive::kNo);
  if (!q.ok()) {
    std::fprintf(stderr, "enqueue failed: %s\n", q.message().c_str());
    std::exit(1);
  }
  w->Wait();
  if (!w->status.ok()) {
    std::fprintf(stderr, "allreduce failed: %s\n", w->status.message().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Runtime::Get().Init();
  const int rank = Runtime::Get().info().rank, size = Runtime::Get().info().size;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  const char* names[] = {"bf_drive", "bf_handoff", "mpi_inplace", "mpi_out_of_place",
                         "bf_drive_inplace"};
  constexpr int kVariants = 5;
  Waiter waiter;
  for (long long bytes : {4LL, 1024LL, 1LL << 20, 4LL << 20, 16LL << 20, 64LL << 20}) {
    const long long count = bytes / 4;
    // Every variant has buffers of its own: a batch runs slower on buffers another variant
    // touched last (measured: 16 MiB at 2 ranks, 2.3 ms per call after the variant sharing its
    // buffers, 3.0 ms after any other), so sharing would favour some pairs.
    std::vector<float> in(count, static_cast<float>(rank + 1)), out(count, 0.0f);
    std::vector<float> in_handoff(in), out_handoff(count, 0.0f);
    std::vector<float> mpi_buf(count, 1.0f), mpi_in(count, 1.0f), mpi_out(count, 0.0f);
    std::vector<float> bf_buf(count, 1.0f);
    const int iters = static_cast<int>(std::clamp(256e6 / (bytes + 65536), 3.0, 2000.0));
    std::vector<double> times[kVariants];
    for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
      // A fresh order each repetition (the same on every rank): a batch runs slower after
      // some others (their dirty buffers in cache), so no variant always follows the same one.
      std::vector<int> order(kVariants);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(rep));
      for (int which : order) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) {
          if (which < 2) {
            BluefogAllreduce(which == 0 ? in.data() : in_handoff.data(),
                             which == 0 ? out.data() : out_handoff.data(), count, which == 0,
                             &waiter);
          } else if (which == 4) {
            BluefogAllreduce(bf_buf.data(), bf_buf.data(), count, true, &waiter);
          } else {
            MPI_Allreduce(which == 2 ? MPI_IN_PLACE : mpi_in.data(),
                          which == 2 ? mpi_buf.data() : mpi_out.data(), static_cast<int>(count),
                          MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          }
        }
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[which].push_back(t);
      }
      const float want = size * (size + 1) / 2.0f;
      if (out[0] != want || out[count - 1] != want || out_handoff[count / 2] != want) {
        std::fprintf(stderr, "rank %d: wrong sum at %lld bytes\n", rank, bytes);
        return 1;
      }
    }
    if (rank == 0) {
      std::printf("{\"ranks\": %d, \"bytes\": %lld", size, bytes);
      for (int which = 0; which < kVariants; ++which) {
        std::sort(times[which].begin(), times[which].end());
        std::printf(", \"%s\": %.3e", names[which], times[which][times[which].size() / 2]);
      }
      std::printf("}\n");
      std::fflush(stdout);
    }
  }
  Runtime::Get().Shutdown();
  return 0;
}
