// Memory for large outputs that is already touched: a block of the shared heap when one is
// running and has room (peers can then push their reduced parts straight into it:
// the shared allreduce, transport/local/shared.cc), else of a private pool of freed blocks.
// TensorFlow's CPU allocator takes such outputs from malloc, which maps fresh pages for some sizes
// on every call (64 MiB always, 4-16 MiB in some launches; page faults cost ~0.3-1 us each on the
// development VM). Used by the TF layer's output pool (tensorflow/output_pool.h) and by the Python
// layer's eager allreduces (tensorflow/eager_calls.cc). See docs/design.md, step 2 of "One
// request, end to end".
#pragma once

#include <cstddef>
#include <memory>

#include "transport/shared_heap.h"

namespace bluefog {

// Outputs of at least this many bytes come from these blocks.
constexpr size_t kPooledOutputBytes = size_t{1} << 20;

struct OutputBlock {
  void* data = nullptr;              // nullptr: no memory could be had
  size_t capacity = 0;               // the bytes asked for, rounded up to the page
  std::shared_ptr<SharedHeap> heap;  // the heap it is from (kept mapped while it is out), or none
};

// A block of at least `bytes` bytes: from `heap` (the running job's shared heap,
// Runtime::shared_heap(); may be nullptr) when it has room, else a freed one of the same
// page-rounded capacity if there is one, else a new one.
OutputBlock TakeOutputBlock(size_t bytes, std::shared_ptr<SharedHeap> heap);
// Back to where it came from; the private pool keeps at most 512 MiB of freed blocks.
void GiveOutputBlock(const OutputBlock& block);

}  // namespace bluefog
