// Allreduces across hosts of an MPI job: over Gloo's pairs (the data plane connected through
// MPI; Tuning::cross_host on) against MPI's own path (off: the ring with one rank per host, the
// hierarchical allreduce with its two-host split with several), in one process, batches
// interleaved repetition by repetition. Run it with BLUEFOG_CROSS_HOST=gloo so that the pairs
// are connected whatever the probe would say, on pretend hosts (bench/netns/):
//
//   bench/netns/hosts.sh up 2 250mbit
//   BLUEFOG_CROSS_HOST=gloo mpirun -np 2 -H 10.213.77.1:1,10.213.77.2:1 -x BLUEFOG_CROSS_HOST
//     --mca plm_rsh_agent bench/netns/rsh.sh --mca btl self,vader,tcp
//     --mca btl_tcp_if_include 10.213.77.0/24 --mca oob_tcp_if_include 10.213.77.0/24
//     build/cpp/cross_host_bench [REPS [LINK_BITS_PER_S]]     (one command line)
//
// Rank 0 prints one JSON line per size: the median seconds per call of each, their ratio, and
// with the link's rate each one's share of it (the floor: each host sends the other the
// buffer's worth once, over the floor's time).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/config.h"
#include "transport/mpi/mpi_communicator.h"

int main(int argc, char** argv) {
  bluefog::MpiCommunicator transport(
      bluefog::TransportOptions::FromConfig(bluefog::Config::FromEnvironment()));
  const bluefog::TransportInfo info = transport.Init();
  const bool have_plane = transport.tuning().cross_host.load();
  if (!have_plane) {
    if (info.rank == 0)
      std::fprintf(stderr,
                   "cross_host_bench: needs ranks on several hosts and BLUEFOG_CROSS_HOST=gloo "
                   "(exported to every rank: mpirun -x BLUEFOG_CROSS_HOST)\n");
    transport.Shutdown();
    return 2;
  }
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const double link_bits = argc > 2 ? std::atof(argv[2]) : 0.0;
  for (long long bytes : {1LL << 20, 4LL << 20, 16LL << 20, 64LL << 20}) {
    const long long count = bytes / 4;
    std::vector<float> in(count, static_cast<float>(info.rank + 1)), out(count, 0.0f);
    const int iters = static_cast<int>(std::clamp(32e6 / bytes, 1.0, 8.0));
    std::vector<double> times[2];
    for (int rep = 0; rep < reps + 1; ++rep) {  // rep 0 warms up
      for (int gloo : {rep % 2, 1 - rep % 2}) {
        transport.tuning().cross_host = gloo == 1;
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i)
          transport.AllreduceSum(in.data(), out.data(), count, bluefog::DataType::kFloat32);
        double t = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (rep > 0) times[gloo].push_back(t);
        const float want = info.size * (info.size + 1) / 2.0f;
        if (out[0] != want || out[count / 2] != want || out[count - 1] != want) {
          std::fprintf(stderr, "rank %d: wrong sum at %lld bytes\n", info.rank, bytes);
          return 1;
        }
      }
    }
    double med[2];
    for (int k = 0; k < 2; ++k) {
      std::sort(times[k].begin(), times[k].end());
      med[k] = times[k][times[k].size() / 2];
    }
    const double floor_s = link_bits > 0 ? bytes * 8.0 / link_bits : 0.0;
    if (info.rank == 0)
      std::printf(
          "{\"ranks\":%d,\"local_size\":%d,\"bytes\":%lld,\"gloo_s\":%.6g,\"mpi_s\":%.6g,"
          "\"mpi_over_gloo\":%.3f,\"gloo_share\":%.3f,\"mpi_share\":%.3f}\n",
          info.size, info.local_size, bytes, med[1], med[0], med[0] / med[1], floor_s / med[1],
          floor_s / med[0]);
    std::fflush(stdout);
  }
  transport.Shutdown();
  return 0;
}
