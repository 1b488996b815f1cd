#include "runtime/runtime.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "core/logging.h"
#include "core/op_rules.h"
#include "core/validation.h"
#include "runtime/flight_dump.h"
#include "transport/options.h"
#include "transport/registry.h"

namespace bluefog {
namespace {

std::mutex& InitMutex() {
  static std::mutex m;
  return m;
}

std::string RanksText(const std::vector<int>& ranks) {
  return ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

}  // namespace

Runtime& Runtime::Get() {
  // Leaked on purpose: kernels may still reference it while static destructors run at exit.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

bool Runtime::running() const { return started_ && world_->running(); }

bool Runtime::windows_open() const {
  return started_ && (world_->running() || (config_.fault_tolerant && windows_->Open()));
}

bool Runtime::forked() const { return started_ && getpid() != init_pid_; }

std::string Runtime::ForkedChildError(const std::string& what) const {
  return Concat("rank ", info_.rank, ": ", what, ": called in process ", getpid(),
                ", a fork of process ", init_pid_,
                " which called bf.init(); bluefog's communicator, shared memory and background "
                "thread belong to that process, and using them here would break its "
                "collectives. Call bluefog only in the process that called bf.init(), or start "
                "the child processes before bf.init() (or with multiprocessing's 'spawn' start "
                "method) and give each its own job.");
}

void Runtime::Init(const Config::Settings& settings) {
  if (forked())  // before the lock: the parent's thread may have held it at the fork
    throw BluefogError(StatusCode::kPrecondition, ForkedChildError("bluefog init"));
  std::lock_guard<std::mutex> guard(InitMutex());
  if (started_) {
    if (world_->running()) return;
    if (!transport_->capabilities().reinitializable)
      throw BluefogError(
          StatusCode::kPrecondition,
          Concat("bluefog was shut down in this process (", world_->stop_reason(),
                 ") and cannot be initialized again, because its backend (", transport_->backend(),
                 ") cannot be restarted. Start a new process (or run on the Gloo "
                 "backend, which can be initialized again)."));
    ResetEndedJob();
  }
  config_ = Config::FromEnvironment(settings);
  if (config_.flight_recorder_size > 0)
    InstallFlightDump(&recorder_, [] {
      Runtime& rt = Runtime::Get();
      return rt.running() ? rt.info().rank : -1;
    });
  {
    std::lock_guard<std::mutex> lock(end_mutex_);
    end_requested_ = false;
  }
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread(&Runtime::Main, this, &started);
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
  init_pid_ = getpid();
  started_ = true;
}

void Runtime::RequestEnd() {
  {
    std::lock_guard<std::mutex> lock(end_mutex_);
    end_requested_ = true;
  }
  end_cv_.notify_all();
}

void Runtime::ResetEndedJob() {
  // The job ended (shutdown, or its global channel failed): its thread finishes on its own.
  RequestEnd();
  if (thread_.joinable()) thread_.join();
  started_ = false;
  world_.reset();
  doctor_.reset();
  windows_ = std::make_unique<WindowService>();
  transport_.reset();
  std::lock_guard<std::mutex> lock(sets_mutex_);
  sets_.clear();
  next_set_id_ = 1;
  removed_ids_.clear();
  adds_agreed_ = 0;
  removes_agreed_ = 0;
}

void Runtime::Shutdown() {
  if (forked()) return;  // the parent's runtime (at exit of a forked child, say): not ours
  std::lock_guard<std::mutex> guard(InitMutex());
  if (!started_) return;
  const std::string reason =
      Concat("rank ", info_.rank, " shut down: bf.shutdown() was called or its process exited");
  // At once, not after the shutdown round: the other ranks join that round only at their next
  // collective, and until then their window operations into this rank must fail, not land.
  windows_->Close(reason);
  RequestEnd();
  world_->RequestStop(reason);
  if (thread_.joinable()) thread_.join();
}

void Runtime::Main(std::promise<void>* started) {
  try {
    // The level now, for what the transport logs while it connects (with its rank).
    SetLogContext(config_.log_level, 0);
    transport_ = RequireBackend(config_).make(config_, &info_);
    BF_ENFORCE(
        config_.UseGloo() || config_.launcher_size < 0 || config_.launcher_size == info_.size,
        StatusCode::kPrecondition, "rank ", info_.rank, ": ", config_.launcher_size_var, "=",
        config_.launcher_size, " says an MPI launcher started ", config_.launcher_size,
        " processes, but MPI formed a job of ", info_.size,
        ": this process was not started by that launcher (its variables are left in "
        "the environment). Start it with mpirun or bfrun, or unset the OMPI_*, PMI_* "
        "and PMIX_* variables");
    inline_threshold_ = config_.inline_threshold_bytes;
    std::lock_guard<std::mutex> lock(heap_mutex_);
    heap_ = transport_->shared_heap();
  } catch (...) {
    started->set_exception(std::current_exception());
    return;
  }
  SetLogContext(config_.log_level, info_.rank);
  if (!config_.timeline_prefix.empty()) {
    try {
      timeline_.Open(config_.timeline_prefix, info_.rank);
    } catch (const BluefogError& e) {
      BF_LOG(LogLevel::kError, "BLUEFOG_TIMELINE: ", e.what(), "; running without a timeline");
    }
  }
  std::vector<int> everyone(info_.size);
  std::iota(everyone.begin(), everyone.end(), 0);
  if (recorder_.capacity() != static_cast<size_t>(config_.flight_recorder_size))
    recorder_.Resize(static_cast<size_t>(config_.flight_recorder_size));
  world_ = std::make_unique<Channel>(0, config_, transport_.get(), info_, everyone, &timeline_);
  world_->set_recorder(&recorder_);
  stragglers_.Reset(info_.size);
  world_->set_straggler_tracker(&stragglers_);
  windows_->Attach(
      [this](size_t header_bytes) { return transport_->CreateWindowLink(header_bytes); },
      info_.rank, info_.size);
  windows_->SetFaultTolerance(config_.fault_tolerant, config_.neighbor_deadline_seconds);
  StartDoctor();
  world_->set_stalls_diagnosed(doctor_ != nullptr);
  world_->set_runtime_hook(
      [this](const Response& r, const Request* mine) { return OnRuntimeOp(r, mine); });
  started->set_value();
  const TransportPaths paths = transport_->paths();
  BF_LOG(LogLevel::kDebug, "initialized (", transport_->backend(), "): size ", info_.size,
         ", local size ", info_.local_size, ", hierarchical allreduce ",
         paths.hierarchical ? "on" : "off", ", direct allreduce ", paths.direct ? "on" : "off",
         ", staged allreduce ", paths.staged ? "on" : "off", ", shared outputs ",
         paths.shared_heap ? "on" : "off", ", rounds through ",
         paths.local_rounds ? "shared memory" : "the backend");

  bool clean = world_->Run();
  // Every rank stops its process sets after the same final round of the global channel.
  std::map<int, ProcessSet> sets;
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    sets.swap(sets_);
  }
  const std::string reason = Concat("bluefog has been shut down: ", world_->stop_reason());
  for (auto& [id, set] : sets)
    if (set.channel) set.channel->RequestStop(reason);
  if (clean) {
    for (auto& [id, set] : sets) {
      if (!set.channel) continue;
      if (set.channel->Join()) {
        set.transport->Shutdown();
      } else {
        clean = false;
      }
    }
  } else {
    // A collective may be left pending: the sets' threads may never finish. They are left
    // running (the process exits without finalizing MPI).
    for (auto& [id, set] : sets) {
      (void)set.channel.release();
      (void)set.transport.release();
    }
  }
  // A backend that fails fast (Gloo: its calls are synchronous) has nothing pending after a
  // failed call, and closing its connections now is what makes the peers still waiting on
  // this rank fail at once rather than after their timeout (their error in turn reaches theirs).
  const bool fails_fast = transport_->capabilities().fails_fast;
  if (!clean && config_.fault_tolerant) {
    // A lost rank failed a collective; the windows' connections of their own still reach the
    // ranks left, so the windows go on (global collectives fail from now on) until shutdown.
    std::unique_lock<std::mutex> lock(end_mutex_);
    if (!end_requested_)
      BF_LOG(LogLevel::kWarning, "collectives have stopped on this rank (", world_->stop_reason(),
             "); its windows go on in fault-tolerant mode until bf.shutdown()");
    end_cv_.wait(lock, [this] { return end_requested_; });
  }
  if (doctor_) doctor_->Stop(clean || fails_fast);
  windows_->Stop(reason, clean || fails_fast);
  timeline_.Close();
  {
    std::lock_guard<std::mutex> lock(heap_mutex_);
    heap_.reset();  // blocks still out keep the mapping; the transport retires the heap
  }
  if (clean || fails_fast) transport_->Shutdown();
}

std::shared_ptr<SharedHeap> Runtime::shared_heap() const {
  std::lock_guard<std::mutex> lock(heap_mutex_);
  return heap_;
}

Status Runtime::Enqueue(Request request, Drive drive) {
  const TensorMeta& meta = request.meta;
  Status invalid = ValidateRequest(request);
  if (!invalid.ok()) return WithRank(info_.rank, invalid);
  if (!started_)
    return OpError(StatusCode::kPrecondition, meta.op, meta.name,
                   "bluefog is not initialized; call bf.init() first");
  if (forked())
    return Status(StatusCode::kPrecondition, ForkedChildError(OpContext(meta.op, meta.name)));
  if (request.process_set == 0) {
    if (meta.op != OpType::kJoin) return world_->Enqueue(std::move(request), drive);
    const std::string name = meta.name;
    Status queued = world_->Enqueue(std::move(request), drive);
    if (queued.ok()) {
      std::lock_guard<std::mutex> lock(sets_mutex_);
      JoinSetsLocked(name);
    }
    return queued;
  }

  std::lock_guard<std::mutex> lock(sets_mutex_);
  Status refused;
  Channel* channel = SetChannelLocked(request, &refused);
  return channel ? channel->Enqueue(std::move(request)) : refused;
}

Channel* Runtime::SetChannelLocked(Request& request, Status* status) {
  const TensorMeta& meta = request.meta;
  auto invalid_in_set = [&](const std::string& what) {
    *status = WithRank(info_.rank, OpError(StatusCode::kInvalidArgument, meta.op, meta.name, what));
    return nullptr;
  };
  auto it = sets_.find(request.process_set);
  if (it == sets_.end())
    return invalid_in_set(Concat("process set ", request.process_set,
                                 " is not registered; add it with bf.add_process_set on every "
                                 "rank first"));
  const ProcessSet& set = it->second;
  if (!set.channel)
    return invalid_in_set(Concat("rank ", info_.rank, " is not in process set ",
                                 request.process_set, " (ranks ", RanksText(set.ranks),
                                 "); only its ranks may call its collectives"));
  if (IsNeighborOp(meta.op))
    return invalid_in_set("neighbor collectives run on the global process set only");
  if (meta.op == OpType::kBroadcast) {
    // root_rank is a job-wide rank; the set's channel numbers its ranks from 0.
    auto root = std::find(set.ranks.begin(), set.ranks.end(), meta.root_rank);
    if (root == set.ranks.end())
      return invalid_in_set(Concat("root_rank ", meta.root_rank, " is not in process set ",
                                   request.process_set, " (ranks ", RanksText(set.ranks), ")"));
    request.meta.root_rank = static_cast<int32_t>(root - set.ranks.begin());
  }
  return set.channel.get();
}

Status Runtime::EnqueueGroup(std::vector<Request> requests) {
  if (requests.empty()) return Status::Ok();
  for (const Request& request : requests) {
    Status invalid = ValidateRequest(request);
    if (!invalid.ok()) return WithRank(info_.rank, invalid);
  }
  const TensorMeta& meta = requests[0].meta;
  if (!started_)
    return OpError(StatusCode::kPrecondition, meta.op, meta.name,
                   "bluefog is not initialized; call bf.init() first");
  if (requests[0].process_set == 0) return world_->EnqueueGroup(std::move(requests));
  std::lock_guard<std::mutex> lock(sets_mutex_);
  Status refused;
  Channel* channel = nullptr;
  for (Request& request : requests)
    if (!(channel = SetChannelLocked(request, &refused))) return refused;
  return channel->EnqueueGroup(std::move(requests));
}

void Runtime::JoinSetsLocked(const std::string& name) {
  for (auto& [id, set] : sets_) {
    if (!set.channel) continue;
    Request marker;
    marker.meta.name = name;
    marker.meta.op = OpType::kJoin;
    marker.meta.dtype = DataType::kInt32;
    // Completes once every member has joined (or fails when the set is removed): nothing waits
    // for it.
    marker.done = [](const Status&) {};
    Status s = set.channel->Enqueue(std::move(marker));
    if (!s.ok()) BF_LOG(LogLevel::kWarning, "process set ", id, ": ", s.message());
  }
}

bool Runtime::SetLayout(int id, int* rank, int* size) {
  if (id == 0) {
    *rank = info_.rank;
    *size = info_.size;
    return true;
  }
  std::lock_guard<std::mutex> lock(sets_mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end() || !it->second.channel) return false;
  *rank = it->second.channel->info().rank;
  *size = it->second.channel->info().size;
  return true;
}

std::vector<int> Runtime::SetRanks(int id) {
  if (id == 0) {
    std::vector<int> everyone(info_.size);
    std::iota(everyone.begin(), everyone.end(), 0);
    return everyone;
  }
  std::lock_guard<std::mutex> lock(sets_mutex_);
  auto it = sets_.find(id);
  return it == sets_.end() ? std::vector<int>() : it->second.ranks;
}

Status Runtime::EnqueueAndWait(Request request, Drive drive) {
  std::promise<Status> promise;
  std::future<Status> result = promise.get_future();
  request.done = [&promise](const Status& s) { promise.set_value(s); };
  Status queued = Enqueue(std::move(request), drive);
  return queued.ok() ? result.get() : queued;
}

int Runtime::RunSetRequest(OpType op, const std::string& name, std::vector<int32_t> ranks) {
  int32_t id = -1;
  Request request;
  request.meta.name = name;
  request.meta.op = op;
  request.meta.dtype = DataType::kInt32;
  request.meta.send_ranks = std::move(ranks);
  request.output = &id;
  Status status = EnqueueAndWait(std::move(request));
  if (!status.ok()) throw BluefogError(status.code(), status.message());
  return id;
}

int Runtime::AddProcessSet(const std::vector<int>& ranks) {
  // Each set's channel calls MPI from a thread of its own.
  BF_ENFORCE(!started_ || info_.threads_multiple, StatusCode::kPrecondition,
             "process sets need MPI_THREAD_MULTIPLE, which this MPI library did not grant "
             "(bf.mpi_threads_supported() is False); use an MPI built with thread support");
  std::vector<int32_t> sorted(ranks.begin(), ranks.end());
  std::sort(sorted.begin(), sorted.end());
  std::lock_guard<std::mutex> one_at_a_time(add_mutex_);
  return RunSetRequest(OpType::kAddProcessSet,
                       Concat("bluefog.add_process_set.", adds_agreed_.load()), std::move(sorted));
}

void Runtime::RemoveProcessSet(int id) {
  std::lock_guard<std::mutex> one_at_a_time(remove_mutex_);
  RunSetRequest(OpType::kRemoveProcessSet,
                Concat("bluefog.remove_process_set.", removes_agreed_.load()), {id});
}

int Runtime::OnRuntimeOp(const Response& response, const Request* mine) {
  const std::vector<int32_t>& list = response.meta.send_ranks;
  if (response.meta.op == OpType::kWinCreate) {
    BF_ENFORCE(mine != nullptr, StatusCode::kInternal, "no request for the window");
    // The op's error names the rank and the window; this says why and what to do.
    BF_ENFORCE(info_.threads_multiple, StatusCode::kPrecondition,
               "windows need MPI_THREAD_MULTIPLE, which this MPI library did not grant "
               "(bf.mpi_threads_supported() is False); use an MPI built with thread support");
    WindowSpec spec;
    spec.name = mine->meta.name;
    spec.dtype = mine->meta.dtype;
    spec.shape = mine->meta.shape;
    spec.in_ranks = mine->meta.recv_ranks;
    spec.out_ranks = mine->meta.send_ranks;
    return windows_->Create(std::move(spec), mine->input, mine->zero_init);
  }
  if (response.meta.op == OpType::kWinFree) {
    windows_->Free(response.meta.name);
    return 0;
  }
  if (response.meta.op == OpType::kAddProcessSet) {
    ++adds_agreed_;  // first: whatever follows, every rank agreed on this name
    ProcessSet set;
    set.ranks.assign(list.begin(), list.end());
    int id;
    {
      std::lock_guard<std::mutex> lock(sets_mutex_);
      auto old = removed_ids_.find(set.ranks);
      if (old != removed_ids_.end() && !sets_.count(old->second)) {
        id = old->second;
      } else {
        id = next_set_id_++;
      }
    }
    auto me = std::find(set.ranks.begin(), set.ranks.end(), info_.rank);
    if (me != set.ranks.end()) {
      // Collective over the set's ranks only: they all handle this response now.
      set.transport = transport_->CreateSubset(set.ranks, id);
      TransportInfo info = info_;
      info.rank = static_cast<int>(me - set.ranks.begin());
      info.size = static_cast<int>(set.ranks.size());
      set.channel =
          std::make_unique<Channel>(id, config_, set.transport.get(), info, set.ranks, nullptr);
      set.channel->set_recorder(&recorder_);
      set.channel->set_straggler_tracker(&stragglers_);
      set.channel->set_stalls_diagnosed(doctor_ != nullptr);
      set.channel->Start();
    }
    std::lock_guard<std::mutex> lock(sets_mutex_);
    sets_.emplace(id, std::move(set));
    return id;
  }
  ++removes_agreed_;
  const int id = list.empty() ? -1 : list[0];
  ProcessSet set;
  {
    std::lock_guard<std::mutex> lock(sets_mutex_);
    auto it = sets_.find(id);
    BF_ENFORCE(it != sets_.end(), StatusCode::kInvalidArgument, "process set ", id,
               " is not registered (the global set, 0, cannot be removed)");
    set = std::move(it->second);
    sets_.erase(it);
    removed_ids_[set.ranks] = id;
  }
  if (set.channel) {
    set.channel->RequestStop(Concat("process set ", id, " was removed"));
    if (set.channel->Join()) {
      set.transport->Shutdown();
    } else {
      (void)set.channel.release();  // its thread may still be inside a collective
      (void)set.transport.release();
    }
  }
  return id;
}

int64_t Runtime::GetTuning(const std::string& knob) {
  if (knob == "inline_threshold") return inline_threshold_.load();
  int64_t value = 0;
  BF_ENFORCE(transport_->tuning().Get(knob, &value), StatusCode::kInvalidArgument, "no knob '",
             knob, "'; there are inline_threshold, ", Tuning::kKnobNames);
  return value;
}

int64_t Runtime::SetTuning(const std::string& knob, int64_t value) {
  if (knob == "inline_threshold") {
    BF_ENFORCE(value >= 0, StatusCode::kInvalidArgument, "inline_threshold must be >= 0");
    if (world_) world_->set_inline_threshold(value);
    std::lock_guard<std::mutex> lock(sets_mutex_);
    for (auto& [id, set] : sets_)
      if (set.channel) set.channel->set_inline_threshold(value);
    return inline_threshold_.exchange(value);
  }
  int64_t before = 0;
  BF_ENFORCE(transport_->tuning().Set(knob, value, &before), StatusCode::kInvalidArgument,
             "no knob '", knob, "' to set; there are inline_threshold, ", Tuning::kKnobNames);
  return before;
}

}  // namespace bluefog
