#include "mpi/window_service.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

namespace bluefog {
namespace {

constexpr int kHeaderTag = 71;
constexpr int kDataTag = 72;
// The thread polls for messages; after a quiet spell it waits longer between polls, up to this
// (which bounds how long an idle target takes to notice a put).
constexpr auto kMinPause = std::chrono::microseconds(20);
constexpr auto kMaxPause = std::chrono::microseconds(1000);
// How long Stop keeps serving the other ranks' last messages before it gives up on them.
constexpr double kDrainSeconds = 1.0;

enum Kind : int32_t {
  kPut = 1,
  kAccumulate,
  kAck,  // code != 0: an error, its text as data
  kGetRequest,
  kGetReply,
  kLock,
  kGrant,
  kUnlock,
};

struct Header {
  int32_t kind;
  int32_t window;
  int64_t op;  // the sender's handle, echoed in the reply
  double weight;
  double p;
  int64_t bytes;  // of the data message that follows (0: none)
  int32_t code;
  int32_t pad;
};

MPI_Comm& AsComm(void*& p) { return *reinterpret_cast<MPI_Comm*>(&p); }

void CheckMpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw BluefogError(StatusCode::kInternal, Concat(call, " failed: ", std::string(text, len)));
}

std::string RanksText(const std::vector<int32_t>& ranks) {
  return ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

// One step of an operation: messages of one kind to some ranks; a lock step asks one rank at a
// time, in ascending order, so two operations that lock overlapping ranks cannot deadlock.
struct WindowService::Op {
  int64_t handle = 0;
  const char* name = "";  // "win_put", ...: for its errors
  std::shared_ptr<Entry> entry;
  struct Step {
    Kind kind;
    std::vector<int32_t> ranks;
    std::vector<double> weights;
  };
  std::deque<Step> steps;
  bool unlock_granted = false;  // a final unlock of what this op's lock step was granted
  std::vector<int32_t> granted;
  std::shared_ptr<std::vector<char>> payload;  // put / accumulate: the data
  double p = 1.0;                              // the sender's push-sum weight (before weights)
  bool with_p = false;
  int outstanding = 0;
  Status status;
};

struct WindowService::Entry {
  std::shared_ptr<Window> window;
  // Send buffers, reused: one is free when only this list holds it.
  std::vector<std::shared_ptr<std::vector<char>>> pool;
  int pending = 0;  // operations not yet finished
  // The mutex other ranks lock on this rank (service thread only).
  int holder = -1;
  std::deque<std::pair<int, int64_t>> waiters;
};

struct WindowService::Outgoing {
  MPI_Request request = MPI_REQUEST_NULL;
  std::unique_ptr<Header> header;
  std::shared_ptr<std::vector<char>> data;
};

WindowService::WindowService() = default;

WindowService::~WindowService() {
  // The runtime stops the service before MPI goes away; nothing may be left running here.
  if (thread_.joinable()) thread_.detach();
}

// ---- Collective: create and free --------------------------------------------------------------

int WindowService::Create(WindowSpec spec, const void* initial, bool zero_init) {
  BF_ENFORCE(spec.NumBytes() <= static_cast<size_t>(INT_MAX), StatusCode::kInvalidArgument,
             "the window holds ", spec.NumBytes(), " bytes; windows are limited to ", INT_MAX,
             " bytes (split the tensor into several windows)");
  if (!have_comms_) {
    // Every rank creates its first window here, at the same point.
    CheckMpi(MPI_Comm_dup(AsComm(world_comm_), &AsComm(comm_)), "MPI_Comm_dup");
    CheckMpi(MPI_Comm_dup(AsComm(world_comm_), &AsComm(ctl_comm_)), "MPI_Comm_dup");
    have_comms_ = true;
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
  CheckMpi(MPI_Barrier(AsComm(ctl_comm_)), "MPI_Barrier");
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
  if (have_comms_) CheckMpi(MPI_Barrier(AsComm(ctl_comm_)), "MPI_Barrier");
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
  if (stop_)
    throw BluefogError(StatusCode::kAborted,
                       WinError(StatusCode::kAborted, op, name, stop_reason_).message());
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

std::shared_ptr<std::vector<char>> WindowService::TakeBuffer(Entry& e) {
  for (auto& b : e.pool)
    if (b.use_count() == 1) return b;
  e.pool.push_back(std::make_shared<std::vector<char>>(e.window->bytes()));
  return e.pool.back();
}

int64_t WindowService::Queue(std::unique_ptr<Op> op, const std::shared_ptr<Entry>& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) throw BluefogError(StatusCode::kAborted, stop_reason_);
  op->handle = next_handle_++;
  op->entry = e;
  ++e->pending;
  handles_[op->handle] = Handle();
  const int64_t handle = op->handle;
  queue_.push_back(std::move(op));
  wake_.notify_one();
  return handle;
}

int64_t WindowService::Put(const std::string& name, const void* data, DataType dtype,
                           const std::vector<int64_t>& shape, const std::vector<int32_t>& dsts,
                           const std::vector<double>& weights, double self_weight, bool accumulate,
                           bool require_mutex, bool with_p) {
  const char* opname = accumulate ? "win_accumulate" : "win_put";
  std::shared_ptr<Entry> e = Find(opname, name);
  CheckTensor(opname, *e, dtype, shape);
  CheckRanks(opname, *e, dsts, weights, true);
  auto op = std::make_unique<Op>();
  op->name = opname;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op->payload = TakeBuffer(*e);
  }
  std::memcpy(op->payload->data(), data, e->window->bytes());
  op->with_p = with_p;
  op->p = e->window->associated_p();
  e->window->Publish(data, self_weight, with_p ? self_weight : 1.0);
  std::vector<int32_t> sorted = dsts;
  std::sort(sorted.begin(), sorted.end());
  if (require_mutex && !dsts.empty()) {
    op->steps.push_back({kLock, sorted, {}});
    op->unlock_granted = true;
  }
  op->steps.push_back({accumulate ? kAccumulate : kPut, dsts, weights});
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
    op->unlock_granted = true;
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
  op->steps.push_back({lock ? kLock : kUnlock, ranks, {}});
  return Queue(std::move(op), e);
}

void WindowService::Update(const std::string& name, const void* self, DataType dtype,
                           const std::vector<int64_t>& shape, void* out, double self_weight,
                           const std::vector<int32_t>& ranks, const std::vector<double>& weights,
                           bool reset, bool publish, bool with_p) {
  std::shared_ptr<Entry> e = Find("win_update", name);
  CheckTensor("win_update", *e, dtype, shape);
  CheckRanks("win_update", *e, ranks, weights, false);
  e->window->Update(self, out, self_weight, ranks, weights, reset, publish, with_p);
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
  if (have_comms_ && free_comms) {
    MPI_Comm_free(&AsComm(comm_));
    MPI_Comm_free(&AsComm(ctl_comm_));
  }
  have_comms_ = false;
}

// ---- The service thread ----------------------------------------------------------------------

void WindowService::Loop() {
  auto pause = kMinPause;
  while (true) {
    std::deque<std::unique_ptr<Op>> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) break;
      fresh.swap(queue_);
    }
    bool worked = !fresh.empty();
    try {
      for (auto& op : fresh) {
        Op* raw = op.get();
        running_[raw->handle] = std::move(op);
        Advance(raw);
      }
      for (int k = 0; k < 64; ++k) {
        int flag = 0;
        MPI_Status st;
        CheckMpi(MPI_Iprobe(MPI_ANY_SOURCE, kHeaderTag, AsComm(comm_), &flag, &st), "MPI_Iprobe");
        if (!flag) break;
        Receive(st.MPI_SOURCE);
        worked = true;
      }
      worked |= TestOutgoing();
    } catch (const std::exception& e) {
      // An MPI failure: nothing more can be trusted to arrive.
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      stop_reason_ = Concat("the window service failed: ", e.what());
      break;
    }
    if (worked) {
      pause = kMinPause;
      continue;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    wake_.wait_for(lock, pause, [this] { return stop_ || !queue_.empty(); });
    pause = std::min(pause * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxPause));
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = stop_reason_;
  }
  std::vector<int64_t> left;
  for (auto& [h, op] : running_) left.push_back(h);
  for (int64_t h : left) {
    Op* op = running_[h].get();
    op->status = WinError(StatusCode::kAborted, op->name, op->entry->window->spec().name, reason);
    running_[h]->outstanding = 0;
    running_[h]->steps.clear();
    running_[h]->unlock_granted = false;
    Advance(running_[h].get());
  }
  Drain();
}

void WindowService::Send(int dst, int kind, int window, int64_t op, double weight, double p,
                         std::shared_ptr<std::vector<char>> data, int64_t bytes) {
  outgoing_.emplace_back();
  Outgoing& out = outgoing_.back();
  out.header = std::make_unique<Header>(Header{kind, window, op, weight, p, bytes, 0, 0});
  out.data = std::move(data);
  CheckMpi(MPI_Isend(out.header.get(), sizeof(Header), MPI_BYTE, dst, kHeaderTag, AsComm(comm_),
                     &out.request),
           "MPI_Isend");
  if (bytes > 0) {
    outgoing_.emplace_back();
    Outgoing& body = outgoing_.back();
    body.data = out.data;
    CheckMpi(MPI_Isend(body.data->data(), static_cast<int>(bytes), MPI_BYTE, dst, kDataTag,
                       AsComm(comm_), &body.request),
             "MPI_Isend");
  }
}

void WindowService::SendError(int dst, int window, int64_t op, const Status& status) {
  auto text = std::make_shared<std::vector<char>>(status.message().begin(), status.message().end());
  outgoing_.emplace_back();
  Outgoing& out = outgoing_.back();
  out.header =
      std::make_unique<Header>(Header{kAck, window, op, 0, 0, static_cast<int64_t>(text->size()),
                                      static_cast<int32_t>(status.code()), 0});
  out.data = text;
  CheckMpi(MPI_Isend(out.header.get(), sizeof(Header), MPI_BYTE, dst, kHeaderTag, AsComm(comm_),
                     &out.request),
           "MPI_Isend");
  if (!text->empty()) {
    outgoing_.emplace_back();
    Outgoing& body = outgoing_.back();
    body.data = text;
    CheckMpi(MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_BYTE, dst, kDataTag,
                       AsComm(comm_), &body.request),
             "MPI_Isend");
  }
}

bool WindowService::TestOutgoing() {
  bool any = false;
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int done = 0;
    CheckMpi(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) {
      it = outgoing_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

// Sends the next step's messages, or finishes the op once nothing is outstanding.
void WindowService::Advance(Op* op) {
  while (op->outstanding == 0) {
    if (!op->status.ok()) {
      // After a failure only the release of what was granted still runs.
      op->steps.clear();
    }
    if (op->steps.empty()) {
      if (op->unlock_granted && !op->granted.empty()) {
        op->unlock_granted = false;
        op->steps.push_back({kUnlock, op->granted, {}});
        op->granted.clear();
        // Sent even after a failure: the lock must not stay held.
        const int window = op->entry->window->id();
        for (int32_t r : op->steps.front().ranks) {
          Send(r, kUnlock, window, op->handle, 0, 0, nullptr, 0);
          ++op->outstanding;
        }
        op->steps.clear();
        continue;
      }
      Finish(op->handle);
      return;
    }
    Op::Step& step = op->steps.front();
    const int window = op->entry->window->id();
    if (step.ranks.empty()) {
      op->steps.pop_front();
      continue;
    }
    if (step.kind == kLock) {
      // One rank at a time, ascending.
      const int32_t r = step.ranks.front();
      step.ranks.erase(step.ranks.begin());
      if (step.ranks.empty()) op->steps.pop_front();
      Send(r, kLock, window, op->handle, 0, 0, nullptr, 0);
      op->granted.push_back(r);  // released by the final unlock even if the grant fails
      op->outstanding = 1;
      return;
    }
    Op::Step s = std::move(step);
    op->steps.pop_front();
    for (size_t k = 0; k < s.ranks.size(); ++k) {
      const double w = s.weights.empty() ? 1.0 : s.weights[k];
      switch (s.kind) {
        case kPut:
        case kAccumulate:
          Send(s.ranks[k], s.kind, window, op->handle, w, op->with_p ? op->p * w : 0.0, op->payload,
               static_cast<int64_t>(op->payload->size()));
          break;
        default: Send(s.ranks[k], s.kind, window, op->handle, w, 0, nullptr, 0); break;
      }
      ++op->outstanding;
    }
  }
}

void WindowService::Finish(int64_t handle) {
  Status status;
  std::shared_ptr<Entry> entry;
  auto op_it = running_.find(handle);
  const bool was_running = op_it != running_.end();
  if (was_running) {
    status = op_it->second->status;
    entry = op_it->second->entry;
    running_.erase(op_it);
  }
  std::function<void(const Status&)> waiter;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entry) --entry->pending;
    auto it = handles_.find(handle);
    if (it == handles_.end()) return;
    if (!was_running) status = it->second.status;  // failed before it started
    if (it->second.waiter) {
      waiter = std::move(it->second.waiter);
      handles_.erase(it);
    } else {
      it->second.done = true;
      it->second.status = status;
    }
  }
  if (waiter) waiter(status);
}

void WindowService::Receive(int src) {
  Header h;
  CheckMpi(
      MPI_Recv(&h, sizeof(Header), MPI_BYTE, src, kHeaderTag, AsComm(comm_), MPI_STATUS_IGNORE),
      "MPI_Recv");
  if (h.bytes > 0) {
    if (scratch_.size() < static_cast<size_t>(h.bytes)) scratch_.resize(h.bytes);
    CheckMpi(MPI_Recv(scratch_.data(), static_cast<int>(h.bytes), MPI_BYTE, src, kDataTag,
                      AsComm(comm_), MPI_STATUS_IGNORE),
             "MPI_Recv");
  }
  // Replies to this rank's own operations.
  if (h.kind == kAck || h.kind == kGrant || h.kind == kGetReply) {
    auto it = running_.find(h.op);
    if (it == running_.end()) return;  // failed by a stop in the meantime
    Op* op = it->second.get();
    if (h.kind == kAck && h.code != 0 && op->status.ok()) {
      op->status =
          Status(static_cast<StatusCode>(h.code),
                 Concat("rank ", src, " refused: ", std::string(scratch_.data(), h.bytes)));
    }
    if (h.kind == kGetReply) {
      if (static_cast<size_t>(h.bytes) == op->entry->window->bytes()) {
        op->entry->window->Write(src, scratch_.data(), h.weight, h.weight * h.p, false);
      } else if (op->status.ok()) {
        op->status = Status(StatusCode::kInternal,
                            Concat("rank ", src, " sent ", h.bytes, " bytes for a window of ",
                                   op->entry->window->bytes()));
      }
    }
    if (op->outstanding > 0) --op->outstanding;
    Advance(op);
    return;
  }
  // Requests from other ranks (or this one) to this rank's windows.
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_id_.find(h.window);
    if (it != by_id_.end()) e = it->second;
  }
  auto refuse = [&](const std::string& what) {
    SendError(src, h.window, h.op, Status(StatusCode::kInvalidArgument, what));
  };
  if (!e) return refuse("it has no such window (freed, or not created there)");
  Window& w = *e->window;
  const std::string& name = w.spec().name;
  switch (h.kind) {
    case kPut:
    case kAccumulate:
      if (w.InIndex(src) < 0)
        return refuse(Concat("rank ", src, " is not an in-neighbor of window '", name, "'"));
      if (static_cast<size_t>(h.bytes) != w.bytes())
        return refuse(Concat("window '", name, "' holds ", w.bytes(), " bytes, not ", h.bytes));
      w.Write(src, scratch_.data(), h.weight, h.p, h.kind == kAccumulate);
      Send(src, kAck, h.window, h.op, 0, 0, nullptr, 0);
      return;
    case kGetRequest: {
      if (w.OutIndex(src) < 0)
        return refuse(Concat("rank ", src, " is not an out-neighbor of window '", name, "'"));
      std::shared_ptr<std::vector<char>> buffer;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        buffer = TakeBuffer(*e);
      }
      double p = 0;
      w.ReadSelf(buffer->data(), &p);
      Send(src, kGetReply, h.window, h.op, h.weight, p, buffer,
           static_cast<int64_t>(buffer->size()));
      return;
    }
    case kLock:
      if (e->holder == src)
        return refuse(Concat("rank ", src, " asks for the mutex of window '", name,
                             "', which it holds already (a require_mutex operation or win_mutex "
                             "inside win_mutex on the same rank would wait for itself)"));
      if (e->holder < 0) {
        e->holder = src;
        Send(src, kGrant, h.window, h.op, 0, 0, nullptr, 0);
      } else {
        e->waiters.emplace_back(src, h.op);
      }
      return;
    case kUnlock:
      if (e->holder != src)
        return refuse(
            Concat("rank ", src, " unlocks the mutex of window '", name, "' but does not hold it"));
      e->holder = -1;
      if (!e->waiters.empty()) {
        auto [next, next_op] = e->waiters.front();
        e->waiters.pop_front();
        e->holder = next;
        Send(next, kGrant, h.window, next_op, 0, 0, nullptr, 0);
      }
      Send(src, kAck, h.window, h.op, 0, 0, nullptr, 0);
      return;
    default: return refuse(Concat("unknown message kind ", h.kind));
  }
}

// Serves the other ranks' last messages for a while, so their operations end, then lets go.
void WindowService::Drain() {
  const double until = Now() + kDrainSeconds;
  while (Now() < until) {
    try {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kHeaderTag, AsComm(comm_), &flag, &st);
      if (flag) {
        Receive(st.MPI_SOURCE);
        continue;
      }
      TestOutgoing();
    } catch (const std::exception&) {
      break;
    }
    if (outgoing_.empty()) break;
    std::this_thread::sleep_for(kMinPause);
  }
  for (Outgoing& out : outgoing_) {
    if (out.request != MPI_REQUEST_NULL) {
      MPI_Cancel(&out.request);
      MPI_Request_free(&out.request);
    }
  }
  outgoing_.clear();
}

}  // namespace bluefog
