#include "core/runtime.h"

#include <algorithm>
#include <chrono>

#include "core/logging.h"
#include "core/op_rules.h"
#include "core/validation.h"
#include "core/wire.h"

namespace bluefog {
namespace {

constexpr auto kMinIdlePause = std::chrono::microseconds(50);
constexpr auto kMaxIdlePause = std::chrono::microseconds(2000);

double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::mutex& InitMutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Runtime& Runtime::Get() {
  // Leaked on purpose: kernels may still reference it while static destructors run at exit.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

void Runtime::Init() {
  std::lock_guard<std::mutex> guard(InitMutex());
  if (state_ == State::kRunning) return;
  BF_ENFORCE(state_ != State::kStopped, StatusCode::kPrecondition,
             "bluefog was shut down in this process (", stop_reason_,
             ") and cannot be initialized again, because MPI cannot be restarted. "
             "Start a new process.");
  config_ = Config::FromEnvironment();
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread(&Runtime::Loop, this, &started);
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

void Runtime::Shutdown() {
  std::lock_guard<std::mutex> guard(InitMutex());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_ == State::kRunning && !shutdown_requested_) {
      shutdown_requested_ = true;
      stop_reason_ =
          Concat("rank ", info_.rank, " shut down: bf.shutdown() was called or its process exited");
    }
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Runtime::Enqueue(Request request) {
  const TensorMeta& meta = request.meta;
  Status invalid = ValidateRequest(request);
  if (!invalid.ok()) return WithRank(info_.rank, invalid);

  std::unique_lock<std::mutex> lock(mutex_);
  if (state_ != State::kRunning || shutdown_requested_) {
    const bool never = state_ == State::kNotStarted;
    return OpError(never ? StatusCode::kPrecondition : StatusCode::kAborted, meta.op, meta.name,
                   never ? "bluefog is not initialized; call bf.init() first"
                         : Concat("bluefog has been shut down (", stop_reason_,
                                  "); no collective can run after shutdown"));
  }
  invalid = ValidateForLayout(request, info_.rank, info_.size);
  if (!invalid.ok()) return WithRank(info_.rank, invalid);
  if (in_flight_.count(meta.name))
    return WithRank(info_.rank,
                    OpError(StatusCode::kInvalidArgument, meta.op, meta.name,
                            "a collective with this name is already in flight on this rank; give "
                            "collectives that may run concurrently distinct names"));
  request.enqueued_at = NowSeconds();
  request.meta.average = request.average;
  request.meta.scale = request.scale;
  unannounced_.push_back(meta);
  in_flight_.emplace(meta.name, std::move(request));
  lock.unlock();
  wake_.notify_one();
  return Status::Ok();
}

void Runtime::Loop(std::promise<void>* started) {
  try {
    info_ = transport_.Init();
    transport_.set_ring_threshold_bytes(config_.ring_threshold_bytes);
  } catch (...) {
    started->set_exception(std::current_exception());
    return;
  }
  coordinator_ = std::make_unique<Coordinator>(info_.size);
  cache_ = std::make_unique<ResponseCache>(static_cast<size_t>(config_.cache_capacity), info_.size);
  SetLogContext(config_.log_level, info_.rank);
  if (!config_.timeline_prefix.empty()) {
    try {
      timeline_.Open(config_.timeline_prefix, info_.rank);
    } catch (const BluefogError& e) {
      BF_LOG(LogLevel::kError, e.what(), "; running without a timeline");
    }
  }
  executor_.Configure(info_,
                      FusionLimits{config_.fusion_threshold_bytes, config_.ring_threshold_bytes});
  stall_watch_ = StallWatch(config_.stall_check_seconds, config_.stall_shutdown_seconds);
  state_ = State::kRunning;
  started->set_value();
  BF_LOG(LogLevel::kDebug, "initialized: size ", info_.size, ", local size ", info_.local_size);

  // A rank joins rounds while it has anything new to say or any request still in flight (the
  // other ranks may be about to announce the matching names). With nothing at all, it sleeps
  // until a request arrives. While only waiting, rounds in which no rank said anything are
  // spaced out by a growing pause, so idle ranks do not spin on empty rounds.
  auto idle_pause = std::chrono::microseconds(0);
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto has_news = [this] { return !unannounced_.empty() || shutdown_requested_; };
      if (in_flight_.empty()) {
        wake_.wait(lock, has_news);
      } else if (idle_pause.count() > 0) {
        wake_.wait_for(lock, idle_pause, has_news);
      }
    }
    if (config_.cycle_time_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
    bool keep_going = true;
    try {
      bool anyone_spoke = false;
      keep_going = RunRound(&anyone_spoke);
      idle_pause = anyone_spoke ? std::chrono::microseconds(0)
                                : std::clamp(idle_pause * 2, kMinIdlePause, kMaxIdlePause);
    } catch (const BluefogError& e) {
      Abandon(e.what());
      keep_going = false;
    } catch (const std::exception& e) {
      // Not the library's own error (e.g. std::bad_alloc for a huge fused buffer): this rank
      // may have left its peers inside a collective, so it cannot go on; it stops, failing
      // every pending request with the reason instead of terminating the process.
      Abandon(Concat("internal error on the background thread: ", e.what()));
      keep_going = false;
    } catch (...) {
      Abandon("internal error on the background thread: an unknown exception");
      keep_going = false;
    }
    if (!keep_going) break;
  }
  BF_LOG(LogLevel::kDebug, "stopping after ", stats_.rounds, " negotiation rounds for ",
         stats_.announced, " requests (", stats_.announced_cached, " announced as cache bits); ",
         stats_.collectives, " collectives ran");
  FailAll(Status(StatusCode::kAborted, Concat("bluefog has been shut down (", stop_reason_,
                                              "); no collective can run after shutdown")));
  timeline_.Close();
  if (!abandoned_mpi_) transport_.Shutdown();
}

bool Runtime::RunRound(bool* anyone_spoke) {
  RoundMessage mine;
  std::vector<TensorMeta> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh.assign(unannounced_.begin(), unannounced_.end());
    unannounced_.clear();
    mine.shutdown = shutdown_requested_;
  }
  // A request agreed before with this exact metadata goes out as its cache slot's bit.
  for (TensorMeta& m : fresh) {
    const int64_t slot = cache_->Find(m, info_.rank);
    if (slot >= 0) {
      mine.cached.push_back(static_cast<uint32_t>(slot));
    } else {
      mine.announcements.push_back(std::move(m));
    }
  }
  std::sort(mine.cached.begin(), mine.cached.end());
  const double round_start = NowSeconds();
  if (timeline_.enabled()) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint32_t slot : mine.cached) {
      Request& r = in_flight_.at(cache_->Get(slot, info_.rank).name);
      r.announced_at = round_start;
      timeline_.Phase(r.meta.name, "QUEUE", r.enqueued_at, round_start);
    }
    for (const TensorMeta& m : mine.announcements) {
      Request& r = in_flight_.at(m.name);
      r.announced_at = round_start;
      timeline_.Phase(m.name, "QUEUE", r.enqueued_at, round_start);
    }
  }
  std::vector<std::string> all =
      transport_.ExchangeAll(EncodeRound(mine), [this] { CheckStalls(); });

  int shutdown_rank = -1;
  for (int r = 0; r < info_.size; ++r) {
    RoundMessage theirs = DecodeRound(all[r].data(), all[r].size());
    if (theirs.shutdown && shutdown_rank < 0) shutdown_rank = r;
    *anyone_spoke |= !theirs.announcements.empty() || !theirs.cached.empty();
    for (uint32_t slot : theirs.cached) coordinator_->Announce(r, cache_->Get(slot, r));
    for (const TensorMeta& meta : theirs.announcements) coordinator_->Announce(r, meta);
  }
  std::vector<Response> ready = coordinator_->TakeReady();
  // Every rank records the same ready list, so the caches stay identical.
  cache_->Record(ready);
  if (timeline_.enabled()) {
    const double now = NowSeconds();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Response& r : ready) {
      auto it = in_flight_.find(r.meta.name);
      if (it != in_flight_.end())
        timeline_.Phase(r.meta.name, "NEGOTIATE", it->second.announced_at, now);
    }
  }
  ++stats_.rounds;
  stats_.announced += mine.announcements.size() + mine.cached.size();
  stats_.announced_cached += mine.cached.size();
  stats_.completed += ready.size();
  BF_LOG(LogLevel::kTrace, "round ", stats_.rounds, ": announced ",
         mine.announcements.size() + mine.cached.size(), " (", mine.cached.size(),
         " as cache bits), ready ", ready.size());
  stats_.collectives += executor_.Execute(ready);
  CheckStalls();
  if (shutdown_rank < 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_reason_.empty())
    stop_reason_ = Concat("rank ", shutdown_rank,
                          " shut down: bf.shutdown() was called or its process exited");
  return false;
}

Request* Runtime::Lookup(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = in_flight_.find(name);
  BF_ENFORCE(it != in_flight_.end(), StatusCode::kInternal, "tensor '", name,
             "' completed but this rank has no such request");
  return &it->second;
}

void Runtime::Finish(const std::string& name, const Status& status) {
  Request request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_flight_.find(name);
    if (it == in_flight_.end()) return;
    request = std::move(it->second);
    in_flight_.erase(it);
  }
  request.done(WithRank(info_.rank, status));
}

void Runtime::Abandon(const std::string& reason) {
  BF_LOG(LogLevel::kError, reason);
  std::lock_guard<std::mutex> lock(mutex_);
  stop_reason_ = reason;
  // The exchange that threw may still be pending; MPI cannot be finalized over it. The process
  // then exits without MPI_Finalize, which makes mpirun end the job with an error.
  abandoned_mpi_ = true;
}

void Runtime::FailAll(const Status& status) {
  std::unordered_map<std::string, Request> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = State::kStopped;
    failed.swap(in_flight_);
    unannounced_.clear();
  }
  for (auto& [name, request] : failed)
    request.done(
        WithRank(info_.rank, OpError(status.code(), request.meta.op, name, status.message())));
}

void Runtime::CheckStalls() {
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
  if (verdict == StallWatch::Verdict::kQuiet) return;
  std::sort(mine.begin(), mine.end());
  std::string message = StallMessage(now - oldest, mine, coordinator_->Waiting());
  if (verdict == StallWatch::Verdict::kFail)
    throw BluefogError(
        StatusCode::kAborted,
        Concat(message, " Giving up after BLUEFOG_STALL_SHUTDOWN_TIME=",
               config_.stall_shutdown_seconds, " s: bluefog is shut down on this rank."));
  BF_LOG(LogLevel::kWarning, message, " (BLUEFOG_STALL_CHECK_TIME=", config_.stall_check_seconds,
         " s)");
}

}  // namespace bluefog
