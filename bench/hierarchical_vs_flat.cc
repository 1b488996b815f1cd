// The hierarchical allreduce (MpiCommunicator, Tuning::hierarchical on) against the flat ring
// over all ranks (off), against MPI_Allreduce and against its first version
// (Tuning::two_host_split off: a two-rank ring across the hosts), in one process, batches
// interleaved repetition by repetition. Meant for jobs over several hosts with the same number
// of ranks on each (bench/netns/ makes pretend hosts with a rate-limited link):
//
//   bench/netns/hosts.sh up 2 1gbit
//   mpirun -np 4 -H 10.213.77.1:2,10.213.77.2:2 --mca plm_rsh_agent bench/netns/rsh.sh
//     --mca btl self,vader,tcp --mca btl_tcp_if_include 10.213.77.0/24
//     --mca oob_tcp_if_include 10.213.77.0/24 build/cpp/hierarchical_bench
//   (one command line)
//
// Rank 0 prints one JSON line per size: median seconds per call of each, and the ratios.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "transport/mpi/mpi_communicator.h"

int main(int argc, char** argv) {
  bluefog::MpiCommunicator transport;
  const bluefog::TransportInfo info = transport.Init();
  transport.tuning().ring_threshold_bytes = 1;  // every size here goes the large-buffer way
  if (!transport.paths().hierarchical) {
    if (info.rank == 0)
      std::fprintf(stderr,
                   "hierarchical_bench: needs several hosts with the same number (> 1) of ranks "
                   "on each (this job: %d ranks, %d on this host)\n",
                   info.size, info.local_size);
    transport.Shutdown();
    return 2;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  for (long long bytes : {1LL << 20, 4LL << 20, 16LL << 20, 64LL << 20}) {
    const long long count = bytes / 4;
    std::vector<float> in(count, static_cast<float>(info.rank + 1)), out(count, 0.0f);
    std::vector<float> mpi_buf(count, 1.0f);
    const int iters = static_cast<int>(std::clamp(64e6 / bytes, 2.0, 20.0));
    std::vector<double> times[4];
    for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
      for (int which : {0, 1, 2, 3}) {
        transport.tuning().hierarchical = which == 0 || which == 3;
        transport.tuning().two_host_split = which == 0;
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i) {
          if (which != 2) {
            transport.AllreduceSum(in.data(), out.data(), count, bluefog::DataType::kFloat32);
          } else {
            MPI_Allreduce(MPI_IN_PLACE, mpi_buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
          }
        }
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[which].push_back(t);
      }
      const float want = info.size * (info.size + 1) / 2.0f;
      if (out[0] != want || out[count / 2] != want || out[count - 1] != want) {
        std::fprintf(stderr, "rank %d: wrong sum at %lld bytes\n", info.rank, bytes);
        return 1;
      }
    }
    double med[4];
    for (int k = 0; k < 4; ++k) {
      std::sort(times[k].begin(), times[k].end());
      med[k] = times[k][times[k].size() / 2];
    }
    if (info.rank == 0)
      std::printf(
          "{\"ranks\":%d,\"local_size\":%d,\"bytes\":%lld,\"hierarchical_s\":%.6g,"
          "\"flat_ring_s\":%.6g,\"mpi_s\":%.6g,\"vs_flat\":%.3f,\"vs_mpi\":%.3f,\"ring_across_s\":%"
          ".6g,"
          "\"vs_ring_across\":%.3f}\n",
          info.size, info.local_size, bytes, med[0], med[1], med[2], med[1] / med[0],
          med[2] / med[0], med[3], med[3] / med[0]);
    std::fflush(stdout);
  }
  transport.Shutdown();
  return 0;
}
