// The op registrations: signatures, shape functions (which refuse wrongly shaped side inputs
// when a graph is built) and docs. Type lists come from the core's op rules (TypeAttr).
#include "core/op_rules.h"
#include "tensorflow/bridge.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bluefog {
namespace tf_bridge {
namespace {

namespace shape_inference = ::tensorflow::shape_inference;

// Scalar and vector inputs (the name, ranks, weights) checked where TensorFlow infers shapes,
// so graph construction rejects them before a kernel would; the kernels check again (eager
// mode runs no shape functions).
absl::Status CheckSideInputs(shape_inference::InferenceContext* c, int name_index) {
  shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(name_index), 0, &unused));
  return absl::OkStatus();
}

// Neighbor ops: name, send_ranks, recv_ranks, then `scalars` scalars and `vectors` vectors.
absl::Status CheckNeighborInputs(shape_inference::InferenceContext* c, int scalars, int vectors) {
  shape_inference::ShapeHandle unused;
  TF_RETURN_IF_ERROR(CheckSideInputs(c, 1));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
  for (int i = 0; i < scalars; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(4 + i), 0, &unused));
  for (int i = 0; i < vectors; ++i)
    TF_RETURN_IF_ERROR(c->WithRank(c->input(4 + scalars + i), 1, &unused));
  return absl::OkStatus();
}

absl::Status UnchangedShape(shape_inference::InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckSideInputs(c, 1));
  return shape_inference::UnchangedShape(c);
}

// Allgathers: the input's shape with an unknown dimension 0.
absl::Status ConcatenatedShape(shape_inference::InferenceContext* c) {
  if (c->num_inputs() >= 4) {  // neighbor_allgather: tensor, name, send_ranks, recv_ranks
    TF_RETURN_IF_ERROR(CheckNeighborInputs(c, 0, 0));
  } else {
    TF_RETURN_IF_ERROR(CheckSideInputs(c, 1));
  }
  shape_inference::ShapeHandle output;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &output));
  TF_RETURN_IF_ERROR(c->ReplaceDim(output, 0, c->UnknownDim(), &output));
  c->set_output(0, output);
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("BluefogAllreduce")
    .Attr(TypeAttr(OpType::kAllreduce))
    .Attr("process_set_id: int = 0")
    .Attr("average: bool")
    .Attr("reduce_op: {'sum', 'min', 'max', 'product'} = 'sum'")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("eager_inline: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(UnchangedShape)
    .Doc(
        "Sum (or average, min, max, product) of `tensor` over all ranks; every rank passes "
        "the same shape.");

REGISTER_OP("BluefogGroupedAllreduce")
    .Attr(TypeAttr(OpType::kAllreduce))
    .Attr("process_set_id: int = 0")
    .Attr("N: int >= 0")
    .Attr("average: bool")
    .Attr("reduce_op: {'sum', 'min', 'max', 'product'} = 'sum'")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Input("tensors: N * T")
    .Input("tensor_name: string")
    .Output("outputs: N * T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckSideInputs(c, c->num_inputs() - 1));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc("Allreduce of each of N tensors of one dtype, named `tensor_name`.0 ... .N-1.");

REGISTER_OP("BluefogReducescatter")
    .Attr(TypeAttr(OpType::kReducescatter))
    .Attr("process_set_id: int = 0")
    .Attr("average: bool")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(ConcatenatedShape)
    .Doc(
        "Sum (or average) of `tensor` over all ranks, of which each rank keeps its slice of "
        "dimension 0: rows / size rows, one more on the first rows % size ranks.");

REGISTER_OP("BluefogGroupedReducescatter")
    .Attr(TypeAttr(OpType::kReducescatter))
    .Attr("process_set_id: int = 0")
    .Attr("N: int >= 0")
    .Attr("average: bool")
    .Input("tensors: N * T")
    .Input("tensor_name: string")
    .Output("outputs: N * T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckSideInputs(c, c->num_inputs() - 1));
      for (int i = 0; i < c->num_outputs(); ++i) {
        shape_inference::ShapeHandle output;
        TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &output));
        TF_RETURN_IF_ERROR(c->ReplaceDim(output, 0, c->UnknownDim(), &output));
        c->set_output(i, output);
      }
      return absl::OkStatus();
    })
    .Doc("Reducescatter of each of N tensors of one dtype, named `tensor_name`.0 ... .N-1.");

REGISTER_OP("BluefogAlltoall")
    .Attr(TypeAttr(OpType::kAlltoall))
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("splits: int64")
    .Output("output: T")
    .Output("received_splits: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
      TF_RETURN_IF_ERROR(ConcatenatedShape(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(
        "Rank r sends rows [offset_j, offset_j + splits[j]) to rank j and returns what every "
        "rank sent it, in rank order, and how many rows each sent.");

REGISTER_OP("BluefogJoin")
    .Input("tensor_name: string")
    .Output("last_joined: int32")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckSideInputs(c, 0));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(
        "Returns once every rank has joined; until then this rank takes part in the others' "
        "allreduces (with zeros) and allgathers (with no rows). Output: the last rank to join.");

REGISTER_OP("BluefogAllgather")
    .Attr(TypeAttr(OpType::kAllgather))
    .Attr("process_set_id: int = 0")
    .Attr("eager_inline: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(ConcatenatedShape)
    .Doc("Concatenation along dimension 0 of `tensor` from every rank, in rank order.");

REGISTER_OP("BluefogNeighborAllreduce")
    .Attr(TypeAttr(OpType::kNeighborAllreduce))
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("send_ranks: int32")
    .Input("recv_ranks: int32")
    .Input("self_weight: double")
    .Input("recv_weights: double")
    .Input("send_weights: double")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(CheckNeighborInputs(c, 1, 2));
      return shape_inference::UnchangedShape(c);
    })
    .Doc("self_weight * tensor + sum of recv_weights[k] * the tensor of recv_ranks[k].");

REGISTER_OP("BluefogNeighborAllgather")
    .Attr(TypeAttr(OpType::kNeighborAllgather))
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("send_ranks: int32")
    .Input("recv_ranks: int32")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(ConcatenatedShape)
    .Doc("Concatenation along dimension 0 of the tensors of recv_ranks, in that order.");

REGISTER_OP("BluefogNeighborAllgatherGrad")
    .Attr(TypeAttr(OpType::kNeighborAllgatherGrad))
    .Input("grad: T")
    .Input("tensor_name: string")
    .Input("send_ranks: int32")
    .Input("recv_ranks: int32")
    .Input("first_dim: int64")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle output;
      shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(CheckNeighborInputs(c, 1, 0));
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &output));
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &rows));
      TF_RETURN_IF_ERROR(c->ReplaceDim(output, 0, rows, &output));
      c->set_output(0, output);
      return absl::OkStatus();
    })
    .Doc(
        "Gradient of BluefogNeighborAllgather: block k of `grad` (sized like send_ranks[k]'s "
        "first_dim) goes to send_ranks[k]; the output sums the blocks from recv_ranks.");

REGISTER_OP("BluefogBroadcast")
    .Attr(TypeAttr(OpType::kBroadcast))
    .Attr("process_set_id: int = 0")
    .Attr("root_rank: int")
    .Attr("eager_inline: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(UnchangedShape)
    .Doc("The value of `tensor` on `root_rank`, on every rank.");

}  // namespace tf_bridge
}  // namespace bluefog
