// The ring allreduce: reduce-scatter then allgather around the ring rank -> rank + 1, each rank
// sending and receiving 2 (n - 1) / n of the buffer, the bandwidth optimum. (Open MPI's
// large-message allreduce allocates its scratch on every call; page faults on fresh memory are
// expensive here.)
#include <mpi.h>

#include <algorithm>
#include <climits>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {
namespace {

// The reduce-scatter moves this much at a time, so the received chunk is still in cache when
// it is summed (measured against whole segments and 512 KiB: up to 1.2x faster at 16-64 MiB,
// equal below, with a 2 MiB L2 per core).
constexpr int64_t kRingChunkBytes = int64_t{1} << 20;

// With a neighbour on another host, this many chunks are in flight each way: the link keeps
// moving while a chunk is summed and while the next chunk's transfer starts (which takes a
// round trip through both processes' progress loops). Measured between two pretend hosts
// (1 Gbit/s, bench/tcp_exchange.c, 16 MiB each way): 1 chunk at a time moved 52-53% of the
// link's rate, 4 at a time 65%.
constexpr int kCrossDepth = 4;

// Chunks 0 .. chunks - 1 exchanged with the neighbours across hosts, kCrossDepth in flight:
// post(c, requests) posts chunk c's receive and send into two requests; arrived(c) runs once
// both have completed, before chunk c + kCrossDepth is posted into the same requests.
template <typename Post, typename Arrived>
void Pipelined(MpiCommunicator* comm, int64_t chunks, Post post, Arrived arrived) {
  MPI_Request* reqs = static_cast<MPI_Request*>(comm->Requests(2 * kCrossDepth));
  for (int64_t c = 0; c < std::min<int64_t>(kCrossDepth, chunks); ++c) {
    post(c, &reqs[2 * (c % kCrossDepth)]);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    MPI_Request* pair = &reqs[2 * (c % kCrossDepth)];
    comm->WaitSparingly(pair, 2);
    arrived(c);
    if (c + kCrossDepth < chunks) post(c + kCrossDepth, pair);
  }
}

}  // namespace

bool RingAllreduce::AppliesTo(const AllreduceCall& call) const {
  return comm_->size() > 1 && LargeCall(comm_->tuning(), call) && call.count >= comm_->size();
}

// The reduce-scatter moves each segment in chunks of kRingChunkBytes received into one
// persistent scratch chunk and summed at once, while still in cache: out = in + chunk in one
// pass, so each step reads and writes memory once. The first step reads `in` and every segment
// of `out` is written exactly once: out of place, no initial copy. The last summing pass also
// divides (the average), and the allgather then sends finished segments straight into `out`.
void RingAllreduce::Run(const AllreduceCall& call) {
  constexpr int kTag = 11;
  const int64_t count = call.count;
  const DataType dtype = call.dtype;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const char* src = static_cast<const char*>(call.in);
  char* data = static_cast<char*>(call.out);
  const int n = comm_->size();
  const int rank = comm_->rank();
  const MPI_Comm comm = CommOf(comm_->comm());
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
  const int right = (rank + 1) % n;
  const int left = (rank - 1 + n) % n;
  auto mod = [n](int k) { return ((k % n) + n) % n; };
  // With a neighbour on another host a step takes milliseconds: several chunks in flight,
  // waited for without spinning.
  const bool across = comm_->OnOtherHost(left) || comm_->OnOtherHost(right);
  char* scratch = comm_->Scratch((across ? kCrossDepth : 1) * chunk * elem);
  auto post = [&](const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes,
                  MPI_Request* pair) {
    comm_->Check(
        MPI_Irecv(recv, static_cast<int>(recv_bytes), MPI_BYTE, left, kTag, comm, &pair[0]),
        "MPI_Irecv");
    comm_->Check(
        MPI_Isend(send, static_cast<int>(send_bytes), MPI_BYTE, right, kTag, comm, &pair[1]),
        "MPI_Isend");
  };
  auto sendrecv = [&](const char* send, int64_t send_bytes, char* recv, int64_t recv_bytes) {
    comm_->Check(
        MPI_Sendrecv(send, static_cast<int>(send_bytes), MPI_BYTE, right, kTag, recv,
                     static_cast<int>(recv_bytes), MPI_BYTE, left, kTag, comm, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
  };
  // Elements [lo, hi) of chunk c within a segment of `len` elements.
  auto piece = [chunk](int64_t c, int64_t len, int64_t* lo) {
    *lo = std::min(len, c * chunk);
    return std::min(len, (c + 1) * chunk) - *lo;
  };
  // Chunk c of the segments sent and received at a step: where each starts, and its elements.
  struct Piece {
    int64_t send_lo, send_n, recv_lo, recv_n;
  };
  auto pieces = [&](int64_t c, int send_seg, int recv_seg) {
    Piece p;
    p.send_n = piece(c, seg_count(send_seg), &p.send_lo);
    p.recv_n = piece(c, seg_count(recv_seg), &p.recv_lo);
    return p;
  };
  for (int step = 0; step < n - 1; ++step) {
    const int send_seg = mod(rank - step);
    const int recv_seg = mod(rank - step - 1);
    // Step 0 sends this rank's own input; later steps the partial sums made in `out`.
    const char* send_base = (step == 0 ? src : data) + begin(send_seg) * elem;
    const char* own = src + begin(recv_seg) * elem;
    char* target = data + begin(recv_seg) * elem;
    const int64_t last_divisor = step == n - 2 ? call.divisor : 1;
    // Chunk c arrived in `got`: summed into its place in `out`.
    auto reduce = [&](int64_t c, const char* got) {
      int64_t recv_lo;
      const int64_t recv_n = piece(c, seg_count(recv_seg), &recv_lo);
      ReduceStep(target + recv_lo * elem, own + recv_lo * elem, got, recv_n, dtype, call.op,
                 last_divisor);
    };
    auto slot = [&](int64_t c) { return scratch + (c % kCrossDepth) * chunk * elem; };
    if (across) {
      Pipelined(
          comm_, chunks,
          [&](int64_t c, MPI_Request* pair) {
            const Piece p = pieces(c, send_seg, recv_seg);
            post(send_base + p.send_lo * elem, p.send_n * elem, slot(c), p.recv_n * elem, pair);
          },
          [&](int64_t c) { reduce(c, slot(c)); });
      continue;
    }
    for (int64_t c = 0; c < chunks; ++c) {
      const Piece p = pieces(c, send_seg, recv_seg);
      sendrecv(send_base + p.send_lo * elem, p.send_n * elem, scratch, p.recv_n * elem);
      reduce(c, scratch);
    }
  }
  for (int step = 0; step < n - 1; ++step) {
    const int send_seg = mod(rank + 1 - step);
    const int recv_seg = mod(rank - step);
    const char* send_base = data + begin(send_seg) * elem;
    char* recv_base = data + begin(recv_seg) * elem;
    if (!across) {
      sendrecv(send_base, seg_count(send_seg) * elem, recv_base, seg_count(recv_seg) * elem);
      continue;
    }
    // Finished segments go straight into `out`, in chunks so that several are in flight.
    Pipelined(
        comm_, chunks,
        [&](int64_t c, MPI_Request* pair) {
          const Piece p = pieces(c, send_seg, recv_seg);
          post(send_base + p.send_lo * elem, p.send_n * elem, recv_base + p.recv_lo * elem,
               p.recv_n * elem, pair);
        },
        [](int64_t) {});
  }
}

}  // namespace bluefog
