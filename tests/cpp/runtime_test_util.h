// Helpers of the runtime's multi-rank tests: submit a request and wait for its result.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace bluefog {
namespace testing_util {

inline int Rank() { return Runtime::Get().info().rank; }
inline int Size() { return Runtime::Get().info().size; }

// A submitted request whose result can be awaited.
struct Pending {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::vector<char> output;
  // Whether it had finished when Enqueue returned (with `drive`, the caller ran it).
  bool finished_in_enqueue = false;
};

inline std::unique_ptr<Pending> Submit(OpType op, const std::string& name, DataType dtype,
                                       std::vector<int64_t> shape, const void* input,
                                       bool average = false, int root = -1,
                                       Drive drive = Drive::kNo) {
  auto p = std::make_unique<Pending>();
  Request req;
  req.meta.name = name;
  req.meta.op = op;
  req.meta.dtype = dtype;
  req.meta.shape = std::move(shape);
  req.meta.root_rank = root;
  req.input = input;
  req.meta.average = average;
  if (op != OpType::kAllgather) {
    p->output.resize(req.meta.NumBytes());
    req.output = p->output.data();
  } else {
    Pending* raw = p.get();
    req.allocate_output = [raw, dtype](const std::vector<int64_t>& s) -> void* {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      raw->output.resize(n * ElementSize(dtype));
      return raw->output.data();
    };
  }
  Pending* raw = p.get();
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  Status s = Runtime::Get().Enqueue(std::move(req), drive);
  if (!s.ok()) p->promise.set_value(s);
  p->finished_in_enqueue = p->future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  return p;
}

inline Status Wait(Pending& p) { return p.future.get(); }

// Enqueues a request built by the caller (meta and input set), with an output of
// `output_bytes` filled with `fill`; Wait() on the result.
inline std::unique_ptr<Pending> SubmitBuilt(Request req, size_t output_bytes, char fill = 0) {
  auto p = std::make_unique<Pending>();
  p->output.assign(output_bytes, fill);
  req.output = p->output.data();
  Pending* raw = p.get();
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  Status s = Runtime::Get().Enqueue(std::move(req));
  if (!s.ok()) p->promise.set_value(s);
  return p;
}

}  // namespace testing_util
}  // namespace bluefog
