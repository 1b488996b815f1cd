#include "core/types.h"

#include <sstream>

namespace bluefog {

size_t ElementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool: return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kNeighborAllreduce: return "neighbor_allreduce";
    case OpType::kNeighborAllgather: return "neighbor_allgather";
    case OpType::kNeighborAllgatherGrad: return "neighbor_allgather gradient";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kJoin: return "join";
    case OpType::kAddProcessSet: return "add_process_set";
    case OpType::kRemoveProcessSet: return "remove_process_set";
    case OpType::kWinCreate: return "win_create";
    case OpType::kWinFree: return "win_free";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
  }
  return "unknown";
}

bool IsValidReduceOp(int value) { return value >= 0 && value < kNumReduceOps; }
bool IsValidDataType(int value) { return value >= 0 && value < kNumDataTypes; }
bool IsValidOpType(int value) { return value >= 0 && value < kNumOpTypes; }
bool IsNeighborOp(OpType op) {
  return op == OpType::kNeighborAllreduce || op == OpType::kNeighborAllgather ||
         op == OpType::kNeighborAllgatherGrad;
}

int64_t TensorMeta::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

bool GroupBase(const std::string& name, std::string* base, int64_t* index) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot + 1 == name.size() || name.size() - dot > 10) return false;
  int64_t i = 0;
  for (size_t k = dot + 1; k < name.size(); ++k) {
    if (name[k] < '0' || name[k] > '9') return false;
    i = i * 10 + (name[k] - '0');
  }
  *base = name.substr(0, dot);
  *index = i;
  return true;
}

}  // namespace bluefog
