// The process-wide runtime: starts MPI on a background thread, owns the channel of every rank
// of the job (the global process set) and one channel per process set this rank belongs to,
// and routes each request to its set's channel. The C API and the framework kernels are its
// only callers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/flight_recorder.h"
#include "core/request.h"
#include "core/straggler.h"
#include "core/timeline.h"
#include "runtime/channel.h"
#include "runtime/doctor.h"
#include "runtime/window_service.h"
#include "transport/communicator.h"
#include "transport/shared_heap.h"

namespace bluefog {

class Runtime {
 public:
  static Runtime& Get();

  // Starts the background thread and MPI; idempotent while running. On the Gloo backend it
  // may run again after a shutdown or a failure (a lost peer): everything of the earlier job
  // (channels, process sets, windows, the transport) is dropped and a new job is joined, as
  // the variables say now (an elastic round). MPI cannot be restarted: there it throws.
  // `settings` take precedence over the environment's variables of the same names
  // (Config::FromEnvironment). Throws BluefogError.
  void Init(const Config::Settings& settings = {});
  // Stops every rank's runtime: pending requests fail with a "shut down" error. Idempotent.
  void Shutdown();

  bool running() const;
  // Whether the windows take operations (fault-tolerant mode: also after the collectives
  // failed, until shutdown).
  bool windows_open() const;
  // Whether this process is a fork (os.fork, multiprocessing's "fork") of the one that called
  // Init. Only the calling thread survives a fork; the communicator, the shared memory of the
  // rounds and the channels' state are the parent's, and the child must not touch them: its
  // collectives are refused (ForkedChildError), its Shutdown does nothing.
  bool forked() const;
  // The error a forked child gets for `what` ("bluefog allreduce of tensor 'x'", say).
  std::string ForkedChildError(const std::string& what) const;
  // BLUEFOG_EAGER_C_API (read at Init).
  bool eager_c_api() const { return config_.eager_c_api; }
  // This rank in the whole job.
  const TransportInfo& info() const { return info_; }
  // The allreduce paths the global communicator can take (communicator.h).
  TransportPaths paths() const { return transport_->paths(); }
  // Which backend runs the job ("mpi").
  const char* backend() const { return transport_->backend(); }
  // The switches benches and tests turn at run time (transport/options.h); while running.
  Tuning& tuning() { return transport_->tuning(); }
  // The running job's shared heap (large outputs every rank of the host can write into:
  // transport/shared_heap.h), or nullptr; any thread.
  std::shared_ptr<SharedHeap> shared_heap() const;
  // Requests of every rank's channel completed from the bytes sent in a negotiation round
  // (Executor::CompleteInline) so far; for tests.
  size_t completed_inline() const { return world_ ? world_->completed_inline() : 0; }
  // The run-time switches of benches and tests, by name: the global communicator's Tuning
  // (transport/options.h), and "inline_threshold", BLUEFOG_INLINE_THRESHOLD of every channel
  // this rank has now (ranks need not agree, see Channel::set_inline_threshold). Throw
  // BluefogError(kInvalidArgument) for an unknown knob, naming those that exist.
  int64_t GetTuning(const std::string& knob);
  // Returns the value before.
  int64_t SetTuning(const std::string& knob, int64_t value);

  // Validates locally and queues on the request's process set. A non-ok status means the
  // request was not queued and `done` will not be called. `drive`: see Channel::Enqueue (the
  // global set only; a process set's channel may be removed while a caller would drive it).
  Status Enqueue(Request request, Drive drive = Drive::kNo);
  // The requests of one grouped op (one process set, one op): validated, then queued together
  // (Channel::EnqueueGroup). All or none are queued; none is driven.
  Status EnqueueGroup(std::vector<Request> requests);
  // Enqueue, then waits for the request to finish (its `done` is this function's): the status
  // of either.
  Status EnqueueAndWait(Request request, Drive drive = Drive::kNo);

  // Process sets. Every rank must register (and remove) the same sets in the same order;
  // these block until every rank has. Throw BluefogError (disagreement, unknown set, ...).
  int AddProcessSet(const std::vector<int>& ranks);
  void RemoveProcessSet(int id);
  // This rank's index and the size of set `id` (0: the whole job). False when this rank is not
  // in the set, or there is no such set.
  bool SetLayout(int id, int* rank, int* size);
  // The job-wide ranks of a registered set; empty when there is none.
  std::vector<int> SetRanks(int id);

  // Records this rank's timeline into `path` from now on (replacing any open one), or stops.
  // Throws BluefogError when the file cannot be created.
  void StartTimeline(const std::string& path) { timeline_.OpenPath(path, info_.rank); }
  void StopTimeline() { timeline_.Close(); }
  // A user's activity (bf.timeline_start_activity/end_activity), times from the steady clock
  // in seconds. False when no timeline is recording.
  bool TimelineActivity(const std::string& tensor, const std::string& activity, double start,
                        double end) {
    if (!timeline_.enabled()) return false;
    timeline_.Phase(tensor, activity.c_str(), start, end);
    return true;
  }
  bool timeline_enabled() const { return timeline_.enabled(); }

  // The windows (bf.win_*). Created and freed through Enqueue (kWinCreate, kWinFree), so every
  // rank does it at the same point; the other operations go to the service directly.
  WindowService& windows() { return *windows_; }
  // This rank's last operations (core/flight_recorder.h): any thread, any time.
  FlightRecorder& recorder() { return recorder_; }
  // When each rank's requests arrived at the negotiation, over the last minute (every channel).
  StragglerTracker& stragglers() { return stragglers_; }
  // What every rank is doing, asked now (runtime/doctor.h); a sentence saying why not when the
  // doctor is off or not running.
  std::string Diagnose();

 private:
  Runtime() = default;
  void Main(std::promise<void>* started);
  // On the background thread at init, at the same point on every rank: the hang doctor's link.
  void StartDoctor();
  // Drops what an ended job left (Init on Gloo, after the background thread has ended).
  void ResetEndedJob();
  // On the global channel's thread: registers or removes the set of `response`, or creates or
  // frees its window (`mine`: this rank's request).
  int OnRuntimeOp(const Response& response, const Request* mine);
  // Runs a registration or removal request on the global channel and waits for it.
  int RunSetRequest(OpType op, const std::string& name, std::vector<int32_t> ranks);
  // The channel of the request's process set, under sets_mutex_, after the set's checks (a
  // broadcast's root becomes the set's rank); null with the reason in *status.
  Channel* SetChannelLocked(Request& request, Status* status);
  // After this rank's join was queued on the global channel: tells the channel of every set
  // this rank belongs to, so that the set's collectives fail on every member instead of waiting
  // for this rank (join() stands in for the global set only). Under sets_mutex_.
  void JoinSetsLocked(const std::string& name);

  Config config_;
  TransportInfo info_;
  std::unique_ptr<Communicator> transport_;  // set by the background thread before Init returns
  mutable std::mutex heap_mutex_;
  std::shared_ptr<SharedHeap> heap_;  // transport_'s, until it shuts down; under heap_mutex_
  std::atomic<int64_t> inline_threshold_{0};  // what SetTuning last set (config's at first)
  Timeline timeline_;
  FlightRecorder recorder_;  // every channel's requests and the window operations
  StragglerTracker stragglers_;
  std::unique_ptr<WindowService> windows_ = std::make_unique<WindowService>();
  std::unique_ptr<Doctor> doctor_;  // set by the background thread before Init returns
  std::unique_ptr<Channel> world_;  // set once by the background thread, before Init returns
  std::atomic<bool> started_{false};
  std::thread thread_;
  // Fault-tolerant mode: once the global channel failed (a lost rank), the background thread
  // keeps the windows running until this rank shuts down or re-initializes.
  std::mutex end_mutex_;
  std::condition_variable end_cv_;
  bool end_requested_ = false;
  void RequestEnd();
  int init_pid_ = 0;  // the process that called Init

  struct ProcessSet {
    std::vector<int> ranks;                   // job-wide, ascending
    std::unique_ptr<Communicator> transport;  // members only
    std::unique_ptr<Channel> channel;         // members only
  };
  std::mutex sets_mutex_;  // guards sets_, next_set_id_ and removed_ids_
  std::map<int, ProcessSet> sets_;
  int next_set_id_ = 1;
  // The id each removed set had, by its ranks: a set registered again with the same ranks takes
  // its old id back (when free). The id is an attribute of the TensorFlow ops, and TensorFlow
  // keeps one eager kernel per attribute value for good (about 35 KB each): fresh ids for a
  // loop of add, collective, remove grew the process without bound. An op traced for the old
  // set that runs on the new one runs on the same ranks.
  std::map<std::vector<int>, int> removed_ids_;
  // The registrations and removals every rank agreed on so far: they name the next request, so
  // they advance only in OnRuntimeOp, at the same point on every rank (a call that failed, on
  // some ranks only, must not shift one rank's names). One call of each kind at a time per
  // rank, so that concurrent calls do not take the same name.
  std::atomic<int> adds_agreed_{0};
  std::atomic<int> removes_agreed_{0};
  std::mutex add_mutex_;
  std::mutex remove_mutex_;
};

}  // namespace bluefog
