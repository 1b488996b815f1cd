// The TensorFlow bridge's shared pieces: the one table between TensorFlow's and the core's
// dtypes, status conversion, and the checks every kernel makes on its inputs. The bridge
// (bridge.cc, ops.cc, kernels.cc) is the only C++ that includes TensorFlow headers.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace bluefog {
namespace tf_bridge {

absl::Status ToTfStatus(const Status& s);
// False for a TensorFlow dtype bluefog does not move.
bool ToCoreType(::tensorflow::DataType dt, DataType* out);
// "T: {uint8, ...}": the dtypes the core's op rules accept for `op`, for an op registration.
std::string TypeAttr(OpType op);
// A mistake in one call's own inputs, found by the kernel: "rank R: bluefog OP of tensor
// 'NAME': what" ("rank R: bluefog OP: what" while the name is not known yet).
absl::Status KernelError(OpType op, const std::string& name, const std::string& what);
// Inputs read as scalars or vectors must have that rank: reading a tensor of another rank as a
// scalar trips a TensorFlow CHECK, which would abort the process.
absl::Status CheckRank(const ::tensorflow::Tensor& t, int rank, const char* input, OpType op,
                       const std::string& name);

template <typename T>
std::vector<T> VectorOf(const ::tensorflow::Tensor& t) {
  auto flat = t.flat<T>();
  return std::vector<T>(flat.data(), flat.data() + flat.size());
}

inline char* DataOf(::tensorflow::Tensor* t) { return const_cast<char*>(t->tensor_data().data()); }

}  // namespace tf_bridge
}  // namespace bluefog
