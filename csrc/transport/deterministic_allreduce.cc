#include "transport/deterministic_allreduce.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/reduce_kernels.h"
#include "transport/communicator.h"

namespace bluefog {
namespace {

bool IsFloat(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

class DeterministicAllreduce : public AllreduceAlgorithm {
 public:
  explicit DeterministicAllreduce(Communicator* comm) : comm_(comm) {}
  const char* name() const override { return "deterministic"; }
  bool AppliesTo(const AllreduceCall& call) const override {
    return IsFloat(call.dtype) && call.count > 0;
  }

  void Run(const AllreduceCall& call) override {
    const int n = comm_->size();
    const int me = comm_->rank();
    const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
    if (n == 1) {
      if (call.out != call.in) std::memcpy(call.out, call.in, call.bytes);
      if (call.divisor > 1) DivideBy(call.out, call.count, call.dtype, call.divisor);
      return;
    }
    // Slice r: elements [begin(r), begin(r + 1)), the first count % n slices one longer.
    const int64_t base = call.count / n, extra = call.count % n;
    auto begin = [&](int r) { return r * base + std::min<int64_t>(r, extra); };
    const int64_t mine = begin(me + 1) - begin(me);
    const int64_t mine_bytes = mine * elem;
    // Every rank's contribution to my slice, in rank order; then my reduced slice.
    parts_.resize(static_cast<size_t>((n + 1) * std::max<int64_t>(mine_bytes, 1)));
    char* parts = parts_.data();
    char* reduced = parts + n * mine_bytes;
    const char* in = static_cast<const char*>(call.in);
    std::vector<PeerBuffer> sends, recvs;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      const int64_t bytes = (begin(r + 1) - begin(r)) * elem;
      if (bytes > 0) sends.push_back({r, const_cast<char*>(in + begin(r) * elem), bytes});
      if (mine_bytes > 0) recvs.push_back({r, parts + r * mine_bytes, mine_bytes});
    }
    comm_->NeighborExchange(sends, recvs);
    if (mine > 0) {
      auto part = [&](int r) -> const void* {
        return r == me ? static_cast<const void*>(in + begin(me) * elem) : parts + r * mine_bytes;
      };
      for (int r = 1; r < n; ++r) {
        const void* acc = r == 1 ? part(0) : reduced;
        ReduceStep(reduced, acc, part(r), mine, call.dtype, call.op, r == n - 1 ? call.divisor : 1);
      }
    }
    std::vector<int64_t> bytes_per_rank(n);
    for (int r = 0; r < n; ++r) bytes_per_rank[r] = (begin(r + 1) - begin(r)) * elem;
    comm_->Allgatherv(reduced, call.out, bytes_per_rank);
  }

 private:
  Communicator* comm_;
  std::vector<char> parts_;  // grown to the largest call, never shrunk
};

}  // namespace

std::unique_ptr<AllreduceAlgorithm> MakeDeterministicAllreduce(Communicator* comm) {
  return std::make_unique<DeterministicAllreduce>(comm);
}

void PutDeterministicFirst(std::vector<AllreduceAlgorithm*>* list,
                           AllreduceAlgorithm* deterministic, AllreduceAlgorithm* rank_ordered) {
  list->insert(list->begin(), deterministic);
  if (rank_ordered != nullptr) list->insert(list->begin(), rank_ordered);
}

}  // namespace bluefog
