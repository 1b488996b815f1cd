// One negotiation round of a channel (Channel::RunRound): this rank's announcements out, every
// rank's in through the communicator's exchange (which a graph kernel may leave open for the
// channel's thread), the coordinator's ready list, the runtime's own ops, then the collectives.
#include <algorithm>

#include "core/logging.h"
#include "core/op_rules.h"
#include "core/wire.h"
#include "runtime/channel.h"

namespace bluefog {
namespace {

// Ops the runtime's hook carries out on every rank at the same point of the global channel.
bool IsRuntimeOp(OpType op) {
  return op == OpType::kAddProcessSet || op == OpType::kRemoveProcessSet ||
         op == OpType::kWinCreate || op == OpType::kWinFree;
}

}  // namespace

std::string Channel::PrepareRound() {
  RoundMessage mine;
  std::vector<TensorMeta> fresh;
  std::vector<std::string> fresh_data;  // the bytes of the small ones that may ride along
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A join goes last in its round, what was queued after it waits for the next one: every
    // rank then takes this rank's other announcements of the round as made before it joined
    // (the coordinator stands in for joined ranks only in what they did not announce before).
    auto end = std::find_if(unannounced_.begin(), unannounced_.end(),
                            [](const TensorMeta& m) { return m.op == OpType::kJoin; });
    if (end != unannounced_.end()) ++end;
    fresh.assign(unannounced_.begin(), end);
    unannounced_.erase(unannounced_.begin(), end);
    mine.shutdown = stop_requested_;
    fresh_data.resize(fresh.size());
    for (size_t k = 0; k < fresh.size(); ++k) {
      if (!MayRideInRound(fresh[k], info_.rank, inline_threshold_.load())) continue;
      const char* input = static_cast<const char*>(in_flight_.at(fresh[k].name).input);
      fresh_data[k].assign(input, fresh[k].NumBytes());
    }
  }
  // A request agreed before with this exact metadata goes out as its cache slot's bit.
  std::vector<std::pair<uint32_t, std::string>> cached;
  for (size_t k = 0; k < fresh.size(); ++k) {
    // A join is announced in full: cache bits are taken before the announcements, and the
    // join must come after the rest.
    const int64_t slot = fresh[k].op == OpType::kJoin ? -1 : cache_.Find(fresh[k], info_.rank);
    if (slot >= 0) {
      cached.emplace_back(static_cast<uint32_t>(slot), std::move(fresh_data[k]));
    } else {
      mine.announcements.push_back(std::move(fresh[k]));
      mine.announcement_data.push_back(std::move(fresh_data[k]));
    }
  }
  std::sort(cached.begin(), cached.end());
  for (auto& [slot, data] : cached) {
    mine.cached.push_back(slot);
    mine.cached_data.push_back(std::move(data));
  }
  if (stragglers_ != nullptr) {
    mine.has_waits = true;
    stragglers_->OwnTotals(&mine.agreed, &mine.wait_units);
  }
  KeepDataThatFits(&mine);
  const double round_start = NowSeconds();
  if (timeline_->enabled()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint32_t slot : mine.cached) {
      Request& r = in_flight_.at(cache_.Get(slot, info_.rank).name);
      r.announced_at = round_start;
      timeline_->Phase(r.meta.name, "QUEUE", r.enqueued_at, round_start);
    }
    for (const TensorMeta& m : mine.announcements) {
      Request& r = in_flight_.at(m.name);
      r.announced_at = round_start;
      timeline_->Phase(m.name, "QUEUE", r.enqueued_at, round_start);
    }
  }
  stats_.announced += mine.announcements.size() + mine.cached.size();
  stats_.announced_cached += mine.cached.size();
  BF_LOG(LogLevel::kTrace, "channel ", id_, " round ", stats_.rounds + 1, ": announcing ",
         mine.announcements.size() + mine.cached.size(), " (", mine.cached.size(),
         " as cache bits)");
  return EncodeRound(mine);
}

bool Channel::RunRound(bool* anyone_spoke, std::chrono::microseconds limit) {
  const auto on_wait = [this] { CheckStalls(); };
  std::vector<std::string> all;
  if (!round_open_) {
    transport_->StartExchange(PrepareRound());
    round_open_ = true;
  }
  if (!transport_->FinishExchange(&all, on_wait, limit)) return true;  // left open
  round_open_ = false;

  int shutdown_rank = -1;
  waits_.clear();
  for (int r = 0; r < info_.size; ++r) {
    RoundMessage theirs = DecodeRound(all[r].data(), all[r].size());
    if (theirs.shutdown && shutdown_rank < 0) shutdown_rank = r;
    if (theirs.has_waits) waits_.push_back({WorldRank(r), theirs.agreed, theirs.wait_units});
    *anyone_spoke |= !theirs.announcements.empty() || !theirs.cached.empty();
    auto data = [](std::vector<std::string>& list, size_t k) {
      return k < list.size() ? std::move(list[k]) : std::string();
    };
    for (size_t k = 0; k < theirs.cached.size(); ++k)
      coordinator_.Announce(r, cache_.Get(theirs.cached[k], r), data(theirs.cached_data, k));
    for (size_t k = 0; k < theirs.announcements.size(); ++k)
      coordinator_.Announce(r, theirs.announcements[k], data(theirs.announcement_data, k));
  }
  if (stragglers_ != nullptr && !waits_.empty())
    stragglers_->Observe(NowSeconds(), waits_.data(), waits_.size());
  std::vector<Response> ready = coordinator_.TakeReady();
  // Every rank records the same ready list, so the caches stay identical.
  cache_.Record(ready);
  ++stats_.rounds;
  stats_.completed += ready.size();
  BF_LOG(LogLevel::kTrace, "channel ", id_, " round ", stats_.rounds, ": ready ", ready.size());
  TrackReady(ready);
  RunRuntimeOps(ready);
  stats_.collectives += executor_.Execute(ready);
  CheckStalls();
  if (shutdown_rank < 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_reason_.empty())
    stop_reason_ = Concat("rank ", WorldRank(shutdown_rank),
                          " shut down: bf.shutdown() was called or its process exited");
  return false;
}

void Channel::TrackReady(const std::vector<Response>& ready) {
  const bool timeline = timeline_->enabled();
  if (!timeline && stragglers_ == nullptr) return;
  // One pass under one lock: the timeline's NEGOTIATE phases, and this rank's waits (submission
  // to agreement) of the collectives agreed, for the straggler report.
  const double now = NowSeconds();
  uint32_t waited = 0;
  double wait = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Response& r : ready) {
      auto it = in_flight_.find(r.meta.name);
      if (it == in_flight_.end()) continue;
      if (timeline) timeline_->Phase(r.meta.name, "NEGOTIATE", it->second.announced_at, now);
      if (r.status.ok() && !IsRuntimeOp(r.meta.op) && r.meta.op != OpType::kJoin) {
        ++waited;
        wait += now - it->second.enqueued_at;
      }
    }
  }
  if (stragglers_ == nullptr) return;
  stragglers_->NoteOwnWaits(waited, wait);
  if (id_ != 0 || info_.rank != 0 || config_.straggler_report_seconds <= 0 ||
      !stragglers_->Due(now, config_.straggler_report_seconds))
    return;
  const std::string text = stragglers_->Report(now).Text();
  if (!text.empty()) BF_LOG(LogLevel::kWarning, text);
}

// Process sets and windows (created, freed) leave the ready list here, in order, before the
// collectives run: every rank handles them at the same point.
void Channel::RunRuntimeOps(std::vector<Response>& ready) {
  if (std::none_of(ready.begin(), ready.end(),
                   [](const Response& r) { return IsRuntimeOp(r.meta.op); }))
    return;
  std::vector<Response> rest;
  for (Response& r : ready) {
    if (!IsRuntimeOp(r.meta.op)) {
      rest.push_back(std::move(r));
      continue;
    }
    if (!r.status.ok() || !runtime_hook_) {
      Finish(r.meta.name,
             r.status.ok() ? Status(StatusCode::kInternal, "no runtime hook") : r.status);
      continue;
    }
    Status status;
    int id = -1;
    const Request* mine = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = in_flight_.find(r.meta.name);
      if (it != in_flight_.end()) mine = &it->second;  // stable: only this thread erases
    }
    try {
      id = runtime_hook_(r, mine);
    } catch (const BluefogError& e) {
      status = OpError(e.code(), r.meta.op, r.meta.name, e.what());
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = in_flight_.find(r.meta.name);
      if (it != in_flight_.end() && it->second.output)
        *static_cast<int32_t*>(it->second.output) = id;
    }
    Finish(r.meta.name, status);
  }
  ready.swap(rest);
}

}  // namespace bluefog
