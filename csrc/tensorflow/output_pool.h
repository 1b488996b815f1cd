// Large allreduce outputs from blocks bluefog keeps: TensorFlow's CPU allocator takes them
// from malloc, which maps fresh pages for some sizes on every call (64 MiB always, 4-16 MiB in
// some launches; page faults cost ~0.3-1 us each on the development VM), while a block that
// returns here when TensorFlow drops the tensor is reused already touched. See docs/design.md.
#pragma once

#include <cstddef>

#include "tensorflow/core/framework/op_kernel.h"

namespace bluefog {
namespace tf_bridge {

// Outputs of at least this many bytes come from the pool.
constexpr size_t kPooledOutputBytes = size_t{1} << 20;

// Makes `ctx`'s output `index` a tensor of `dtype` and `shape` over a pooled block (a freed block
// of the same page-rounded size if there is one, else a new one).
absl::Status AllocatePooledOutput(::tensorflow::OpKernelContext* ctx, int index,
                                  ::tensorflow::DataType dtype,
                                  const ::tensorflow::TensorShape& shape,
                                  ::tensorflow::Tensor** output);

}  // namespace tf_bridge
}  // namespace bluefog
