// One allreduce algorithm of the MPI backend behind one small interface: whether it applies to
// a call, and running it. MpiCommunicator::Allreduce asks its ordered list (MakeAllreduceList)
// and runs the first that applies; each algorithm lives in a file of its own in this folder.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/types.h"

namespace bluefog {

class MpiCommunicator;

struct AllreduceCall {
  const void* in;  // may equal `out` (in place); otherwise only read
  void* out;
  int64_t count;
  DataType dtype;
  ReduceOp op;
  int64_t divisor;  // > 1: divide the sum by it (kSum only)
  int64_t bytes;    // count * the element's size
};

class AllreduceAlgorithm {
 public:
  virtual ~AllreduceAlgorithm() = default;
  virtual const char* name() const = 0;
  // Decided from what every rank knows alike (sizes, switches, the job's layout), so every
  // rank picks the same algorithm for the same call.
  virtual bool AppliesTo(const AllreduceCall& call) const = 0;
  virtual void Run(const AllreduceCall& call) = 0;
};

// The algorithms of `comm`, in the order they are asked; the last (MPI_Allreduce) applies to
// every call.
std::vector<std::unique_ptr<AllreduceAlgorithm>> MakeAllreduceList(MpiCommunicator* comm);

}  // namespace bluefog
