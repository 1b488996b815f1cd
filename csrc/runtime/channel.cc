#include "runtime/channel.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "core/logging.h"
#include "core/op_rules.h"
#include "core/validation.h"
#include "core/wire.h"
#include "transport/options.h"

namespace bluefog {
namespace {

constexpr auto kMinIdlePause = std::chrono::microseconds(50);
constexpr auto kMaxIdlePause = std::chrono::microseconds(2000);
// Set while this thread runs rounds: a request that one of their callbacks submits is queued,
// never driven (the rounds are held already).
thread_local bool t_running_rounds = false;

}  // namespace

Channel::Channel(int id, const Config& config, Communicator* transport, const TransportInfo& info,
                 std::vector<int> world_ranks, Timeline* timeline)
    : id_(id),
      config_(config),
      inline_threshold_(config.inline_threshold_bytes),
      transport_(transport),
      info_(info),
      world_ranks_(std::move(world_ranks)),
      timeline_(timeline ? timeline : &no_timeline_),
      coordinator_(info.size, id == 0 ? std::vector<int>() : world_ranks_),
      cache_(static_cast<size_t>(config.cache_capacity), info.size),
      executor_(transport, this, timeline_),
      stall_watch_(config.stall_check_seconds, config.stall_shutdown_seconds) {
  executor_.Configure(info_,
                      FusionLimits{config_.fusion_threshold_bytes, config_.ring_threshold_bytes});
}

std::string Channel::stop_reason() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_reason_;
}

void Channel::Start() {
  thread_ = std::thread([this] { run_result_ = Run(); });
}

bool Channel::Join() {
  if (thread_.joinable()) thread_.join();
  return run_result_;
}

void Channel::RequestStop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (running_ && !stop_requested_) {
      stop_requested_ = true;
      stop_reason_ = reason;
    }
  }
  wake_.notify_all();
}

Status Channel::CheckEnqueueLocked(const Request& request) {
  const TensorMeta& meta = request.meta;
  const int me = WorldRank(info_.rank);
  if (!running_ || stop_requested_ || ended_) {
    const std::string what =
        id_ == 0 ? Concat("bluefog has been shut down (", stop_reason_,
                          "); no collective can run after shutdown")
                 : Concat("process set ", id_, " can no longer be used (", stop_reason_, ")");
    return OpError(StatusCode::kAborted, meta.op, meta.name, what);
  }
  Status invalid = ValidateForLayout(request, info_.rank, info_.size);
  if (!invalid.ok()) return WithRank(me, invalid);
  if (in_flight_.count(meta.name))
    return WithRank(me, OpError(StatusCode::kInvalidArgument, meta.op, meta.name,
                                "a collective with this name is already in flight on this rank; "
                                "give collectives that may run concurrently distinct names"));
  return Status::Ok();
}

uint64_t Channel::Record(const Request& request) {
  return recorder_->Begin(OpTypeName(request.meta.op), request.meta.name, request.process_set,
                          static_cast<int64_t>(request.meta.NumBytes()), request.meta.dtype);
}

Status Channel::EnqueueGroup(std::vector<Request> requests) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t k = 0; k < requests.size(); ++k) {
      Status s = CheckEnqueueLocked(requests[k]);
      for (size_t j = 0; j < k && s.ok(); ++j)
        if (requests[j].meta.name == requests[k].meta.name)
          s = WithRank(WorldRank(info_.rank),
                       OpError(StatusCode::kInvalidArgument, requests[k].meta.op,
                               requests[k].meta.name, "the group names this tensor twice"));
      if (!s.ok()) return s;
    }
    const double now = NowSeconds();
    for (Request& request : requests) {
      request.enqueued_at = now;
      request.flight_id = Record(request);
      unannounced_.push_back(request.meta);
      std::string name = request.meta.name;
      in_flight_.emplace(std::move(name), std::move(request));
    }
  }
  wake_.notify_one();
  return Status::Ok();
}

Status Channel::Enqueue(Request request, Drive how) {
  const TensorMeta& meta = request.meta;
  std::unique_lock<std::mutex> lock(mutex_);
  Status refused = CheckEnqueueLocked(request);
  if (!refused.ok()) return refused;
  request.enqueued_at = NowSeconds();
  request.flight_id = Record(request);
  // Driven by the caller only when this is the one request of the rank: with others pending,
  // the channel's thread is at work (and may fuse this one with them).
  const bool drive =
      how != Drive::kNo && !t_running_rounds && !driver_active_ && info_.threads_multiple &&
      config_.cycle_time_ms <= 0 && in_flight_.empty() && unannounced_.empty() &&
      (how == Drive::kUntilDone
           ? config_.eager_inline
           : transport_->splits_exchange() &&
                 transport_->tuning().graph_join_us.load(std::memory_order_relaxed) > 0);
  std::shared_ptr<Driven> driven;
  if (drive) {
    driver_active_ = true;  // the channel's thread stays out of the rounds until it is done
    driven = std::make_shared<Driven>();
    driven->done = std::move(request.done);
    request.done = [driven](const Status& s) {
      driven->status = s;
      if (driven->state.exchange(Driven::kFinished) == Driven::kLeft) driven->done(s);
    };
  }
  unannounced_.push_back(meta);
  in_flight_.emplace(meta.name, std::move(request));
  lock.unlock();
  if (!drive) {
    wake_.notify_one();
    return Status::Ok();
  }
  DriveUntil(driven->state, how);
  // The caller's own request completes once this thread has let go of the rounds: what its
  // callback starts (a graph's next kernel) may then submit the next request and find the
  // channel free to drive. Handed over unfinished, the channel's thread completes it.
  if (driven->state.exchange(Driven::kLeft) == Driven::kFinished) driven->done(driven->status);
  return Status::Ok();
}

void Channel::DriveUntil(const std::atomic<int>& state, Drive how) {
  auto finished = [&state] { return state.load() == Driven::kFinished; };
  // The channel's thread had nothing to do and starts no round while a driver is active; it
  // may still hold the rounds for a moment, checking that.
  std::unique_lock<std::mutex> round(round_mutex_);
  t_running_rounds = true;
  // A graph kernel's one round: what the other ranks do not join within the wait, and what the
  // round leaves pending, is the channel thread's (two ranks whose only executor threads each
  // joined a round for a different tensor would otherwise wait for each other forever).
  const bool join = how == Drive::kJoinRound;
  const auto limit = std::chrono::microseconds(
      join ? transport_->tuning().graph_join_us.load(std::memory_order_relaxed) : -1);
  // As the channel's thread does while waiting on other ranks: rounds in which nobody said
  // anything are spaced out by a growing pause.
  auto idle_pause = std::chrono::microseconds(0);
  while (!finished()) {
    bool anyone_spoke = false;
    ++stats_.rounds_driven;
    if (join) ++stats_.rounds_joined;
    const bool going = DriveRound(&anyone_spoke, limit);
    if (round_open_) ++stats_.rounds_left_open;
    if (!going || join || finished()) break;
    idle_pause = anyone_spoke ? std::chrono::microseconds(0)
                              : std::clamp(idle_pause * 2, kMinIdlePause, kMaxIdlePause);
    if (idle_pause.count() > 0) std::this_thread::sleep_for(idle_pause);
  }
  t_running_rounds = false;
  // Anything still pending (an open round, other threads' requests, or the failures of an ended
  // channel) is the channel thread's. Handed over while the rounds are still held, so that once
  // they are released this thread touches no member.
  bool kick;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    driver_active_ = false;
    kick = kicked_ = !in_flight_.empty() || !unannounced_.empty() || ended_ || stop_requested_;
  }
  // With nothing left the channel's thread stays asleep: waking it only to find nothing (a
  // futex wake and a thread switch per eager call) costs the core other ranks may need.
  if (kick) wake_.notify_one();
}

bool Channel::Run() {
  BF_LOG(LogLevel::kDebug, "channel ", id_, " running: size ", info_.size);
  t_running_rounds = true;  // the callbacks this thread runs never drive
  // A rank joins rounds while it has anything new to say or any request still in flight (the
  // other ranks may be about to announce the matching names). With nothing at all, it sleeps
  // until a request arrives. While only waiting, rounds in which no rank said anything are
  // spaced out by a growing pause, so idle ranks do not spin on empty rounds.
  auto idle_pause = std::chrono::microseconds(0);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // While a caller drives the rounds (Enqueue with drive) they are its alone.
      auto has_news = [this] {
        return ended_ || (!driver_active_ && (!unannounced_.empty() || stop_requested_ || kicked_ ||
                                              !in_flight_.empty()));
      };
      if (in_flight_.empty() || driver_active_) {
        wake_.wait(lock, has_news);
      } else if (idle_pause.count() > 0) {
        // Only this thread completes requests now: in_flight_ stays non-empty, so no caller
        // becomes a driver during the pause.
        wake_.wait_for(lock, idle_pause, [this] {
          return ended_ || !unannounced_.empty() || stop_requested_ || kicked_;
        });
      }
      kicked_ = false;
    }
    if (config_.cycle_time_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
    std::lock_guard<std::mutex> round(round_mutex_);
    {
      // A caller may have run the rounds in the meantime, or be about to (Enqueue with drive).
      std::lock_guard<std::mutex> lock(mutex_);
      if (ended_) break;
      if (driver_active_ ||
          (!round_open_ && in_flight_.empty() && unannounced_.empty() && !stop_requested_))
        continue;
    }
    bool anyone_spoke = false;
    if (!DriveRound(&anyone_spoke)) break;
    idle_pause = anyone_spoke ? std::chrono::microseconds(0)
                              : std::clamp(idle_pause * 2, kMinIdlePause, kMaxIdlePause);
  }
  BF_LOG(LogLevel::kDebug, "channel ", id_, " stopping after ", stats_.rounds,
         " negotiation rounds (", stats_.rounds_driven, " run by callers, ", stats_.rounds_joined,
         " of those joined by graph kernels, ", stats_.rounds_left_open,
         " of which left open to this thread) for ", stats_.announced, " requests (",
         stats_.announced_cached, " announced as cache bits); ", stats_.collectives,
         " collectives ran; ", executor_.completed_inline(),
         " requests completed from the rounds' data alone");
  bool abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abandoned = abandoned_;
  }
  const std::string reason = stop_reason();
  FailAll(Status(StatusCode::kAborted,
                 id_ == 0 ? Concat("bluefog has been shut down (", reason,
                                   "); no collective can run after shutdown")
                          : Concat("process set ", id_, " can no longer be used (", reason, ")")));
  return !abandoned;
}

bool Channel::DriveRound(bool* anyone_spoke, std::chrono::microseconds limit) {
  bool keep_going = false;
  std::string failure;
  try {
    keep_going = RunRound(anyone_spoke, limit);
  } catch (const BluefogError& e) {
    failure = e.what();
  } catch (const std::exception& e) {
    // Not the library's own error (e.g. std::bad_alloc for a huge fused buffer): this rank
    // may have left its peers inside a collective, so it cannot go on; it stops, failing
    // every pending request with the reason instead of terminating the process.
    failure = Concat("internal error on the background thread: ", e.what());
  } catch (...) {
    failure = "internal error on the background thread: an unknown exception";
  }
  if (!failure.empty()) Abandon(failure);
  if (keep_going) return true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_ = true;
    abandoned_ = abandoned_ || !failure.empty();
  }
  wake_.notify_all();
  return false;
}

Request* Channel::Lookup(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_flight_.find(name);
  BF_ENFORCE(it != in_flight_.end(), StatusCode::kInternal, "tensor '", name,
             "' completed but this rank has no such request");
  // The executors look a request up when its collective runs: from now on it is exchanging.
  recorder_->Start(it->second.flight_id);
  return &it->second;  // stable: only this thread erases
}

void Channel::Finish(const std::string& name, const Status& status) {
  Request request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_flight_.find(name);
    if (it == in_flight_.end()) return;
    request = std::move(it->second);
    in_flight_.erase(it);
  }
  recorder_->End(request.flight_id, status.ok());
  request.done(WithRank(WorldRank(info_.rank), status));
}

void Channel::Abandon(const std::string& reason) {
  // In an elastic round (bfrun --gloo --min-np) a lost rank is expected: bf.elastic.run
  // re-forms the job and says so in one line, and any other caller gets the reason in the
  // error of its collective. Elsewhere the job is over, which deserves an ERROR.
  const std::string pending = recorder_->Pending(NowSeconds(), 10);
  BF_LOG(config_.gloo_external_store ? LogLevel::kInfo : LogLevel::kError, reason,
         pending.empty() ? "" : " Pending on this rank (bf.flight_recorder()):", pending);
  std::lock_guard<std::mutex> lock(mutex_);
  // The exchange that threw may still be pending; MPI cannot be finalized (nor this
  // communicator freed) over it. The process then exits without MPI_Finalize, which makes
  // mpirun end the job with an error.
  stop_reason_ = reason;
}

void Channel::FailAll(const Status& status) {
  std::unordered_map<std::string, Request> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    failed.swap(in_flight_);
    unannounced_.clear();
  }
  for (auto& [name, request] : failed) {
    recorder_->End(request.flight_id, false);
    request.done(WithRank(WorldRank(info_.rank),
                          OpError(status.code(), request.meta.op, name, status.message())));
  }
}

void Channel::CheckStalls() {
  const double now = NowSeconds();
  if (!stall_watch_.enabled() || !stall_watch_.Due(now)) return;
  double oldest = now;
  std::vector<std::string> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, request] : in_flight_) {
      oldest = std::min(oldest, request.enqueued_at);
      mine.push_back(name);
    }
  }
  const StallWatch::Verdict verdict = stall_watch_.Check(now, oldest);
  if (verdict == StallWatch::Verdict::kQuiet ||
      (verdict == StallWatch::Verdict::kWarn && stalls_diagnosed_))
    return;
  std::sort(mine.begin(), mine.end());
  std::vector<WaitingTensor> waiting = coordinator_.Waiting();
  for (WaitingTensor& w : waiting)  // job-wide ranks in messages
    for (int& r : w.missing_ranks) r = WorldRank(r);
  std::string message = StallMessage(now - oldest, mine, waiting);
  recorder_->NoteStall(Concat("rank ", WorldRank(info_.rank), ": ", message), now);
  const std::string pending = recorder_->Pending(now, 10);
  if (!pending.empty())
    message += Concat(" What rank ", WorldRank(info_.rank),
                      " has pending (bf.flight_recorder()):", pending, "\n");
  if (verdict == StallWatch::Verdict::kFail)
    throw BluefogError(
        StatusCode::kAborted,
        Concat(message, " Giving up after BLUEFOG_STALL_SHUTDOWN_TIME=",
               config_.stall_shutdown_seconds, " s: bluefog is shut down on this rank."));
  BF_LOG(LogLevel::kWarning, message, " (BLUEFOG_STALL_CHECK_TIME=", config_.stall_check_seconds,
         " s)");
}

}  // namespace bluefog
