#include "core/coordinator.h"

#include <algorithm>
#include <sstream>

#include "core/op_rules.h"
#include "core/validation.h"

namespace bluefog {
namespace {

// "rank 0 has X, rank 1 has Y" listing every rank whose value differs from rank 0's.
template <typename Getter>
std::string DescribeDifference(const std::vector<std::optional<TensorMeta>>& metas,
                               Getter value_of) {
  std::ostringstream out;
  const std::string first = value_of(*metas[0]);
  out << "rank 0 has " << first;
  for (size_t r = 1; r < metas.size(); ++r) {
    std::string v = value_of(*metas[r]);
    if (v != first) out << ", rank " << r << " has " << v;
  }
  return out.str();
}

std::string TrailingShape(const TensorMeta& m) {
  if (m.shape.empty()) return "a scalar";
  std::vector<int64_t> rest(m.shape.begin() + 1, m.shape.end());
  return Concat("rank ", m.shape.size(), " with trailing dimensions ", ShapeString(rest));
}

std::string RanksString(const std::vector<int32_t>& ranks) {
  return ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end()));  // "[1, 4]"
}

}  // namespace

bool HasPerRankFirstDim(OpType op) {
  return op == OpType::kAllgather || op == OpType::kNeighborAllgather ||
         op == OpType::kNeighborAllgatherGrad || op == OpType::kAlltoall;
}

Status CheckAgreement(const std::vector<std::optional<TensorMeta>>& metas) {
  const TensorMeta& m0 = *metas[0];
  auto fail = [&](const char* what, const std::string& detail, const char* advice) {
    return OpError(StatusCode::kPrecondition, m0.op, m0.name,
                   Concat("ranks disagree on the ", what, ": ", detail, ". ", advice));
  };
  for (const auto& m : metas) {
    if (m->op != m0.op)
      return fail("operation",
                  DescribeDifference(
                      metas, [](const TensorMeta& x) { return std::string(OpTypeName(x.op)); }),
                  "Every rank must call the same collective for the same name (an allreduce "
                  "with compression int8, int4, topk or powersgd starts with an allgather: pass "
                  "the same compression= on every rank).");
  }
  for (const auto& m : metas) {
    if (m->group_size != m0.group_size)
      return fail("number of tensors in the group",
                  DescribeDifference(
                      metas, [](const TensorMeta& x) { return std::to_string(x.group_size); }),
                  "Pass the same number of tensors (of each dtype) to the grouped op on every "
                  "rank.");
  }
  for (const auto& m : metas) {
    if (m->dtype != m0.dtype)
      return fail(
          "dtype",
          DescribeDifference(
              metas, [](const TensorMeta& x) { return std::string(DataTypeName(x.dtype)); }),
          "Cast the tensor to one dtype on every rank (and give every rank the same "
          "compression).");
  }
  for (const auto& m : metas) {
    if (m->root_rank != m0.root_rank)
      return fail("root rank",
                  DescribeDifference(
                      metas, [](const TensorMeta& x) { return std::to_string(x.root_rank); }),
                  "Pass the same root_rank on every rank.");
  }
  for (const auto& m : metas) {
    if (m->reduce_op != m0.reduce_op)
      return fail(
          "reduction",
          DescribeDifference(
              metas, [](const TensorMeta& x) { return std::string(ReduceOpName(x.reduce_op)); }),
          "Pass the same op on every rank.");
  }
  for (const auto& m : metas) {
    if (m->average != m0.average)
      return fail("averaging",
                  DescribeDifference(metas,
                                     [](const TensorMeta& x) {
                                       return std::string(x.average ? "average" : "sum");
                                     }),
                  "Pass the same average (or op) on every rank.");
  }
  for (const auto& m : metas) {
    if (m->scale != m0.scale)
      return fail("scale factor",
                  DescribeDifference(metas, [](const TensorMeta& x) { return Concat(x.scale); }),
                  "Pass the same prescale_factor * postscale_factor on every rank.");
  }
  if (m0.op == OpType::kAddProcessSet || m0.op == OpType::kRemoveProcessSet) {
    for (const auto& m : metas) {
      if (m->send_ranks != m0.send_ranks)
        return fail(m0.op == OpType::kAddProcessSet ? "process set's ranks" : "process set",
                    DescribeDifference(
                        metas, [](const TensorMeta& x) { return RanksString(x.send_ranks); }),
                    "Every rank must add (and remove) the same process sets in the same order.");
    }
  }
  if (m0.op == OpType::kWinFree) {
    for (size_t r = 0; r < metas.size(); ++r) {
      if (metas[r]->splits.size() == 1 && metas[r]->splits[0] > 0)
        return fail("moment to free the window",
                    Concat("rank ", r, " has ", metas[r]->splits[0],
                           " window operations that have not finished"),
                    "Wait for them (bf.win_wait on their handles) on every rank, then free.");
    }
  }
  if (m0.op == OpType::kAlltoall) {
    const int n = static_cast<int>(metas.size());
    for (int r = 0; r < n; ++r) {
      const std::string problem = AlltoallSplitsProblem(*metas[r], n);
      if (!problem.empty())
        return OpError(StatusCode::kPrecondition, m0.op, m0.name,
                       Concat("rank ", r, "'s ", problem,
                              ". Pass splits with one non-negative row count per rank, adding "
                              "up to dimension 0 of the tensor."));
    }
  }
  if (IsNeighborOp(m0.op) || m0.op == OpType::kWinCreate) {
    // Every receive must be matched by the sender's send and vice versa, or the exchange hangs.
    const int n = static_cast<int>(metas.size());
    auto has = [](const std::vector<int32_t>& v, int r) {
      return std::find(v.begin(), v.end(), r) != v.end();
    };
    for (int r = 0; r < n; ++r) {
      for (int32_t src : metas[r]->recv_ranks) {
        if (src < 0 || src >= n || !has(metas[src]->send_ranks, r))
          return fail("topology",
                      Concat("rank ", r, " expects to receive from rank ", src, ", but rank ", src,
                             " does not send to rank ", r),
                      m0.op == OpType::kWinCreate
                          ? "Every rank must create the window under the same topology."
                          : "Every rank's src_weights must mirror the senders' dst_weights.");
      }
      for (int32_t dst : metas[r]->send_ranks) {
        if (dst < 0 || dst >= n || !has(metas[dst]->recv_ranks, r))
          return fail("topology",
                      Concat("rank ", r, " sends to rank ", dst, ", but rank ", dst,
                             " does not expect to receive from rank ", r),
                      m0.op == OpType::kWinCreate
                          ? "Every rank must create the window under the same topology."
                          : "Every rank's dst_weights must mirror the receivers' src_weights.");
      }
    }
  }
  if (HasPerRankFirstDim(m0.op)) {
    for (const auto& m : metas) {
      if (TrailingShape(*m) != TrailingShape(m0))
        return fail("shape", DescribeDifference(metas, TrailingShape),
                    m0.op == OpType::kAlltoall
                        ? "alltoall tensors may differ only in their first dimension."
                        : "allgather tensors may differ only in their first dimension.");
    }
    if (m0.op == OpType::kNeighborAllgatherGrad) {
      // Each rank's input holds one block per destination, sized like that destination's output
      // (the forward input it gathered); anything else would send misaligned blocks.
      for (size_t r = 0; r < metas.size(); ++r) {
        int64_t rows = 0;
        for (int32_t dst : metas[r]->send_ranks) rows += metas[dst]->shape[0];
        if (rows != metas[r]->input_rows)
          return fail("shape",
                      Concat("rank ", r, "'s upstream gradient has ", metas[r]->input_rows,
                             " rows, but the tensors it gathered "
                             "from ranks ",
                             RanksString(metas[r]->send_ranks), " have ", rows, " rows in all"),
                      "The gradient of neighbor_allgather must have the shape of its output.");
      }
    }
  } else {
    for (const auto& m : metas) {
      if (m->shape != m0.shape)
        return fail(
            "shape",
            DescribeDifference(metas, [](const TensorMeta& x) { return ShapeString(x.shape); }),
            "Every rank must pass a tensor of the same shape for the same name.");
    }
  }
  return Status::Ok();
}

Coordinator::Coordinator(int size, std::vector<int> world_ranks)
    : size_(size), world_ranks_(std::move(world_ranks)), joined_(size, false) {}

bool Coordinator::OnlyJoinedMissing(const Entry& entry) const {
  if (num_joined_ == 0) return false;
  for (int r = 0; r < size_; ++r)
    if (!entry.metas[r] && !joined_[r]) return false;
  return true;
}

void Coordinator::CompleteForJoined() {
  std::vector<std::string> names;
  for (const auto& [name, entry] : table_)
    if (entry.count > 0 && OnlyJoinedMissing(entry)) names.push_back(name);
  // Every rank completes them in the same order, whatever its map's iteration order.
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    auto it = table_.find(name);
    PushReady(it->second);
    table_.erase(it);
  }
}

void Coordinator::Announce(int rank, const TensorMeta& meta, std::string data) {
  BF_ENFORCE(rank >= 0 && rank < size_, StatusCode::kInternal, "announcement from rank ", rank,
             " outside [0, ", size_, ")");
  Entry& entry = table_[meta.name];
  if (entry.metas.empty()) entry.metas.resize(size_);
  BF_ENFORCE(!entry.metas[rank].has_value(), StatusCode::kInternal, "rank ", rank,
             " announced tensor '", meta.name, "' twice");
  entry.metas[rank] = meta;
  if (!data.empty()) {
    if (entry.data.empty()) entry.data.resize(size_);
    entry.data[rank] = std::move(data);
    ++entry.data_count;
  }
  if (meta.op == OpType::kJoin && !joined_[rank]) {
    joined_[rank] = true;
    ++num_joined_;
    last_joined_ = rank;
  }
  if (++entry.count == size_) {
    PushReady(entry);
    table_.erase(meta.name);
    if (meta.op == OpType::kJoin) {  // every rank has joined: the join is over
      std::fill(joined_.begin(), joined_.end(), false);
      num_joined_ = 0;
      last_joined_ = -1;
    }
  } else if (meta.op == OpType::kJoin) {
    CompleteForJoined();
  } else if (OnlyJoinedMissing(entry)) {
    PushReady(entry);
    table_.erase(meta.name);
  }
}

Response Coordinator::Complete(Entry& entry) const {
  Response response;
  if (entry.count < size_) {
    // Stand in for the joined ranks: an allreduce runs with their identity of the reduction, an
    // allgather with their zero rows; any other op cannot run while a rank has stopped submitting.
    const TensorMeta* present = nullptr;
    for (const auto& m : entry.metas)
      if (m && !present) present = &*m;
    for (int r = 0; r < size_; ++r) {
      if (entry.metas[r]) {
        response.only_ranks.push_back(r);
        continue;
      }
      response.joined.push_back(r);
      TensorMeta stand_in = *present;
      if (HasPerRankFirstDim(stand_in.op) && !stand_in.shape.empty()) stand_in.shape[0] = 0;
      entry.metas[r] = std::move(stand_in);
    }
    const OpType op = present->op;
    if (!world_ranks_.empty()) {
      std::vector<int32_t> joined;
      for (int r : response.joined) joined.push_back(world_ranks_[r]);
      response.meta = *present;
      response.status = OpError(
          StatusCode::kPrecondition, op, present->name,
          Concat("rank(s) ", RanksString(joined),
                 " of this process set have called join(), which stands in only for the global "
                 "set's allreduces and allgathers: a process set's collectives cannot run while "
                 "a member has joined. Call them on every member of the set before join()"));
      response.joined.clear();
      return response;
    }
    if (op != OpType::kAllreduce && op != OpType::kAllgather) {
      response.meta = *present;
      response.status = OpError(
          StatusCode::kPrecondition, op, present->name,
          Concat("rank(s) ",
                 RanksString(std::vector<int32_t>(response.joined.begin(), response.joined.end())),
                 " have called join() and submit no more collectives; only allreduce and "
                 "allgather run until every rank has joined"));
      response.joined.clear();
      return response;
    }
  }
  response.only_ranks.clear();  // it runs: every rank takes part
  response.meta = *entry.metas[0];
  if (response.meta.op == OpType::kJoin) response.last_joined = last_joined_;
  response.status = CheckAgreement(entry.metas);
  if (response.status.ok() && IsNeighborOp(response.meta.op)) {
    std::string& sig = response.topology_signature;
    for (const auto& m : entry.metas) {
      for (const auto* ranks : {&m->send_ranks, &m->recv_ranks}) {
        sig += std::to_string(ranks->size());
        for (int32_t r : *ranks) sig += "," + std::to_string(r);
        sig += ";";
      }
    }
  }
  if (response.status.ok() && HasPerRankFirstDim(response.meta.op)) {
    response.first_dims.reserve(size_);
    for (const auto& m : entry.metas) response.first_dims.push_back(m->shape[0]);
  }
  if (response.status.ok() && response.meta.op == OpType::kAlltoall) {
    response.all_splits.reserve(static_cast<size_t>(size_) * size_);
    for (const auto& m : entry.metas)
      response.all_splits.insert(response.all_splits.end(), m->splits.begin(), m->splits.end());
  }
  if (response.status.ok() && response.joined.empty() && entry.data_count > 0) {
    const TensorMeta& m0 = response.meta;
    const bool complete =
        m0.op == OpType::kBroadcast
            ? m0.root_rank >= 0 && m0.root_rank < size_ && !entry.data[m0.root_rank].empty()
            : (m0.op == OpType::kAllreduce || m0.op == OpType::kAllgather) &&
                  entry.data_count == size_;
    // Each rank's bytes must be what its own metadata says, or they are not used.
    bool sized = complete;
    for (int r = 0; r < size_ && sized; ++r)
      if (!entry.data[r].empty()) sized = entry.data[r].size() == entry.metas[r]->NumBytes();
    if (sized) response.inline_data = std::move(entry.data);
  }
  if (response.status.ok()) {
    response.rank_metas.reserve(size_);
    for (auto& m : entry.metas)
      response.rank_metas.push_back(std::move(*m));  // entry is erased next
  }
  return response;
}

void Coordinator::PushReady(Entry& entry) {
  ready_.push_back(Complete(entry));
  const Response& r = ready_.back();
  if (r.status.ok() || r.meta.group_size == 0) return;
  int32_t min_size = r.meta.group_size, max_size = r.meta.group_size;
  for (const auto& m : entry.metas) {
    if (!m) continue;
    min_size = std::min(min_size, m->group_size);
    max_size = std::max(max_size, m->group_size);
  }
  std::string base;
  int64_t index = 0;
  if (min_size == max_size || !GroupBase(r.meta.name, &base, &index)) return;
  for (const GroupFailure& f : group_failures_)
    if (f.base == base) return;
  group_failures_.push_back(
      {base, min_size,
       Concat("ranks disagree on the number of tensors in the group '", base, "': ",
              DescribeDifference(entry.metas,
                                 [](const TensorMeta& x) { return std::to_string(x.group_size); }),
              ". Pass the same number of tensors (of each dtype) to the grouped op on every "
              "rank.")});
}

void Coordinator::FailGroupLeftovers() {
  if (group_failures_.empty()) return;
  std::vector<std::string> names;
  for (const auto& [name, entry] : table_) {
    std::string base;
    int64_t index = 0;
    if (!GroupBase(name, &base, &index)) continue;
    for (const GroupFailure& f : group_failures_) {
      if (f.base != base || index < f.min_size) continue;
      // Only tensors of the failed groups: every rank that announced it did so in a group.
      bool grouped = true;
      for (const auto& m : entry.metas) grouped = grouped && (!m || m->group_size > f.min_size);
      if (grouped) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());  // one order on every rank
  for (const std::string& name : names) {
    auto it = table_.find(name);
    const TensorMeta* present = nullptr;
    for (const auto& m : it->second.metas)
      if (m && !present) present = &*m;
    std::string base;
    int64_t index = 0;
    GroupBase(name, &base, &index);
    Response response;
    response.meta = *present;
    for (int r = 0; r < size_; ++r)
      if (it->second.metas[r]) response.only_ranks.push_back(r);
    for (const GroupFailure& f : group_failures_)
      if (f.base == base)
        response.status = OpError(StatusCode::kPrecondition, present->op, name, f.detail);
    ready_.push_back(std::move(response));
    table_.erase(it);
  }
  group_failures_.clear();
}

std::vector<Response> Coordinator::TakeReady() {
  FailGroupLeftovers();
  std::vector<Response> out;
  out.swap(ready_);
  return out;
}

std::vector<WaitingTensor> Coordinator::Waiting() const {
  std::vector<WaitingTensor> out;
  for (const auto& [name, entry] : table_) {
    WaitingTensor w;
    w.name = name;
    for (int r = 0; r < size_; ++r) (entry.metas[r] ? w.ready_ranks : w.missing_ranks).push_back(r);
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(),
            [](const WaitingTensor& a, const WaitingTensor& b) { return a.name < b.name; });
  return out;
}

}  // namespace bluefog
