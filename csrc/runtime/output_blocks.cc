#include "runtime/output_blocks.h"

#include <cstdlib>
#include <mutex>

#include "core/free_blocks.h"

namespace bluefog {
namespace {

// Freed blocks beyond this many bytes in all go back to the system.
constexpr size_t kMaxFreeBytes = size_t{512} << 20;
constexpr size_t kPage = 4096;

class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool;  // never destroyed: tensors may outlive static destructors
    return *pool;
  }
  void* Take(size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (void* block = free_.Pop(capacity)) return block;
    }
    return std::aligned_alloc(kPage, capacity);
  }
  void Give(void* block, size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (free_.bytes() + capacity <= kMaxFreeBytes) {
        free_.Push(block, capacity);
        return;
      }
    }
    std::free(block);
  }

 private:
  std::mutex mutex_;
  FreeBlocks free_;
};

}  // namespace

OutputBlock TakeOutputBlock(size_t bytes, std::shared_ptr<SharedHeap> heap) {
  OutputBlock block;
  block.capacity = (bytes + kPage - 1) / kPage * kPage;
  if (block.capacity == 0) block.capacity = kPage;
  block.heap = std::move(heap);
  if (block.heap) block.data = block.heap->Take(block.capacity);
  if (block.data == nullptr) {
    block.heap.reset();
    block.data = Pool::Get().Take(block.capacity);
  }
  return block;
}

void GiveOutputBlock(const OutputBlock& block) {
  if (block.data == nullptr) return;
  if (block.heap) {
    block.heap->Give(block.data, block.capacity);
  } else {
    Pool::Get().Give(block.data, block.capacity);
  }
}

}  // namespace bluefog
