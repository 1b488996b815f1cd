// The checks a rank makes on its own request before announcing it: pure functions, no MPI.
// A request that fails them is refused at once (kInvalidArgument), before any communication.
#pragma once

#include "core/request.h"
#include "core/status.h"

namespace bluefog {

// Tensors may have at most this many dimensions (the wire format's limit).
constexpr size_t kMaxDims = 64;

// Checks that need nothing but the request: name, shape, dtype, reduction. Returns the error in
// OpError's form (no rank prefix), or ok.
Status ValidateRequest(const Request& request);
// Checks against the job's layout: root rank, neighbour ranks and weights.
Status ValidateForLayout(const Request& request, int rank, int size);
// What is wrong with an alltoall's splits (one non-negative row count per rank, adding up to
// dimension 0 without overflow), or "". Not a local check: the coordinator applies it to
// every rank's announcement, so one rank's bad splits fail the alltoall on every rank instead
// of leaving the others waiting for it.
std::string AlltoallSplitsProblem(const TensorMeta& meta, int size);

}  // namespace bluefog
