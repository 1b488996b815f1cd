#include "core/op_rules.h"

namespace bluefog {
namespace {

constexpr unsigned Bit(DataType dtype) { return 1u << static_cast<unsigned>(dtype); }

constexpr unsigned kFloats = Bit(DataType::kFloat16) | Bit(DataType::kBFloat16) |
                             Bit(DataType::kFloat32) | Bit(DataType::kFloat64);
constexpr unsigned kNumeric = kFloats | Bit(DataType::kUInt8) | Bit(DataType::kInt8) |
                              Bit(DataType::kUInt16) | Bit(DataType::kInt16) |
                              Bit(DataType::kInt32) | Bit(DataType::kInt64);
// bool cannot be summed (it would silently saturate), but it can be moved.
constexpr unsigned kAll = kNumeric | Bit(DataType::kBool);

struct OpRule {
  unsigned dtypes;
  const char* refusal;
  bool needs_dimension_zero;
};

// Indexed by OpType.
constexpr OpRule kRules[kNumOpTypes] = {
    /* allreduce */ {kNumeric, "cannot be summed; cast it to an integer or float dtype first",
                     false},
    /* allgather */ {kAll, "", true},
    /* broadcast */ {kAll, "", false},
    /* neighbor_allreduce */
    {kFloats, "cannot be averaged with weights; cast it to a float dtype first", false},
    /* neighbor_allgather */ {kAll, "", true},
    /* neighbor_allgather gradient */ {kFloats, "has no gradient", true},
    /* alltoall */ {kAll, "", true},
    /* reducescatter */
    {kNumeric, "cannot be summed; cast it to an integer or float dtype first", true},
    /* join */ {kAll, "", false},
    /* add_process_set */ {kAll, "", false},
    /* remove_process_set */ {kAll, "", false},
    /* win_create */
    {kFloats, "cannot be averaged with weights; cast it to a float dtype first", false},
    /* win_free */ {kAll, "", false},
};

const OpRule& RuleOf(OpType op) { return kRules[static_cast<int>(op)]; }

}  // namespace

bool IsFloat(DataType dtype) { return kFloats & Bit(dtype); }
bool OpAcceptsDtype(OpType op, DataType dtype) { return RuleOf(op).dtypes & Bit(dtype); }
const char* DtypeRefusal(OpType op) { return RuleOf(op).refusal; }
bool NeedsDimensionZero(OpType op) { return RuleOf(op).needs_dimension_zero; }

int64_t ReducescatterRows(int64_t rows, int size, int rank) {
  return rows / size + (rank < rows % size ? 1 : 0);
}

int64_t ReducescatterFirstRow(int64_t rows, int size, int rank) {
  const int64_t extra = rows % size;
  return rank * (rows / size) + (rank < extra ? rank : extra);
}

std::string OpContext(OpType op, const std::string& name) {
  const bool window = op == OpType::kWinCreate || op == OpType::kWinFree;
  return Concat("bluefog ", OpTypeName(op), window ? " of window '" : " of tensor '", name, "'");
}

Status OpError(StatusCode code, OpType op, const std::string& name, const std::string& what) {
  return Status(code, Concat(OpContext(op, name), ": ", what));
}

Status WithRank(int rank, const Status& status) {
  if (status.ok()) return status;
  return Status(status.code(), Concat("rank ", rank, ": ", status.message()));
}

}  // namespace bluefog
