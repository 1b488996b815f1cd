// The executors of the neighbour ops (Executor's other half): point-to-point exchanges with the
// ranks each request names, combined in C++ over persistent buffers.
#include <cstring>

#include "core/reduce_kernels.h"
#include "runtime/executor.h"

namespace bluefog {

// Every request of the group has the same peers on this rank (same topology signature). Their
// inputs are packed into one buffer, exchanged once, and each output is combined with its own
// weights from the received copies.
void Executor::NeighborAllreduces(const Response* group, size_t n) {
  const DataType dtype = group[0].meta.dtype;
  std::vector<Request*> reqs;
  std::vector<size_t> offsets;
  size_t total = 0;
  bool scaled_sends = false;
  for (size_t k = 0; k < n; ++k) {
    reqs.push_back(requests_->Lookup(group[k].meta.name));
    offsets.push_back(total);
    total += reqs.back()->meta.NumBytes();
    scaled_sends |= !reqs.back()->send_weights.empty();
  }
  const size_t elem = ElementSize(dtype);
  const std::vector<int32_t>& send_ranks = reqs[0]->meta.send_ranks;
  const std::vector<int32_t>& recv_ranks = reqs[0]->meta.recv_ranks;
  if (total > 0) {
    if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
    char* packed = fusion_buffer_.data();
    for (size_t k = 0; k < reqs.size(); ++k)
      std::memcpy(packed + offsets[k], reqs[k]->input, reqs[k]->meta.NumBytes());
    const size_t nrecv = recv_ranks.size();
    const size_t nscaled = scaled_sends ? send_ranks.size() : 0;
    if (neighbor_buffer_.size() < (nrecv + nscaled) * total)
      neighbor_buffer_.resize((nrecv + nscaled) * total);
    char* scratch = neighbor_buffer_.data();
    std::vector<PeerBuffer> sends, recvs;
    for (size_t j = 0; j < nrecv; ++j)
      recvs.push_back({recv_ranks[j], scratch + j * total, static_cast<int64_t>(total)});
    for (size_t j = 0; j < send_ranks.size(); ++j) {
      char* data = packed;
      if (nscaled) {  // what goes to send_ranks[j] is each tensor scaled by its weight for j
        data = scratch + (nrecv + j) * total;
        for (size_t k = 0; k < reqs.size(); ++k) {
          const double w = reqs[k]->send_weights.empty() ? 1.0 : reqs[k]->send_weights[j];
          ScaleAdd(data + offsets[k], packed + offsets[k],
                   static_cast<int64_t>(reqs[k]->meta.NumBytes() / elem), dtype, w, false);
        }
      }
      sends.push_back({send_ranks[j], data, static_cast<int64_t>(total)});
    }
    transport_->NeighborExchange(sends, recvs);
    for (size_t k = 0; k < reqs.size(); ++k) {
      Request* req = reqs[k];
      const int64_t count = static_cast<int64_t>(req->meta.NumBytes() / elem);
      ScaleAdd(req->output, packed + offsets[k], count, dtype, req->self_weight, false);
      for (size_t j = 0; j < nrecv; ++j)
        ScaleAdd(req->output, scratch + j * total + offsets[k], count, dtype, req->recv_weights[j],
                 true);
    }
  }
  for (size_t k = 0; k < n; ++k) requests_->Finish(group[k].meta.name, Status::Ok());
}

void Executor::NeighborAllgather(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  std::vector<int64_t> shape = meta.shape;
  shape[0] = 0;
  for (int32_t src : meta.recv_ranks) shape[0] += response.first_dims[src];
  Status status;
  std::vector<char> scratch;
  char* out =
      static_cast<char*>(AllocateOutput(req, shape, shape[0] * row_bytes, &scratch, &status));
  std::vector<PeerBuffer> sends, recvs;
  int64_t offset = 0;
  for (int32_t src : meta.recv_ranks) {
    const int64_t b = response.first_dims[src] * row_bytes;
    recvs.push_back({src, out + offset, b});
    offset += b;
  }
  const int64_t my_bytes = meta.shape[0] * row_bytes;
  for (int32_t dst : meta.send_ranks)
    sends.push_back({dst, const_cast<void*>(req->input), my_bytes});
  transport_->NeighborExchange(sends, recvs);
  requests_->Finish(meta.name, status);
}

// Block k of the input (sized like send_ranks[k]'s output) goes to send_ranks[k]; the output is
// the sum of the blocks received from recv_ranks (zeros when there are none).
void Executor::NeighborAllgatherGrad(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  const int64_t out_bytes = meta.shape[0] * row_bytes;
  const char* in = static_cast<const char*>(req->input);
  std::vector<PeerBuffer> sends, recvs;
  int64_t offset = 0;
  for (int32_t dst : meta.send_ranks) {
    const int64_t b = response.first_dims[dst] * row_bytes;
    sends.push_back({dst, const_cast<char*>(in + offset), b});
    offset += b;
  }
  const size_t nrecv = meta.recv_ranks.size();
  // The first block lands in the output; the others in scratch, summed into it afterwards.
  const size_t extra = nrecv > 1 ? (nrecv - 1) * static_cast<size_t>(out_bytes) : 0;
  if (neighbor_buffer_.size() < extra) neighbor_buffer_.resize(extra);
  char* out = static_cast<char*>(req->output);
  for (size_t j = 0; j < nrecv; ++j)
    recvs.push_back({meta.recv_ranks[j],
                     j == 0 ? out : neighbor_buffer_.data() + (j - 1) * out_bytes, out_bytes});
  transport_->NeighborExchange(sends, recvs);
  if (nrecv == 0 && out_bytes > 0) std::memset(out, 0, static_cast<size_t>(out_bytes));
  const int64_t count = meta.NumElements();
  for (size_t j = 1; j < nrecv; ++j)
    SumInto(out, neighbor_buffer_.data() + (j - 1) * out_bytes, count, meta.dtype);
  requests_->Finish(meta.name, Status::Ok());
}

}  // namespace bluefog
