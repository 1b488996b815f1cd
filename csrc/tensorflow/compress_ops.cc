// The quantizers of compressed collectives (csrc/compress/) as TensorFlow ops: plain CPU kernels
// that run no collective; bluefog/tensorflow/quantized.py composes them with alltoall and
// allgather. Errors carry the caller's prefix (`what`: rank, op and tensor name).
#include <atomic>
#include <string>

#include "compress/quantize.h"
#include "core/status.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bluefog {
namespace tf_bridge {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace shape_inference = ::tensorflow::shape_inference;

absl::Status VectorOutputs(shape_inference::InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

REGISTER_OP("BluefogQuantize")
    .Input("tensor: float")
    .Output("codes: uint8")
    .Output("scales: float")
    .Output("error: float")
    .Attr("bits: int = 8")
    .Attr("block: int = 256")
    .Attr("stochastic: bool = false")
    .Attr("seed: int = 0")
    .Attr("nonfinite_to_nan: bool = false")
    .Attr("what: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(VectorOutputs(c));
      c->set_output(2, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per-block quantization of a float32 tensor (flattened): codes (8 bits, or 4 bits two to a
byte), one scale per `block` values (absmax / 127 or / 7), and error = tensor - dequantized.
A NaN or infinity is an InvalidArgument error (with nonfinite_to_nan: the block's scale is
NaN). Stochastic rounding's seed advances per run.
)doc");

REGISTER_OP("BluefogDequantize")
    .Input("codes: uint8")
    .Input("scales: float")
    .Output("tensor: float")
    .Attr("bits: int = 8")
    .Attr("block: int = 256")
    .Attr("count: int")
    .Attr("what: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t count;
      TF_RETURN_IF_ERROR(c->GetAttr("count", &count));
      c->set_output(0, c->Vector(count));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The `count` float32 values that BluefogQuantize's codes and scales stand for.
)doc");

REGISTER_OP("BluefogDequantizeSum")
    .Input("codes: uint8")
    .Input("scales: float")
    .Output("sum: float")
    .Attr("bits: int = 8")
    .Attr("block: int = 256")
    .Attr("factor: float = 1.0")
    .Attr("what: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
factor * the sum over rows of the dequantized rows: codes [sources, bytes] and scales
[sources, scales per row], each row a whole number of blocks (bytes * 8 / bits values).
)doc");

// The attributes as options, checked.
absl::Status ReadOptions(OpKernelConstruction* c, compress::QuantizeOptions* o) {
  int64_t bits = 8;
  TF_RETURN_IF_ERROR(c->GetAttr("bits", &bits));
  TF_RETURN_IF_ERROR(c->GetAttr("block", &o->block));
  o->bits = static_cast<int>(bits);
  if (c->HasAttr("stochastic")) TF_RETURN_IF_ERROR(c->GetAttr("stochastic", &o->stochastic));
  if (c->HasAttr("nonfinite_to_nan")) {
    TF_RETURN_IF_ERROR(c->GetAttr("nonfinite_to_nan", &o->nonfinite_to_nan));
  }
  if (c->HasAttr("seed")) {
    int64_t seed = 0;
    TF_RETURN_IF_ERROR(c->GetAttr("seed", &seed));
    o->seed = static_cast<uint64_t>(seed);
  }
  try {
    compress::CheckOptions(*o);
  } catch (const BluefogError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

// Runs `f`, turning a core error into the kernel's status with the caller's prefix.
template <typename F>
void Guarded(OpKernelContext* ctx, const std::string& what, F&& f) {
  try {
    f();
  } catch (const BluefogError& e) {
    std::string message = what.empty() ? e.what() : what + ": " + e.what();
    ctx->SetStatus(e.code() == StatusCode::kInvalidArgument ? absl::InvalidArgumentError(message)
                                                            : absl::InternalError(message));
  }
}

class QuantizeKernel : public OpKernel {
 public:
  explicit QuantizeKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadOptions(c, &options_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const int64_t n = input.NumElements();
    Tensor *codes, *scales, *error;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({compress::CodeBytes(n, options_)}), &codes));
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(1, TensorShape({compress::ScaleCount(n, options_)}), &scales));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, input.shape(), &error));
    // Stochastic rounding draws new noise on every run: the seed advances per call.
    compress::QuantizeOptions options = options_;
    options.seed += 0x9e3779b97f4a7c15ull * calls_.fetch_add(1, std::memory_order_relaxed);
    Guarded(ctx, what_, [&] {
      compress::Quantize(input.flat<float>().data(), n, options, codes->flat<uint8_t>().data(),
                         scales->flat<float>().data(), error->flat<float>().data());
    });
  }

 private:
  compress::QuantizeOptions options_;
  std::string what_;
  std::atomic<uint64_t> calls_{0};
};

class DequantizeKernel : public OpKernel {
 public:
  explicit DequantizeKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadOptions(c, &options_));
    OP_REQUIRES_OK(c, c->GetAttr("count", &count_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    const Tensor& scales = ctx->input(1);
    OP_REQUIRES(
        ctx,
        codes.NumElements() == compress::CodeBytes(count_, options_) &&
            scales.NumElements() == compress::ScaleCount(count_, options_),
        absl::InvalidArgumentError(
            what_ + ": dequantize: " + std::to_string(count_) + " values need " +
            std::to_string(compress::CodeBytes(count_, options_)) + " code bytes and " +
            std::to_string(compress::ScaleCount(count_, options_)) + " scales, got " +
            std::to_string(codes.NumElements()) + " and " + std::to_string(scales.NumElements())));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({count_}), &out));
    Guarded(ctx, what_, [&] {
      compress::Dequantize(codes.flat<uint8_t>().data(), scales.flat<float>().data(), count_,
                           options_, out->flat<float>().data());
    });
  }

 private:
  compress::QuantizeOptions options_;
  int64_t count_ = 0;
  std::string what_;
};

class DequantizeSumKernel : public OpKernel {
 public:
  explicit DequantizeSumKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadOptions(c, &options_));
    OP_REQUIRES_OK(c, c->GetAttr("factor", &factor_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    const Tensor& scales = ctx->input(1);
    OP_REQUIRES(ctx,
                codes.dims() == 2 && scales.dims() == 2 && codes.dim_size(0) >= 1 &&
                    codes.dim_size(0) == scales.dim_size(0),
                absl::InvalidArgumentError(what_ + ": dequantize-sum: codes and scales must be "
                                                   "[sources, row] with the same sources"));
    const int64_t sources = codes.dim_size(0), row = codes.dim_size(1);
    const int64_t count = options_.bits == 8 ? row : 2 * row;
    OP_REQUIRES(ctx, scales.dim_size(1) == compress::ScaleCount(count, options_),
                absl::InvalidArgumentError(
                    what_ + ": dequantize-sum: rows of " + std::to_string(count) + " values need " +
                    std::to_string(compress::ScaleCount(count, options_)) + " scales each, got " +
                    std::to_string(scales.dim_size(1))));
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({count}), &out));
    Guarded(ctx, what_, [&] {
      compress::DequantizeSum(codes.flat<uint8_t>().data(), row, scales.flat<float>().data(),
                              scales.dim_size(1), static_cast<int>(sources), count, options_,
                              factor_, out->flat<float>().data());
    });
  }

 private:
  compress::QuantizeOptions options_;
  float factor_ = 1.0f;
  std::string what_;
};

REGISTER_KERNEL_BUILDER(Name("BluefogQuantize").Device(::tensorflow::DEVICE_CPU), QuantizeKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogDequantize").Device(::tensorflow::DEVICE_CPU),
                        DequantizeKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogDequantizeSum").Device(::tensorflow::DEVICE_CPU),
                        DequantizeSumKernel);

}  // namespace
}  // namespace tf_bridge
}  // namespace bluefog
