// Blocks of memory every rank of one host can write into: each rank's part of a shared-memory
// segment (the rounds' memfd, LocalRounds) that every rank has mapped whole. Large allreduce
// outputs are taken from here (the TF layer's output pool), so that a peer can push its
// reduced part straight into them with plain stores (the shared allreduce,
// transport/local/shared.cc). See docs/design.md, step 2 of "One request, end to end".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/free_blocks.h"

namespace bluefog {

class SharedHeap {
 public:
  // Owns the mapping at `base` (`size` parts of `part_bytes`, rank r's at r * part_bytes) and
  // unmaps it when the last holder (the transport, a tensor over one of its blocks) lets go.
  SharedHeap(void* base, size_t part_bytes, int rank, int size);
  ~SharedHeap();
  SharedHeap(const SharedHeap&) = delete;
  SharedHeap& operator=(const SharedHeap&) = delete;

  // A block of `capacity` bytes (a multiple of the page) of this rank's part: a freed one of
  // that capacity, else the part's next unused bytes; nullptr when neither is left or the heap
  // is retired.
  void* Take(size_t capacity);
  void Give(void* block, size_t capacity);
  // No blocks from now on (the transport shut down); those out stay valid until given back.
  void Retire();

  // Where [p, p + bytes) starts in this rank's part, or -1 when it is not inside the part.
  int64_t OffsetOf(const void* p, size_t bytes) const;
  char* part(int rank) const { return base_ + static_cast<size_t>(rank) * part_bytes_; }

 private:
  char* base_;
  size_t part_bytes_;
  int rank_;
  int size_;
  std::mutex mutex_;
  size_t used_ = 0;  // bytes of this rank's part handed out at least once
  bool retired_ = false;
  FreeBlocks free_;
};

}  // namespace bluefog
