// One communicator's engine: the requests this rank submitted for it, the negotiation rounds
// over it (coordinator, response cache), the executors and the stall watch, all driven by one
// background thread. The runtime has one channel for every rank of the job and one for each
// process set this rank belongs to, so that sets never wait on each other.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "core/coordinator.h"
#include "core/flight_recorder.h"
#include "core/request.h"
#include "core/response_cache.h"
#include "core/stall_report.h"
#include "core/straggler.h"
#include "core/timeline.h"
#include "core/wire.h"
#include "runtime/executor.h"
#include "runtime/round_data.h"
#include "transport/communicator.h"

namespace bluefog {

class Channel : private RequestTable {
 public:
  // `transport` is this channel's communicator (already initialized); `info` its rank and size
  // in it; `world_ranks[i]` is the job-wide rank of its rank i (for messages). `timeline` may be
  // null (only the world channel writes one).
  Channel(int id, const Config& config, Communicator* transport, const TransportInfo& info,
          std::vector<int> world_ranks, Timeline* timeline);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Registration and removal of process sets, and creating and freeing windows, run on the
  // world channel's thread, in the order every rank agreed on: the hook does it (given this
  // rank's request) and returns the set's or window's id, or throws BluefogError.
  using RuntimeHook = std::function<int(const Response&, const Request*)>;
  void set_runtime_hook(RuntimeHook hook) { runtime_hook_ = std::move(hook); }
  // Where this channel records its requests (queued, running, finished); set before Start.
  void set_recorder(FlightRecorder* recorder) { recorder_ = recorder; }
  // The hang doctor (runtime/doctor.h) prints the diagnosis of a stall: this channel then only
  // fails a request at BLUEFOG_STALL_SHUTDOWN_TIME, without warnings of its own. Before Start.
  void set_stalls_diagnosed(bool diagnosed) { stalls_diagnosed_ = diagnosed; }
  // Where this channel adds up its requests' waits and records the other ranks' (carried in the
  // rounds); set before Start.
  void set_straggler_tracker(StragglerTracker* tracker) { stragglers_ = tracker; }

  // Runs the loop on the calling thread until every rank of the channel has agreed to stop (or
  // an error stops it); then fails what is still pending. Returns false when an exchange may be
  // left pending (MPI must then not be finalized or the communicator freed).
  bool Run();
  // Run() on a thread of its own.
  void Start();
  // Asks every rank of the channel to stop after the next round (announced in it); `reason`
  // is what pending and later requests are told. Idempotent.
  void RequestStop(const std::string& reason);
  // Waits for Start()'s thread. Returns Run()'s result.
  bool Join();

  // Validates and queues (state, layout, name in flight). A non-ok status means the request was
  // not queued and its `done` will not be called.
  //
  // `drive` (core/request.h) lets the calling thread run the rounds when nothing else is pending
  // on this rank, no other thread is running a round and the thread is not inside one already
  // (a callback of a request it completed), instead of waking the channel's thread and being
  // woken again by it (two thread handoffs). Drive::kUntilDone (eager ops, which wait for the
  // result anyway) runs the negotiation rounds and the collective until its request has
  // finished. Drive::kJoinRound (graph kernels) joins one round and waits for the other ranks
  // at most graph_join_us (Tuning); when they all came, it runs the round and its collectives,
  // otherwise it hands the open round to the channel's thread, so the executor's thread never
  // waits long for a rank still computing. The rounds are the same ones the channel's thread
  // would run, so the other ranks cannot tell the difference: errors, ordering and fusion are
  // unchanged. Otherwise the request is queued as usual.
  Status Enqueue(Request request, Drive drive = Drive::kNo);
  // The requests of one grouped op, queued together (never driven), so that this rank
  // announces them in one round: when ranks disagree on the group's size, the coordinator then
  // sees every tensor of the group at once (Coordinator::FailGroupLeftovers). All or none are
  // queued.
  Status EnqueueGroup(std::vector<Request> requests);

  int id() const { return id_; }
  const TransportInfo& info() const { return info_; }
  bool running() const { return running_.load(); }
  // Requests completed without a collective, from the round's bytes (read after the rounds).
  size_t completed_inline() const { return executor_.completed_inline(); }
  // BLUEFOG_INLINE_THRESHOLD from now on (any thread, any time: whether a rank sends its data
  // is its own choice; a request uses the data only when every rank sent it).
  void set_inline_threshold(int64_t bytes) { inline_threshold_.store(bytes); }
  // Why the channel stopped (empty while running).
  std::string stop_reason();

 private:
  // One negotiation round and the collectives it made ready; false once every rank stops. With
  // `limit` (not negative), the others are waited for that long at most, the round left open
  // (round_open_) if they did not all come; the next RunRound finishes it.
  bool RunRound(bool* anyone_spoke,
                std::chrono::microseconds limit = std::chrono::microseconds(-1));
  // The start of a round: this rank's announcements, taken from unannounced_, encoded.
  std::string PrepareRound();
  // RunRound for whichever thread holds round_mutex_: an error abandons the channel. False
  // once the channel has ended (every rank stopped, or this rank abandoned it).
  bool DriveRound(bool* anyone_spoke,
                  std::chrono::microseconds limit = std::chrono::microseconds(-1));
  // Enqueue's checks, under mutex_: why `request` cannot be queued now, or ok.
  Status CheckEnqueueLocked(const Request& request);
  // Enqueue(drive)'s rounds on the calling thread, until `state` is kFinished or the channel ends
  // (for Drive::kJoinRound, one round at most); what is left pending goes back to the channel's
  // thread. One driver at a time: a caller drives only when nothing else is pending.
  void DriveUntil(const std::atomic<int>& state, Drive how);
  // A request its caller drives: its callback, deferred until the caller let go of the rounds
  // (kFinished while it still drives), or called by whichever thread finishes it after the
  // caller left (kLeft).
  struct Driven {
    enum : int { kDriving, kFinished, kLeft };
    std::atomic<int> state{kDriving};
    Status status;
    std::function<void(const Status&)> done;
  };
  void RunRuntimeOps(std::vector<Response>& ready);
  Request* Lookup(const std::string& name) override;
  void Finish(const std::string& name, const Status& status) override;
  void Abandon(const std::string& reason);
  void FailAll(const Status& status);
  void CheckStalls();
  // The ready list's timeline phases, and how long this rank's requests among it waited for the
  // straggler tracker; on world rank 0's global channel, logs the straggler every
  // BLUEFOG_STRAGGLER_REPORT seconds.
  void TrackReady(const std::vector<Response>& ready);
  // The request's entry in the flight recorder, queued now.
  uint64_t Record(const Request& request);
  int WorldRank(int rank) const { return world_ranks_[rank]; }

  const int id_;
  const Config config_;
  bool stalls_diagnosed_ = false;
  std::atomic<int64_t> inline_threshold_;
  Communicator* transport_;
  const TransportInfo info_;
  const std::vector<int> world_ranks_;
  Timeline no_timeline_;
  Timeline* timeline_;
  FlightRecorder no_recorder_{0};
  FlightRecorder* recorder_ = &no_recorder_;
  StragglerTracker* stragglers_ = nullptr;
  std::vector<StragglerTracker::Totals> waits_;  // a round's, for stragglers_ (round_mutex_)
  Coordinator coordinator_;
  // Held by the thread running a round (the channel's own, or a caller in Enqueue(drive)):
  // cache_, coordinator_, executor_, stall_watch_ and stats_ are used under it only.
  // Lock order: round_mutex_, then mutex_.
  std::mutex round_mutex_;
  // A round whose exchange this rank started and has not finished: during RunRound, and after
  // a graph kernel left it open for the channel's thread (RunRound with a limit).
  bool round_open_ = false;
  ResponseCache cache_;
  Executor executor_;
  StallWatch stall_watch_;
  RuntimeHook runtime_hook_;
  std::thread thread_;
  bool run_result_ = true;
  std::atomic<bool> running_{true};

  std::mutex mutex_;  // guards the members below
  std::condition_variable wake_;
  std::deque<TensorMeta> unannounced_;
  std::unordered_map<std::string, Request> in_flight_;
  bool stop_requested_ = false;
  std::string stop_reason_;
  bool driver_active_ = false;  // a caller runs the rounds (Enqueue with drive)
  bool kicked_ = false;         // a driver left requests pending: the channel's thread takes over
  bool ended_ = false;          // the last round has run (or failed); no more rounds
  bool abandoned_ = false;      // ended by an error: an exchange may be left pending

  struct Stats {
    uint64_t rounds = 0;
    uint64_t rounds_driven = 0;     // of those, run by a caller (Enqueue with drive)
    uint64_t rounds_joined = 0;     // of those, by graph kernels (Drive::kJoinRound)
    uint64_t rounds_left_open = 0;  // of those, handed on open: the others did not come in time
    uint64_t announced = 0;
    uint64_t announced_cached = 0;  // of those, as a cache bit
    uint64_t completed = 0;
    uint64_t collectives = 0;  // after fusion
  } stats_;
};

}  // namespace bluefog
