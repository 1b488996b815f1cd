// The window service's thread: polls for messages, serves the other ranks' requests to this
// rank's windows and drives this rank's own operations (the protocol: window_service.h).
#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/window_internal.h"
#include "runtime/window_service.h"

namespace bluefog {

using namespace window_internal;

namespace {

// The refusal of a request to a window of a rank that shut down.
Status ShutDown(int rank, const std::string& name, const std::string& why) {
  return Status(StatusCode::kAborted,
                Concat("window '", name, "' on rank ", rank, " is shut down (", why,
                       ") and takes no more puts, accumulates, gets or mutex requests; stop "
                       "using it and call bf.shutdown() on this rank too"));
}

}  // namespace

void WindowService::Loop() {
  auto pause = kMinPause;
  bool waiters_refused = false;
  double last_check = Now();
  double last_queued = Now();
  while (true) {
    std::deque<std::unique_ptr<Op>> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_) break;
      fresh.swap(queue_);
    }
    bool worked = !fresh.empty();
    try {
      std::string why;
      if (!waiters_refused && Closed(&why)) {
        RefuseWaiters(why);
        waiters_refused = true;
      }
      for (auto& op : fresh) {
        Op* raw = op.get();
        running_[raw->handle] = std::move(op);
        Begin(raw);
        Advance(raw);
      }
      for (int k = 0; k < 64; ++k) {
        int src = -1;
        if (!link_->ProbeHeader(&src)) break;
        worked = true;
        if (!fault_tolerant_) {
          Receive(src);
          continue;
        }
        try {
          Receive(src);
        } catch (const std::exception& e) {
          MarkGone(src, Concat("its message broke off: ", e.what()));
        }
      }
      worked |= TestOutgoing();
      if (fault_tolerant_) {
        for (int r : link_->TakeLostPeers()) MarkGone(r, "its connection broke");
        if (!running_.empty() && CheckDeadlines() > kLateReplySeconds &&
            Now() - last_check > kTolerantPeerCheckSeconds) {
          last_check = Now();
          link_->CheckPeers();
        }
        if (Now() - last_queued > deadline_ / 3) {
          last_queued = Now();
          SendQueued();
        }
      } else if (worked || running_.empty()) {
        last_check = Now();
      } else if (Now() - last_check > kPeerCheckSeconds) {
        last_check = Now();
        link_->CheckPeers();
      }
    } catch (const std::exception& e) {
      // A failure of the link: nothing more can be trusted to arrive.
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
    op->outstanding = 0;
    op->steps.clear();
    op->granted.clear();  // every rank stops now: nothing will be locked any more
    Advance(op);
  }
  try {
    std::string why;
    if (Closed(&why)) RefuseWaiters(why);
  } catch (const std::exception&) {
    // The link failed: Drain gives up at once too.
  }
  Drain();
}

bool WindowService::Closed(std::string* reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!closed_ && !stop_) return false;
  *reason = closed_ ? closed_reason_ : stop_reason_;
  return true;
}

// After Close: the ranks queued for this rank's mutexes would wait for a grant that never comes.
void WindowService::RefuseWaiters(const std::string& reason) {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, e] : by_id_) entries.push_back(e);
  }
  for (auto& e : entries) {
    for (auto [src, op] : e->waiters)
      SendError(src, e->window->id(), op, ShutDown(rank_, e->window->spec().name, reason));
    e->waiters.clear();
  }
}

void WindowService::Send(int dst, int kind, int window, int64_t op, double weight, double p,
                         std::shared_ptr<std::vector<char>> data, int64_t bytes) {
  Post(dst, std::make_unique<Header>(Header{kind, window, op, weight, p, bytes, 0, 0}),
       std::move(data));
}

void WindowService::SendError(int dst, int window, int64_t op, const Status& status) {
  auto text = std::make_shared<std::vector<char>>(status.message().begin(), status.message().end());
  Post(dst,
       std::make_unique<Header>(Header{kAck, window, op, 0, 0, static_cast<int64_t>(text->size()),
                                       static_cast<int32_t>(status.code()), 0}),
       text);
}

// A header, then its data (h.bytes of `data`) when it has any. Each goes into the list only
// once the link took it, so a send that fails leaves nothing behind.
void WindowService::Post(int dst, std::unique_ptr<Header> header,
                         std::shared_ptr<std::vector<char>> data) {
  const int64_t bytes = header->bytes;
  auto send = link_->SendHeader(dst, header.get());
  outgoing_.push_back(Outgoing{std::move(send), std::move(header), data});
  if (bytes > 0) {
    send = link_->SendData(dst, data->data(), static_cast<size_t>(bytes));
    outgoing_.push_back(Outgoing{std::move(send), nullptr, std::move(data)});
  }
}

bool WindowService::TestOutgoing() {
  bool any = false;
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->send->Test()) {
      it = outgoing_.erase(it);
      any = true;
    } else {
      ++it;
    }
  }
  return any;
}

// Checks a starting op's locks against the mutexes this rank's win_mutex holds, before it asks
// for any: asking for one of them would be refused part-way (or wait for itself), and the
// overlap is known here. A win_mutex lock or unlock updates what is held.
void WindowService::Begin(Op* op) {
  if (op->steps.empty()) return;
  const Op::Step& first = op->steps.front();
  std::vector<int32_t>& held = op->entry->held;
  if (op->win_mutex && first.kind == kUnlock) {
    for (int32_t r : first.ranks) held.erase(std::remove(held.begin(), held.end(), r), held.end());
    return;
  }
  if (first.kind != kLock) return;
  std::vector<int32_t> both;
  for (int32_t r : first.ranks)
    if (std::find(held.begin(), held.end(), r) != held.end()) both.push_back(r);
  if (!both.empty()) {
    const std::string& name = op->entry->window->spec().name;
    op->status = WinError(
        StatusCode::kInvalidArgument, op->name, name,
        Concat("rank ", rank_, " holds the mutex of window '", name, "' on ", RanksText(both),
               " already (in a bf.win_mutex block), and asking for it again would wait for "
               "itself; nothing was locked or sent. Inside win_mutex use require_mutex=False "
               "for those ranks, or leave the block first"));
    op->steps.clear();
    return;
  }
  if (op->win_mutex) {
    op->holds = first.ranks;
    held.insert(held.end(), first.ranks.begin(), first.ranks.end());
  }
}

// Sends the next step's messages, or finishes the op once nothing is outstanding.
void WindowService::Advance(Op* op) {
  while (op->outstanding == 0) {
    if (!op->status.ok()) {
      // After a failure only the release of what was granted still runs.
      op->steps.clear();
    }
    if (op->steps.empty()) {
      if (!op->granted.empty() && (op->release_at_end || !op->status.ok())) {
        // Sent even after a failure: no mutex this op took may stay held. Only those it was
        // granted: a refused request's mutex may be this rank's win_mutex's.
        if (!op->status.ok())
          op->status = Status(op->status.code(),
                              Concat(op->status.message(), " (the mutexes it had taken, on ",
                                     RanksText(op->granted), ", were released)"));
        const int window = op->entry->window->id();
        for (int32_t r : op->granted) {
          if (IsGone(r)) continue;
          Send(r, kUnlock, window, op->handle, 0, 0, nullptr, 0);
          ++op->outstanding;
          if (fault_tolerant_) op->waiting[r] = Now();
        }
        op->granted.clear();
        op->release_at_end = false;
        continue;
      }
      if (!op->status.ok()) {
        std::vector<int32_t>& held = op->entry->held;
        for (int32_t r : op->holds)
          held.erase(std::remove(held.begin(), held.end(), r), held.end());
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
      if (IsGone(r)) continue;
      Send(r, kLock, window, op->handle, 0, 0, nullptr, 0);
      op->outstanding = 1;
      if (fault_tolerant_) op->waiting[r] = Now();
      return;
    }
    Op::Step s = std::move(step);
    op->steps.pop_front();
    for (size_t k = 0; k < s.ranks.size(); ++k) {
      const double w = s.weights.empty() ? 1.0 : s.weights[k];
      const int32_t r = s.ranks[k];
      const bool put = s.kind == kPut || s.kind == kAccumulate;
      if (IsGone(r)) {
        if (put && op->gives_back)
          op->entry->window->GiveBack(op->payload->data(), w, op->with_p ? op->p * w : 0.0);
        continue;
      }
      if (fault_tolerant_) {
        op->waiting[r] = Now();
        if (put) op->unacked[r] = w;
      }
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
  link_->ReceiveHeader(src, &h);
  if (h.bytes > 0) {
    if (scratch_.size() < static_cast<size_t>(h.bytes)) scratch_.resize(h.bytes);
    link_->ReceiveData(src, scratch_.data(), static_cast<size_t>(h.bytes));
  }
  if (h.kind == kQueued) {
    auto it = running_.find(h.op);
    if (it != running_.end()) {
      auto w = it->second->waiting.find(src);
      if (w != it->second->waiting.end()) w->second = Now();
    }
    return;
  }
  // Replies to this rank's own operations.
  if (h.kind == kAck || h.kind == kGrant || h.kind == kGetReply) {
    auto it = running_.find(h.op);
    if (it == running_.end()) return;  // failed by a stop in the meantime
    Op* op = it->second.get();
    if (h.kind == kAck && h.code != 0 && op->status.ok()) {
      op->status =
          WinError(static_cast<StatusCode>(h.code), op->name, op->entry->window->spec().name,
                   Concat("rank ", src, " refused: ", std::string(scratch_.data(), h.bytes)));
    }
    if (fault_tolerant_) {
      // A reply from a rank already dropped (late, not dead) was given up on: not counted twice.
      if (!op->waiting.erase(src)) return;
      op->unacked.erase(src);
    }
    if (h.kind == kGrant) op->granted.push_back(src);
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
  // After shutdown began here only unlocks are served, so the other ranks' operations end
  // with an error at once instead of landing (or waiting) while this rank goes away.
  std::string why;
  if (h.kind != kUnlock && Closed(&why))
    return SendError(src, h.window, h.op, ShutDown(rank_, name, why));
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
        if (fault_tolerant_) Send(src, kQueued, h.window, h.op, 0, 0, nullptr, 0);
      }
      return;
    case kUnlock:
      if (e->holder != src)
        return refuse(
            Concat("rank ", src, " unlocks the mutex of window '", name, "' but does not hold it"));
      e->holder = -1;
      if (Closed(&why)) {
        RefuseWaiters(why);
      } else {
        GrantNext(*e);
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
      int src = -1;
      if (link_->ProbeHeader(&src)) {
        Receive(src);
        continue;
      }
      TestOutgoing();
    } catch (const std::exception&) {
      break;
    }
    if (outgoing_.empty()) break;
    std::this_thread::sleep_for(kMinPause);
  }
  for (Outgoing& out : outgoing_) out.send->Cancel();
  outgoing_.clear();
}

}  // namespace bluefog
