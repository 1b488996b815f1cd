#include "transport/mpi/transport.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/mpi/comm_handle.h"

namespace bluefog {
namespace {

// Large transfers are split so each MPI count fits in an int.
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;
// The ring's reduce-scatter moves this much at a time, so the received chunk is still in cache
// when it is summed. Measured here (2 MiB L2 per core) against whole segments and 512 KiB: up
// to 1.2x faster at 16-64 MiB, equal below.
constexpr int64_t kRingChunkBytes = int64_t{1} << 20;
MPI_Op& AsOp(void*& p) { return *reinterpret_cast<MPI_Op*>(&p); }

// What MPI has no operation for (sums of the 16-bit floats; min, max and product, whose NaN
// handling must match the ring's) goes through bluefog's own kernels, as one MPI op. MPI calls
// it on the thread that called MPI_Allreduce, the background thread, which sets the context
// just before.
struct ReduceContext {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
};
thread_local ReduceContext reduce_context;
void BluefogReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceOf(inout, inout, in, *len, reduce_context.dtype, reduce_context.op);
}

// MPI_SUM where MPI can sum the dtype itself; otherwise bluefog's own op (`ours`), with the
// context its callback reads set for this thread.
MPI_Op AsMpiOp(MPI_Op ours, DataType dtype, ReduceOp reduce) {
  if (reduce == ReduceOp::kSum && dtype != DataType::kFloat16 && dtype != DataType::kBFloat16)
    return MPI_SUM;
  reduce_context = {dtype, reduce};
  return ours;
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

}  // namespace

static_assert(sizeof(MPI_Comm) <= sizeof(void*), "MPI_Comm must fit in a pointer");
static_assert(sizeof(MPI_Op) <= sizeof(void*), "MPI_Op must fit in a pointer");

MpiTransport::~MpiTransport() { Shutdown(); }

void MpiTransport::Check(int code, const char* call) const {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw BluefogError(StatusCode::kInternal, Concat(call, " failed: ", std::string(text, len)));
}

char* MpiTransport::Scratch(int64_t bytes) {
  if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(static_cast<size_t>(bytes));
  return scratch_.data();
}

TransportInfo MpiTransport::Init() {
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
  } else {
    Check(MPI_Comm_free(&AsComm(cross)), "MPI_Comm_free");
  }

  const bool one_host = size_ > 1 && info.local_size == size_;
  if (one_host) ProbeDirect();
  SetUpExchange(one_host);
  initialized_ = true;
  info.rank = rank_;
  info.size = size_;
  return info;
}

std::unique_ptr<MpiTransport> MpiTransport::CreateSubset(const std::vector<int>& ranks, int tag) {
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

std::unique_ptr<MpiTransport> MpiTransport::Adopt(void* comm) {
  auto t = std::make_unique<MpiTransport>();
  t->comm_ = comm;
  Check(MPI_Comm_set_errhandler(AsComm(t->comm_), MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Check(MPI_Comm_rank(AsComm(t->comm_), &t->rank_), "MPI_Comm_rank");
  Check(MPI_Comm_size(AsComm(t->comm_), &t->size_), "MPI_Comm_size");
  Check(MPI_Op_create(&BluefogReduce, 1, &AsOp(t->bluefog_op_)), "MPI_Op_create");
  t->ring_threshold_bytes_ = ring_threshold_bytes_;
  t->direct_enabled_ = direct_enabled_;
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
    MPI_Comm_free(&shared);
    one_host = shared_size == t->size_;
    if (one_host) t->ProbeDirect();
  }
  t->local_rounds_enabled_ = local_rounds_enabled_;
  t->staged_bytes_ = staged_bytes_;
  t->SetUpExchange(one_host);
  t->initialized_ = true;
  return t;
}

void MpiTransport::Shutdown() {
  if (!initialized_) return;
  initialized_ = false;
  if (const std::shared_ptr<SharedHeap> heap = shared_heap()) {
    heap->Retire();  // blocks still out stay mapped until TensorFlow frees them
    if (SharedHeap::Current() == heap) SharedHeap::SetCurrent(nullptr);
  }
  local_rounds_.reset();
  MPI_Op_free(&AsOp(bluefog_op_));
  if (has_local_comm_) MPI_Comm_free(&AsComm(local_comm_));
  if (cross_) cross_->Shutdown();
  MPI_Comm_free(&AsComm(comm_));
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void MpiTransport::Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                             int64_t divisor) {
  BF_ENFORCE(op == ReduceOp::kSum || divisor == 1, StatusCode::kInternal,
             "only a sum can be averaged (PlanAverage decides who divides)");
  const int64_t bytes = count * static_cast<int64_t>(ElementSize(dtype));
  const bool large = ring_threshold_bytes_ > 0 && bytes >= ring_threshold_bytes_;
  if (large && hierarchical() && count >= local_size_ && count <= INT_MAX) {
    HierarchicalAllreduce(in, out, count, dtype, op, divisor);
  } else if (large && staged() && size_ > 1) {
    LocalAllreduce(in, out, count, dtype, op, divisor);
  } else if (large && direct() && count >= size_) {
    DirectAllreduce(in, out, count, dtype, op, divisor);
  } else if (size_ > 1 && large && count >= size_) {
    RingAllreduce(in, out, count, dtype, op, divisor);
  } else {
    MpiAllreduce(in, out, count, dtype, op);
    if (divisor > 1) DivideBy(out, count, dtype, divisor);
  }
}

// Reduce-scatter then allgather around the ring rank -> rank + 1: each rank sends and receives
// 2 (n - 1) / n of the buffer, the bandwidth optimum. (Open MPI's large-message allreduce
// allocates its scratch on every call; page faults on fresh memory are expensive here.)
// The reduce-scatter moves each segment in chunks of kRingChunkBytes received into one
// persistent scratch chunk and summed at once, while still in cache: out = in + chunk in one
// pass, so each step reads and writes memory once. The first step reads `in` and every segment
// of `out` is written exactly once: out of place, no initial copy. The last summing pass also
// divides (the average), and the allgather then sends finished segments straight into `out`.
void MpiTransport::RingAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                 ReduceOp op, int64_t divisor) {
  constexpr int kTag = 11;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const char* src = static_cast<const char*>(in);
  char* data = static_cast<char*>(out);
  const int n = size_;
  // Segment k covers elements [begin(k), begin(k + 1)).
  auto begin = [&](int k) { return count * k / n; };
  auto seg_count = [&](int k) { return begin(k + 1) - begin(k); };
  const int64_t max_seg = (count + n - 1) / n;
  BF_ENFORCE(max_seg * elem < INT_MAX, StatusCode::kInvalidArgument,
             "allreduce segment over 2 GiB is not supported");
  // Every rank derives the same chunking from `count`, so chunk c of a segment on the sender
  // pairs with chunk c of that segment on the receiver (the last chunk may be empty on one).
  const int64_t chunk = std::max<int64_t>(1, kRingChunkBytes / elem);
  const int64_t chunks = (max_seg + chunk - 1) / chunk;
  char* scratch = Scratch(chunk * elem);
  const int right = (rank_ + 1) % n;
  const int left = (rank_ - 1 + n) % n;
  auto mod = [n](int k) { return ((k % n) + n) % n; };
  // Elements [lo, hi) of chunk c within a segment of `len` elements.
  auto piece = [chunk](int64_t c, int64_t len, int64_t* lo) {
    *lo = std::min(len, c * chunk);
    return std::min(len, (c + 1) * chunk) - *lo;
  };
  for (int step = 0; step < n - 1; ++step) {
    const int send_seg = mod(rank_ - step);
    const int recv_seg = mod(rank_ - step - 1);
    // Step 0 sends this rank's own input; later steps the partial sums made in `out`.
    const char* send_base = (step == 0 ? src : data) + begin(send_seg) * elem;
    const char* own = src + begin(recv_seg) * elem;
    char* target = data + begin(recv_seg) * elem;
    const int64_t last_divisor = step == n - 2 ? divisor : 1;
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t send_lo, recv_lo;
      const int64_t send_n = piece(c, seg_count(send_seg), &send_lo);
      const int64_t recv_n = piece(c, seg_count(recv_seg), &recv_lo);
      Check(MPI_Sendrecv(send_base + send_lo * elem, static_cast<int>(send_n * elem), MPI_BYTE,
                         right, kTag, scratch, static_cast<int>(recv_n * elem), MPI_BYTE, left,
                         kTag, AsComm(comm_), MPI_STATUS_IGNORE),
            "MPI_Sendrecv");
      if (op == ReduceOp::kSum) {
        SumOf(target + recv_lo * elem, own + recv_lo * elem, scratch, recv_n, dtype, last_divisor);
      } else {
        ReduceOf(target + recv_lo * elem, own + recv_lo * elem, scratch, recv_n, dtype, op);
      }
    }
  }
  for (int step = 0; step < n - 1; ++step) {
    const int send_seg = mod(rank_ + 1 - step);
    const int recv_seg = mod(rank_ - step);
    Check(MPI_Sendrecv(data + begin(send_seg) * elem, static_cast<int>(seg_count(send_seg) * elem),
                       MPI_BYTE, right, kTag, data + begin(recv_seg) * elem,
                       static_cast<int>(seg_count(recv_seg) * elem), MPI_BYTE, left, kTag,
                       AsComm(comm_), MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }
}

// Within each host a reduce-scatter leaves local rank l with slice l of the host's sum; the
// ranks with one local rank (one per host) allreduce that slice across the hosts (the ring, or
// MPI_Allreduce for slices under the ring threshold), so every
// local rank uses its own share of the links between hosts; an allgather within each host
// puts the slices together. Across hosts each host sends and receives about 2 (H-1)/H of the
// buffer in all, against 2 (N-1)/N per rank (L times as much per host) for a flat ring.
void MpiTransport::HierarchicalAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                         ReduceOp reduce, int64_t divisor) {
  const MPI_Op op = AsMpiOp(AsOp(bluefog_op_), dtype, reduce);
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  local_counts_.resize(local_size_);
  local_displs_.resize(local_size_);
  int offset = 0;
  for (int l = 0; l < local_size_; ++l) {
    local_counts_[l] = static_cast<int>(count / local_size_ + (l < count % local_size_ ? 1 : 0));
    local_displs_[l] = offset;
    offset += local_counts_[l];
  }
  const int mine = local_counts_[local_rank_];
  char* slice = static_cast<char*>(out) + static_cast<int64_t>(local_displs_[local_rank_]) * elem;
  // Reduce-scatter straight into this rank's slice of the output (in place when in == out).
  const void* send = in == out ? MPI_IN_PLACE : in;
  if (send == MPI_IN_PLACE) {
    // MPI_Reduce_scatter in place leaves the result at the start of the buffer; move it into
    // place after (the slice is at most 1/L of the buffer).
    Check(MPI_Reduce_scatter(MPI_IN_PLACE, out, local_counts_.data(), ToMpi(dtype), op,
                             AsComm(local_comm_)),
          "MPI_Reduce_scatter");
    if (slice != out) std::memmove(slice, out, static_cast<size_t>(mine) * elem);
  } else {
    Check(
        MPI_Reduce_scatter(in, slice, local_counts_.data(), ToMpi(dtype), op, AsComm(local_comm_)),
        "MPI_Reduce_scatter");
  }
  // Across hosts our ring: both directions of every link busy at once. (Open MPI's allreduce of
  // two ranks was measured here to reduce, then send back: each direction idle half the time.)
  // Two hosts: each slice is reduced on one host and sent back, the hosts taking alternate
  // slices, so the links stay busy both ways while each process only sends or only receives.
  // Slices under one chunk keep the ring, whose two directions overlap (1 MiB buffers at 2 x 2
  // ranks: 24 ms by the ring, 32 ms split).
  if (cross_->size_ == 2 && local_size_ > 1 && two_host_split_ && mine * elem >= kRingChunkBytes) {
    TwoHostSliceAllreduce(slice, mine, dtype, reduce, divisor);
  } else {
    cross_->Allreduce(slice, slice, mine, dtype, reduce, divisor);
  }
  Check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, local_counts_.data(),
                       local_displs_.data(), ToMpi(dtype), AsComm(local_comm_)),
        "MPI_Allgatherv");
}

// Slice l of two hosts' partial sums: the process with local rank l on host l % 2 receives
// the other host's partial in chunks (the next one arriving while it sums the last) and sends
// the result back; its counterpart sends, then receives. With local ranks taking alternate
// roots, one process of each pair sends across while another receives in each phase: measured
// on pretend hosts here, a process that sends and receives over TCP at once moved about half
// the bytes per second of one that only sends or only receives.
void MpiTransport::TwoHostSliceAllreduce(char* slice, int64_t count, DataType dtype, ReduceOp op,
                                         int64_t divisor) {
  constexpr int kPartialTag = 21;
  constexpr int kResultTag = 22;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  MPI_Comm comm = AsComm(cross_->comm_);
  const int peer = 1 - cross_->rank_;
  const bool root = local_rank_ % 2 == cross_->rank_;
  const int64_t chunk = std::max<int64_t>(1, kRingChunkBytes / elem);
  const int64_t chunks = (count + chunk - 1) / chunk;
  auto piece = [&](int64_t c, int64_t* lo) {
    *lo = c * chunk;
    return static_cast<int>(std::min(chunk, count - *lo) * elem);
  };
  const size_t slots = static_cast<size_t>(std::max<int64_t>(2, chunks));
  if (requests_.size() < slots * sizeof(MPI_Request)) requests_.resize(slots * sizeof(MPI_Request));
  MPI_Request* pending = reinterpret_cast<MPI_Request*>(requests_.data());
  if (root) {
    char* scratch = Scratch(2 * chunk * elem);
    auto post = [&](int64_t c) {
      int64_t lo;
      const int bytes = piece(c, &lo);
      Check(MPI_Irecv(scratch + (c % 2) * chunk * elem, bytes, MPI_BYTE, peer, kPartialTag, comm,
                      &pending[c % 2]),
            "MPI_Irecv");
    };
    for (int64_t c = 0; c < std::min<int64_t>(2, chunks); ++c) post(c);
    for (int64_t c = 0; c < chunks; ++c) {
      Check(MPI_Wait(&pending[c % 2], MPI_STATUS_IGNORE), "MPI_Wait");
      int64_t lo;
      const int64_t n = piece(c, &lo) / elem;
      const char* got = scratch + (c % 2) * chunk * elem;
      char* target = slice + lo * elem;
      if (op == ReduceOp::kSum) {
        SumOf(target, target, got, n, dtype, divisor);
      } else {
        ReduceOf(target, target, got, n, dtype, op);
      }
      if (c + 2 < chunks) post(c + 2);
    }
    Check(MPI_Send(slice, static_cast<int>(count), ToMpi(dtype), peer, kResultTag, comm),
          "MPI_Send");
  } else {
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t lo;
      const int bytes = piece(c, &lo);
      Check(MPI_Isend(slice + lo * elem, bytes, MPI_BYTE, peer, kPartialTag, comm, &pending[c]),
            "MPI_Isend");
    }
    Check(MPI_Waitall(static_cast<int>(chunks), pending, MPI_STATUSES_IGNORE), "MPI_Waitall");
    Check(MPI_Recv(slice, static_cast<int>(count), ToMpi(dtype), peer, kResultTag, comm,
                   MPI_STATUS_IGNORE),
          "MPI_Recv");
  }
}

void MpiTransport::MpiAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                ReduceOp reduce) {
  const MPI_Op op = AsMpiOp(AsOp(bluefog_op_), dtype, reduce);
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int64_t chunk = kMaxChunkBytes / elem;
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t done = 0; done < count; done += chunk) {
    int len = static_cast<int>(std::min(chunk, count - done));
    const void* send = src == dst ? MPI_IN_PLACE : src + done * elem;
    Check(MPI_Allreduce(send, dst + done * elem, len, ToMpi(dtype), op, AsComm(comm_)),
          "MPI_Allreduce");
  }
}

void MpiTransport::ReduceScatter(const void* in, void* out,
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
  const MPI_Op op = AsMpiOp(AsOp(bluefog_op_), dtype, reduce);
  Check(MPI_Reduce_scatter(in, out, counts_.data(), ToMpi(dtype), op, AsComm(comm_)),
        "MPI_Reduce_scatter");
  if (divisor > 1) DivideBy(out, counts_per_rank[rank_], dtype, divisor);
}

void MpiTransport::Allgatherv(const void* in, void* out,
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

void MpiTransport::Broadcast(void* buffer, int64_t bytes, int root) {
  char* p = static_cast<char*>(buffer);
  for (int64_t done = 0; done < bytes; done += kMaxChunkBytes) {
    int n = static_cast<int>(std::min(kMaxChunkBytes, bytes - done));
    Check(MPI_Bcast(p + done, n, MPI_BYTE, root, AsComm(comm_)), "MPI_Bcast");
  }
}

void MpiTransport::NeighborExchange(const std::vector<PeerBuffer>& sends,
                                    const std::vector<PeerBuffer>& recvs) {
  constexpr int kTag = 7;
  const size_t count = sends.size() + recvs.size();
  if (requests_.size() < count * sizeof(MPI_Request)) requests_.resize(count * sizeof(MPI_Request));
  MPI_Request* reqs = reinterpret_cast<MPI_Request*>(requests_.data());
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

}  // namespace bluefog
