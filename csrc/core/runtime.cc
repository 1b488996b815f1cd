#include "core/runtime.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "core/logging.h"
#include "core/reduce_kernels.h"
#include "core/wire.h"

namespace bluefog {
namespace {

constexpr size_t kMaxRank = 64;
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

std::string Runtime::Prefix() const { return Concat("rank ", info_.rank, ": "); }

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
      stop_reason_ = Concat("rank ", info_.rank, " shut down: bf.shutdown() was called or its process exited");
    }
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status Runtime::Enqueue(Request request) {
  const TensorMeta& meta = request.meta;
  auto invalid = [&](const std::string& what) {
    return Status(StatusCode::kInvalidArgument,
                  Concat("rank ", info_.rank, ": bluefog ", OpTypeName(meta.op), " of tensor '",
                         meta.name, "': ", what));
  };
  if (meta.name.empty()) return invalid("the name is empty; pass a non-empty name or None");
  if (meta.shape.size() > kMaxRank) return invalid(Concat("rank ", meta.shape.size(), " exceeds ", kMaxRank));
  for (int64_t d : meta.shape)
    if (d < 0) return invalid(Concat("shape ", ShapeString(meta.shape), " has a negative dimension"));
  if (meta.op == OpType::kAllreduce && !SupportsSum(meta.dtype))
    return invalid(Concat("dtype ", DataTypeName(meta.dtype),
                          " cannot be summed; cast it to an integer or float dtype first"));
  if (meta.reduce_op != ReduceOp::kSum && (meta.op != OpType::kAllreduce || request.average))
    return invalid(Concat("reduction ", ReduceOpName(meta.reduce_op),
                          " applies to allreduce without averaging only"));
  if (meta.op == OpType::kAllgather && meta.shape.empty())
    return invalid("allgather concatenates along dimension 0 and needs a tensor of rank >= 1; "
                   "reshape the scalar to [1] first");

  std::unique_lock<std::mutex> lock(mutex_);
  if (state_ != State::kRunning || shutdown_requested_) {
    const bool never = state_ == State::kNotStarted;
    return Status(never ? StatusCode::kPrecondition : StatusCode::kAborted,
                  Concat("bluefog ", OpTypeName(meta.op), " of tensor '", meta.name, "': ",
                         never ? "bluefog is not initialized; call bf.init() first"
                               : Concat("bluefog has been shut down (", stop_reason_,
                                        "); no collective can run after shutdown")));
  }
  if (meta.op == OpType::kBroadcast && (meta.root_rank < 0 || meta.root_rank >= info_.size))
    return invalid(Concat("root_rank ", meta.root_rank, " is outside [0, ", info_.size, ")"));
  if (IsNeighborOp(meta.op)) {
    Status s = ValidateNeighbors(request);
    if (!s.ok()) return invalid(s.message());
  }
  if (in_flight_.count(meta.name))
    return invalid("a collective with this name is already in flight on this rank; give "
                   "collectives that may run concurrently distinct names");
  request.enqueued_at = NowSeconds();
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
  fusion_buffer_.clear();
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
      BF_LOG(LogLevel::kError, e.what());
      std::lock_guard<std::mutex> lock(mutex_);
      stop_reason_ = e.what();
      keep_going = false;
      // The exchange that threw may still be pending; MPI cannot be finalized over it. The
      // process then exits without MPI_Finalize, which makes mpirun end the job with an error.
      abandoned_mpi_ = true;
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
  std::vector<std::string> all = transport_.ExchangeAll(EncodeRound(mine), [this] { CheckStalls(); });

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
  Execute(ready);
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
  return &it->second;  // stable: only this thread erases
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
  if (status.ok()) {
    request.done(status);
  } else {
    request.done(Status(status.code(), Prefix() + status.message()));
  }
}

void Runtime::FailAll(const Status& status) {
  std::unordered_map<std::string, Request> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = State::kStopped;
    failed.swap(in_flight_);
    unannounced_.clear();
  }
  for (auto& [name, request] : failed) {
    request.done(Status(status.code(), Concat(Prefix(), "bluefog ", OpTypeName(request.meta.op),
                                              " of tensor '", name, "': ", status.message())));
  }
}

void Runtime::Execute(std::vector<Response>& responses) {
  // An allreduce big enough for the ring runs alone, out of place, straight from its input to
  // its output: packing it into the fusion buffer would add a copy in and a copy out for no
  // saving (measured at 2 ranks: 16 x 1 MiB 11.0 -> 5.5 ms, 8 x 8 MiB 25-35 -> 15-18 ms). Those
  // go last, so that the small ones between them still form one run. Every rank reorders the
  // same list the same way.
  const int64_t solo_bytes = config_.ring_threshold_bytes;
  auto solo = [solo_bytes](const Response& r) {
    return solo_bytes > 0 && r.status.ok() && r.meta.op == OpType::kAllreduce &&
           static_cast<int64_t>(r.meta.NumBytes()) >= solo_bytes;
  };
  if (std::any_of(responses.begin(), responses.end(), solo))  // stable_partition allocates
    std::stable_partition(responses.begin(), responses.end(),
                          [&solo](const Response& r) { return !solo(r); });
  size_t i = 0;
  while (i < responses.size()) {
    const Response& r = responses[i];
    if (!r.status.ok()) {
      Finish(r.meta.name, r.status);
      ++i;
      continue;
    }
    size_t end = i + 1;
    if ((r.meta.op == OpType::kAllreduce || r.meta.op == OpType::kNeighborAllreduce) && !solo(r)) {
      // Fuse the run of ready requests of this op and dtype (and, for neighbor_allreduce, with
      // every rank exchanging with the same peers) that fits the fusion buffer.
      int64_t bytes = r.meta.NumBytes();
      while (end < responses.size()) {
        const Response& next = responses[end];
        if (!next.status.ok() || solo(next) || next.meta.op != r.meta.op ||
            next.meta.dtype != r.meta.dtype || next.meta.reduce_op != r.meta.reduce_op ||
            next.topology_signature != r.topology_signature ||
            bytes + static_cast<int64_t>(next.meta.NumBytes()) > config_.fusion_threshold_bytes)
          break;
        bytes += next.meta.NumBytes();
        ++end;
      }
    }
    std::vector<Response> group(responses.begin() + i, responses.begin() + end);
    ++stats_.collectives;
    const double comm_start = timeline_.enabled() ? NowSeconds() : 0;
    try {
      switch (r.meta.op) {
        case OpType::kAllreduce: ExecuteAllreduces(group); break;
        case OpType::kAllgather: ExecuteAllgather(r); break;
        case OpType::kBroadcast: ExecuteBroadcast(r); break;
        case OpType::kNeighborAllreduce: ExecuteNeighborAllreduces(group); break;
        case OpType::kNeighborAllgather: ExecuteNeighborAllgather(r); break;
        case OpType::kNeighborAllgatherGrad: ExecuteNeighborAllgatherGrad(r); break;
      }
    } catch (const BluefogError& e) {
      for (const Response& g : group)
        Finish(g.meta.name, Status(e.code(), Concat("bluefog ", OpTypeName(g.meta.op),
                                                    " of tensor '", g.meta.name, "': ", e.what())));
    }
    if (timeline_.enabled()) {
      const double comm_end = NowSeconds();
      for (const Response& g : group)
        timeline_.Phase(g.meta.name, OpTypeName(g.meta.op), comm_start, comm_end);
    }
    i = end;
  }
}

void Runtime::ExecuteAllreduces(const std::vector<Response>& group) {
  const DataType dtype = group[0].meta.dtype;
  const size_t elem = ElementSize(dtype);
  if (group.size() == 1) {
    Request* req = Lookup(group[0].meta.name);
    const int64_t n = req->meta.NumElements();
    if (n > 0) {
      transport_.Allreduce(req->input, req->output, n, dtype, req->meta.reduce_op,
                           req->average ? info_.size : 1);
    }
    Finish(group[0].meta.name, Status::Ok());
    return;
  }
  std::vector<Request*> reqs;
  size_t total = 0;
  bool all_average = true;
  for (const Response& g : group) {
    reqs.push_back(Lookup(g.meta.name));
    total += reqs.back()->meta.NumBytes();
    all_average &= reqs.back()->average;
  }
  // Grown to the largest fused size seen, never shrunk: no allocation per step.
  if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
  char* buffer = fusion_buffer_.data();
  size_t offset = 0;
  for (Request* req : reqs) {
    std::memcpy(buffer + offset, req->input, req->meta.NumBytes());
    offset += req->meta.NumBytes();
  }
  // When every request averages, the transport divides as part of the sum.
  transport_.Allreduce(buffer, buffer, static_cast<int64_t>(total / elem), dtype,
                       group[0].meta.reduce_op, all_average ? info_.size : 1);
  offset = 0;
  for (Request* req : reqs) {
    const size_t bytes = req->meta.NumBytes();
    if (req->average && !all_average)
      DivideBy(buffer + offset, req->meta.NumElements(), dtype, info_.size);
    std::memcpy(req->output, buffer + offset, bytes);
    offset += bytes;
  }
  for (const Response& g : group) Finish(g.meta.name, Status::Ok());
}

// Bytes of one slice along dimension 0.
int64_t Runtime::RowBytes(const TensorMeta& meta) {
  int64_t row_elems = 1;
  for (size_t d = 1; d < meta.shape.size(); ++d) row_elems *= meta.shape[d];
  return row_elems * static_cast<int64_t>(ElementSize(meta.dtype));
}

// The allgathers' output. This rank must take part in the collective even if its output cannot
// be allocated, or the other ranks would wait forever: it then receives into `scratch` and
// reports the error in `status`.
void* Runtime::AllocateOutput(Request* req, const std::vector<int64_t>& shape, int64_t bytes,
                              std::vector<char>* scratch, Status* status) {
  try {
    return req->allocate_output(shape);
  } catch (const BluefogError& e) {
    *status = Status(e.code(), Concat("bluefog ", OpTypeName(req->meta.op), " of tensor '",
                                      req->meta.name, "': ", e.what()));
    scratch->resize(bytes);
    return scratch->data();
  }
}

void Runtime::ExecuteAllgather(const Response& response) {
  Request* req = Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  std::vector<int64_t> bytes_per_rank(info_.size);
  std::vector<int64_t> shape = meta.shape;
  shape[0] = 0;
  for (int r = 0; r < info_.size; ++r) {
    bytes_per_rank[r] = response.first_dims[r] * row_bytes;
    shape[0] += response.first_dims[r];
  }
  Status status;
  std::vector<char> scratch;
  void* out = AllocateOutput(req, shape, shape[0] * row_bytes, &scratch, &status);
  transport_.Allgatherv(req->input, out, bytes_per_rank);
  Finish(meta.name, status);
}

void Runtime::ExecuteBroadcast(const Response& response) {
  Request* req = Lookup(response.meta.name);
  const size_t bytes = req->meta.NumBytes();
  if (bytes > 0) {
    if (info_.rank == response.meta.root_rank && req->output != req->input)
      std::memcpy(req->output, req->input, bytes);
    transport_.Broadcast(req->output, static_cast<int64_t>(bytes), response.meta.root_rank);
  }
  Finish(response.meta.name, Status::Ok());
}

Status Runtime::ValidateNeighbors(const Request& request) const {
  const TensorMeta& meta = request.meta;
  auto bad = [](const std::string& m) { return Status(StatusCode::kInvalidArgument, m); };
  for (const auto* ranks : {&meta.send_ranks, &meta.recv_ranks}) {
    for (size_t k = 0; k < ranks->size(); ++k) {
      const int r = (*ranks)[k];
      if (r < 0 || r >= info_.size || r == info_.rank)
        return bad(Concat("neighbor rank ", r, " is not another rank in [0, ", info_.size, ")"));
      if (k > 0 && (*ranks)[k - 1] >= r)
        return bad("neighbor ranks must be unique and ascending");
    }
  }
  if (meta.op == OpType::kNeighborAllreduce) {
    if (!IsFloatingPoint(meta.dtype))
      return bad(Concat("dtype ", DataTypeName(meta.dtype),
                        " cannot be averaged with weights; cast it to a float dtype first"));
    if (request.recv_weights.size() != meta.recv_ranks.size())
      return bad(Concat(request.recv_weights.size(), " receive weights for ",
                        meta.recv_ranks.size(), " source ranks"));
    if (!request.send_weights.empty() && request.send_weights.size() != meta.send_ranks.size())
      return bad(Concat(request.send_weights.size(), " send weights for ",
                        meta.send_ranks.size(), " destination ranks"));
  } else if (meta.shape.empty()) {
    return bad("neighbor_allgather concatenates along dimension 0 and needs a tensor of rank >= 1");
  } else if (meta.op == OpType::kNeighborAllgatherGrad) {
    if (!IsFloatingPoint(meta.dtype))
      return bad(Concat("dtype ", DataTypeName(meta.dtype), " has no gradient"));
    if (meta.input_rows < 0 || meta.shape[0] < 0)
      return bad(Concat("negative rows: input ", meta.input_rows, ", output ", meta.shape[0]));
  }
  return Status::Ok();
}

// Every request of the group has the same peers on this rank (same topology signature). Their
// inputs are packed into one buffer, exchanged once, and each output is combined with its own
// weights from the received copies.
void Runtime::ExecuteNeighborAllreduces(const std::vector<Response>& group) {
  const DataType dtype = group[0].meta.dtype;
  std::vector<Request*> reqs;
  std::vector<size_t> offsets;
  size_t total = 0;
  bool scaled_sends = false;
  for (const Response& g : group) {
    reqs.push_back(Lookup(g.meta.name));
    offsets.push_back(total);
    total += reqs.back()->meta.NumBytes();
    scaled_sends |= !reqs.back()->send_weights.empty();
  }
  const size_t elem = ElementSize(dtype);
  const std::vector<int32_t>& send_ranks = reqs[0]->meta.send_ranks;
  const std::vector<int32_t>& recv_ranks = reqs[0]->meta.recv_ranks;
  if (total > 0) {
    if (fusion_buffer_.size() < total) fusion_buffer_.resize(total);
    char* packed = fusion_buffer_.data();
    for (size_t k = 0; k < reqs.size(); ++k)
      std::memcpy(packed + offsets[k], reqs[k]->input, reqs[k]->meta.NumBytes());
    const size_t nrecv = recv_ranks.size();
    const size_t nscaled = scaled_sends ? send_ranks.size() : 0;
    if (neighbor_buffer_.size() < (nrecv + nscaled) * total)
      neighbor_buffer_.resize((nrecv + nscaled) * total);
    char* scratch = neighbor_buffer_.data();
    std::vector<MpiTransport::PeerBuffer> sends, recvs;
    for (size_t j = 0; j < nrecv; ++j)
      recvs.push_back({recv_ranks[j], scratch + j * total, static_cast<int64_t>(total)});
    for (size_t j = 0; j < send_ranks.size(); ++j) {
      char* data = packed;
      if (nscaled) {  // what goes to send_ranks[j] is each tensor scaled by its weight for j
        data = scratch + (nrecv + j) * total;
        for (size_t k = 0; k < reqs.size(); ++k) {
          const double w = reqs[k]->send_weights.empty() ? 1.0 : reqs[k]->send_weights[j];
          ScaleAdd(data + offsets[k], packed + offsets[k],
                   static_cast<int64_t>(reqs[k]->meta.NumBytes() / elem), dtype, w, false);
        }
      }
      sends.push_back({send_ranks[j], data, static_cast<int64_t>(total)});
    }
    transport_.NeighborExchange(sends, recvs);
    for (size_t k = 0; k < reqs.size(); ++k) {
      Request* req = reqs[k];
      const int64_t n = static_cast<int64_t>(req->meta.NumBytes() / elem);
      ScaleAdd(req->output, packed + offsets[k], n, dtype, req->self_weight, false);
      for (size_t j = 0; j < nrecv; ++j)
        ScaleAdd(req->output, scratch + j * total + offsets[k], n, dtype, req->recv_weights[j],
                 true);
    }
  }
  for (const Response& g : group) Finish(g.meta.name, Status::Ok());
}

void Runtime::ExecuteNeighborAllgather(const Response& response) {
  Request* req = Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  std::vector<int64_t> shape = meta.shape;
  shape[0] = 0;
  for (int32_t src : meta.recv_ranks) shape[0] += response.first_dims[src];
  Status status;
  std::vector<char> scratch;
  char* out = static_cast<char*>(AllocateOutput(req, shape, shape[0] * row_bytes, &scratch, &status));
  std::vector<MpiTransport::PeerBuffer> sends, recvs;
  int64_t offset = 0;
  for (int32_t src : meta.recv_ranks) {
    const int64_t b = response.first_dims[src] * row_bytes;
    recvs.push_back({src, out + offset, b});
    offset += b;
  }
  const int64_t my_bytes = meta.shape[0] * row_bytes;
  for (int32_t dst : meta.send_ranks)
    sends.push_back({dst, const_cast<void*>(req->input), my_bytes});
  transport_.NeighborExchange(sends, recvs);
  Finish(meta.name, status);
}

// Block k of the input (sized like send_ranks[k]'s output) goes to send_ranks[k]; the output is
// the sum of the blocks received from recv_ranks (zeros when there are none).
void Runtime::ExecuteNeighborAllgatherGrad(const Response& response) {
  Request* req = Lookup(response.meta.name);
  const TensorMeta& meta = req->meta;
  const int64_t row_bytes = RowBytes(meta);
  const int64_t out_bytes = meta.shape[0] * row_bytes;
  const char* in = static_cast<const char*>(req->input);
  std::vector<MpiTransport::PeerBuffer> sends, recvs;
  int64_t offset = 0;
  for (int32_t dst : meta.send_ranks) {
    const int64_t b = response.first_dims[dst] * row_bytes;
    sends.push_back({dst, const_cast<char*>(in + offset), b});
    offset += b;
  }
  const size_t nrecv = meta.recv_ranks.size();
  // The first block lands in the output; the others in scratch, summed into it afterwards.
  const size_t extra = nrecv > 1 ? (nrecv - 1) * static_cast<size_t>(out_bytes) : 0;
  if (neighbor_buffer_.size() < extra) neighbor_buffer_.resize(extra);
  char* out = static_cast<char*>(req->output);
  for (size_t j = 0; j < nrecv; ++j)
    recvs.push_back({meta.recv_ranks[j], j == 0 ? out : neighbor_buffer_.data() + (j - 1) * out_bytes,
                     out_bytes});
  transport_.NeighborExchange(sends, recvs);
  if (nrecv == 0 && out_bytes > 0) std::memset(out, 0, static_cast<size_t>(out_bytes));
  const int64_t count = meta.NumElements();
  for (size_t j = 1; j < nrecv; ++j)
    SumInto(out, neighbor_buffer_.data() + (j - 1) * out_bytes, count, meta.dtype);
  Finish(meta.name, Status::Ok());
}

void Runtime::CheckStalls() {
  const bool report = config_.stall_check_seconds > 0;
  const bool fail = config_.stall_shutdown_seconds > 0;
  if (!report && !fail) return;
  const double now = NowSeconds();
  if (now - last_stall_check_ < 0.5) return;
  last_stall_check_ = now;
  double oldest = now;
  std::vector<std::string> mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [name, request] : in_flight_) {
      oldest = std::min(oldest, request.enqueued_at);
      mine.push_back(name);
    }
  }
  std::sort(mine.begin(), mine.end());
  const double waited = now - oldest;
  const bool report_now = report && waited >= config_.stall_check_seconds &&
                          now - last_stall_report_ >= config_.stall_check_seconds;
  const bool fail_now = fail && waited >= config_.stall_shutdown_seconds;
  if (!report_now && !fail_now) return;
  last_stall_report_ = now;
  std::ostringstream out;
  out << "a collective submitted on this rank has waited " << static_cast<int>(waited)
      << " s for the other ranks. Waiting here:";
  for (size_t k = 0; k < mine.size() && k < 10; ++k) out << " '" << mine[k] << "'";
  if (mine.size() > 10) out << " ... (" << mine.size() << " in all)";
  out << ".";
  std::vector<WaitingTensor> waiting = coordinator_->Waiting();
  if (waiting.empty()) {
    out << " No other rank has announced these names yet: the other ranks have not reached a "
           "collective, or are blocked elsewhere.";
  } else {
    out << " Submitted by some ranks but not all:";
    size_t shown = 0;
    for (const WaitingTensor& w : waiting) {
      if (++shown > 20) {
        out << " ... and " << waiting.size() - 20 << " more";
        break;
      }
      out << " '" << w.name << "' (missing ranks";
      for (int r : w.missing_ranks) out << " " << r;
      out << ")";
    }
    out << ". The missing ranks may have stopped calling collectives or use other names.";
  }
  if (fail_now) {
    out << " Giving up after BLUEFOG_STALL_SHUTDOWN_TIME=" << config_.stall_shutdown_seconds
        << " s: bluefog is shut down on this rank.";
    throw BluefogError(StatusCode::kAborted, out.str());
  }
  BF_LOG(LogLevel::kWarning, out.str(), " (BLUEFOG_STALL_CHECK_TIME=", config_.stall_check_seconds,
         " s)");
}

}  // namespace bluefog
