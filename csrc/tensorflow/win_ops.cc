// The window ops' registrations (bf.win_*). Kernels in win_kernels.cc; how windows work in
// runtime/window_service.h and docs/windows.md.
#include "core/op_rules.h"
#include "tensorflow/bridge.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace bluefog {
namespace tf_bridge {
namespace {

namespace shape_inference = ::tensorflow::shape_inference;

// Checks that inputs [first, first + ranks.size()) have the given ranks (0: scalar, 1: vector).
absl::Status InputRanks(shape_inference::InferenceContext* c, int first,
                        std::initializer_list<int> ranks) {
  shape_inference::ShapeHandle unused;
  int i = first;
  for (int r : ranks) TF_RETURN_IF_ERROR(c->WithRank(c->input(i++), r, &unused));
  return absl::OkStatus();
}

absl::Status ScalarOutput(shape_inference::InferenceContext* c) {
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("BluefogWinCreate")
    .Attr(TypeAttr(OpType::kWinCreate))
    .Attr("zero_init: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("in_ranks: int32")
    .Input("out_ranks: int32")
    .Output("window_id: int32")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 1, {0, 1, 1}));
      return ScalarOutput(c);
    })
    .Doc(
        "Collective: creates window `tensor_name` with this rank's value and one receive "
        "buffer per in-neighbour (in_ranks).");

REGISTER_OP("BluefogWinFree")
    .Input("tensor_name: string")
    .Output("window_id: int32")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0}));
      return ScalarOutput(c);
    })
    .Doc("Collective: frees window `tensor_name` on every rank.");

REGISTER_OP("BluefogWinPut")
    .Attr(TypeAttr(OpType::kWinCreate))
    .Attr("accumulate: bool = false")
    .Attr("require_mutex: bool = false")
    .Attr("with_p: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("dst_ranks: int32")
    .Input("dst_weights: double")
    .Input("self_weight: double")
    .Output("handle: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 1, {0, 1, 1, 0}));
      return ScalarOutput(c);
    })
    .Doc(
        "Starts writing (or adding) dst_weights[k] * tensor into this rank's buffer at "
        "dst_ranks[k]; returns the handle to wait for.");

REGISTER_OP("BluefogWinGet")
    .Attr("require_mutex: bool = false")
    .Input("tensor_name: string")
    .Input("src_ranks: int32")
    .Input("src_weights: double")
    .Output("handle: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0, 1, 1}));
      return ScalarOutput(c);
    })
    .Doc("Starts reading src_weights[k] * the value of src_ranks[k] into its buffer here.");

REGISTER_OP("BluefogWinMutex")
    .Attr("lock: bool")
    .Input("tensor_name: string")
    .Input("ranks: int32")
    .Output("handle: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0, 1}));
      return ScalarOutput(c);
    })
    .Doc("Starts locking (or unlocking) the window's mutex on each of `ranks`.");

REGISTER_OP("BluefogWinWait")
    .Input("handle: int64")
    .Output("done: bool")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0}));
      return ScalarOutput(c);
    })
    .Doc("Waits until the window operation `handle` finished; fails with its error.");

REGISTER_OP("BluefogWinPoll")
    .Input("handle: int64")
    .Output("done: bool")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0}));
      return ScalarOutput(c);
    })
    .Doc("Whether the window operation `handle` finished.");

REGISTER_OP("BluefogWinUpdate")
    .Attr(TypeAttr(OpType::kWinCreate))
    .Attr("reset: bool = false")
    .Attr("publish: bool = true")
    .Attr("with_p: bool = false")
    .Input("tensor: T")
    .Input("tensor_name: string")
    .Input("self_weight: double")
    .Input("ranks: int32")
    .Input("weights: double")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 1, {0, 0, 1, 1}));
      return shape_inference::UnchangedShape(c);
    })
    .Doc("self_weight * tensor + sum of weights[k] * the buffer of ranks[k].");

REGISTER_OP("BluefogWinVersion")
    .Input("tensor_name: string")
    .Output("ranks: int32")
    .Output("versions: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0}));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("The in-neighbours and how many writes each one's buffer saw since it was last read.");

REGISTER_OP("BluefogWinAssociatedP")
    .Input("tensor_name: string")
    .Output("p: double")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      TF_RETURN_IF_ERROR(InputRanks(c, 0, {0}));
      return ScalarOutput(c);
    })
    .Doc("The push-sum weight associated with this rank's value in the window.");

}  // namespace tf_bridge
}  // namespace bluefog
