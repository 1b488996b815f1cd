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
#include <string>
#include <vector>

#include "core/runtime.h"

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
  Status q = Runtime::Get().Enqueue(std::move(r), drive);
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
  const int reps = argc > 1 ? std::atoi(argv[1]) : 7;
  const char* names[] = {"bf_drive", "bf_handoff", "mpi_inplace", "mpi_out_of_place",
                         "bf_drive_inplace"};
  constexpr int kVariants = 5;
  Waiter waiter;
  for (long long bytes : {4LL, 1024LL, 1LL << 20, 4LL << 20, 16LL << 20, 64LL << 20}) {
    const long long count = bytes / 4;
    std::vector<float> in(count, static_cast<float>(rank + 1)), out(count, 0.0f);
    std::vector<float> mpi_buf(count, 1.0f), mpi_out(count, 0.0f), bf_buf(count, 1.0f);
    const int iters = static_cast<int>(std::clamp(256e6 / (bytes + 65536), 3.0, 2000.0));
    std::vector<double> times[kVariants];
    for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
      for (int which = 0; which < kVariants; ++which) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) {
          if (which < 2) {
            BluefogAllreduce(in.data(), out.data(), count, which == 0, &waiter);
          } else if (which == 4) {
            BluefogAllreduce(bf_buf.data(), bf_buf.data(), count, true, &waiter);
          } else {
            MPI_Allreduce(which == 2 ? MPI_IN_PLACE : mpi_buf.data(),
                          which == 2 ? mpi_buf.data() : mpi_out.data(), static_cast<int>(count),
                          MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          }
        }
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[which].push_back(t);
      }
      const float want = size * (size + 1) / 2.0f;
      if (out[0] != want || out[count - 1] != want) {
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
