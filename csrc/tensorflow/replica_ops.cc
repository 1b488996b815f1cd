// BluefogReplicaRecords: what check_replicas (bluefog/tensorflow/replicas.py) allgathers: one
// row of int64 per input tensor, computed locally, no communication. Registration and kernel
// together: the op is small and nothing else uses it.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/fingerprint.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"

namespace bluefog {
namespace tf_bridge {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// A row: the dtype (TensorFlow's DataType value), the number of dimensions, the number of
// elements, a fingerprint of the whole shape, the fingerprint of the bytes, then the first
// kShownDims dimensions (0 past the last) for error messages. replicas.py reads the same layout.
constexpr int kShownDims = 7;
constexpr int kRowWidth = 5 + kShownDims;

int64_t AsInt64(uint64_t x) {
  int64_t out;
  static_assert(sizeof(out) == sizeof(x), "64-bit");
  std::memcpy(&out, &x, sizeof(out));
  return out;
}

class ReplicaRecordsKernel : public OpKernel {
 public:
  explicit ReplicaRecordsKernel(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const int n = ctx->num_inputs();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, kRowWidth}), &out));
    auto rows = out->matrix<int64_t>();
    for (int i = 0; i < n; ++i) {
      const Tensor& t = ctx->input(i);
      OP_REQUIRES(ctx, ::tensorflow::DataTypeCanUseMemcpy(t.dtype()),
                  absl::InvalidArgumentError(
                      "bluefog check_replicas: tensor " + std::to_string(i) + " has dtype " +
                      ::tensorflow::DataTypeString(t.dtype()) +
                      ", which has no fixed byte layout to compare; pass numeric or bool "
                      "variables only"));
      std::vector<int64_t> dims;
      for (int d = 0; d < t.dims(); ++d) dims.push_back(t.dim_size(d));
      rows(i, 0) = static_cast<int64_t>(t.dtype());
      rows(i, 1) = t.dims();
      rows(i, 2) = t.NumElements();
      rows(i, 3) = AsInt64(Fingerprint64(dims.data(), dims.size() * sizeof(int64_t)));
      const auto bytes = t.tensor_data();
      rows(i, 4) = AsInt64(Fingerprint64(bytes.data(), bytes.size()));
      for (int d = 0; d < kShownDims; ++d)
        rows(i, 5 + d) = d < static_cast<int>(dims.size()) ? dims[d] : 0;
    }
  }
};

}  // namespace

REGISTER_OP("BluefogReplicaRecords")
    .Attr("T: list(type) >= 0")
    .Input("tensors: T")
    .Output("records: int64")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Matrix(c->num_inputs(), kRowWidth));
      return absl::OkStatus();
    })
    .Doc(
        "One row per input, computed locally: dtype, number of dimensions, number of elements, "
        "a fingerprint of the shape, a 64-bit fingerprint of the bytes, the first 7 "
        "dimensions.");

REGISTER_KERNEL_BUILDER(Name("BluefogReplicaRecords").Device(::tensorflow::DEVICE_CPU),
                        ReplicaRecordsKernel);

}  // namespace tf_bridge
}  // namespace bluefog
