// One rank's submission of one collective, and how the runtime reports back.
#pragma once

#include <functional>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace bluefog {

struct Request {
  TensorMeta meta;
  bool average = false;          // allreduce: divide the sum by the number of ranks
  const void* input = nullptr;   // meta.NumBytes() bytes, valid until `done` runs
  void* output = nullptr;        // allreduce, broadcast: same size as input, set by the caller
  // allgather: called on the background thread with the result's shape once every rank's first
  // dimension is known; returns the buffer to fill. May throw BluefogError.
  std::function<void*(const std::vector<int64_t>& shape)> allocate_output;
  // Called exactly once, on the background thread, when the request finished or failed.
  std::function<void(const Status&)> done;
};

}  // namespace bluefog
