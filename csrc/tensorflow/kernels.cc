// The AsyncOpKernels: each turns a TF tensor into a core Request and calls done() from the
// completion callback. Registrations are in ops.cc, the shared pieces in bridge.h.
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/op_rules.h"
#include "runtime/runtime.h"
#include "tensorflow/bridge.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/output_pool.h"

namespace bluefog {
namespace tf_bridge {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// The process_set_id attribute of the ops that have one (0: every rank).
int ProcessSetAttr(OpKernelConstruction* c) {
  int id = 0;
  if (c->HasAttr("process_set_id")) {
    absl::Status s = c->GetAttr("process_set_id", &id);
    if (!s.ok()) c->SetStatus(s);
  }
  return id;
}

// The allreduce ops' prescale_factor times postscale_factor: one factor the runtime applies
// after the sum.
double ScaleAttr(OpKernelConstruction* c) {
  float pre = 1.0f, post = 1.0f;
  absl::Status s = c->GetAttr("prescale_factor", &pre);
  if (s.ok()) s = c->GetAttr("postscale_factor", &post);
  if (!s.ok()) c->SetStatus(s);
  return static_cast<double>(pre) * static_cast<double>(post);
}

// The allreduce ops' reduce_op attr (the registration restricts its values).
ReduceOp ReduceOpAttr(OpKernelConstruction* c) {
  std::string name;
  absl::Status s = c->GetAttr("reduce_op", &name);
  if (!s.ok()) c->SetStatus(s);
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  if (name == "product") return ReduceOp::kProduct;
  return ReduceOp::kSum;
}

// For ops whose output shape is known only after negotiation (the allgathers).
std::function<void*(const std::vector<int64_t>&)> AllocateLike(OpKernelContext* ctx) {
  return [ctx](const std::vector<int64_t>& shape) -> void* {
    TensorShape tf_shape;
    for (int64_t d : shape) tf_shape.AddDim(d);
    Tensor* output = nullptr;
    absl::Status s = ctx->allocate_output(0, tf_shape, &output);
    if (!s.ok())
      throw BluefogError(StatusCode::kInternal,
                         "cannot allocate the output: " + std::string(s.message()));
    return DataOf(output);
  };
}

// Shared by the three kernels: reads the name input, builds the request, enqueues it.
class CollectiveKernel : public AsyncOpKernel {
 public:
  CollectiveKernel(OpKernelConstruction* c, OpType op)
      : AsyncOpKernel(c), op_(op), process_set_(ProcessSetAttr(c)) {
    // Set by the Python wrappers when executing eagerly: the caller waits for the result, so
    // it may run the collective itself (Channel::Enqueue's `drive`). In a graph, whose executor
    // must not be blocked by one op while others wait to be enqueued, the kernel joins a round
    // only for as long as the other ranks arrive promptly (Drive::kJoinRound); so do the ops
    // without the attribute (reducescatter, alltoall, the neighbour ops), eager or not.
    bool eager = false;
    if (c->HasAttr("eager_inline")) OP_REQUIRES_OK(c, c->GetAttr("eager_inline", &eager));
    drive_ = eager ? Drive::kUntilDone : Drive::kJoinRound;
  }

 protected:
  // Fills `request` from input 0 and the name input 1; returns false after reporting an error.
  bool Prepare(OpKernelContext* ctx, const DoneCallback& done, Request* request) {
    const Tensor& input = ctx->input(0);
    const Tensor& name = ctx->input(1);
    request->meta.op = op_;
    request->process_set = process_set_;
    absl::Status shape_ok = CheckRank(name, 0, "tensor_name", op_, "");
    if (!shape_ok.ok()) {
      ctx->SetStatus(shape_ok);
      done();
      return false;
    }
    request->meta.name = std::string(name.scalar<::tensorflow::tstring>()());
    if (!ToCoreType(input.dtype(), &request->meta.dtype)) {
      ctx->SetStatus(KernelError(
          op_, request->meta.name,
          Concat("dtype ", ::tensorflow::DataTypeString(input.dtype()), " is not supported")));
      done();
      return false;
    }
    for (int d = 0; d < input.dims(); ++d) request->meta.shape.push_back(input.dim_size(d));
    request->input = input.tensor_data().data();
    request->done = [ctx, done](const Status& s) {
      if (!s.ok()) ctx->SetStatus(ToTfStatus(s));
      done();
    };
    return true;
  }

  void Submit(OpKernelContext* ctx, const DoneCallback& done, Request request) {
    Status s = Runtime::Get().Enqueue(std::move(request), drive_);
    if (!s.ok()) {
      ctx->SetStatus(ToTfStatus(s));
      done();
    }
  }

 protected:
  int process_set() const { return process_set_; }

 private:
  OpType op_;
  int process_set_;
  Drive drive_ = Drive::kNo;
};

class AllreduceKernel : public CollectiveKernel {
 public:
  explicit AllreduceKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, OpType::kAllreduce), reduce_op_(ReduceOpAttr(c)), scale_(ScaleAttr(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("average", &average_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    Tensor* output = nullptr;
    // Reuses the input buffer when TF no longer needs it, which saves a copy; a large output
    // that cannot comes from bluefog's pool (output_pool.h), so its pages are already touched.
    const Tensor& input = ctx->input(0);
    if (input.TotalBytes() < kPooledOutputBytes) {
      OP_REQUIRES_OK_ASYNC(
          ctx, ctx->forward_input_or_allocate_output({0}, 0, input.shape(), &output), done);
    } else if (!ctx->forward_input_to_output_with_shape(0, 0, input.shape(), &output)) {
      OP_REQUIRES_OK_ASYNC(ctx, AllocatePooledOutput(ctx, 0, input.dtype(), input.shape(), &output),
                           done);
    }
    request.output = DataOf(output);
    request.meta.average = average_;
    request.meta.reduce_op = reduce_op_;
    request.meta.scale = scale_;
    Submit(ctx, done, std::move(request));
  }

 private:
  bool average_ = false;
  ReduceOp reduce_op_;
  double scale_;
};

// The output shape of an allreduce (the input's) or a reducescatter (this rank's slice of
// dimension 0) on this rank.
TensorShape ReducedShape(OpType op, const TensorShape& input, int process_set) {
  TensorShape shape = input;
  int rank = 0, size = 1;
  // Outside the set (or an unknown set) the runtime refuses the request; any shape will do.
  if (op == OpType::kReducescatter && shape.dims() > 0 &&
      Runtime::Get().SetLayout(process_set, &rank, &size))
    shape.set_dim(0, ReducescatterRows(shape.dim_size(0), size, rank));
  return shape;
}

// Allreduces (or reducescatters) N tensors in one kernel: one executor node per step instead
// of N, and the runtime sees all N requests at once, so allreduces fuse into as few
// collectives as the threshold allows.
template <OpType kOp>
class GroupedKernel : public AsyncOpKernel {
 public:
  explicit GroupedKernel(OpKernelConstruction* c)
      : AsyncOpKernel(c),
        process_set_(ProcessSetAttr(c)),
        reduce_op_(kOp == OpType::kAllreduce ? ReduceOpAttr(c) : ReduceOp::kSum),
        scale_(kOp == OpType::kAllreduce ? ScaleAttr(c) : 1.0) {
    OP_REQUIRES_OK(c, c->GetAttr("average", &average_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs() - 1;
    OP_REQUIRES_OK_ASYNC(ctx, CheckRank(ctx->input(n), 0, "tensor_name", kOp, ""), done);
    const std::string base(ctx->input(n).scalar<::tensorflow::tstring>()());
    DataType dtype;
    if (n == 0) {
      done();
      return;
    }
    if (!ToCoreType(ctx->input(0).dtype(), &dtype)) {
      ctx->SetStatus(
          KernelError(kOp, base,
                      Concat("dtype ", ::tensorflow::DataTypeString(ctx->input(0).dtype()),
                             " is not supported")));
      done();
      return;
    }
    // Shared by the N completions; the last one reports the first error and calls done().
    struct Group {
      std::atomic<int> remaining;
      std::mutex mutex;
      absl::Status status;
    };
    auto group = std::make_shared<Group>();
    group->remaining = n;
    auto finish_one = [ctx, done, group](const absl::Status& s) {
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(group->mutex);
        if (group->status.ok()) group->status = s;
      }
      if (--group->remaining == 0) {
        if (!group->status.ok()) ctx->SetStatus(group->status);
        done();
      }
    };
    // Built first and queued together (Runtime::EnqueueGroup), each carrying the group's size:
    // ranks that pass different numbers of tensors then fail on every rank instead of waiting.
    std::vector<Request> requests(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& input = ctx->input(i);
      Tensor* output = nullptr;
      absl::Status s;
      if (kOp != OpType::kAllreduce) {
        s = ctx->allocate_output(i, ReducedShape(kOp, input.shape(), process_set_), &output);
      } else if (input.TotalBytes() < kPooledOutputBytes) {
        s = ctx->forward_input_or_allocate_output({i}, i, input.shape(), &output);
      } else if (!ctx->forward_input_to_output_with_shape(i, i, input.shape(), &output)) {
        s = AllocatePooledOutput(ctx, i, input.dtype(), input.shape(), &output);
      }
      if (!s.ok()) {
        ctx->SetStatus(s);
        done();
        return;
      }
      Request& request = requests[i];
      request.meta.op = kOp;
      request.process_set = process_set_;
      request.meta.name = base + "." + std::to_string(i);
      request.meta.dtype = dtype;
      for (int d = 0; d < input.dims(); ++d) request.meta.shape.push_back(input.dim_size(d));
      request.input = input.tensor_data().data();
      request.output = DataOf(output);
      request.meta.average = average_;
      request.meta.reduce_op = reduce_op_;
      request.meta.scale = scale_;
      request.meta.group_size = n;
      request.done = [finish_one](const Status& st) { finish_one(ToTfStatus(st)); };
    }
    Status queued = Runtime::Get().EnqueueGroup(std::move(requests));
    if (!queued.ok()) {
      ctx->SetStatus(ToTfStatus(queued));
      done();
    }
  }

 private:
  int process_set_;
  bool average_ = false;
  ReduceOp reduce_op_;
  double scale_;
};

class ReducescatterKernel : public CollectiveKernel {
 public:
  explicit ReducescatterKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, OpType::kReducescatter) {
    OP_REQUIRES_OK(c, c->GetAttr("average", &average_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    request.meta.average = average_;
    if (!request.meta.shape.empty()) {  // a scalar is refused by the runtime's validation
      Tensor* output = nullptr;
      OP_REQUIRES_OK_ASYNC(
          ctx,
          ctx->allocate_output(
              0, ReducedShape(OpType::kReducescatter, ctx->input(0).shape(), process_set()),
              &output),
          done);
      request.output = DataOf(output);
    }
    Submit(ctx, done, std::move(request));
  }

 private:
  bool average_ = false;
};

// Input 2 holds the rows for each rank; empty means equal splits (dimension 0 must divide).
// Output 1 receives how many rows each rank sent this one.
class AlltoallKernel : public CollectiveKernel {
 public:
  explicit AlltoallKernel(OpKernelConstruction* c) : CollectiveKernel(c, OpType::kAlltoall) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    const std::string& name = request.meta.name;
    OP_REQUIRES_OK_ASYNC(ctx, CheckRank(ctx->input(2), 1, "splits", OpType::kAlltoall, name), done);
    int my_rank = 0, size = 1;
    Runtime::Get().SetLayout(process_set(), &my_rank, &size);  // else refused when submitted
    request.meta.splits = VectorOf<int64_t>(ctx->input(2));
    if (request.meta.splits.empty() && !request.meta.shape.empty()) {
      const int64_t rows = request.meta.shape[0];
      OP_REQUIRES_ASYNC(
          ctx, rows % size == 0,
          KernelError(OpType::kAlltoall, name,
                      Concat("dimension 0 has ", rows, " rows, which do not split evenly over ",
                             size, " ranks; pass splits (one row count per rank)")),
          done);
      request.meta.splits.assign(size, rows / size);
    }
    Tensor* received = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(1, TensorShape({size}), &received), done);
    request.received_splits = received->flat<int64_t>().data();
    request.allocate_output = AllocateLike(ctx);
    Submit(ctx, done, std::move(request));
  }
};

// Input 0 is the request name; output 0 (int32 scalar) the last rank to join.
class JoinKernel : public AsyncOpKernel {
 public:
  explicit JoinKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_OK_ASYNC(ctx, CheckRank(ctx->input(0), 0, "tensor_name", OpType::kJoin, ""), done);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &output), done);
    Request request;
    request.meta.op = OpType::kJoin;
    request.meta.name = std::string(ctx->input(0).scalar<::tensorflow::tstring>()());
    request.meta.dtype = DataType::kInt32;
    request.output = DataOf(output);
    request.done = [ctx, done](const Status& s) {
      if (!s.ok()) ctx->SetStatus(ToTfStatus(s));
      done();
    };
    Status s = Runtime::Get().Enqueue(std::move(request));
    if (!s.ok()) {
      ctx->SetStatus(ToTfStatus(s));
      done();
    }
  }
};

class AllgatherKernel : public CollectiveKernel {
 public:
  explicit AllgatherKernel(OpKernelConstruction* c) : CollectiveKernel(c, OpType::kAllgather) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    request.allocate_output = AllocateLike(ctx);
    Submit(ctx, done, std::move(request));
  }
};

// Neighbor ops' inputs after (tensor, tensor_name): send_ranks, recv_ranks [, self_weight,
// recv_weights, send_weights]; the ranks (and weights) may change from call to call.
absl::Status ReadPeers(OpKernelContext* ctx, Request* request) {
  const TensorMeta& meta = request->meta;
  TF_RETURN_IF_ERROR(CheckRank(ctx->input(2), 1, "send_ranks", meta.op, meta.name));
  TF_RETURN_IF_ERROR(CheckRank(ctx->input(3), 1, "recv_ranks", meta.op, meta.name));
  request->meta.send_ranks = VectorOf<int32_t>(ctx->input(2));
  request->meta.recv_ranks = VectorOf<int32_t>(ctx->input(3));
  return absl::OkStatus();
}

class NeighborAllreduceKernel : public CollectiveKernel {
 public:
  explicit NeighborAllreduceKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, OpType::kNeighborAllreduce) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPeers(ctx, &request), done);
    const std::string& name = request.meta.name;
    OP_REQUIRES_OK_ASYNC(
        ctx, CheckRank(ctx->input(4), 0, "self_weight", OpType::kNeighborAllreduce, name), done);
    OP_REQUIRES_OK_ASYNC(
        ctx, CheckRank(ctx->input(5), 1, "recv_weights", OpType::kNeighborAllreduce, name), done);
    OP_REQUIRES_OK_ASYNC(
        ctx, CheckRank(ctx->input(6), 1, "send_weights", OpType::kNeighborAllreduce, name), done);
    request.self_weight = ctx->input(4).scalar<double>()();
    request.recv_weights = VectorOf<double>(ctx->input(5));
    request.send_weights = VectorOf<double>(ctx->input(6));
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->forward_input_or_allocate_output({0}, 0, ctx->input(0).shape(), &output), done);
    request.output = DataOf(output);
    Submit(ctx, done, std::move(request));
  }
};

class NeighborAllgatherKernel : public CollectiveKernel {
 public:
  explicit NeighborAllgatherKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, OpType::kNeighborAllgather) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPeers(ctx, &request), done);
    request.allocate_output = AllocateLike(ctx);
    Submit(ctx, done, std::move(request));
  }
};

// The gradient of neighbor_allgather. Input 0 is the upstream gradient (one block per send
// rank); input 4 is dimension 0 of this rank's forward input, which the output takes.
class NeighborAllgatherGradKernel : public CollectiveKernel {
 public:
  explicit NeighborAllgatherGradKernel(OpKernelConstruction* c)
      : CollectiveKernel(c, OpType::kNeighborAllgatherGrad) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    OP_REQUIRES_OK_ASYNC(ctx, ReadPeers(ctx, &request), done);
    OP_REQUIRES_OK_ASYNC(
        ctx,
        CheckRank(ctx->input(4), 0, "first_dim", OpType::kNeighborAllgatherGrad, request.meta.name),
        done);
    const Tensor& grad = ctx->input(0);
    const int64_t rows = ctx->input(4).scalar<int64_t>()();
    OP_REQUIRES_ASYNC(ctx, grad.dims() >= 1 && rows >= 0,
                      KernelError(OpType::kNeighborAllgatherGrad, request.meta.name,
                                  "needs a gradient of rank >= 1 and a non-negative first "
                                  "dimension"),
                      done);
    TensorShape shape = grad.shape();
    shape.set_dim(0, rows);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, shape, &output), done);
    request.meta.input_rows = grad.dim_size(0);
    request.meta.shape[0] = rows;
    request.output = DataOf(output);
    Submit(ctx, done, std::move(request));
  }
};

class BroadcastKernel : public CollectiveKernel {
 public:
  explicit BroadcastKernel(OpKernelConstruction* c) : CollectiveKernel(c, OpType::kBroadcast) {
    OP_REQUIRES_OK(c, c->GetAttr("root_rank", &root_rank_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    Request request;
    if (!Prepare(ctx, done, &request)) return;
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(
        ctx, ctx->forward_input_or_allocate_output({0}, 0, ctx->input(0).shape(), &output), done);
    request.output = DataOf(output);
    request.meta.root_rank = root_rank_;
    Submit(ctx, done, std::move(request));
  }

 private:
  int root_rank_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("BluefogAllreduce").Device(::tensorflow::DEVICE_CPU), AllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogGroupedAllreduce").Device(::tensorflow::DEVICE_CPU),
                        GroupedKernel<OpType::kAllreduce>);
REGISTER_KERNEL_BUILDER(Name("BluefogReducescatter").Device(::tensorflow::DEVICE_CPU),
                        ReducescatterKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogGroupedReducescatter").Device(::tensorflow::DEVICE_CPU),
                        GroupedKernel<OpType::kReducescatter>);
REGISTER_KERNEL_BUILDER(Name("BluefogAlltoall").Device(::tensorflow::DEVICE_CPU), AlltoallKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogJoin").Device(::tensorflow::DEVICE_CPU), JoinKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogAllgather").Device(::tensorflow::DEVICE_CPU), AllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogNeighborAllreduce").Device(::tensorflow::DEVICE_CPU),
                        NeighborAllreduceKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogNeighborAllgather").Device(::tensorflow::DEVICE_CPU),
                        NeighborAllgatherKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogNeighborAllgatherGrad").Device(::tensorflow::DEVICE_CPU),
                        NeighborAllgatherGradKernel);
REGISTER_KERNEL_BUILDER(Name("BluefogBroadcast").Device(::tensorflow::DEVICE_CPU), BroadcastKernel);

}  // namespace tf_bridge
}  // namespace bluefog
