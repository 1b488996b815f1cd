#include "transport/shared_heap.h"

#include <sys/mman.h>

namespace bluefog {
SharedHeap::SharedHeap(void* base, size_t part_bytes, int rank, int size)
    : base_(static_cast<char*>(base)), part_bytes_(part_bytes), rank_(rank), size_(size) {}

SharedHeap::~SharedHeap() { munmap(base_, part_bytes_ * static_cast<size_t>(size_)); }

void* SharedHeap::Take(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (retired_) return nullptr;
  if (void* block = free_.Pop(capacity)) return block;
  // Blocks are never merged or split: a training loop asks for the same few sizes every step,
  // and an unusual size that finds no room is simply not shared (the pool allocates it).
  if (part_bytes_ - used_ < capacity) return nullptr;
  void* block = part(rank_) + used_;
  used_ += capacity;
  return block;
}

void SharedHeap::Give(void* block, size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.Push(block, capacity);
}

void SharedHeap::Retire() {
  std::lock_guard<std::mutex> lock(mutex_);
  retired_ = true;
}

int64_t SharedHeap::OffsetOf(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  const char* mine = part(rank_);
  if (c < mine || c > mine + part_bytes_ || bytes > static_cast<size_t>(mine + part_bytes_ - c))
    return -1;
  return c - mine;
}

}  // namespace bluefog
