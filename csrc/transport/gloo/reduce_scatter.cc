// The Gloo backend's reduce-scatter: a ring over its pairs (GlooCommunicator::ReduceScatter).
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/gloo/gloo_communicator.h"

namespace bluefog {
namespace {

// A slot prefix of its own (Gloo's collectives use 0x01-0x08, the neighbour exchange 0x20).
constexpr uint64_t kReduceScatterSlot = uint64_t{0x21} << 56;

}  // namespace

// A ring over Gloo's pairs: at step s (of n - 1) each rank sends its running sum of segment
// (rank - s - 1) mod n to the next rank and adds what the previous one sent of segment
// (rank - s - 2) mod n, so after the last step it holds segment `rank` reduced over every rank.
// Each rank sends and receives (n - 1) / n of the buffer, half of what reducing the whole
// buffer costs. Every rank reduces in the same order along the ring, as Gloo's allreduce does.
void GlooCommunicator::ReduceScatter(const void* in, void* out,
                                     const std::vector<int64_t>& counts_per_rank, DataType dtype,
                                     ReduceOp op, int64_t divisor) {
  BF_ENFORCE(op == ReduceOp::kSum || divisor == 1, StatusCode::kInternal,
             "only a sum can be averaged (PlanAverage decides who divides)");
  const size_t element = ElementSize(dtype);
  std::vector<int64_t>& offset = slice_offsets_;  // reused: no allocation per call
  offset.assign(static_cast<size_t>(size_) + 1, 0);
  for (int r = 0; r < size_; ++r) offset[r + 1] = offset[r] + counts_per_rank[r];
  const char* src = static_cast<const char*>(in);
  if (size_ == 1) {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(counts_per_rank[0]) * element);
    if (divisor > 1) DivideBy(out, counts_per_rank[0], dtype, divisor);
    return;
  }
  int64_t largest = 0;
  for (int64_t c : counts_per_rank) largest = std::max(largest, c);
  // work: this rank's running sums, one segment of the largest size each for sending and
  // receiving (the input is only read).
  const size_t seg_bytes = static_cast<size_t>(largest) * element;
  if (scratch_.size() < 2 * seg_bytes) scratch_.resize(2 * seg_bytes);
  char* sending = scratch_.data();
  char* received = scratch_.data() + seg_bytes;
  const int right = (rank_ + 1) % size_, left = (rank_ - 1 + size_) % size_;
  auto seg = [&](int k) { return ((k % size_) + size_) % size_; };
  auto bytes_of = [&](int k) { return static_cast<size_t>(counts_per_rank[k]) * element; };
  Run("reducescatter", [&] {
    std::memcpy(sending, src + offset[seg(rank_ - 1)] * element, bytes_of(seg(rank_ - 1)));
    for (int s = 0; s < size_ - 1; ++s) {
      const int send_seg = seg(rank_ - s - 1), recv_seg = seg(rank_ - s - 2);
      const uint64_t slot = kReduceScatterSlot + static_cast<uint64_t>(s);
      std::unique_ptr<gloo::transport::UnboundBuffer> sent, got;
      if (bytes_of(send_seg) > 0) {
        sent = context_->createUnboundBuffer(sending, bytes_of(send_seg));
        sent->send(right, slot);
      }
      if (bytes_of(recv_seg) > 0) {
        got = context_->createUnboundBuffer(received, bytes_of(recv_seg));
        got->recv(left, slot);
      }
      if (got)
        BF_ENFORCE(got->waitRecv(setup_.timeout), StatusCode::kAborted, "rank ", rank_,
                   ": Gloo reducescatter: a receive was aborted");
      if (sent)
        BF_ENFORCE(sent->waitSend(setup_.timeout), StatusCode::kAborted, "rank ", rank_,
                   ": Gloo reducescatter: a send was aborted");
      // The next step sends this sum on: the last one's is this rank's own segment.
      char* into = s == size_ - 2 ? static_cast<char*>(out) : sending;
      ReduceOf(into, src + offset[recv_seg] * element, received, counts_per_rank[recv_seg], dtype,
               op);
    }
  });
  if (divisor > 1) DivideBy(out, counts_per_rank[rank_], dtype, divisor);
}

}  // namespace bluefog
