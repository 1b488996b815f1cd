// Runs the requests every rank agreed on: plans the groups (fusion.h), then one executor per
// op moves the data through the transport. Runs on the runtime's background thread only.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/coordinator.h"
#include "core/fusion.h"
#include "core/request.h"
#include "core/timeline.h"
#include "transport/communicator.h"
#include "transport/shared_heap.h"

namespace bluefog {

// What the executors need from the runtime: this rank's request for an agreed name, and a way
// to complete it. Lookup throws kInternal for an unknown name; Finish reports once and forgets.
class RequestTable {
 public:
  virtual Request* Lookup(const std::string& name) = 0;
  virtual void Finish(const std::string& name, const Status& status) = 0;

 protected:
  ~RequestTable() = default;
};

class Executor {
 public:
  Executor(Communicator* transport, RequestTable* requests, Timeline* timeline)
      : transport_(transport), requests_(requests), timeline_(timeline) {}
  ~Executor() {
    if (fusion_block_) fusion_heap_->Give(fusion_block_, fusion_block_bytes_);
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Configure(const TransportInfo& info, const FusionLimits& limits) {
    info_ = info;
    limits_ = limits;
  }
  // Runs every response of `ready` (reordered by PlanGroups); returns the number of
  // collectives run after fusion. A BluefogError fails that group's requests and goes on.
  // Responses that carry their data (Response::inline_data) complete first, without one.
  size_t Execute(std::vector<Response>& ready);
  // How many requests completed from the round's bytes alone, since the start (counted before
  // they complete; any thread may read it).
  size_t completed_inline() const { return completed_inline_.load(); }

 private:
  // Group executors: `n` responses from `group`, all of the group's op.
  void Allreduces(const Response* group, size_t n);
  void Allgather(const Response& response);
  void Broadcast(const Response& response);
  void NeighborAllreduces(const Response* group, size_t n);
  void NeighborAllgather(const Response& response);
  void NeighborAllgatherGrad(const Response& response);
  void Alltoall(const Response& response);
  void Reducescatter(const Response& response);
  void Join(const Response& response);
  // A small allreduce, allgather or broadcast from the bytes every rank (a broadcast's root)
  // sent in the round: the same arithmetic in the same order on every rank, so the same bits.
  void CompleteInline(const Response& response);
  // This rank's request for `response`: its own or, when it has joined (bf.join()), a stand-in
  // that contributes the reduction's identity (allreduce: 0 for a sum, 1 for a product,
  // the largest or lowest value for min or max) or no rows (allgather) and whose result is dropped.
  Request* RequestFor(const Response& response);
  // The allgathers' output, or scratch memory (and an error in *status) when it cannot be
  // allocated: this rank must still take part in the collective, or the others would wait.
  void* AllocateOutput(Request* req, const std::vector<int64_t>& shape, int64_t bytes,
                       std::vector<char>* scratch, Status* status);

  Communicator* transport_;
  RequestTable* requests_;
  Timeline* timeline_;
  TransportInfo info_;
  FusionLimits limits_;
  // Grown to the largest size seen, never shrunk: no allocation per step. A block of the shared
  // heap when the transport has one and it has room (every rank's fused allreduce can then take
  // the shared path), else fusion_buffer_'s own memory.
  char* FusedAllreduceBuffer(size_t bytes);
  std::vector<char> fusion_buffer_;
  std::shared_ptr<SharedHeap> fusion_heap_;
  char* fusion_block_ = nullptr;
  size_t fusion_block_bytes_ = 0;
  std::vector<char> neighbor_buffer_;         // received (and scaled outgoing) copies
  std::deque<Request> stand_ins_;             // this round's stand-ins for a joined rank
  std::vector<char> zeros_;                   // their input: only ever read, so it stays zero
  std::deque<std::vector<char>> identities_;  // their input for min, max and product
  std::vector<char> dropped_;                 // their output
  std::atomic<size_t> completed_inline_{0};
};

// Bytes of one slice along dimension 0.
int64_t RowBytes(const TensorMeta& meta);

}  // namespace bluefog
