// The MPI backend's own allreduce algorithms, one file each; MakeAllreduceList (list.cc) puts
// them in order after the one-host ones (transport/local/). docs/design.md has the table of
// when each runs and why.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "transport/allreduce_algorithm.h"

namespace bluefog {

class LocalHost;
class MpiCommunicator;

// The algorithms of `comm` in the order they are asked: the one-host ones of `local` (when
// its ranks share a host), then the MPI backend's; the last (MPI_Allreduce) applies to every
// call. `owned` keeps the MPI backend's.
std::vector<AllreduceAlgorithm*> MakeAllreduceList(
    MpiCommunicator* comm, LocalHost* local,
    std::vector<std::unique_ptr<AllreduceAlgorithm>>* owned);

// Several hosts, the same number of ranks on each: reduce-scatter within each host, allreduce
// of each slice across the hosts (on two hosts each slice reduced on alternate hosts), then
// allgather within each host (hierarchical.cc).
class HierarchicalAllreduce : public AllreduceAlgorithm {
 public:
  explicit HierarchicalAllreduce(MpiCommunicator* comm) : comm_(comm) {}
  const char* name() const override { return "hierarchical"; }
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override;

 private:
  void TwoHostSlice(char* slice, int64_t count, DataType dtype, ReduceOp op, int64_t divisor);
  MpiCommunicator* comm_;
  std::vector<int> counts_;
  std::vector<int> displs_;
};

// Across hosts over the communicator's data plane (Gloo's TCP pairs; cross_host.cc), where one
// is connected and the probe at init or BLUEFOG_CROSS_HOST chose it (Tuning::cross_host).
class CrossHostAllreduce : public AllreduceAlgorithm {
 public:
  explicit CrossHostAllreduce(MpiCommunicator* comm) : comm_(comm) {}
  const char* name() const override;
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override;

 private:
  MpiCommunicator* comm_;
};

// Reduce-scatter then allgather around the ring (ring.cc).
class RingAllreduce : public AllreduceAlgorithm {
 public:
  explicit RingAllreduce(MpiCommunicator* comm) : comm_(comm) {}
  const char* name() const override { return "ring"; }
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override;

 private:
  MpiCommunicator* comm_;
};

// MPI_Allreduce: small buffers, and whatever no other algorithm takes (mpi_native.cc).
class MpiNativeAllreduce : public AllreduceAlgorithm {
 public:
  explicit MpiNativeAllreduce(MpiCommunicator* comm) : comm_(comm) {}
  const char* name() const override { return "mpi"; }
  bool AppliesTo(const AllreduceCall&) const override { return true; }
  void Run(const AllreduceCall& call) override;

 private:
  MpiCommunicator* comm_;
};

}  // namespace bluefog
