// The window ops' kernels (bf.win_*). Creating and freeing go through the runtime's agreement
// on the global channel, like a collective; the other ops call the window service directly and
// return at once (put, get, mutex return a handle that win_wait waits for).
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/op_rules.h"
#include "runtime/runtime.h"
#include "tensorflow/bridge.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace bluefog {
namespace tf_bridge {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// "rank R: " before the service's message.
absl::Status WinStatus(const Status& s) {
  return ToTfStatus(WithRank(Runtime::Get().info().rank, s));
}

absl::Status NotRunning(const char* op) {
  return absl::FailedPreconditionError(
      Concat("bluefog ", op, ": bluefog is not initialized; call bf.init() first"));
}

// Ok when window operations may run here: the windows open, in the process that started it
// (the window service and its thread are the parent's in a forked child).
absl::Status Usable(const char* op, const std::string& what) {
  // windows_open: in fault-tolerant mode windows outlive failed collectives.
  if (!Runtime::Get().windows_open()) return NotRunning(op);
  if (Runtime::Get().forked())
    return absl::FailedPreconditionError(Runtime::Get().ForkedChildError(what));
  return absl::OkStatus();
}

// Checks the ranks of inputs [first, ...) (0: scalar, 1: vector) and reads the window name.
absl::Status ReadName(OpKernelContext* ctx, const char* op, int name_index,
                      std::initializer_list<int> side_ranks, std::string* name) {
  int i = name_index;
  for (int r : side_ranks) {
    const Tensor& t = ctx->input(i);
    if (t.dims() != r)
      return absl::InvalidArgumentError(Concat(
          "rank ", Runtime::Get().info().rank, ": bluefog ", op, ": input ", i, " must be a ",
          r == 0 ? "scalar" : "vector", ", got shape ", t.shape().DebugString()));
    ++i;
  }
  *name = std::string(ctx->input(name_index).scalar<::tensorflow::tstring>()());
  return Usable(op, Concat("bluefog ", op, " of window '", *name, "'"));
}

// Window operations in the flight recorder: an entry from the call until win_wait sees the
// operation end (a handle never waited for keeps its entry "running", as it is).
class WindowFlights {
 public:
  static WindowFlights& Get() {
    static WindowFlights* flights = new WindowFlights();  // outlives every kernel
    return *flights;
  }
  // The entry of an operation about to be queued; then Queued with its handle (-1: refused).
  uint64_t Begin(const char* op, const std::string& name, int64_t bytes, DataType dtype) {
    FlightRecorder& recorder = Runtime::Get().recorder();
    const uint64_t id = recorder.Begin(op, name, 0, bytes, dtype);
    recorder.Start(id);  // no negotiation: it goes out at once
    return id;
  }
  void Queued(uint64_t id, int64_t handle) {
    if (id == 0) return;
    if (handle < 0) {
      Runtime::Get().recorder().End(id, false);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ids_[handle] = id;
  }
  void Waited(int64_t handle, bool ok) {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = ids_.find(handle);
      if (it == ids_.end()) return;
      id = it->second;
      ids_.erase(it);
    }
    Runtime::Get().recorder().End(id, ok);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int64_t, uint64_t> ids_;
};

bool TensorMetaOf(const Tensor& t, DataType* dtype, std::vector<int64_t>* shape) {
  if (!ToCoreType(t.dtype(), dtype)) return false;
  for (int d = 0; d < t.dims(); ++d) shape->push_back(t.dim_size(d));
  return true;
}

// Runs `body` (a call into the window service); a BluefogError becomes the op's error.
template <typename F>
void Guarded(OpKernelContext* ctx, F&& body) {
  try {
    body();
  } catch (const BluefogError& e) {
    ctx->SetStatus(WinStatus(e.ToStatus()));
  }
}

void ScalarOut(OpKernelContext* ctx, int64_t value) {
  Tensor* out = nullptr;
  OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
  out->scalar<int64_t>()() = value;
}

// win_create and win_free: agreed with every rank, then done on the global channel's thread.
class WinCollectiveKernel : public AsyncOpKernel {
 public:
  WinCollectiveKernel(OpKernelConstruction* c, OpType op) : AsyncOpKernel(c), op_(op) {
    if (op == OpType::kWinCreate) OP_REQUIRES_OK(c, c->GetAttr("zero_init", &zero_init_));
  }
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const bool create = op_ == OpType::kWinCreate;
    std::string name;
    OP_REQUIRES_OK_ASYNC(
        ctx,
        ReadName(ctx, OpTypeName(op_), create ? 1 : 0,
                 create ? std::initializer_list<int>{0, 1, 1} : std::initializer_list<int>{0},
                 &name),
        done);
    Tensor* output = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &output), done);
    Request request;
    request.meta.name = name;
    request.meta.op = op_;
    request.meta.dtype = DataType::kInt32;
    if (create) {
      const Tensor& tensor = ctx->input(0);
      request.meta.shape.clear();
      OP_REQUIRES_ASYNC(ctx, TensorMetaOf(tensor, &request.meta.dtype, &request.meta.shape),
                        KernelError(op_, name, "the dtype is not supported"), done);
      request.meta.recv_ranks = VectorOf<int32_t>(ctx->input(2));
      request.meta.send_ranks = VectorOf<int32_t>(ctx->input(3));
      request.input = tensor.tensor_data().data();
      request.zero_init = zero_init_;
    } else {
      const int pending = Runtime::Get().windows().PendingOps(name);
      OP_REQUIRES_ASYNC(
          ctx, pending >= 0,
          KernelError(op_, name, "there is no window of that name (bf.win_create makes one)"),
          done);
      request.meta.splits = {pending};
    }
    request.output = DataOf(output);
    request.done = [ctx, done](const Status& s) {
      if (!s.ok()) ctx->SetStatus(ToTfStatus(s));
      done();
    };
    Status queued = Runtime::Get().Enqueue(std::move(request));
    if (!queued.ok()) {
      ctx->SetStatus(ToTfStatus(queued));
      done();
    }
  }

 private:
  OpType op_;
  bool zero_init_ = false;
};

class WinCreateKernel : public WinCollectiveKernel {
 public:
  explicit WinCreateKernel(OpKernelConstruction* c) : WinCollectiveKernel(c, OpType::kWinCreate) {}
};
class WinFreeKernel : public WinCollectiveKernel {
 public:
  explicit WinFreeKernel(OpKernelConstruction* c) : WinCollectiveKernel(c, OpType::kWinFree) {}
};

class WinPutKernel : public OpKernel {
 public:
  explicit WinPutKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("accumulate", &accumulate_));
    OP_REQUIRES_OK(c, c->GetAttr("require_mutex", &require_mutex_));
    OP_REQUIRES_OK(c, c->GetAttr("with_p", &with_p_));
  }
  void Compute(OpKernelContext* ctx) override {
    const char* op = accumulate_ ? "win_accumulate" : "win_put";
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, op, 1, {0, 1, 1, 0}, &name));
    const Tensor& tensor = ctx->input(0);
    DataType dtype;
    std::vector<int64_t> shape;
    OP_REQUIRES(ctx, TensorMetaOf(tensor, &dtype, &shape),
                WinStatus(WinError(StatusCode::kInvalidArgument, op, name, "unsupported dtype")));
    int64_t handle = -1;
    const uint64_t flight =
        WindowFlights::Get().Begin(op, name, static_cast<int64_t>(tensor.TotalBytes()), dtype);
    Guarded(ctx, [&] {
      WinPutOptions options;
      options.dsts = VectorOf<int32_t>(ctx->input(2));
      options.weights = VectorOf<double>(ctx->input(3));
      options.self_weight = ctx->input(4).scalar<double>()();
      options.accumulate = accumulate_;
      options.require_mutex = require_mutex_;
      options.with_p = with_p_;
      handle =
          Runtime::Get().windows().Put(name, {tensor.tensor_data().data(), dtype, shape}, options);
    });
    WindowFlights::Get().Queued(flight, ctx->status().ok() ? handle : -1);
    if (ctx->status().ok()) ScalarOut(ctx, handle);
  }

 private:
  bool accumulate_ = false;
  bool require_mutex_ = false;
  bool with_p_ = false;
};

class WinGetKernel : public OpKernel {
 public:
  explicit WinGetKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("require_mutex", &require_mutex_));
  }
  void Compute(OpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, "win_get", 0, {0, 1, 1}, &name));
    int64_t handle = -1;
    const uint64_t flight = WindowFlights::Get().Begin("win_get", name, 0, DataType::kFloat32);
    Guarded(ctx, [&] {
      handle = Runtime::Get().windows().Get(name, VectorOf<int32_t>(ctx->input(1)),
                                            VectorOf<double>(ctx->input(2)), require_mutex_);
    });
    WindowFlights::Get().Queued(flight, ctx->status().ok() ? handle : -1);
    if (ctx->status().ok()) ScalarOut(ctx, handle);
  }

 private:
  bool require_mutex_ = false;
};

class WinMutexKernel : public OpKernel {
 public:
  explicit WinMutexKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("lock", &lock_));
  }
  void Compute(OpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, "win_mutex", 0, {0, 1}, &name));
    int64_t handle = -1;
    const uint64_t flight = WindowFlights::Get().Begin(
        lock_ ? "win_mutex_acquire" : "win_mutex_release", name, 0, DataType::kFloat32);
    Guarded(ctx, [&] {
      handle = Runtime::Get().windows().Mutex(name, VectorOf<int32_t>(ctx->input(1)), lock_);
    });
    WindowFlights::Get().Queued(flight, ctx->status().ok() ? handle : -1);
    if (ctx->status().ok()) ScalarOut(ctx, handle);
  }

 private:
  bool lock_ = true;
};

class WinWaitKernel : public AsyncOpKernel {
 public:
  explicit WinWaitKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {}
  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    OP_REQUIRES_ASYNC(ctx, ctx->input(0).dims() == 0,
                      absl::InvalidArgumentError("bluefog win_wait: the handle must be a scalar"),
                      done);
    OP_REQUIRES_OK_ASYNC(ctx, Usable("win_wait", "bluefog win_wait"), done);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(0, TensorShape({}), &out), done);
    out->scalar<bool>()() = true;
    const int64_t handle = ctx->input(0).scalar<int64_t>()();
    Runtime::Get().windows().Wait(handle, [ctx, done, handle](const Status& s) {
      WindowFlights::Get().Waited(handle, s.ok());
      if (!s.ok()) ctx->SetStatus(WinStatus(s));
      done();
    });
  }
};

class WinPollKernel : public OpKernel {
 public:
  explicit WinPollKernel(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, ctx->input(0).dims() == 0,
                absl::InvalidArgumentError("bluefog win_poll: the handle must be a scalar"));
    OP_REQUIRES_OK(ctx, Usable("win_poll", "bluefog win_poll"));
    const int64_t handle = ctx->input(0).scalar<int64_t>()();
    const int state = Runtime::Get().windows().Poll(handle);
    OP_REQUIRES(
        ctx, state >= 0,
        WinStatus(Status(StatusCode::kInvalidArgument,
                         Concat("bluefog win_poll: there is no window operation with "
                                "handle ",
                                handle, " (it was waited for already, or never started)"))));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = state == 1;
  }
};

class WinUpdateKernel : public OpKernel {
 public:
  explicit WinUpdateKernel(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("reset", &reset_));
    OP_REQUIRES_OK(c, c->GetAttr("publish", &publish_));
    OP_REQUIRES_OK(c, c->GetAttr("with_p", &with_p_));
  }
  void Compute(OpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, "win_update", 1, {0, 0, 1, 1}, &name));
    const Tensor& self = ctx->input(0);
    DataType dtype;
    std::vector<int64_t> shape;
    OP_REQUIRES(
        ctx, TensorMetaOf(self, &dtype, &shape),
        WinStatus(WinError(StatusCode::kInvalidArgument, "win_update", name, "unsupported dtype")));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 0, self.shape(), &output));
    Guarded(ctx, [&] {
      WinUpdateOptions options;
      options.self_weight = ctx->input(2).scalar<double>()();
      options.ranks = VectorOf<int32_t>(ctx->input(3));
      options.weights = VectorOf<double>(ctx->input(4));
      options.reset = reset_;
      options.publish = publish_;
      options.with_p = with_p_;
      Runtime::Get().windows().Update(name, {self.tensor_data().data(), dtype, shape},
                                      DataOf(output), options);
    });
  }

 private:
  bool reset_ = false;
  bool publish_ = true;
  bool with_p_ = false;
};

class WinVersionKernel : public OpKernel {
 public:
  explicit WinVersionKernel(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, "get_win_version", 0, {0}, &name));
    std::vector<int32_t> ranks;
    std::vector<int64_t> versions;
    Guarded(ctx, [&] {
      ranks = Runtime::Get().windows().InRanks(name);
      versions = Runtime::Get().windows().Versions(name);
    });
    if (!ctx->status().ok()) return;
    Tensor* r = nullptr;
    Tensor* v = nullptr;
    const int64_t n = static_cast<int64_t>(ranks.size());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &r));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &v));
    for (int64_t k = 0; k < n; ++k) {
      r->vec<int32_t>()(k) = ranks[k];
      v->vec<int64_t>()(k) = versions[k];
    }
  }
};

class WinAssociatedPKernel : public OpKernel {
 public:
  explicit WinAssociatedPKernel(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    std::string name;
    OP_REQUIRES_OK(ctx, ReadName(ctx, "win_associated_p", 0, {0}, &name));
    double p = 0;
    Guarded(ctx, [&] { p = Runtime::Get().windows().AssociatedP(name); });
    if (!ctx->status().ok()) return;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<double>()() = p;
  }
};

}  // namespace

#define BF_WIN_KERNEL(name, kernel) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_CPU), kernel)
BF_WIN_KERNEL("BluefogWinCreate", WinCreateKernel);
BF_WIN_KERNEL("BluefogWinFree", WinFreeKernel);
BF_WIN_KERNEL("BluefogWinPut", WinPutKernel);
BF_WIN_KERNEL("BluefogWinGet", WinGetKernel);
BF_WIN_KERNEL("BluefogWinMutex", WinMutexKernel);
BF_WIN_KERNEL("BluefogWinWait", WinWaitKernel);
BF_WIN_KERNEL("BluefogWinPoll", WinPollKernel);
BF_WIN_KERNEL("BluefogWinUpdate", WinUpdateKernel);
BF_WIN_KERNEL("BluefogWinVersion", WinVersionKernel);
BF_WIN_KERNEL("BluefogWinAssociatedP", WinAssociatedPKernel);
#undef BF_WIN_KERNEL

}  // namespace tf_bridge
}  // namespace bluefog
