// Data types, op kinds and tensor metadata shared by every layer of the core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bluefog {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8,
  kUInt16,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};
constexpr int kNumDataTypes = 11;

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
};
constexpr int kNumOpTypes = 3;

size_t ElementSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* OpTypeName(OpType op);
bool IsValidDataType(int value);
bool IsValidOpType(int value);
// Whether an elementwise sum is defined for the dtype (bool is not: it would silently saturate).
bool SupportsSum(DataType dtype);

// What a rank announces about one request; every rank must agree on it (up to the rules of the op).
struct TensorMeta {
  std::string name;
  OpType op = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  int32_t root_rank = -1;  // broadcast only; -1 otherwise
  std::vector<int64_t> shape;

  int64_t NumElements() const;
  size_t NumBytes() const { return static_cast<size_t>(NumElements()) * ElementSize(dtype); }
};

std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace bluefog
