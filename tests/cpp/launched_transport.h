// The communicator of the backend the test's launcher implies, initialized: Gloo under
// tests/cpp/gloo_launch.sh (MASTER_ADDR set, no MPI rank), else MPI (mpirun). For transport
// tests that run over either backend without the runtime.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "transport/communicator.h"
#include "transport/options.h"
#ifdef BLUEFOG_HAVE_MPI
#include "transport/mpi/mpi_communicator.h"
#endif
#ifdef BLUEFOG_HAVE_GLOO
#include "transport/gloo/gloo_communicator.h"
#include "transport/gloo/tcp_store.h"
#endif

namespace bluefog {

// Throws what the backend's Init throws.
inline std::unique_ptr<Communicator> LaunchedTransport(const TransportOptions& options,
                                                       TransportInfo* info) {
#ifdef BLUEFOG_HAVE_GLOO
  if (std::getenv("MASTER_ADDR") != nullptr && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    GlooSetup setup;
    setup.master_addr = std::getenv("MASTER_ADDR");
    setup.master_port = std::stoi(std::getenv("MASTER_PORT"));
    setup.rank = std::stoi(std::getenv("RANK"));
    setup.size = std::stoi(std::getenv("WORLD_SIZE"));
    setup.timeout = std::chrono::seconds(60);
    setup.token = JobToken("", setup.master_addr, setup.master_port, setup.size);
    auto t = std::make_unique<GlooCommunicator>(setup, options);
    *info = t->Init();
    return t;
  }
#endif
#ifdef BLUEFOG_HAVE_MPI
  auto t = std::make_unique<MpiCommunicator>(options);
  *info = t->Init();
  return t;
#else
  (void)options;
  (void)info;
  std::fprintf(stderr, "no MPI in this build: run through tests/cpp/gloo_launch.sh\n");
  std::exit(2);
#endif
}

}  // namespace bluefog
