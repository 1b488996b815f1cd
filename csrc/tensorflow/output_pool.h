// Large allreduce outputs as tensors over bluefog's output blocks (core/output_blocks.h): the
// shared heap's when it has room, else a private pool's, already touched either way. See
// docs/design.md.
#pragma once

#include "runtime/output_blocks.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace bluefog {
namespace tf_bridge {

// Makes `ctx`'s output `index` a tensor of `dtype` and `shape` over an output block (a freed
// block of the same page-rounded size if there is one, else a new one).
absl::Status AllocatePooledOutput(::tensorflow::OpKernelContext* ctx, int index,
                                  ::tensorflow::DataType dtype,
                                  const ::tensorflow::TensorShape& shape,
                                  ::tensorflow::Tensor** output);

}  // namespace tf_bridge
}  // namespace bluefog
