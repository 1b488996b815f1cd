#include "transport/mpi/mpi_communicator.h"

#include <mpi.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/deterministic_allreduce.h"
#include "transport/exchange_slots.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/comm_handle.h"
#include "transport/registry.h"
#include "transport/shared_heap.h"

namespace bluefog {
namespace {

// Large transfers are split so each MPI count fits in an int.
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;

struct ReduceContext {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
};
thread_local ReduceContext reduce_context;

}  // namespace

static_assert(sizeof(MPI_Comm) <= sizeof(void*), "MPI_Comm must fit in a pointer");
static_assert(sizeof(MPI_Op) <= sizeof(void*), "MPI_Op must fit in a pointer");

void BluefogReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceOf(inout, inout, in, *len, reduce_context.dtype, reduce_context.op);
}

MPI_Op MpiOpFor(void* ours, DataType dtype, ReduceOp reduce) {
  if (reduce == ReduceOp::kSum && dtype != DataType::kFloat16 && dtype != DataType::kBFloat16)
    return MPI_SUM;
  reduce_context = {dtype, reduce};
  return AsOp(ours);
}

MPI_Datatype ToMpi(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kBool: return MPI_C_BOOL;
  }
  return MPI_DATATYPE_NULL;
}

MpiCommunicator::MpiCommunicator(const TransportOptions& options)
    : options_(options), tuning_(std::make_shared<Tuning>(options)) {}

MpiCommunicator::~MpiCommunicator() { Shutdown(); }

void MpiCommunicator::Check(int code, const char* call) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw BluefogError(StatusCode::kInternal, Concat(call, " failed: ", std::string(text, len)));
}

char* MpiCommunicator::Scratch(int64_t bytes) {
  if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(static_cast<size_t>(bytes));
  return scratch_.data();
}

void* MpiCommunicator::Requests(size_t n) {
  if (requests_.size() < n * sizeof(MPI_Request)) requests_.resize(n * sizeof(MPI_Request));
  return requests_.data();
}

TransportPaths MpiCommunicator::paths() const {
  TransportPaths p = LocalPaths(local_.get());
  p.hierarchical = tuning_->hierarchical && cross_ != nullptr;
  return p;
}

TransportInfo MpiCommunicator::Init() {
  TransportInfo info;
  int already = 0;
  MPI_Initialized(&already);
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    BF_ENFORCE(code == MPI_SUCCESS, StatusCode::kInternal, "MPI_Init_thread failed (code ", code,
               "); is this process started by mpirun or bfrun with Open MPI?");
    owns_mpi_ = true;
  } else {
    int finalized = 0;
    MPI_Finalized(&finalized);
    BF_ENFORCE(!finalized, StatusCode::kPrecondition,
               "MPI was already finalized in this process; bluefog cannot be initialized again "
               "after shutdown(). Start a new process.");
    MPI_Query_thread(&provided);
  }
  info.threads_multiple = provided >= MPI_THREAD_MULTIPLE;

  Check(MPI_Comm_dup(MPI_COMM_WORLD, &AsComm(comm_)), "MPI_Comm_dup");
  Check(MPI_Comm_set_errhandler(AsComm(comm_), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Check(MPI_Comm_rank(AsComm(comm_), &rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(AsComm(comm_), &size_), "MPI_Comm_size");
  Check(MPI_Comm_split_type(AsComm(comm_), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL,
                            &AsComm(local_comm_)),
        "MPI_Comm_split_type");
  has_local_comm_ = true;
  Check(MPI_Comm_rank(AsComm(local_comm_), &info.local_rank), "MPI_Comm_rank");
  Check(MPI_Comm_size(AsComm(local_comm_), &info.local_size), "MPI_Comm_size");
  MapHosts(local_comm_);
  Check(MPI_Op_create(&BluefogReduce, 1, &AsOp(bluefog_op_)), "MPI_Op_create");
  local_rank_ = info.local_rank;
  local_size_ = info.local_size;
  // The hierarchical allreduce needs more than one host, more than one rank per host and the
  // same number of ranks on every host (each local rank owns one slice).
  // Contiguous blocks: local rank 0's rank is this rank minus its local rank, on every host.
  int first = rank_;
  Check(MPI_Bcast(&first, 1, MPI_INT, 0, AsComm(local_comm_)), "MPI_Bcast");
  const bool block = first == rank_ - info.local_rank && first % info.local_size == 0;
  // min and max of the local sizes, and whether some rank is outside its block, in one MPI_MAX
  int sizes[3] = {-info.local_size, info.local_size, block ? 0 : 1};
  Check(MPI_Allreduce(MPI_IN_PLACE, sizes, 3, MPI_INT, MPI_MAX, AsComm(comm_)), "MPI_Allreduce");
  info.homogeneous = -sizes[0] == sizes[1] && sizes[2] == 0;
  // The ranks with this local rank, one per host (Horovod's cross rank and size).
  void* cross = nullptr;
  Check(MPI_Comm_split(AsComm(comm_), info.local_rank, rank_, &AsComm(cross)), "MPI_Comm_split");
  Check(MPI_Comm_rank(AsComm(cross), &info.cross_rank), "MPI_Comm_rank");
  Check(MPI_Comm_size(AsComm(cross), &info.cross_size), "MPI_Comm_size");
  if (-sizes[0] == sizes[1] && info.local_size > 1 && info.local_size < size_) {
    cross_ = Adopt(cross);
    // The hierarchical path's sum within the host goes through the one-host transport.
    void* host = nullptr;
    Check(MPI_Comm_dup(AsComm(local_comm_), &AsComm(host)), "MPI_Comm_dup");
    host_ = Adopt(host);
  } else {
    Check(MPI_Comm_free(&AsComm(cross)), "MPI_Comm_free");
  }

  try {
    // Across hosts: a data plane over the ranks that share a link (the cross communicator when
    // the hierarchical allreduce runs, else every rank), where BLUEFOG_CROSS_HOST and the probe
    // choose it; or over every rank when BLUEFOG_ALLREDUCE_ALGORITHM names one (then the list
    // is checked once that is connected).
    const bool hosts = same_host_ < size_;
    const bool forced_plane = hosts && FindDataPlane(options_.allreduce_algorithm) != nullptr;
    SetUp(size_ > 1 && info.local_size == size_, /*world=*/!forced_plane);
    if (forced_plane) {
      ConnectCrossHost(options_.allreduce_algorithm, /*world=*/true, rank_, rank_ == 0);
    } else if (hosts) {
      (cross_ ? cross_.get() : this)
          ->ConnectCrossHost(options_.cross_host, /*world=*/!cross_, rank_, rank_ == 0);
    } else if (options_.cross_host != "auto" && options_.cross_host != "mpi") {
      BF_ENFORCE(FindDataPlane(options_.cross_host) != nullptr, StatusCode::kInvalidArgument,
                 "rank ", rank_, ": BLUEFOG_CROSS_HOST=", options_.cross_host,
                 " is not a transport this build can use across hosts; use auto, mpi or one of: ",
                 DataPlaneNames());
    }
  } catch (...) {
    // A set-up every rank refused alike (BLUEFOG_ALLREDUCE_ALGORITHM): free what Init made and
    // finalize MPI, so the process ends cleanly after reporting it.
    initialized_ = true;
    Shutdown();
    throw;
  }
  initialized_ = true;
  info.rank = rank_;
  info.size = size_;
  return info;
}

std::unique_ptr<Communicator> MpiCommunicator::CreateSubset(const std::vector<int>& ranks,
                                                            int tag) {
  MPI_Group all, group;
  Check(MPI_Comm_group(AsComm(comm_), &all), "MPI_Comm_group");
  Check(MPI_Group_incl(all, static_cast<int>(ranks.size()), ranks.data(), &group),
        "MPI_Group_incl");
  void* comm = nullptr;
  int code = MPI_Comm_create_group(AsComm(comm_), group, tag, &AsComm(comm));
  MPI_Group_free(&group);
  MPI_Group_free(&all);
  Check(code, "MPI_Comm_create_group");
  return Adopt(comm);
}

// A subset shares this communicator's tuning and options, but has no shared heap (outputs
// come from the global communicator's) and no hierarchical path.
std::unique_ptr<MpiCommunicator> MpiCommunicator::Adopt(void* comm) {
  TransportOptions options = options_;
  options.shared_heap_bytes = 0;
  auto t = std::make_unique<MpiCommunicator>(options);
  t->tuning_ = tuning_;
  t->comm_ = comm;
  Check(MPI_Comm_set_errhandler(AsComm(t->comm_), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Check(MPI_Comm_rank(AsComm(t->comm_), &t->rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(AsComm(t->comm_), &t->size_), "MPI_Comm_size");
  Check(MPI_Op_create(&BluefogReduce, 1, &AsOp(t->bluefog_op_)), "MPI_Op_create");
  // A process set whose ranks all share one host reads its peers' buffers directly too, and
  // negotiates through shared memory.
  bool one_host = false;
  if (t->size_ > 1) {
    MPI_Comm shared;
    Check(MPI_Comm_split_type(AsComm(t->comm_), MPI_COMM_TYPE_SHARED, t->rank_, MPI_INFO_NULL,
                              &shared),
          "MPI_Comm_split_type");
    int shared_size = 0;
    Check(MPI_Comm_size(shared, &shared_size), "MPI_Comm_size");
    void* shared_handle = nullptr;
    AsComm(shared_handle) = shared;
    t->MapHosts(shared_handle);
    MPI_Comm_free(&shared);
    one_host = shared_size == t->size_;
  } else {
    t->host_of_.assign(1, 0);
  }
  t->SetUp(one_host, /*world=*/false);
  t->initialized_ = true;
  return t;
}

void MpiCommunicator::MapHosts(void* shared) {
  int first = rank_;
  Check(MPI_Bcast(&first, 1, MPI_INT, 0, CommOf(shared)), "MPI_Bcast");
  host_of_.assign(size_, 0);
  Check(MPI_Allgather(&first, 1, MPI_INT, host_of_.data(), 1, MPI_INT, AsComm(comm_)),
        "MPI_Allgather");
  same_host_ = static_cast<int>(std::count(host_of_.begin(), host_of_.end(), first));
}

void MpiCommunicator::SetUp(bool one_host, bool world) {
  exchange_send_.assign(kExchangeSlotTotal, 0);
  exchange_recv_.assign(kExchangeSlotTotal * static_cast<size_t>(size_), 0);
  counts_.assign(size_, 0);
  displs_.assign(size_, 0);
  // LocalHost's set-up takes this communicator's Broadcast and Allgatherv, which call MPI
  // directly, so it may come before the list.
  if (one_host) {
    // Below BLUEFOG_ONE_HOST_THRESHOLD, MPI_Allreduce through Open MPI's shared memory wins.
    local_ = LocalHost::Create(this, tuning_, options_, /*every_size=*/false);
  }
  allreduce_ = ForceAllreduce(MakeAllreduceList(this, local_.get(), &own_allreduce_),
                              options_.allreduce_algorithm, world, rank_, backend());
  if (options_.deterministic) {
    own_allreduce_.push_back(MakeDeterministicAllreduce(this));
    PutDeterministicFirst(&allreduce_, own_allreduce_.back().get(),
                          local_ ? local_->rank_ordered() : nullptr);
  }
}

void MpiCommunicator::Shutdown() {
  if (!initialized_) return;
  initialized_ = false;
  if (const std::shared_ptr<SharedHeap> heap = shared_heap()) {
    heap->Retire();  // blocks still out stay mapped until TensorFlow frees them
  }
  allreduce_.clear();
  own_allreduce_.clear();
  plane_.reset();
  local_.reset();
  MPI_Op_free(&AsOp(bluefog_op_));
  if (has_local_comm_) MPI_Comm_free(&AsComm(local_comm_));
  if (cross_) cross_->Shutdown();
  if (host_) host_->Shutdown();
  MPI_Comm_free(&AsComm(comm_));
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void MpiCommunicator::Allreduce(const void* in, void* out, int64_t count, DataType dtype,
                                ReduceOp op, int64_t divisor) {
  RunAllreduce(allreduce_, in, out, count, dtype, op, divisor);
}

void MpiCommunicator::ReduceScatter(const void* in, void* out,
                                    const std::vector<int64_t>& counts_per_rank, DataType dtype,
                                    ReduceOp reduce, int64_t divisor) {
  BF_ENFORCE(reduce == ReduceOp::kSum || divisor == 1, StatusCode::kInternal,
             "only a sum can be averaged (PlanAverage decides who divides)");
  for (int r = 0; r < size_; ++r) {
    // Every rank sees every count, so every rank refuses the same call before any transfer.
    BF_ENFORCE(counts_per_rank[r] < INT_MAX, StatusCode::kInvalidArgument,
               "reducescatter slices of 2^31 elements or more are not supported");
    counts_[r] = static_cast<int>(counts_per_rank[r]);
  }
  const MPI_Op op = MpiOpFor(bluefog_op_, dtype, reduce);
  Check(MPI_Reduce_scatter(in, out, counts_.data(), ToMpi(dtype), op, AsComm(comm_)),
        "MPI_Reduce_scatter");
  if (divisor > 1) DivideBy(out, counts_per_rank[rank_], dtype, divisor);
}

void MpiCommunicator::Allgatherv(const void* in, void* out,
                                 const std::vector<int64_t>& bytes_per_rank) {
  int64_t total = 0;
  for (int r = 0; r < size_; ++r) {
    BF_ENFORCE(total + bytes_per_rank[r] < INT_MAX, StatusCode::kInvalidArgument,
               "allgather result exceeds 2 GiB, which this version does not support");
    displs_[r] = static_cast<int>(total);
    counts_[r] = static_cast<int>(bytes_per_rank[r]);
    total += bytes_per_rank[r];
  }
  Check(MPI_Allgatherv(in, counts_[rank_], MPI_BYTE, out, counts_.data(), displs_.data(), MPI_BYTE,
                       AsComm(comm_)),
        "MPI_Allgatherv");
}

void MpiCommunicator::Broadcast(void* buffer, int64_t bytes, int root) {
  char* p = static_cast<char*>(buffer);
  for (int64_t done = 0; done < bytes; done += kMaxChunkBytes) {
    int n = static_cast<int>(std::min(kMaxChunkBytes, bytes - done));
    Check(MPI_Bcast(p + done, n, MPI_BYTE, root, AsComm(comm_)), "MPI_Bcast");
  }
}

void MpiCommunicator::NeighborExchange(const std::vector<PeerBuffer>& sends,
                                       const std::vector<PeerBuffer>& recvs) {
  constexpr int kTag = 7;
  if (sends.size() == 1 && recvs.size() == 1 && sends[0].rank == recvs[0].rank &&
      sends[0].bytes > 0 && recvs[0].bytes > 0 && same_host_ > 1 &&
      host_of_[sends[0].rank] != host_of_[rank_] &&
      tuning_->phased_exchange.load(std::memory_order_relaxed)) {
    PhasedExchange(sends[0], recvs[0]);
    return;
  }
  MPI_Request* reqs = static_cast<MPI_Request*>(Requests(sends.size() + recvs.size()));
  size_t posted = 0;
  auto post = [&](const PeerBuffer& p, bool is_send) {
    BF_ENFORCE(p.bytes < INT_MAX, StatusCode::kInvalidArgument,
               "neighbor transfers over 2 GiB are not supported");
    int code = is_send ? MPI_Isend(p.data, static_cast<int>(p.bytes), MPI_BYTE, p.rank, kTag,
                                   AsComm(comm_), &reqs[posted])
                       : MPI_Irecv(p.data, static_cast<int>(p.bytes), MPI_BYTE, p.rank, kTag,
                                   AsComm(comm_), &reqs[posted]);
    Check(code, is_send ? "MPI_Isend" : "MPI_Irecv");
    ++posted;
  };
  for (const PeerBuffer& r : recvs) post(r, false);
  for (const PeerBuffer& s : sends) post(s, true);
  Check(MPI_Waitall(static_cast<int>(posted), reqs, MPI_STATUSES_IGNORE), "MPI_Waitall");
}

// One peer on another host, to which this rank sends and from which it receives: first one
// direction, then the other. Measured on pretend hosts (2 x 4 ranks, 250 Mbit/s): an Open MPI
// process sending and receiving over TCP at once moves about half the bytes per second of one
// that only sends or only receives, so 4 such pairs exchanging 4 MiB each way took 870 ms
// where the link needs 540. The pair's lower rank goes first when it is even, second when odd:
// both ranks of a pair derive the same order, and when the pairs are the same local rank on
// two hosts (the machine exchange of hierarchical_neighbor_allreduce), half of each host's
// processes send while the other half receive, so both directions of the link stay busy.
// A peer that exchanges with several ranks posts everything at once, which matches either
// order here, so no order deadlocks.
void MpiCommunicator::PhasedExchange(const PeerBuffer& send, const PeerBuffer& recv) {
  constexpr int kTag = 7;
  BF_ENFORCE(send.bytes < INT_MAX && recv.bytes < INT_MAX, StatusCode::kInvalidArgument,
             "neighbor transfers over 2 GiB are not supported");
  const int lower = std::min(rank_, send.rank);
  const bool send_first = (rank_ == lower) == (lower % 2 == 0);
  for (int phase = 0; phase < 2; ++phase) {
    MPI_Request request;
    if ((phase == 0) == send_first) {
      Check(MPI_Isend(send.data, static_cast<int>(send.bytes), MPI_BYTE, send.rank, kTag,
                      AsComm(comm_), &request),
            "MPI_Isend");
    } else {
      Check(MPI_Irecv(recv.data, static_cast<int>(recv.bytes), MPI_BYTE, recv.rank, kTag,
                      AsComm(comm_), &request),
            "MPI_Irecv");
    }
    WaitSparingly(&request);
  }
}

// A transfer across hosts takes many milliseconds, and MPI_Wait would spin through them on a
// core that the host's other ranks may need (ranks often outnumber cores). So: test, spin a
// little, then yield, then sleep between tests, at most kMaxPause: the socket buffers hold far
// more than a link delivers in that time, so the transfer does not slow down.
void MpiCommunicator::WaitSparingly(void* request, int n) {
  constexpr auto kMaxPause = std::chrono::microseconds(500);
  MPI_Request* r = static_cast<MPI_Request*>(request);
  int done = 0;
  auto pause = std::chrono::microseconds(20);
  const auto start = std::chrono::steady_clock::now();
  for (int tests = 0;; ++tests) {
    Check(MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return;
    if (tests < 100) continue;
    if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1)) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kMaxPause);
  }
}

}  // namespace bluefog
