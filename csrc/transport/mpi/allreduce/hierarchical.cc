// The hierarchical allreduce, for jobs over several hosts with the same number of ranks on
// each: within each host a reduce-scatter leaves local rank l with slice l of the host's sum;
// the ranks with one local rank (one per host) allreduce that slice across the hosts, so every
// local rank uses its own share of the links between hosts; an allgather within each host puts
// the slices together. Across hosts each host sends and receives about 2 (H-1)/H of the buffer
// in all, against 2 (N-1)/N per rank (L times as much per host) for a flat ring.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/reduce_kernels.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

// Two hosts: slices of at least this much take the split (TwoHostSlice), received in chunks
// of this size; smaller ones the cross communicator's allreduce, whose two directions overlap
// (1 MiB buffers at 2 x 2 ranks: 24 ms by the ring, 32 ms split).
constexpr int64_t kSplitChunkBytes = int64_t{1} << 20;
// Chunks the receiving side keeps posted, so the link keeps moving while it sums one.
constexpr int64_t kSplitDepth = 4;

}  // namespace

bool HierarchicalAllreduce::AppliesTo(const AllreduceCall& call) const {
  return LargeCall(comm_->tuning(), call) && comm_->cross() != nullptr &&
         comm_->tuning().hierarchical.load(std::memory_order_relaxed) &&
         call.count >= comm_->local_size() && call.count <= INT_MAX;
}

void HierarchicalAllreduce::Run(const AllreduceCall& call) {
  const DataType dtype = call.dtype;
  const int64_t count = call.count;
  const MPI_Op op = MpiOpFor(comm_->reduce_op(), dtype, call.op);
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int local_size = comm_->local_size();
  const MPI_Comm local = CommOf(comm_->local_comm());
  counts_.resize(local_size);
  displs_.resize(local_size);
  int offset = 0;
  for (int l = 0; l < local_size; ++l) {
    counts_[l] = static_cast<int>(count / local_size + (l < count % local_size ? 1 : 0));
    displs_[l] = offset;
    offset += counts_[l];
  }
  const int mine = counts_[comm_->local_rank()];
  char* out = static_cast<char*>(call.out);
  char* slice = out + static_cast<int64_t>(displs_[comm_->local_rank()]) * elem;
  // The host's sum into every local rank's output through the one-host transport (2 pretend
  // hosts x 2 ranks, 250 Mbit/s, 4-64 MiB: 89-91% of the link against 56-62% with
  // MPI_Reduce_scatter), else a reduce-scatter straight into this rank's slice of the output
  // (in place when in == out).
  if (MpiCommunicator* host = comm_->host()) {
    host->Allreduce(call.in, call.out, count, dtype, call.op, 1);
  } else if (call.in == call.out) {
    // MPI_Reduce_scatter in place leaves the result at the start of the buffer; move it into
    // place after (the slice is at most 1/L of the buffer).
    comm_->Check(MPI_Reduce_scatter(MPI_IN_PLACE, out, counts_.data(), ToMpi(dtype), op, local),
                 "MPI_Reduce_scatter");
    if (slice != out) std::memmove(slice, out, static_cast<size_t>(mine) * elem);
  } else {
    comm_->Check(MPI_Reduce_scatter(call.in, slice, counts_.data(), ToMpi(dtype), op, local),
                 "MPI_Reduce_scatter");
  }
  // Across hosts both directions of every link busy at once. (Open MPI's allreduce of two
  // ranks was measured here to reduce, then send back: each direction idle half the time.)
  MpiCommunicator* cross = comm_->cross();
  // (Over Gloo's pairs, where the probe chose them, both directions move at once anyway.)
  const bool plane =
      cross->data_plane() != nullptr && comm_->tuning().cross_host.load(std::memory_order_relaxed);
  if (cross->size() == 2 && local_size > 1 && !plane &&
      comm_->tuning().two_host_split.load(std::memory_order_relaxed) &&
      mine * elem >= kSplitChunkBytes) {
    TwoHostSlice(slice, mine, dtype, call.op, call.divisor);
  } else {
    cross->Allreduce(slice, slice, mine, dtype, call.op, call.divisor);
  }
  comm_->Check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, counts_.data(),
                              displs_.data(), ToMpi(dtype), local),
               "MPI_Allgatherv");
}

// Slice l of two hosts' partial sums: the process with local rank l on host l % 2 receives
// the other host's partial in chunks (the next one arriving while it sums the last) and sends
// the result back; its counterpart sends, then receives. With local ranks taking alternate
// roots, one process of each pair sends across while another receives in each phase: measured
// on pretend hosts here, a process that sends and receives over TCP at once moved about half
// the bytes per second of one that only sends or only receives. Every wait across hosts is
// WaitSparingly: the host's other ranks are sending too and need the cores.
void HierarchicalAllreduce::TwoHostSlice(char* slice, int64_t count, DataType dtype, ReduceOp op,
                                         int64_t divisor) {
  constexpr int kPartialTag = 21;
  constexpr int kResultTag = 22;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  MpiCommunicator* cross = comm_->cross();
  const MPI_Comm comm = CommOf(cross->comm());
  const int peer = 1 - cross->rank();
  const bool root = comm_->local_rank() % 2 == cross->rank();
  const int64_t chunk = std::max<int64_t>(1, kSplitChunkBytes / elem);
  const int64_t chunks = (count + chunk - 1) / chunk;
  auto piece = [&](int64_t c, int64_t* lo) {
    *lo = c * chunk;
    return static_cast<int>(std::min(chunk, count - *lo) * elem);
  };
  const size_t slots = static_cast<size_t>(std::max<int64_t>(kSplitDepth, chunks));
  MPI_Request* pending = static_cast<MPI_Request*>(comm_->Requests(slots));
  if (root) {
    char* scratch = comm_->Scratch(kSplitDepth * chunk * elem);
    auto post = [&](int64_t c) {
      int64_t lo;
      const int bytes = piece(c, &lo);
      comm_->Check(MPI_Irecv(scratch + (c % kSplitDepth) * chunk * elem, bytes, MPI_BYTE, peer,
                             kPartialTag, comm, &pending[c % kSplitDepth]),
                   "MPI_Irecv");
    };
    for (int64_t c = 0; c < std::min(kSplitDepth, chunks); ++c) post(c);
    for (int64_t c = 0; c < chunks; ++c) {
      comm_->WaitSparingly(&pending[c % kSplitDepth]);
      int64_t lo;
      const int64_t n = piece(c, &lo) / elem;
      const char* got = scratch + (c % kSplitDepth) * chunk * elem;
      char* target = slice + lo * elem;
      ReduceStep(target, target, got, n, dtype, op, divisor);
      if (c + kSplitDepth < chunks) post(c + kSplitDepth);
    }
    comm_->Check(
        MPI_Isend(slice, static_cast<int>(count), ToMpi(dtype), peer, kResultTag, comm, pending),
        "MPI_Isend");
    comm_->WaitSparingly(pending);
  } else {
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t lo;
      const int bytes = piece(c, &lo);
      comm_->Check(
          MPI_Isend(slice + lo * elem, bytes, MPI_BYTE, peer, kPartialTag, comm, &pending[c]),
          "MPI_Isend");
    }
    comm_->WaitSparingly(pending, static_cast<int>(chunks));
    comm_->Check(
        MPI_Irecv(slice, static_cast<int>(count), ToMpi(dtype), peer, kResultTag, comm, pending),
        "MPI_Irecv");
    comm_->WaitSparingly(pending);
  }
}

}  // namespace bluefog
