// The hierarchical allreduce on Gloo, for jobs on several hosts with the same number L (> 1) of
// ranks on each, host h holding ranks h*L .. h*L+L-1: the host's sum through its one-host
// transport (shared memory), then local rank l's slice of it allreduced across the hosts over
// Gloo's pairs among the ranks with local rank l, then the slices gathered within each host. A
// host sends about one buffer across at two hosts, against 2(N-1)/N of it per crossing for a
// flat ring over all N ranks (1.5 buffers at 2 x 2 ranks). The two subsets are made at the first
// call that takes this path (every rank of the job reaches it at the same point), not at init.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"
#include "transport/gloo/gloo_communicator.h"

namespace bluefog {
namespace {

// Subset tags of their own (process sets' ids are >= 0).
constexpr int kLocalTag = -1;
constexpr int kCrossTag = -2;

class GlooHierarchicalAllreduce : public AllreduceAlgorithm {
 public:
  GlooHierarchicalAllreduce(GlooCommunicator* world, int local_size)
      : world_(world), local_size_(local_size) {}
  const char* name() const override { return "hierarchical"; }
  bool AppliesTo(const AllreduceCall& call) const override {
    return LargeCall(world_->tuning(), call) &&
           world_->tuning().hierarchical.load(std::memory_order_relaxed) &&
           call.count >= local_size_;
  }
  void Run(const AllreduceCall& call) override {
    if (!local_) Connect();
    const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
    const int l = local_->rank();
    std::vector<int64_t>& bytes = bytes_;  // per local rank, kept: no allocation per call
    bytes.resize(local_size_);
    int64_t offset = 0, mine_offset = 0;
    for (int k = 0; k < local_size_; ++k) {
      const int64_t n = call.count / local_size_ + (k < call.count % local_size_ ? 1 : 0);
      if (k == l) mine_offset = offset;
      bytes[k] = n * elem;
      offset += n;
    }
    char* out = static_cast<char*>(call.out);
    char* slice = out + mine_offset * elem;
    local_->Allreduce(call.in, call.out, call.count, call.dtype, call.op, 1);
    cross_->Allreduce(slice, slice, bytes[l] / elem, call.dtype, call.op, call.divisor);
    if (scratch_.size() < static_cast<size_t>(bytes[l])) scratch_.resize(bytes[l]);
    std::memcpy(scratch_.data(), slice, static_cast<size_t>(bytes[l]));
    local_->Allgatherv(scratch_.data(), out, bytes);
  }

 private:
  void Connect() {
    const int rank = world_->rank();
    std::vector<int> local, cross;
    for (int r = 0; r < world_->size(); ++r) {
      if (r / local_size_ == rank / local_size_) local.push_back(r);
      if (r % local_size_ == rank % local_size_) cross.push_back(r);
    }
    local_ = world_->CreateSubset(local, kLocalTag);
    cross_ = world_->CreateSubset(cross, kCrossTag);
  }

  GlooCommunicator* world_;
  int local_size_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Communicator> cross_;
  std::vector<char> scratch_;
  std::vector<int64_t> bytes_;
};

}  // namespace

int HomogeneousLocalSize(const std::vector<std::string>& hosts) {
  const int size = static_cast<int>(hosts.size());
  const int L = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[0]));
  if (L <= 1 || L == size || size % L != 0) return 0;
  for (int r = 0; r < size; ++r) {
    if (hosts[r] != hosts[r - r % L]) return 0;
    if (r % L == 0 && std::count(hosts.begin(), hosts.end(), hosts[r]) != L) return 0;
  }
  return L;
}

std::unique_ptr<AllreduceAlgorithm> MakeGlooHierarchical(GlooCommunicator* world, int local_size) {
  return std::make_unique<GlooHierarchicalAllreduce>(world, local_size);
}

}  // namespace bluefog
