// The quantizers of compressed collectives (csrc/compress/) as TensorFlow ops: plain CPU kernels
// that run no collective; bluefog/tensorflow/quantized.py composes them with alltoall and
// allgather. Errors carry the caller's prefix (`what`: rank, op and tensor name).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "compress/quantize.h"
#include "core/status.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bluefog {
namespace tf_bridge {
namespace {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace shape_inference = ::tensorflow::shape_inference;

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

REGISTER_OP("BluefogQuantizeInputs")
    .Input("tensors: N * float")
    .Input("residuals: M * float")
    .Output("codes: uint8")
    .Output("scales: float")
    .Output("errors: M * float")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0")
    .Attr("count: int")
    .Attr("bits: int = 8")
    .Attr("block: int = 256")
    .Attr("stochastic: bool = false")
    .Attr("seed: int = 0")
    .Attr("nonfinite_to_nan: bool = false")
    .Attr("what: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t n, m;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      for (int64_t i = 0; i < m; ++i) c->set_output(2 + i, c->input(n + i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Per-block quantization of the concatenation of tensors[i] + residuals[i] (flattened),
zero-padded to `count` values: codes (8 bits, or 4 bits two to a byte) and one scale per `block`
values (absmax / 127 or / 7). A NaN or infinity is an InvalidArgument error (with
nonfinite_to_nan: the block's scale is NaN); stochastic rounding's seed advances per run. Done
in pieces that stay in cache: no concatenated copy is made. errors[i] is tensors[i] +
residuals[i] - dequantized, in the tensor's shape (M = N, or M = 0: no residuals).
)doc");

REGISTER_OP("BluefogDequantizeOutputs")
    .Input("codes: uint8")
    .Input("scales: float")
    .Output("tensors: N * float")
    .Attr("N: int >= 1")
    .Attr("shapes: list(shape)")
    .Attr("bits: int = 8")
    .Attr("block: int = 256")
    .Attr("what: string = ''")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      std::vector<::tensorflow::PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      for (size_t i = 0; i < shapes.size(); ++i) {
        shape_inference::ShapeHandle out;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &out));
        c->set_output(static_cast<int>(i), out);
      }
      return absl::OkStatus();
    })
    .Doc(R"doc(
The first values that codes and scales stand for, split into tensors of `shapes`. A NaN scale
(a NaN or infinity in some rank's input) is an InvalidArgument error.
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

// Values per piece of the grouped ops: whole blocks, small enough to stay in cache.
int64_t PieceValues(const compress::QuantizeOptions& o) {
  return o.block * std::max<int64_t>(1, 65536 / o.block);
}

int64_t CodeOffset(int64_t start, const compress::QuantizeOptions& o) {
  return o.bits == 8 ? start : start / 2;
}

// Calls f(tensor, offset in tensor, offset in piece, length) for the parts of the
// concatenation of tensors of `sizes` that fall in [start, start + length).
template <typename F>
void ForEachPart(const std::vector<int64_t>& sizes, int64_t start, int64_t length, F&& f) {
  int64_t begin = 0;
  for (size_t t = 0; t < sizes.size() && begin < start + length; begin += sizes[t], ++t) {
    const int64_t lo = std::max(begin, start), hi = std::min(begin + sizes[t], start + length);
    if (lo < hi) f(t, lo - begin, lo - start, hi - lo);
  }
}

class QuantizeInputsKernel : public OpKernel {
 public:
  explicit QuantizeInputsKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadOptions(c, &options_));
    OP_REQUIRES_OK(c, c->GetAttr("count", &count_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList tensors, residuals;
    OP_REQUIRES_OK(ctx, ctx->input_list("tensors", &tensors));
    OP_REQUIRES_OK(ctx, ctx->input_list("residuals", &residuals));
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (int i = 0; i < tensors.size(); ++i) {
      sizes.push_back(tensors[i].NumElements());
      total += sizes.back();
      OP_REQUIRES(ctx, residuals.size() == 0 || residuals[i].shape() == tensors[i].shape(),
                  absl::InvalidArgumentError(what_ + ": quantize: residual " + std::to_string(i) +
                                             " has another shape than its tensor"));
    }
    OP_REQUIRES(
        ctx, total <= count_,
        absl::InvalidArgumentError(what_ + ": quantize: " + std::to_string(total) +
                                   " values do not fit in count " + std::to_string(count_)));
    Tensor *codes, *scales;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({compress::CodeBytes(count_, options_)}), &codes));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            1, TensorShape({compress::ScaleCount(count_, options_)}), &scales));
    OpOutputList errors;
    OP_REQUIRES_OK(ctx, ctx->output_list("errors", &errors));
    std::vector<float*> error_out;
    for (int i = 0; i < residuals.size(); ++i) {
      Tensor* e;
      OP_REQUIRES_OK(ctx, errors.allocate(i, tensors[i].shape(), &e));
      error_out.push_back(e->flat<float>().data());
    }
    compress::QuantizeOptions options = options_;
    const uint64_t seed =
        options.seed + 0x9e3779b97f4a7c15ull * calls_.fetch_add(1, std::memory_order_relaxed);
    const int64_t piece = PieceValues(options_);
    std::vector<float> x(static_cast<size_t>(std::min(piece, count_))), error(x.size());
    Guarded(ctx, what_, [&] {
      for (int64_t start = 0; start < count_; start += piece) {
        const int64_t m = std::min(piece, count_ - start);
        std::fill(x.begin(), x.begin() + m, 0.0f);
        ForEachPart(sizes, start, m, [&](size_t t, int64_t at, int64_t to, int64_t len) {
          const float* in = tensors[t].flat<float>().data() + at;
          float* out = x.data() + to;
          if (residuals.size() == 0) {
            std::copy(in, in + len, out);
          } else {
            const float* r = residuals[t].flat<float>().data() + at;
            for (int64_t i = 0; i < len; ++i) out[i] = in[i] + r[i];
          }
        });
        options.seed = seed + static_cast<uint64_t>(start);
        compress::Quantize(x.data(), m, options,
                           codes->flat<uint8_t>().data() + CodeOffset(start, options_),
                           scales->flat<float>().data() + start / options_.block,
                           error_out.empty() ? nullptr : error.data());
        if (error_out.empty()) continue;
        ForEachPart(sizes, start, m, [&](size_t t, int64_t at, int64_t to, int64_t len) {
          std::copy(error.data() + to, error.data() + to + len, error_out[t] + at);
        });
      }
    });
  }

 private:
  compress::QuantizeOptions options_;
  int64_t count_ = 0;
  std::string what_;
  std::atomic<uint64_t> calls_{0};
};

class DequantizeOutputsKernel : public OpKernel {
 public:
  explicit DequantizeOutputsKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadOptions(c, &options_));
    OP_REQUIRES_OK(c, c->GetAttr("shapes", &shapes_));
    OP_REQUIRES_OK(c, c->GetAttr("what", &what_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    const Tensor& scales = ctx->input(1);
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("tensors", &outputs));
    std::vector<int64_t> sizes;
    std::vector<float*> out;
    int64_t total = 0;
    for (size_t i = 0; i < shapes_.size(); ++i) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, outputs.allocate(static_cast<int>(i), shapes_[i], &t));
      out.push_back(t->flat<float>().data());
      sizes.push_back(t->NumElements());
      total += sizes.back();
    }
    OP_REQUIRES(ctx,
                codes.NumElements() >= compress::CodeBytes(total, options_) &&
                    scales.NumElements() >= compress::ScaleCount(total, options_),
                absl::InvalidArgumentError(what_ + ": dequantize: too few codes or scales for " +
                                           std::to_string(total) + " values"));
    const float* s = scales.flat<float>().data();
    for (int64_t b = 0; b < compress::ScaleCount(total, options_); ++b) {
      // Every rank dequantizes the same scales, so every rank fails here alike.
      OP_REQUIRES(ctx, !std::isnan(s[b]),
                  absl::InvalidArgumentError(
                      what_ + ": a NaN or an infinity in the input of some rank (compressed "
                              "allreduces need finite floats; look for a diverging loss)"));
    }
    const int64_t piece = PieceValues(options_);
    std::vector<float> x(static_cast<size_t>(std::max<int64_t>(1, std::min(piece, total))));
    Guarded(ctx, what_, [&] {
      for (int64_t start = 0; start < total; start += piece) {
        const int64_t m = std::min(piece, total - start);
        compress::Dequantize(codes.flat<uint8_t>().data() + CodeOffset(start, options_),
                             s + start / options_.block, m, options_, x.data());
        ForEachPart(sizes, start, m, [&](size_t t, int64_t at, int64_t to, int64_t len) {
          std::copy(x.data() + to, x.data() + to + len, out[t] + at);
        });
      }
    });
  }

 private:
  compress::QuantizeOptions options_;
  std::vector<TensorShape> shapes_;
  std::string what_;
};

REGISTER_KERNEL_BUILDER(Name("BluefogDequantizeSum").Device(::tensorflow::DEVICE_CPU),
                        DequantizeSumKernel);

REGISTER_KERNEL_BUILDER(Name("BluefogQuantizeInputs").Device(::tensorflow::DEVICE_CPU),
                        QuantizeInputsKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogDequantizeOutputs").Device(::tensorflow::DEVICE_CPU),
                        DequantizeOutputsKernel);

}  // namespace
}  // namespace tf_bridge
}  // namespace bluefog
