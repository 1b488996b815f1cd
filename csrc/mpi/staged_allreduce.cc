// The staged allreduce among ranks of one host: through data areas in the rounds' shared-memory
// segment (LocalRounds), with plain loads and stores (MpiTransport::StagedAllreduce), and the
// timed choice between it and the direct path (ChosenLocalAllreduce); see docs/design.md,
// step 5 of "One request, end to end".
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/reduce_kernels.h"
#include "mpi/shared_heap.h"
#include "mpi/transport.h"

namespace bluefog {
namespace {

// The reduced part is written to the output and published this much at a time, so the second
// write reads it from cache.
constexpr int64_t kPublishBytes = int64_t{64} << 10;

}  // namespace

// The buffer goes in steps of at most data_bytes(); each step's elements are split into n
// segments, segment r being rank r's. A step:
//  1. a sync (a shared-memory round): every rank is done with the areas' previous step (on the
//     first step, `synced`: the caller's gather of the buffers was one);
//  2. every rank copies its input's segments s != r into its own area, at their offsets;
//  3. a sync;
//  4. rank r sums its own input's segment r with segment r of every peer's area into its output
//     and copies the result into segment r of its own area;
//  5. a sync;
//  6. rank r copies segment s of rank s's area into its output, for every s != r.
// No sync after the last step: no peer ever touches this rank's own buffers, and the next step
// (of this call or a later one) starts with one. Per rank that reads its input once and writes
// its output once in main memory, and the areas (n data_bytes() in all, one set: a second set
// would save the first sync but double what must stay in cache) are written once and read once.
// Each segment is reduced by one rank only, so every rank gets the same bits; in place is safe,
// as a rank overwrites a segment of its buffer only after copying it in.
void MpiTransport::StagedAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                   ReduceOp op, int64_t divisor, bool synced) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int n = size_;
  const int64_t step =
      std::max<int64_t>(n, static_cast<int64_t>(local_rounds_->data_bytes()) / elem);
  const int64_t publish = std::max<int64_t>(1, kPublishBytes / elem);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t lo = 0; lo < count; lo += step) {
    const int64_t m = std::min(step, count - lo);
    auto begin = [&](int k) { return m * k / n; };
    char* mine = local_rounds_->data(rank_);
    if (lo > 0 || !synced) local_rounds_->Exchange(nullptr);
    for (int k = 1; k < n; ++k) {
      const int s = (rank_ + k) % n;
      std::memcpy(mine + begin(s) * elem, src + (lo + begin(s)) * elem,
                  static_cast<size_t>((begin(s + 1) - begin(s)) * elem));
    }
    local_rounds_->Exchange(nullptr);
    for (int64_t i = begin(rank_); i < begin(rank_ + 1); i += publish) {
      const int64_t len = std::min(publish, begin(rank_ + 1) - i);
      char* d = dst + (lo + i) * elem;
      for (int k = 1; k < n; ++k) {
        const char* theirs = local_rounds_->data((rank_ + k) % n) + i * elem;
        const char* acc = k == 1 ? src + (lo + i) * elem : d;
        if (op == ReduceOp::kSum) {
          SumOf(d, acc, theirs, len, dtype, k == n - 1 ? divisor : 1);
        } else {
          ReduceOf(d, acc, theirs, len, dtype, op);
        }
      }
      std::memcpy(mine + i * elem, d, static_cast<size_t>(len * elem));
    }
    local_rounds_->Exchange(nullptr);
    for (int k = 1; k < n; ++k) {
      const int s = (rank_ + k) % n;
      std::memcpy(dst + (lo + begin(s)) * elem, local_rounds_->data(s) + begin(s) * elem,
                  static_cast<size_t>((begin(s + 1) - begin(s)) * elem));
    }
  }
}

// Every output in the shared heap: the staged allreduce, but each rank writes the segment it
// reduced straight into every peer's output (a plain store into the peer's part of the heap,
// while the chunk is still in cache) instead of through its area, so nobody copies anything
// out. A step:
//  1. a sync (on the first step the caller's gather of the buffers): the areas are free;
//  2. every rank copies its input's segments s != r into its own area, at their offsets;
//  3. a sync;
//  4. rank r sums its own input's segment r with segment r of every peer's area into its output,
//     kPublishBytes at a time, and copies each summed piece into every peer's output.
// A last sync: every output is complete (and the areas free for the next call). Per rank that
// reads its input once and writes its own segment once plus the peers' copies of it ((n-1)S/n,
// what they would otherwise copy out), and its area is written once and read by the peers once:
// two passes over the data fewer than the staged path, with one sync fewer per step after the
// first. In place is safe for the same reason as there: rank r writes segment r of a peer's
// buffer only after the sync that follows the peer's copy of it into its area.
void MpiTransport::SharedAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                   ReduceOp op, int64_t divisor) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int n = size_;
  const int64_t step =
      std::max<int64_t>(n, static_cast<int64_t>(local_rounds_->data_bytes()) / elem);
  const int64_t publish = std::max<int64_t>(1, kPublishBytes / elem);
  const SharedHeap& heap = *local_rounds_->heap();
  peer_outputs_.resize(n);
  for (int r = 0; r < n; ++r)
    peer_outputs_[r] = heap.part(r) + static_cast<int64_t>(peer_buffers_[3 * r + 2]);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  char* mine = local_rounds_->data(rank_);
  for (int64_t lo = 0; lo < count; lo += step) {
    const int64_t m = std::min(step, count - lo);
    auto begin = [&](int k) { return m * k / n; };
    if (lo > 0) local_rounds_->Exchange(nullptr);
    for (int k = 1; k < n; ++k) {
      const int s = (rank_ + k) % n;
      std::memcpy(mine + begin(s) * elem, src + (lo + begin(s)) * elem,
                  static_cast<size_t>((begin(s + 1) - begin(s)) * elem));
    }
    local_rounds_->Exchange(nullptr);
    for (int64_t i = begin(rank_); i < begin(rank_ + 1); i += publish) {
      const int64_t len = std::min(publish, begin(rank_ + 1) - i);
      char* d = dst + (lo + i) * elem;
      for (int k = 1; k < n; ++k) {
        const char* theirs = local_rounds_->data((rank_ + k) % n) + i * elem;
        const char* acc = k == 1 ? src + (lo + i) * elem : d;
        if (op == ReduceOp::kSum) {
          SumOf(d, acc, theirs, len, dtype, k == n - 1 ? divisor : 1);
        } else {
          ReduceOf(d, acc, theirs, len, dtype, op);
        }
      }
      for (int k = 1; k < n; ++k)
        std::memcpy(peer_outputs_[(rank_ + k) % n] + (lo + i) * elem, d,
                    static_cast<size_t>(len * elem));
    }
  }
  local_rounds_->Exchange(nullptr);
}

// The one-host paths over the rounds' shared memory. One sync gathers every rank's input and
// output addresses and where its output lies in the shared heap (-1: not there); it is the
// first sync of whichever path runs, so choosing costs nothing. Every output in the heap: the
// shared path; otherwise the staged or the direct one as before.
void MpiTransport::LocalAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                  ReduceOp op, int64_t divisor) {
  const int64_t bytes = count * static_cast<int64_t>(ElementSize(dtype));
  const std::shared_ptr<SharedHeap>& heap = local_rounds_->heap();
  const int64_t offset = shared_enabled_.load(std::memory_order_relaxed) && heap
                             ? heap->OffsetOf(out, static_cast<size_t>(bytes))
                             : -1;
  const uint64_t mine[3] = {reinterpret_cast<uint64_t>(in), reinterpret_cast<uint64_t>(out),
                            static_cast<uint64_t>(offset)};
  peer_buffers_.resize(3 * static_cast<size_t>(size_));
  SmallAllgather(mine, sizeof(mine), peer_buffers_.data());
  bool all_shared = true;
  for (int r = 0; r < size_; ++r)
    all_shared = all_shared && static_cast<int64_t>(peer_buffers_[3 * r + 2]) >= 0;
  if (all_shared) {
    SharedAllreduce(in, out, count, dtype, op, divisor);
    shared_calls_.fetch_add(1, std::memory_order_relaxed);
  } else if (direct() && count >= size_ && bytes <= kStagedMaxBytes) {
    ChosenLocalAllreduce(in, out, count, dtype, op, divisor);
  } else if (direct() && count >= size_) {
    DirectAllreduce(in, out, count, dtype, op, divisor, true);
  } else {
    StagedAllreduce(in, out, count, dtype, op, divisor, true);
  }
}

// Which of the two one-host paths is faster depends on the state the VM's memory is in (at
// 2 ranks, 1 MiB: the staged path 1.8x MPI and the direct one 0.9x in one state, 1.2-1.5x and
// 2.5-3x in the other, from launch to launch), so each power-of-two size class is decided by
// timing it: its first calls run the two in turns, kLocalBlock calls at a time (4 blocks),
// the first kLocalWarm calls of a block untimed (they find the other path's data in cache,
// and were measured up to 5x slower than the rest); then every rank takes the path whose
// median, the slowest rank's, was lower (the medians are allgathered: all ranks choose alike).
// Every local_recheck_calls_ calls of the class after that, it is decided again the same way
// (at most 32 calls in 2048 + 32, half of them on the slower path).
void MpiTransport::ChosenLocalAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                        ReduceOp op, int64_t divisor) {
  LocalChoice& c = local_choice_[SizeClass(count * static_cast<int64_t>(ElementSize(dtype)))];
  const int algorithm = c.pick >= 0 ? c.pick : (c.trials / kLocalBlock) % 2;  // 0: staged
  const double start = MPI_Wtime();
  if (algorithm == 0) {
    StagedAllreduce(in, out, count, dtype, op, divisor, true);
  } else {
    DirectAllreduce(in, out, count, dtype, op, divisor, true);
  }
  if (c.pick >= 0) {
    // The state can change later (it did within launches): time both again now and then.
    if (++c.since_pick >= local_recheck_calls_) c = LocalChoice();
    return;
  }
  const int in_block = c.trials % kLocalBlock;
  if (in_block >= kLocalWarm)
    c.seconds[algorithm][(c.trials / (2 * kLocalBlock)) * (kLocalBlock - kLocalWarm) + in_block -
                         kLocalWarm] = MPI_Wtime() - start;
  if (++c.trials < 4 * kLocalBlock) return;
  double medians[2];
  for (int a = 0; a < 2; ++a) {
    double* t = c.seconds[a];
    std::nth_element(t, t + kLocalTrials / 2, t + kLocalTrials);
    medians[a] = t[kLocalTrials / 2];
  }
  std::vector<double> all(2 * static_cast<size_t>(size_));
  SmallAllgather(medians, sizeof(medians), all.data());
  double slowest[2] = {0, 0};
  for (int r = 0; r < size_; ++r)
    for (int a = 0; a < 2; ++a) slowest[a] = std::max(slowest[a], all[2 * r + a]);
  c.pick = slowest[1] < slowest[0] ? 1 : 0;
}

int MpiTransport::SizeClass(int64_t bytes) {
  int size_class = 0;
  while ((int64_t{2} << size_class) <= bytes && size_class < 62) ++size_class;
  return size_class;
}

int MpiTransport::local_choice(int64_t bytes) const { return local_choice_[SizeClass(bytes)].pick; }

}  // namespace bluefog
