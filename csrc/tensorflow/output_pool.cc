#include "tensorflow/output_pool.h"

#include <string>
#include <utility>

#include "tensorflow/core/framework/allocation_description.pb.h"
#include "tensorflow/core/framework/tensor.h"

#include "runtime/runtime.h"

namespace bluefog {
namespace tf_bridge {
namespace {

// A tensor's buffer over an output block, which goes back when TensorFlow drops the tensor.
class PooledBuffer : public ::tensorflow::TensorBuffer {
 public:
  PooledBuffer(OutputBlock block, size_t bytes)
      : TensorBuffer(block.data), block_(std::move(block)), bytes_(bytes) {}
  ~PooledBuffer() override { GiveOutputBlock(block_); }
  size_t size() const override { return bytes_; }
  TensorBuffer* root_buffer() override { return this; }
  void FillAllocationDescription(::tensorflow::AllocationDescription* proto) const override {
    proto->set_requested_bytes(static_cast<int64_t>(bytes_));
    proto->set_allocated_bytes(static_cast<int64_t>(block_.capacity));
    proto->set_allocator_name(block_.heap ? "bluefog_shared_heap" : "bluefog_output_pool");
  }

 private:
  OutputBlock block_;  // its heap stays mapped while this buffer lives
  size_t bytes_;
};

}  // namespace

absl::Status AllocatePooledOutput(::tensorflow::OpKernelContext* ctx, int index,
                                  ::tensorflow::DataType dtype,
                                  const ::tensorflow::TensorShape& shape,
                                  ::tensorflow::Tensor** output) {
  const size_t bytes =
      static_cast<size_t>(shape.num_elements()) * ::tensorflow::DataTypeSize(dtype);
  OutputBlock block = TakeOutputBlock(bytes, Runtime::Get().shared_heap());
  if (block.data == nullptr)
    return absl::ResourceExhaustedError("bluefog: could not allocate an output of " +
                                        std::to_string(bytes) + " bytes");
  auto* buffer = new PooledBuffer(std::move(block), bytes);
  ::tensorflow::Tensor tensor(dtype, shape, buffer);
  buffer->Unref();  // the tensor holds its own reference
  ctx->set_output(index, tensor);
  *output = ctx->mutable_output(index);
  return absl::OkStatus();
}

}  // namespace tf_bridge
}  // namespace bluefog
