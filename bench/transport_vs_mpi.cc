// bluefog's large-buffer allreduce (MpiTransport::AllreduceSum: the chunked ring) against
// MPI_Allreduce, both from C++ on buffers allocated once, their batches interleaved repetition
// by repetition so both see the same machine. No TensorFlow, no negotiation: this isolates the
// algorithm from bluefog's per-call cost. Built by `make bench` (target transport_bench), run
// by bench/run.py under mpirun; rank 0 prints one JSON line per size.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "mpi/transport.h"

int main() {
  bluefog::MpiTransport transport;
  const bluefog::TransportInfo info = transport.Init();
  constexpr int kReps = 9;
  const bool direct_possible = transport.direct();
  for (long long bytes : {1LL << 20, 4LL << 20, 16LL << 20, 64LL << 20}) {
    const long long count = bytes / 4;
    // Every variant has buffers of its own: a batch runs slower on buffers another variant
    // touched last, so sharing would favour some pairs.
    std::vector<float> in(count, static_cast<float>(info.rank + 1)), out(count, 0.0f);
    std::vector<float> direct_in(in), direct_out(count, 0.0f);
    std::vector<float> mpi_buf(count, 0.0f), in_place(count, 0.0f);
    const int iters = static_cast<int>(std::clamp(200e6 / bytes, 3.0, 200.0));
    std::vector<double> ring, mpi, direct, direct_in_place;
    for (int rep = 0; rep < kReps + 1; ++rep) {  // rep 0 warms up all
      // A fresh order each repetition (the same on every rank): a batch runs slower after
      // some others (their dirty buffers in cache), so no variant always follows the same one.
      std::vector<int> order = {0, 1, 2, 3};
      std::shuffle(order.begin(), order.end(), std::mt19937(rep));
      for (int which : order) {
        MPI_Barrier(MPI_COMM_WORLD);
        transport.set_direct(which == 1 || which == 2);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) {
          if (which == 0) {
            transport.AllreduceSum(in.data(), out.data(), count, bluefog::DataType::kFloat32);
          } else if (which == 1) {
            transport.AllreduceSum(direct_in.data(), direct_out.data(), count,
                                   bluefog::DataType::kFloat32);
          } else if (which == 2) {
            transport.AllreduceSum(in_place.data(), in_place.data(), count,
                                   bluefog::DataType::kFloat32);
          } else {
            MPI_Allreduce(MPI_IN_PLACE, mpi_buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
          }
        }
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0)
          (which == 0   ? ring
           : which == 1 ? direct
           : which == 2 ? direct_in_place
                        : mpi)
              .push_back(t);
      }
    }
    const float want = info.size * (info.size + 1) / 2.0f;
    if (out[count / 3] != want || out[count - 1] != want || direct_out[count / 3] != want ||
        direct_out[count - 1] != want || direct_out[0] != want) {
      std::fprintf(stderr, "rank %d: wrong sum at %lld bytes\n", info.rank, bytes);
      return 1;
    }
    std::sort(ring.begin(), ring.end());
    std::sort(mpi.begin(), mpi.end());
    std::sort(direct.begin(), direct.end());
    std::sort(direct_in_place.begin(), direct_in_place.end());
    if (info.rank == 0)
      std::printf(
          "{\"impl\":\"transport\",\"ranks\":%d,\"bytes\":%lld,\"ring_s\":%.9g,"
          "\"direct_s\":%.9g,\"direct_in_place_s\":%.9g,\"mpi_s\":%.9g,\"direct\":%s}\n",
          info.size, bytes, ring[kReps / 2], direct[kReps / 2], direct_in_place[kReps / 2],
          mpi[kReps / 2], direct_possible ? "true" : "false");
  }
  transport.Shutdown();
  return 0;
}
