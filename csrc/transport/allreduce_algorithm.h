// One allreduce algorithm behind one small interface: whether it applies to a call, and running
// it. A backend asks its ordered list (the one-host algorithms of transport/local/ first where
// the ranks share a host, then its own) and runs the first that applies; each algorithm lives
// in a file of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/types.h"
#include "transport/options.h"

namespace bluefog {

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
  // What BLUEFOG_ALLREDUCE_ALGORITHM and the tests call it.
  virtual const char* name() const = 0;
  // Decided from what every rank knows alike (sizes, switches, the job's layout), so every
  // rank picks the same algorithm for the same call.
  virtual bool AppliesTo(const AllreduceCall& call) const = 0;
  virtual void Run(const AllreduceCall& call) = 0;
};

// Whether `call` is large enough for bluefog's own algorithms (BLUEFOG_RING_THRESHOLD).
inline bool LargeCall(const Tuning& tuning, const AllreduceCall& call) {
  const int64_t threshold = tuning.ring_threshold_bytes.load(std::memory_order_relaxed);
  return threshold > 0 && call.bytes >= threshold;
}

// Whether `call`, among `size` ranks, is large enough for the one-host paths: large, or at
// least BLUEFOG_ONE_HOST_THRESHOLD bytes with an element per rank (BLUEFOG_RING_THRESHOLD 0:
// never).
inline bool OneHostCall(const Tuning& tuning, int size, const AllreduceCall& call) {
  if (LargeCall(tuning, call)) return true;
  const int64_t threshold = tuning.one_host_threshold_bytes.load(std::memory_order_relaxed);
  return threshold > 0 && call.bytes >= threshold && call.count >= size &&
         tuning.ring_threshold_bytes.load(std::memory_order_relaxed) > 0;
}

// A backend's Allreduce: the call run by the first algorithm of `list` that applies (the list's
// last applies to every call). Only a sum may be divided (`divisor` > 1).
void RunAllreduce(const std::vector<AllreduceAlgorithm*>& list, const void* in, void* out,
                  int64_t count, DataType dtype, ReduceOp op, int64_t divisor);

// The list a backend asks, given BLUEFOG_ALLREDUCE_ALGORITHM (`forced`): empty, `list` as it
// is; else the algorithm of `list` called so, then the list's last (the backend's own, which
// takes every call: the calls the forced one does not apply to, too small for it or with fewer
// elements than ranks). Where none is called so, `must` (the job's world communicator) throws
// an error naming `rank`, the value, why it cannot run here and the algorithms there are;
// otherwise (a process set whose ranks lack what it needs) `list` as it is.
std::vector<AllreduceAlgorithm*> ForceAllreduce(std::vector<AllreduceAlgorithm*> list,
                                                const std::string& forced, bool must, int rank,
                                                const char* backend);

}  // namespace bluefog
