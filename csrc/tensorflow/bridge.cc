#include "tensorflow/bridge.h"

#include "core/op_rules.h"
#include "runtime/runtime.h"

namespace bluefog {
namespace tf_bridge {
namespace {

using ::tensorflow::Tensor;

// The dtypes bluefog moves, on both sides: the one table that maps them.
struct DtypeEntry {
  DataType core;
  ::tensorflow::DataType tf;
  const char* attr;  // the name an op registration's type list uses
};
constexpr DtypeEntry kDtypes[kNumDataTypes] = {
    {DataType::kUInt8, ::tensorflow::DT_UINT8, "uint8"},
    {DataType::kInt8, ::tensorflow::DT_INT8, "int8"},
    {DataType::kUInt16, ::tensorflow::DT_UINT16, "uint16"},
    {DataType::kInt16, ::tensorflow::DT_INT16, "int16"},
    {DataType::kInt32, ::tensorflow::DT_INT32, "int32"},
    {DataType::kInt64, ::tensorflow::DT_INT64, "int64"},
    {DataType::kFloat16, ::tensorflow::DT_HALF, "half"},
    {DataType::kBFloat16, ::tensorflow::DT_BFLOAT16, "bfloat16"},
    {DataType::kFloat32, ::tensorflow::DT_FLOAT, "float"},
    {DataType::kFloat64, ::tensorflow::DT_DOUBLE, "double"},
    {DataType::kBool, ::tensorflow::DT_BOOL, "bool"},
};
}  // namespace

absl::Status ToTfStatus(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return absl::OkStatus();
    case StatusCode::kInvalidArgument: return absl::InvalidArgumentError(s.message());
    case StatusCode::kPrecondition: return absl::FailedPreconditionError(s.message());
    case StatusCode::kAborted: return absl::AbortedError(s.message());
    case StatusCode::kInternal: return absl::InternalError(s.message());
  }
  return absl::UnknownError(s.message());
}

bool ToCoreType(::tensorflow::DataType dt, DataType* out) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.tf == dt) {
      *out = e.core;
      return true;
    }
  }
  return false;
}

// "T: {uint8, ...}": the dtypes the core's op rules accept for `op`.
std::string TypeAttr(OpType op) {
  std::string spec = "T: {";
  for (const DtypeEntry& e : kDtypes) {
    if (!OpAcceptsDtype(op, e.core)) continue;
    if (spec.back() != '{') spec += ", ";
    spec += e.attr;
  }
  return spec + "}";
}

// A mistake in one call's own inputs, found by the kernel: "rank R: bluefog OP of tensor
// 'NAME': what" ("rank R: bluefog OP: what" while the name is not known yet).
absl::Status KernelError(OpType op, const std::string& name, const std::string& what) {
  const int rank = Runtime::Get().info().rank;
  if (name.empty())
    return absl::InvalidArgumentError(
        Concat("rank ", rank, ": bluefog ", OpTypeName(op), ": ", what));
  return ToTfStatus(WithRank(rank, OpError(StatusCode::kInvalidArgument, op, name, what)));
}

// Inputs read as scalars or vectors must have that rank: reading a tensor of another rank as a
// scalar trips a TensorFlow CHECK, which would abort the process.
absl::Status CheckRank(const Tensor& t, int rank, const char* input, OpType op,
                       const std::string& name) {
  if (t.dims() == rank) return absl::OkStatus();
  return KernelError(op, name,
                     Concat("the ", input, " input must be a ", rank == 0 ? "scalar" : "vector",
                            ", got shape ", t.shape().DebugString()));
}

}  // namespace tf_bridge
}  // namespace bluefog
