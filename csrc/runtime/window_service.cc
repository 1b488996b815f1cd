#include "runtime/window_service.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "runtime/window_internal.h"

namespace bluefog {

using namespace window_internal;

WindowService::WindowService() = default;

WindowService::~WindowService() {
  // The runtime stops the service before the backend goes away; nothing may be left running here.
  if (thread_.joinable()) thread_.detach();
}

// ---- Collective: create and free --------------------------------------------------------------

int WindowService::Create(WindowSpec spec, const void* initial, bool zero_init) {
  BF_ENFORCE(spec.NumBytes() <= static_cast<size_t>(INT_MAX), StatusCode::kInvalidArgument,
             "the window holds ", spec.NumBytes(), " bytes; windows are limited to ", INT_MAX,
             " bytes (split the tensor into several windows)");
  if (!link_) {
    // Every rank creates its first window here, at the same point.
    if (make_link_) link_ = make_link_(sizeof(Header));
    BF_ENFORCE(link_ != nullptr, StatusCode::kPrecondition,
               "windows (win_create, win_put/get/accumulate and the window optimizers) are not "
               "available on this backend");
    if (fault_tolerant_ && !link_->TolerateLostPeers()) {
      link_->Free(true);
      link_.reset();
      throw BluefogError(StatusCode::kPrecondition,
                         "fault-tolerant windows (BLUEFOG_FAULT_TOLERANT=1 or "
                         "bf.init(fault_tolerant=True)) need the Gloo backend; this backend ends "
                         "the whole job when a rank is lost. Run on Gloo, or leave the mode off");
    }
    thread_ = std::thread(&WindowService::Loop, this);
  }
  int id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    BF_ENFORCE(!stop_, StatusCode::kAborted, stop_reason_);
    BF_ENFORCE(!by_name_.count(spec.name), StatusCode::kInvalidArgument, "a window named '",
               spec.name, "' exists already; free it with bf.win_free first, or pick another name");
    id = next_id_++;
    auto entry = std::make_shared<Entry>();
    entry->window = std::make_shared<Window>(id, spec, initial, zero_init);
    by_name_[spec.name] = entry;
    by_id_[id] = entry;
  }
  // No rank may put into this window before every rank has it.
  link_->Barrier();
  return id;
}

void WindowService::Free(const std::string& name) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_name_.find(name);
    BF_ENFORCE(it != by_name_.end(), StatusCode::kInvalidArgument, "there is no window named '",
               name, "'");
    entry = it->second;
    by_name_.erase(it);
    by_id_.erase(entry->window->id());
  }
  if (link_) link_->Barrier();
}

int WindowService::PendingOps(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second->pending;
}

std::vector<std::string> WindowService::Names() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : by_name_) names.push_back(name);
  return names;
}

// ---- The calling threads ----------------------------------------------------------------------

std::shared_ptr<WindowService::Entry> WindowService::Find(const char* op, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || closed_)
    throw BluefogError(
        StatusCode::kAborted,
        WinError(StatusCode::kAborted, op, name, stop_ ? stop_reason_ : closed_reason_).message());
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    throw BluefogError(StatusCode::kInvalidArgument,
                       WinError(StatusCode::kInvalidArgument, op, name,
                                "there is no window of that name; create it with "
                                "bf.win_create(tensor, name) on every rank first")
                           .message());
  return it->second;
}

void WindowService::CheckTensor(const char* op, const Entry& e, DataType dtype,
                                const std::vector<int64_t>& shape) {
  const WindowSpec& spec = e.window->spec();
  if (dtype != spec.dtype || shape != spec.shape)
    throw BluefogError(
        StatusCode::kInvalidArgument,
        WinError(StatusCode::kInvalidArgument, op, spec.name,
                 Concat("the tensor is ", DataTypeName(dtype), " of shape ", ShapeString(shape),
                        ", but the window holds ", DataTypeName(spec.dtype), " of shape ",
                        ShapeString(spec.shape),
                        "; pass a tensor like the one it was created "
                        "with"))
            .message());
}

void WindowService::CheckRanks(const char* op, const Entry& e, const std::vector<int32_t>& ranks,
                               const std::vector<double>& weights, bool out) {
  const WindowSpec& spec = e.window->spec();
  auto fail = [&](const std::string& what) {
    throw BluefogError(StatusCode::kInvalidArgument,
                       WinError(StatusCode::kInvalidArgument, op, spec.name, what).message());
  };
  if (weights.size() != ranks.size())
    fail(Concat(weights.size(), " weights for ", ranks.size(), " ranks"));
  for (size_t k = 0; k < weights.size(); ++k)
    if (!std::isfinite(weights[k]))
      fail(Concat("the weight for rank ", ranks[k], " is ", weights[k],
                  "; weights must be finite numbers"));
  for (size_t k = 0; k < ranks.size(); ++k) {
    const int r = ranks[k];
    const bool ok = out ? e.window->OutIndex(r) >= 0 : e.window->InIndex(r) >= 0;
    if (!ok)
      fail(Concat("rank ", r, " is not an ", out ? "out" : "in",
                  "-neighbor of this rank in this "
                  "window (its ",
                  out ? "out" : "in", "-neighbors are ",
                  RanksText(out ? spec.out_ranks : spec.in_ranks),
                  "); a window keeps the topology it was created with"));
    for (size_t j = 0; j < k; ++j)
      if (ranks[j] == r) fail(Concat("rank ", r, " is listed twice"));
  }
}

void WindowService::CheckSelfWeight(const char* op, const Entry& e, double self_weight) {
  if (!std::isfinite(self_weight))
    throw BluefogError(
        StatusCode::kInvalidArgument,
        WinError(StatusCode::kInvalidArgument, op, e.window->spec().name,
                 Concat("self_weight is ", self_weight, "; weights must be finite numbers"))
            .message());
}

std::shared_ptr<std::vector<char>> WindowService::TakeBuffer(Entry& e) {
  for (auto& b : e.pool)
    if (b.use_count() == 1) return b;
  e.pool.push_back(std::make_shared<std::vector<char>>(e.window->bytes()));
  return e.pool.back();
}

int64_t WindowService::Queue(std::unique_ptr<Op> op, const std::shared_ptr<Entry>& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_ || closed_)
    throw BluefogError(StatusCode::kAborted, stop_ ? stop_reason_ : closed_reason_);
  op->handle = next_handle_++;
  op->entry = e;
  ++e->pending;
  handles_[op->handle] = Handle();
  const int64_t handle = op->handle;
  queue_.push_back(std::move(op));
  wake_.notify_one();
  return handle;
}

int64_t WindowService::Put(const std::string& name, const WinTensor& tensor,
                           const WinPutOptions& options) {
  const char* opname = options.accumulate ? "win_accumulate" : "win_put";
  const std::vector<int32_t>& dsts = options.dsts;
  const bool with_p = options.with_p;
  const void* data = tensor.data;
  std::shared_ptr<Entry> e = Find(opname, name);
  CheckTensor(opname, *e, tensor.dtype, tensor.shape);
  CheckRanks(opname, *e, dsts, options.weights, true);
  CheckSelfWeight(opname, *e, options.self_weight);
  auto op = std::make_unique<Op>();
  op->name = opname;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op->payload = TakeBuffer(*e);
  }
  std::memcpy(op->payload->data(), data, e->window->bytes());
  op->with_p = with_p;
  op->gives_back = options.accumulate || with_p;
  op->p = e->window->associated_p();
  e->window->Publish(data, options.self_weight, with_p ? options.self_weight : 1.0);
  std::vector<int32_t> sorted = dsts;
  std::sort(sorted.begin(), sorted.end());
  if (options.require_mutex && !dsts.empty()) {
    op->steps.push_back({kLock, sorted, {}});
    op->release_at_end = true;
  }
  op->steps.push_back({options.accumulate ? kAccumulate : kPut, dsts, options.weights});
  return Queue(std::move(op), e);
}

int64_t WindowService::Get(const std::string& name, const std::vector<int32_t>& srcs,
                           const std::vector<double>& weights, bool require_mutex) {
  std::shared_ptr<Entry> e = Find("win_get", name);
  CheckRanks("win_get", *e, srcs, weights, false);
  auto op = std::make_unique<Op>();
  op->name = "win_get";
  std::vector<int32_t> sorted = srcs;
  std::sort(sorted.begin(), sorted.end());
  if (require_mutex && !srcs.empty()) {
    op->steps.push_back({kLock, sorted, {}});
    op->release_at_end = true;
  }
  op->steps.push_back({kGetRequest, srcs, weights});
  return Queue(std::move(op), e);
}

int64_t WindowService::Mutex(const std::string& name, std::vector<int32_t> ranks, bool lock) {
  std::shared_ptr<Entry> e = Find("win_mutex", name);
  std::sort(ranks.begin(), ranks.end());
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k] < 0 || ranks[k] >= size_ || (k > 0 && ranks[k] == ranks[k - 1]))
      throw BluefogError(StatusCode::kInvalidArgument,
                         WinError(StatusCode::kInvalidArgument, "win_mutex", name,
                                  Concat("ranks ", RanksText(ranks),
                                         " must be distinct ranks in [0, ", size_, ")"))
                             .message());
  }
  auto op = std::make_unique<Op>();
  op->name = "win_mutex";
  op->win_mutex = true;
  op->steps.push_back({lock ? kLock : kUnlock, ranks, {}});
  return Queue(std::move(op), e);
}

void WindowService::Update(const std::string& name, const WinTensor& self, void* out,
                           const WinUpdateOptions& o) {
  std::shared_ptr<Entry> e = Find("win_update", name);
  CheckTensor("win_update", *e, self.dtype, self.shape);
  CheckRanks("win_update", *e, o.ranks, o.weights, false);
  CheckSelfWeight("win_update", *e, o.self_weight);
  std::vector<int32_t> ranks = o.ranks;
  std::vector<double> weights = o.weights;
  double self_weight = o.self_weight;
  if (fault_tolerant_ && !o.with_p) {
    // An average over the in-neighbours left: the dropped ones' weights are spread over the
    // rest (self included) in proportion, so the weights keep their sum.
    std::lock_guard<std::mutex> lock(mutex_);
    double total = self_weight, kept = self_weight;
    std::vector<int32_t> live_ranks;
    std::vector<double> live_weights;
    for (size_t k = 0; k < ranks.size(); ++k) {
      total += weights[k];
      if (gone_.count(ranks[k])) continue;
      kept += weights[k];
      live_ranks.push_back(ranks[k]);
      live_weights.push_back(weights[k]);
    }
    if (live_ranks.size() != ranks.size()) {
      if (kept != 0.0) {
        const double scale = total / kept;
        self_weight *= scale;
        for (double& w : live_weights) w *= scale;
      } else {
        self_weight = total;
      }
      ranks.swap(live_ranks);
      weights.swap(live_weights);
    }
  }
  e->window->Update(self.data, out, self_weight, ranks, weights, o.reset, o.publish, o.with_p);
}

std::vector<int32_t> WindowService::GoneRanks() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::vector<int32_t>(gone_.begin(), gone_.end());
}

std::vector<int32_t> WindowService::InRanks(const std::string& name) {
  return Find("get_win_version", name)->window->spec().in_ranks;
}

std::vector<int64_t> WindowService::Versions(const std::string& name) {
  return Find("get_win_version", name)->window->Versions();
}

double WindowService::AssociatedP(const std::string& name) {
  return Find("win_associated_p", name)->window->associated_p();
}

void WindowService::Wait(int64_t handle, std::function<void(const Status&)> done) {
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) {
      status = Status(StatusCode::kInvalidArgument,
                      Concat("bluefog win_wait: there is no window operation with handle ", handle,
                             " (it was waited for already, or never started)"));
    } else if (!it->second.done) {
      it->second.waiter = std::move(done);
      return;
    } else {
      status = it->second.status;
      handles_.erase(it);
    }
  }
  done(status);
}

int WindowService::Poll(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return -1;
  return it->second.done ? 1 : 0;
}

void WindowService::Close(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || stop_) return;
  closed_ = true;
  closed_reason_ = reason;
  wake_.notify_one();
}

void WindowService::Stop(const std::string& reason, bool free_comms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    stop_ = true;
    stop_reason_ = reason;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  // Without a thread (no window was ever made) nothing can be pending but the queue.
  std::vector<int64_t> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& op : queue_) left.push_back(op->handle);
    queue_.clear();
    by_name_.clear();
    by_id_.clear();
  }
  for (int64_t h : left) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = handles_.find(h);
      if (it != handles_.end()) it->second.status = Status(StatusCode::kAborted, reason);
    }
    Finish(h);
  }
  if (link_) link_->Free(free_comms);
}

}  // namespace bluefog
