// Freed blocks kept by their capacity, handed out again for the same capacity (last freed,
// first out: the likeliest to be in cache). Not synchronized: its owner holds its own lock.
// Used by the TF layer's output pool and by the shared heap (mpi/shared_heap.h).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace bluefog {

class FreeBlocks {
 public:
  // A freed block of exactly `capacity` bytes, or nullptr.
  void* Pop(size_t capacity) {
    auto it = free_.find(capacity);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* block = it->second.back();
    it->second.pop_back();
    bytes_ -= capacity;
    return block;
  }
  void Push(void* block, size_t capacity) {
    free_[capacity].push_back(block);
    bytes_ += capacity;
  }
  size_t bytes() const { return bytes_; }  // held in all

 private:
  std::map<size_t, std::vector<void*>> free_;
  size_t bytes_ = 0;
};

}  // namespace bluefog
