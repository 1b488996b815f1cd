// Gloo's ring allreduce over a connected context, in place, reducing with bluefog's kernels
// (core/reduce_kernels.h) so every dtype and op reduces as on MPI: the Gloo backend's own
// algorithm and the data plane's (data_plane.cc).
#pragma once

#include <cstdint>
#include <memory>

#include <gloo/allreduce.h>

#include "core/reduce_kernels.h"
#include "core/types.h"

namespace bluefog {

// Gloo splits a buffer into segments by whole elements of T, so T must have the dtype's size.
template <typename T>
void GlooAllreduceAs(const std::shared_ptr<gloo::Context>& context, void* data, int64_t count,
                     DataType dtype, ReduceOp op) {
  gloo::AllreduceOptions opts(context);
  opts.setOutput(static_cast<T*>(data), static_cast<size_t>(count));
  opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t n) {
    ReduceOf(c, a, b, static_cast<int64_t>(n), dtype, op);
  });
  gloo::allreduce(opts);
}

inline void GlooAllreduce(const std::shared_ptr<gloo::Context>& context, void* data, int64_t count,
                          DataType dtype, ReduceOp op) {
  switch (ElementSize(dtype)) {
    case 1: GlooAllreduceAs<uint8_t>(context, data, count, dtype, op); break;
    case 2: GlooAllreduceAs<uint16_t>(context, data, count, dtype, op); break;
    case 4: GlooAllreduceAs<uint32_t>(context, data, count, dtype, op); break;
    default: GlooAllreduceAs<uint64_t>(context, data, count, dtype, op); break;
  }
}

}  // namespace bluefog
