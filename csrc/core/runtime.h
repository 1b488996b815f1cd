// The process-wide runtime: one background thread that negotiates requests with the other ranks
// and runs every MPI call. The C API and the framework kernels are its only callers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/config.h"
#include "core/coordinator.h"
#include "core/executor.h"
#include "core/request.h"
#include "core/response_cache.h"
#include "core/stall_report.h"
#include "core/timeline.h"
#include "mpi/transport.h"

namespace bluefog {

class Runtime : private RequestTable {
 public:
  static Runtime& Get();

  // Starts the background thread and MPI; idempotent while running. Throws BluefogError.
  void Init();
  // Stops every rank's runtime: pending requests fail with a "shut down" error. Idempotent.
  void Shutdown();

  bool running() const { return state_.load() == State::kRunning; }
  const TransportInfo& info() const { return info_; }
  const Config& config() const { return config_; }

  // Validates locally and queues. A non-ok status means the request was not queued and `done`
  // will not be called.
  Status Enqueue(Request request);

 private:
  enum class State { kNotStarted, kRunning, kStopped };
  Runtime() = default;
  void Loop(std::promise<void>* started);
  // One negotiation round and the collectives it made ready; returns false once stopped.
  // Sets *anyone_spoke when some rank announced something.
  bool RunRound(bool* anyone_spoke);
  // RequestTable, for the executors. Lookup's result stays valid: only this thread erases.
  Request* Lookup(const std::string& name) override;
  // Removes the local request for `name` and reports `status` to it.
  void Finish(const std::string& name, const Status& status) override;
  // Stops the loop after an error the runtime cannot recover from: records the reason, and
  // gives up finalizing MPI, since an exchange may still be pending.
  void Abandon(const std::string& reason);
  void FailAll(const Status& status);
  void CheckStalls();

  std::atomic<State> state_{State::kNotStarted};
  Config config_;
  TransportInfo info_;
  MpiTransport transport_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ResponseCache> cache_;  // only the background thread touches it
  std::thread thread_;

  std::mutex mutex_;  // guards the members below
  std::condition_variable wake_;
  std::deque<TensorMeta> unannounced_;
  std::unordered_map<std::string, Request> in_flight_;
  bool shutdown_requested_ = false;
  std::string stop_reason_;

  struct Stats {
    uint64_t rounds = 0;
    uint64_t announced = 0;
    uint64_t announced_cached = 0;  // of those, as a cache bit
    uint64_t completed = 0;
    uint64_t collectives = 0;  // after fusion
  } stats_;
  Timeline timeline_;
  Executor executor_{&transport_, this, &timeline_};
  StallWatch stall_watch_{0, 0};
  bool abandoned_mpi_ = false;  // a collective was left pending: MPI cannot be finalized
};

}  // namespace bluefog
