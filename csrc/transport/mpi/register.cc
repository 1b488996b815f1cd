// The MPI backend's entry in the registry (transport/registry.h).
#include <sched.h>

#include <cstdlib>

#include "transport/mpi/mpi_communicator.h"
#include "transport/registry.h"

namespace bluefog {
namespace {

// Open MPI busy-polls while a rank waits inside MPI. With more ranks on a host than cores, a
// waiting rank then keeps a core from the rank it waits for until the scheduler preempts it
// (milliseconds): measured at 4 ranks on 2 cores, a 4-byte eager allreduce took 10-25 ms that
// way against 0.5-1.7 ms with Open MPI yielding the core while it polls. So when Open MPI
// says this host has more ranks than this process may use cores, and the user has not chosen,
// polling yields (mpi_yield_when_idle, which MPI_Init reads from the environment).
void YieldWhenOversubscribed(const Config& config) {
  if (config.mpi_yield_chosen || config.launcher_local_size == 0) return;
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return;
  if (config.launcher_local_size > CPU_COUNT(&cpus)) setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
}

// Open MPI's TCP transport carries everything between two processes over one socket and moves
// bytes only while the process is inside an MPI call. Measured between two pretend hosts (a
// ring's exchange of 1 MiB chunks each way at once, 4 in flight): one socket per pair moved
// 58-68% of the link's rate, two 77-86%, two with the transport's own progress thread (which
// waits for its sockets in epoll, as Gloo's does) 84-85%; 4 sockets no more than two. (Three
// interleaved launches of each at 250 Mbit/s, 8 MiB: one socket 73-83%, two 74-94%, two and the
// thread 75-96%; this machine's noise is as large as the thread's gain.) Unless the user chose
// (the environment, which `mpirun --mca NAME VALUE` sets too), MPI_Init opens two sockets and
// starts the thread. Between the ranks of one host Open MPI uses shared memory, where neither
// costs anything.
void TcpAcrossHosts() {
  setenv("OMPI_MCA_btl_tcp_links", "2", 0);
  setenv("OMPI_MCA_btl_tcp_progress_thread", "1", 0);
}

const BackendRegistration kMpi({"mpi", [](const Config& config, TransportInfo* info) {
                                  YieldWhenOversubscribed(config);
                                  TcpAcrossHosts();
                                  auto mpi = std::make_unique<MpiCommunicator>(
                                      TransportOptions::FromConfig(config));
                                  *info = mpi->Init();
                                  return std::unique_ptr<Communicator>(std::move(mpi));
                                }});

}  // namespace
}  // namespace bluefog
