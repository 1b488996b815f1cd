#include "tensorflow/output_pool.h"

#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/free_blocks.h"
#include "mpi/shared_heap.h"
#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"

namespace bluefog {
namespace tf_bridge {
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

// A block of the shared heap when one is running and has room (peers can then push into the
// output: MpiTransport::SharedAllreduce), else of the pool.
class PooledBuffer : public ::tensorflow::TensorBuffer {
 public:
  PooledBuffer(void* data, size_t bytes, size_t capacity, std::shared_ptr<SharedHeap> heap)
      : TensorBuffer(data), bytes_(bytes), capacity_(capacity), heap_(std::move(heap)) {}
  ~PooledBuffer() override {
    if (heap_) {
      heap_->Give(data(), capacity_);
    } else {
      Pool::Get().Give(data(), capacity_);
    }
  }
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(::tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocated_bytes(static_cast<int64_t>(capacity_));
    proto->set_allocator_name(heap_ ? "bluefog_shared_heap" : "bluefog_output_pool");
  }

 private:
  size_t bytes_;
  size_t capacity_;
  std::shared_ptr<SharedHeap> heap_;  // keeps the heap mapped while this block is out
};

}  // namespace

absl::Status AllocatePooledOutput(::tensorflow::OpKernelContext* ctx, int index,
                                  ::tensorflow::DataType dtype,
                                  const ::tensorflow::TensorShape& shape,
                                  ::tensorflow::Tensor** output) {
  const size_t bytes =
      static_cast<size_t>(shape.num_elements()) * ::tensorflow::DataTypeSize(dtype);
  const size_t capacity = (bytes + kPage - 1) / kPage * kPage;
  std::shared_ptr<SharedHeap> heap = SharedHeap::Current();
  void* block = heap ? heap->Take(capacity) : nullptr;
  if (block == nullptr) {
    heap.reset();
    block = Pool::Get().Take(capacity);
  }
  if (block == nullptr)
    return absl::ResourceExhaustedError("bluefog: could not allocate an output of " +
                                        std::to_string(bytes) + " bytes");
  auto* buffer = new PooledBuffer(block, bytes, capacity, std::move(heap));
  ::tensorflow::Tensor tensor(dtype, shape, buffer);
  buffer->Unref();  // the tensor holds its own reference
  ctx->set_output(index, tensor);
  *output = ctx->mutable_output(index);
  return absl::OkStatus();
}

}  // namespace tf_bridge
}  // namespace bluefog
