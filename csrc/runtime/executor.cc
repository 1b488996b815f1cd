#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/op_rules.h"
#include "core/reduce_kernels.h"

namespace bluefog {
namespace {

// After the sum: the division of an average done after the collective, then the scale factor.
void FinishReduced(void* data, int64_t count, DataType dtype, int64_t divisor, double scale) {
  if (divisor > 1) DivideBy(data, count, dtype, divisor);
  if (scale != 1.0) ScaleAdd(data, data, count, dtype, scale, false);
}

}  // namespace

int64_t RowBytes(const TensorMeta& meta) {
  int64_t row_elems = 1;
  for (size_t d = 1; d < meta.shape.size(); ++d) row_elems *= meta.shape[d];
  return row_elems * static_cast<int64_t>(ElementSize(meta.dtype));
}

Request* Executor::RequestFor(const Response& response) {
  if (!std::binary_search(response.joined.begin(), response.joined.end(), info_.rank))
    return requests_->Lookup(response.meta.name);
  Request& r = stand_ins_.emplace_back();
  r.meta = response.meta;
  if (HasPerRankFirstDim(r.meta.op) && !r.meta.shape.empty()) r.meta.shape[0] = 0;
  const size_t bytes = r.meta.NumBytes();
  if (zeros_.size() < bytes) zeros_.resize(bytes, 0);
  if (dropped_.size() < bytes) dropped_.resize(bytes);
  r.input = zeros_.data();
  if (r.meta.op == OpType::kAllreduce && r.meta.reduce_op != ReduceOp::kSum) {
    // Zeros would be taken as values by min, max and product: the reduction's identity leaves
    // the others' result as it is.
    std::vector<char>& identity = identities_.emplace_back(bytes);
    FillIdentity(identity.data(), r.meta.NumElements(), r.meta.dtype, r.meta.reduce_op);
    r.input = identity.data();
  }
  r.output = dropped_.data();
  r.allocate_output = [this](const std::vector<int64_t>& shape) -> void* {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    // Sized by the caller's dtype: the largest element is 8 bytes.
    if (dropped_.size() < static_cast<size_t>(n) * 8) dropped_.resize(static_cast<size_t>(n) * 8);
    return dropped_.data();
  };
  return &r;
}

size_t Executor::Execute(std::vector<Response>& ready) {
  size_t collectives = 0;
  stand_ins_.clear();
  identities_.clear();
  auto carries_data = [](const Response& r) { return r.status.ok() && !r.inline_data.empty(); };
  if (std::any_of(ready.begin(), ready.end(), carries_data)) {
    for (const Response& r : ready) {
      if (!carries_data(r)) continue;
      const double start = timeline_->enabled() ? NowSeconds() : 0;
      ++completed_inline_;
      try {
        CompleteInline(r);
      } catch (const BluefogError& e) {
        requests_->Finish(r.meta.name, OpError(e.code(), r.meta.op, r.meta.name, e.what()));
      }
      if (timeline_->enabled())
        timeline_->Phase(r.meta.name, OpTypeName(r.meta.op), start, NowSeconds());
    }
    ready.erase(std::remove_if(ready.begin(), ready.end(), carries_data), ready.end());
  }
  for (const Group& g : PlanGroups(ready, limits_)) {
    const Response* group = ready.data() + g.begin;
    const size_t n = g.end - g.begin;
    const Response& r = group[0];
    if (!r.status.ok()) {
      if (r.only_ranks.empty() ||
          std::binary_search(r.only_ranks.begin(), r.only_ranks.end(), info_.rank))
        requests_->Finish(r.meta.name, r.status);
      continue;
    }
    ++collectives;
    const double comm_start = timeline_->enabled() ? NowSeconds() : 0;
    try {
      switch (r.meta.op) {
        case OpType::kAllreduce: Allreduces(group, n); break;
        case OpType::kAllgather: Allgather(r); break;
        case OpType::kBroadcast: Broadcast(r); break;
        case OpType::kNeighborAllreduce: NeighborAllreduces(group, n); break;
        case OpType::kNeighborAllgather: NeighborAllgather(r); break;
        case OpType::kNeighborAllgatherGrad: NeighborAllgatherGrad(r); break;
        case OpType::kAlltoall: Alltoall(r); break;
        case OpType::kReducescatter: Reducescatter(r); break;
        case OpType::kJoin: Join(r); break;
        case OpType::kAddProcessSet:
        case OpType::kRemoveProcessSet:  // run by the channel before the executors
        case OpType::kWinCreate:
        case OpType::kWinFree:
          throw BluefogError(StatusCode::kInternal,
                             "a request the runtime carries out reached the executor");
      }
    } catch (const TransportError&) {
      throw;  // the channel stops: every request fails, after the job is marked ended
    } catch (const BluefogError& e) {
      for (size_t k = 0; k < n; ++k)
        requests_->Finish(group[k].meta.name,
                          OpError(e.code(), group[k].meta.op, group[k].meta.name, e.what()));
    }
    if (timeline_->enabled()) {
      const double comm_end = NowSeconds();
      for (size_t k = 0; k < n; ++k)
        timeline_->Phase(group[k].meta.name, OpTypeName(group[k].meta.op), comm_start, comm_end);
    }
  }
  return collectives;
}

void Executor::CompleteInline(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const std::vector<std::string>& data = response.inline_data;
  switch (meta.op) {
    case OpType::kAllreduce: {
      const int64_t count = meta.NumElements();
      const AveragePlan plan =
          PlanAverage({meta.average}, meta.reduce_op, info_.size, {meta.scale}, meta.dtype);
      void* out = req->output;
      std::vector<std::string> divided;
      if (plan.before[0] > 1) {
        divided = data;
        for (std::string& d : divided) DivideBy(d.data(), count, meta.dtype, plan.before[0]);
      }
      const std::vector<std::string>& in = divided.empty() ? data : divided;
      // Rank 0's bytes, then every other rank's in rank order: one order for every rank.
      if (info_.size == 1) std::memcpy(out, in[0].data(), in[0].size());
      for (int r = 1; r < info_.size; ++r) {
        const void* acc = r == 1 ? static_cast<const void*>(in[0].data()) : out;
        if (meta.reduce_op == ReduceOp::kSum) {
          SumOf(out, acc, in[r].data(), count, meta.dtype, 1);
        } else {
          ReduceOf(out, acc, in[r].data(), count, meta.dtype, meta.reduce_op);
        }
      }
      FinishReduced(out, count, meta.dtype, plan.collective_divisor * plan.after[0], plan.scale[0]);
      break;
    }
    case OpType::kAllgather: {
      std::vector<int64_t> shape = meta.shape;
      shape[0] = 0;
      for (int64_t rows : response.first_dims) shape[0] += rows;
      int64_t bytes = 0;
      for (const std::string& d : data) bytes += static_cast<int64_t>(d.size());
      Status status;
      std::vector<char> scratch;
      char* out = static_cast<char*>(AllocateOutput(req, shape, bytes, &scratch, &status));
      for (const std::string& d : data) {
        std::memcpy(out, d.data(), d.size());
        out += d.size();
      }
      requests_->Finish(meta.name, status);
      return;
    }
    case OpType::kBroadcast: {
      const std::string& root = data[response.meta.root_rank];
      std::memcpy(req->output, root.data(), root.size());
      break;
    }
    default:
      throw BluefogError(StatusCode::kInternal,
                         Concat(OpTypeName(meta.op), " cannot complete from the round's data"));
  }
  requests_->Finish(meta.name, Status::Ok());
}

void Executor::Allreduces(const Response* group, size_t n) {
  const DataType dtype = group[0].meta.dtype;
  const ReduceOp op = group[0].meta.reduce_op;
  std::vector<Request*> reqs;
  std::vector<bool> average;
  std::vector<double> scale;
  size_t total = 0;
  for (size_t k = 0; k < n; ++k) {
    reqs.push_back(RequestFor(group[k]));
    total += reqs.back()->meta.NumBytes();
    average.push_back(reqs.back()->meta.average);
    scale.push_back(reqs.back()->meta.scale);
  }
  const AveragePlan plan = PlanAverage(average, op, info_.size, scale, dtype);
  const size_t elem = ElementSize(dtype);
  auto finish_slice = [&](size_t k, void* data) {
    FinishReduced(data, reqs[k]->meta.NumElements(), dtype, plan.after[k], plan.scale[k]);
  };
  if (n == 1) {  // out of place, from the input straight into the output: no copy
    if (total > 0) {
      const void* input = reqs[0]->input;
      if (plan.before[0] > 1) {  // divided into the output, then reduced in place
        std::memcpy(reqs[0]->output, input, total);
        DivideBy(reqs[0]->output, static_cast<int64_t>(total / elem), dtype, plan.before[0]);
        input = reqs[0]->output;
      }
      transport_->Allreduce(input, reqs[0]->output, static_cast<int64_t>(total / elem), dtype, op,
                            plan.collective_divisor);
      finish_slice(0, reqs[0]->output);
    }
    requests_->Finish(group[0].meta.name, Status::Ok());
    return;
  }
  char* buffer = FusedAllreduceBuffer(total);
  size_t offset = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t bytes = reqs[k]->meta.NumBytes();
    std::memcpy(buffer + offset, reqs[k]->input, bytes);
    if (plan.before[k] > 1)
      DivideBy(buffer + offset, reqs[k]->meta.NumElements(), dtype, plan.before[k]);
    offset += bytes;
  }
  transport_->Allreduce(buffer, buffer, static_cast<int64_t>(total / elem), dtype, op,
                        plan.collective_divisor);
  offset = 0;
  for (size_t k = 0; k < n; ++k) {
    const size_t bytes = reqs[k]->meta.NumBytes();
    finish_slice(k, buffer + offset);
    std::memcpy(reqs[k]->output, buffer + offset, bytes);
    offset += bytes;
  }
  for (size_t k = 0; k < n; ++k) requests_->Finish(group[k].meta.name, Status::Ok());
}

char* Executor::FusedAllreduceBuffer(size_t bytes) {
  if (fusion_block_bytes_ >= bytes) return fusion_block_;
  if (!fusion_heap_) fusion_heap_ = transport_->shared_heap();
  if (fusion_heap_) {
    // Grown by doubling, so a few sizes of block serve every step.
    const size_t capacity = (std::max(bytes, 2 * fusion_block_bytes_) + 4095) / 4096 * 4096;
    if (fusion_block_) fusion_heap_->Give(fusion_block_, fusion_block_bytes_);
    fusion_block_ = static_cast<char*>(fusion_heap_->Take(capacity));
    fusion_block_bytes_ = fusion_block_ ? capacity : 0;
    if (fusion_block_) return fusion_block_;
  }
  if (fusion_buffer_.size() < bytes) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

void* Executor::AllocateOutput(Request* req, const std::vector<int64_t>& shape, int64_t bytes,
                               std::vector<char>* scratch, Status* status) {
  try {
    return req->allocate_output(shape);
  } catch (const BluefogError& e) {
    *status = OpError(e.code(), req->meta.op, req->meta.name, e.what());
  } catch (const std::exception& e) {  // e.g. std::bad_alloc from the framework's allocator
    *status =
        OpError(StatusCode::kInternal, req->meta.op, req->meta.name,
                Concat("cannot allocate the output of shape ", ShapeString(shape), ": ", e.what()));
  }
  scratch->resize(static_cast<size_t>(bytes));
  return scratch->data();
}

void Executor::Allgather(const Response& response) {
  Request* req = RequestFor(response);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  std::vector<int64_t> bytes_per_rank(info_.size);
  std::vector<int64_t> shape = meta.shape;
  shape[0] = 0;
  for (int r = 0; r < info_.size; ++r) {
    bytes_per_rank[r] = response.first_dims[r] * row_bytes;
    shape[0] += response.first_dims[r];
  }
  Status status;
  std::vector<char> scratch;
  void* out = AllocateOutput(req, shape, shape[0] * row_bytes, &scratch, &status);
  transport_->Allgatherv(req->input, out, bytes_per_rank);
  requests_->Finish(meta.name, status);
}

void Executor::Broadcast(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const size_t bytes = req->meta.NumBytes();
  if (bytes > 0) {
    if (info_.rank == response.meta.root_rank && req->output != req->input)
      std::memcpy(req->output, req->input, bytes);
    transport_->Broadcast(req->output, static_cast<int64_t>(bytes), response.meta.root_rank);
  }
  requests_->Finish(response.meta.name, Status::Ok());
}

// Rows [offset_j, offset_j + splits[j]) go to rank j; what rank j sends this rank (its
// splits[rank], known from the negotiation) lands at offset sum_{i<j} in the output. The block
// that stays on this rank is copied.
void Executor::Alltoall(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  std::vector<int64_t> shape = meta.shape;
  shape[0] = 0;
  for (int j = 0; j < info_.size; ++j) {
    const int64_t rows = response.all_splits[j * info_.size + info_.rank];
    if (req->received_splits) req->received_splits[j] = rows;
    shape[0] += rows;
  }
  Status status;
  std::vector<char> scratch;
  char* out =
      static_cast<char*>(AllocateOutput(req, shape, shape[0] * row_bytes, &scratch, &status));
  const char* in = static_cast<const char*>(req->input);
  std::vector<PeerBuffer> sends, recvs;
  int64_t send_offset = 0, recv_offset = 0;
  for (int j = 0; j < info_.size; ++j) {
    const int64_t send_bytes = meta.splits[j] * row_bytes;
    const int64_t recv_bytes = response.all_splits[j * info_.size + info_.rank] * row_bytes;
    if (j == info_.rank) {
      if (send_bytes > 0) std::memcpy(out + recv_offset, in + send_offset, send_bytes);
    } else {
      sends.push_back({j, const_cast<char*>(in + send_offset), send_bytes});
      recvs.push_back({j, out + recv_offset, recv_bytes});
    }
    send_offset += send_bytes;
    recv_offset += recv_bytes;
  }
  transport_->NeighborExchange(sends, recvs);
  requests_->Finish(meta.name, status);
}

void Executor::Reducescatter(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t rows = meta.shape[0];
  const int64_t row_elems = RowBytes(meta) / static_cast<int64_t>(ElementSize(meta.dtype));
  std::vector<int64_t> counts(info_.size);
  for (int r = 0; r < info_.size; ++r)
    counts[r] = ReducescatterRows(rows, info_.size, r) * row_elems;
  const AveragePlan plan = PlanAverage({meta.average}, meta.reduce_op, info_.size, {}, meta.dtype);
  const void* input = req->input;
  std::vector<char> divided;
  if (plan.before[0] > 1 && meta.NumElements() > 0) {
    const char* in = static_cast<const char*>(req->input);
    divided.assign(in, in + meta.NumBytes());
    DivideBy(divided.data(), meta.NumElements(), meta.dtype, plan.before[0]);
    input = divided.data();
  }
  if (meta.NumElements() > 0)
    transport_->ReduceScatter(input, req->output, counts, meta.dtype, meta.reduce_op,
                              plan.collective_divisor);
  requests_->Finish(meta.name, Status::Ok());
}

// Every rank has joined: the join completes with the last rank to join, no data moves.
void Executor::Join(const Response& response) {
  Request* req = requests_->Lookup(response.meta.name);
  if (req->output) *static_cast<int32_t*>(req->output) = response.last_joined;
  requests_->Finish(response.meta.name, Status::Ok());
}

}  // namespace bluefog
