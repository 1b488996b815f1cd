#include "core/validation.h"

#include <cmath>

#include "core/op_rules.h"

namespace bluefog {
namespace {

Status Invalid(const TensorMeta& meta, const std::string& what) {
  return OpError(StatusCode::kInvalidArgument, meta.op, meta.name, what);
}

Status RefuseDtype(const TensorMeta& meta) {
  return Invalid(meta, Concat("dtype ", DataTypeName(meta.dtype), " ", DtypeRefusal(meta.op)));
}

Status ValidateNeighbors(const Request& request, int rank, int size) {
  const TensorMeta& meta = request.meta;
  for (const auto* ranks : {&meta.send_ranks, &meta.recv_ranks}) {
    for (size_t k = 0; k < ranks->size(); ++k) {
      const int r = (*ranks)[k];
      if (r < 0 || r >= size || r == rank)
        return Invalid(meta,
                       Concat("neighbor rank ", r, " is not another rank in [0, ", size, ")"));
      if (k > 0 && (*ranks)[k - 1] >= r)
        return Invalid(meta, "neighbor ranks must be unique and ascending");
    }
  }
  if (meta.op == OpType::kNeighborAllreduce) {
    if (!OpAcceptsDtype(meta.op, meta.dtype)) return RefuseDtype(meta);
    if (request.recv_weights.size() != meta.recv_ranks.size())
      return Invalid(meta, Concat(request.recv_weights.size(), " receive weights for ",
                                  meta.recv_ranks.size(), " source ranks"));
    if (!request.send_weights.empty() && request.send_weights.size() != meta.send_ranks.size())
      return Invalid(meta, Concat(request.send_weights.size(), " send weights for ",
                                  meta.send_ranks.size(), " destination ranks"));
    // A NaN or infinite weight would spread into every neighbour's result.
    if (!std::isfinite(request.self_weight))
      return Invalid(
          meta, Concat("self_weight is ", request.self_weight, "; weights must be finite numbers"));
    for (const auto* list : {&request.recv_weights, &request.send_weights})
      for (size_t k = 0; k < list->size(); ++k)
        if (!std::isfinite((*list)[k]))
          return Invalid(
              meta, Concat(list == &request.recv_weights ? "src_weights" : "dst_weights", " has ",
                           (*list)[k], " for rank ",
                           (list == &request.recv_weights ? meta.recv_ranks : meta.send_ranks)[k],
                           "; weights must be finite numbers"));
    return Status::Ok();
  }
  if (NeedsDimensionZero(meta.op) && meta.shape.empty())
    return Invalid(meta,
                   "neighbor_allgather concatenates along dimension 0 and needs a tensor of "
                   "rank >= 1");
  if (!OpAcceptsDtype(meta.op, meta.dtype)) return RefuseDtype(meta);
  if (meta.op == OpType::kNeighborAllgatherGrad && (meta.input_rows < 0 || meta.shape[0] < 0))
    return Invalid(meta,
                   Concat("negative rows: input ", meta.input_rows, ", output ", meta.shape[0]));
  return Status::Ok();
}

}  // namespace

Status ValidateRequest(const Request& request) {
  const TensorMeta& meta = request.meta;
  if (meta.name.empty()) return Invalid(meta, "the name is empty; pass a non-empty name or None");
  if (meta.name.find('\0') != std::string::npos) {
    TensorMeta shown = meta;  // the NUL written out, so that the message stays readable
    shown.name.clear();
    for (char c : meta.name) shown.name += c == '\0' ? std::string("\\0") : std::string(1, c);
    return Invalid(shown,
                   "the name contains a NUL character, where a C string would end; pass a name "
                   "without \\0");
  }
  if (meta.shape.size() > kMaxDims)
    return Invalid(meta, Concat("rank ", meta.shape.size(), " exceeds ", kMaxDims));
  for (int64_t d : meta.shape)
    if (d < 0)
      return Invalid(meta, Concat("shape ", ShapeString(meta.shape), " has a negative dimension"));
  // Neighbour ops report their dtype after their ranks (the order users have always seen).
  if (!IsNeighborOp(meta.op) && !OpAcceptsDtype(meta.op, meta.dtype)) return RefuseDtype(meta);
  if (meta.reduce_op != ReduceOp::kSum && (meta.op != OpType::kAllreduce || meta.average))
    return Invalid(meta, Concat("reduction ", ReduceOpName(meta.reduce_op),
                                " applies to allreduce without averaging only"));
  if (meta.scale != 1.0 &&
      (meta.op != OpType::kAllreduce || meta.reduce_op != ReduceOp::kSum || !IsFloat(meta.dtype)))
    return Invalid(meta, Concat("prescale_factor and postscale_factor apply to sums and averages "
                                "of float tensors only, not to ",
                                ReduceOpName(meta.reduce_op), " of ", DataTypeName(meta.dtype)));
  if (meta.op == OpType::kAllgather && meta.shape.empty())
    return Invalid(meta,
                   "allgather concatenates along dimension 0 and needs a tensor of rank >= 1; "
                   "reshape the scalar to [1] first");
  if ((meta.op == OpType::kAlltoall || meta.op == OpType::kReducescatter) && meta.shape.empty())
    return Invalid(meta, Concat(OpTypeName(meta.op),
                                " splits dimension 0 over the ranks and needs "
                                "a tensor of rank >= 1; reshape the scalar to [1] first"));
  return Status::Ok();
}

Status ValidateForLayout(const Request& request, int rank, int size) {
  const TensorMeta& meta = request.meta;
  if (meta.op == OpType::kBroadcast && (meta.root_rank < 0 || meta.root_rank >= size))
    return Invalid(meta, Concat("root_rank ", meta.root_rank, " is outside [0, ", size, ")"));
  if (IsNeighborOp(meta.op)) return ValidateNeighbors(request, rank, size);
  if (meta.op == OpType::kWinCreate) {
    for (const auto* ranks : {&meta.send_ranks, &meta.recv_ranks}) {
      for (size_t k = 0; k < ranks->size(); ++k) {
        const int r = (*ranks)[k];
        if (r < 0 || r >= size || r == rank)
          return Invalid(meta, Concat("neighbor rank ", r, " is not another rank in [0, ", size,
                                      "); check the topology (bf.set_topology)"));
        if (k > 0 && (*ranks)[k - 1] >= r)
          return Invalid(meta, "neighbor ranks must be unique and ascending");
      }
    }
  }
  if (meta.op == OpType::kWinFree && meta.splits.size() != 1)
    return Invalid(meta, "win_free carries one count of pending operations");
  if (meta.op == OpType::kAddProcessSet) {
    const auto& ranks = meta.send_ranks;
    if (ranks.empty()) return Invalid(meta, "a process set needs at least one rank");
    for (size_t k = 0; k < ranks.size(); ++k) {
      if (ranks[k] < 0 || ranks[k] >= size)
        return Invalid(meta, Concat("rank ", ranks[k], " is outside [0, ", size, ")"));
      if (k > 0 && ranks[k - 1] == ranks[k])
        return Invalid(meta, Concat("rank ", ranks[k], " is listed twice"));
    }
  }
  return Status::Ok();
}

std::string AlltoallSplitsProblem(const TensorMeta& meta, int size) {
  if (meta.splits.size() != static_cast<size_t>(size))
    return Concat("splits has ", meta.splits.size(), " entries for ", size,
                  " ranks; pass one row count per rank");
  const int64_t tensor_rows = meta.shape.empty() ? 0 : meta.shape[0];
  int64_t rows = 0;
  for (int64_t s : meta.splits) {
    if (s < 0) return Concat("splits ", ShapeString(meta.splits), " has a negative entry");
    // Wrapped around, a sum of huge entries could equal the rows: receivers would then size
    // their outputs from the entries themselves.
    if (__builtin_add_overflow(rows, s, &rows))
      return Concat("splits ", ShapeString(meta.splits),
                    " add up to more than an int64 holds, but the tensor has ", tensor_rows,
                    " rows");
  }
  if (rows != tensor_rows)
    return Concat("splits ", ShapeString(meta.splits), " add up to ", rows,
                  " rows, but the tensor has ", tensor_rows, " rows");
  return "";
}

}  // namespace bluefog
