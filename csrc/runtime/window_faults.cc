// The window service in fault-tolerant mode (WindowService::SetFaultTolerance): dropping a lost
// or silent neighbour, and what its operations and mutexes do without it. Runs on the service's
// thread (window_thread.cc).
#include <algorithm>

#include "core/logging.h"
#include "runtime/window_internal.h"
#include "runtime/window_service.h"

namespace bluefog {

using namespace window_internal;

void WindowService::GrantNext(Entry& e) {
  while (e.holder < 0 && !e.waiters.empty()) {
    auto [next, next_op] = e.waiters.front();
    e.waiters.pop_front();
    if (IsGone(next)) continue;
    e.holder = next;
    Send(next, kGrant, e.window->id(), next_op, 0, 0, nullptr, 0);
  }
}

// Only the service thread changes gone_, so it reads it without the lock.
bool WindowService::IsGone(int rank) { return fault_tolerant_ && gone_.count(rank) > 0; }

void WindowService::SendQueued() {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, e] : by_id_) entries.push_back(e);
  }
  for (auto& e : entries)
    for (auto [src, op] : e->waiters) Send(src, kQueued, e->window->id(), op, 0, 0, nullptr, 0);
}

double WindowService::CheckDeadlines() {
  const double now = Now();
  double oldest = 0;
  std::vector<std::pair<int, std::string>> late;
  for (auto& [h, op] : running_)
    for (auto& [r, since] : op->waiting) {
      if (r == rank_) continue;
      oldest = std::max(oldest, now - since);
      if (now - since > deadline_) late.emplace_back(r, op->entry->window->spec().name);
    }
  for (auto& [r, name] : late)
    MarkGone(r,
             Concat("it left this rank's ", name.empty() ? "" : Concat("'", name, "' "),
                    "window message unanswered for ", deadline_, " s (BLUEFOG_NEIGHBOR_DEADLINE)"));
  return oldest;
}

void WindowService::MarkGone(int rank, const std::string& why) {
  if (rank == rank_ || IsGone(rank)) return;
  std::vector<std::shared_ptr<Entry>> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone_.insert(rank);
    for (auto& [id, e] : by_id_) entries.push_back(e);
  }
  std::string names;
  for (auto& e : entries) {
    const Window& w = *e->window;
    if (w.InIndex(rank) >= 0 || w.OutIndex(rank) >= 0)
      names += Concat(names.empty() ? "'" : ", '", w.spec().name, "'");
  }
  BF_LOG(LogLevel::kWarning, "rank ", rank_, " drops rank ", rank, " from its windows (",
         names.empty() ? "none has it as a neighbour" : names, "): ", why,
         ". Its share of this rank's puts and accumulates stays with this rank, and later "
         "window operations leave it out (fault-tolerant mode)");
  link_->DropPeer(rank);
  for (auto& e : entries) {
    // A lost rank holds this rank's mutex for good, or waits for it in vain.
    std::deque<std::pair<int, int64_t>>& q = e->waiters;
    q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& w) { return w.first == rank; }),
            q.end());
    if (e->holder == rank) {
      e->holder = -1;
      GrantNext(*e);
    }
    const WindowSpec& spec = e->window->spec();
    bool alone = true;
    for (int32_t r : spec.in_ranks) alone &= r == rank_ || IsGone(r);
    for (int32_t r : spec.out_ranks) alone &= r == rank_ || IsGone(r);
    if (alone && alone_.insert(spec.name).second)
      BF_LOG(LogLevel::kWarning, "rank ", rank_, ": every neighbour of window '", spec.name,
             "' is gone; this rank goes on alone with it (its updates keep its own value)");
  }
  std::vector<int64_t> waiting;
  for (auto& [h, op] : running_)
    if (op->waiting.count(rank)) waiting.push_back(h);
  for (int64_t h : waiting) {
    auto it = running_.find(h);
    if (it != running_.end()) Abandon(it->second.get(), rank);
  }
}

// `op` gives up on the reply of a dropped rank.
void WindowService::Abandon(Op* op, int rank) {
  if (!op->waiting.erase(rank)) return;
  auto it = op->unacked.find(rank);
  if (it != op->unacked.end()) {
    const double w = it->second;
    if (op->gives_back)
      op->entry->window->GiveBack(op->payload->data(), w, op->with_p ? op->p * w : 0.0);
    op->unacked.erase(it);
  }
  if (op->outstanding > 0) --op->outstanding;
  Advance(op);
}

}  // namespace bluefog
