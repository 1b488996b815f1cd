// A data plane: collectives over the ranks of a communicator, on another backend's transport,
// connected through that communicator's own Allgatherv (no rendezvous of its own). The MPI
// backend runs its allreduces across hosts over Gloo's TCP pairs this way when a probe at init
// finds them faster than Open MPI's TCP transport (mpi/cross_host.cc); a backend offers one
// through its registry entry (registry.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/allreduce_algorithm.h"

namespace bluefog {

class Communicator;

struct DataPlaneOptions {
  std::string iface;  // BLUEFOG_GLOO_IFACE: the interface to listen on; empty: chosen (below)
  std::chrono::milliseconds timeout{300000};  // a connection or a call that takes longer fails
  int world_rank = 0;                         // for errors
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  // What BLUEFOG_CROSS_HOST and the logs call it ("gloo").
  virtual const char* name() const = 0;
  // Where this rank listens (for logs and errors).
  virtual std::string address() const = 0;
  // Collective over every rank of the communicator it was made over. Throws TransportError.
  virtual void Allreduce(const AllreduceCall& call) = 0;
};

}  // namespace bluefog
