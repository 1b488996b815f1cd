// The allreduces among ranks of one host through data areas in the rounds' shared-memory
// segment (LocalRounds), with plain loads and stores: staged (MpiTransport::StagedAllreduce)
// and shared (outputs in the shared heap, SharedAllreduce), whose large out-of-place outputs are
// written with streaming stores (BLUEFOG_STREAMING_STORES); and the timed choice between those
// and the direct path (LocalAllreduce). See docs/design.md, step 5 of "One request, end to end".
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/config.h"
#include "core/logging.h"
#include "core/reduce_kernels.h"
#include "transport/mpi/shared_heap.h"
#include "transport/mpi/transport.h"

namespace bluefog {
namespace {

// The reduced part is written to the output and published this much at a time, so the second
// write reads it from cache.
constexpr int64_t kPublishBytes = int64_t{64} << 10;

using CopyFn = void (*)(void*, const void*, size_t);
void PlainCopy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

std::atomic<int64_t> g_streaming_store_bytes{Config().streaming_store_bytes};

// The median of t[0..n) (reorders them).
double MedianOf(double* t, int n) {
  std::nth_element(t, t + n / 2, t + n);
  return t[n / 2];
}

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
  const int64_t step = StepElements(elem);
  const int64_t publish = std::max<int64_t>(1, kPublishBytes / elem);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // Streaming: each piece is summed into the scratch (in cache) and streamed into the output.
  const bool stream = Streams(in, out, count * elem);
  char* piece = stream ? Scratch(kPublishBytes) : nullptr;
  const CopyFn put = stream ? StreamCopy : PlainCopy;
  for (int64_t lo = 0; lo < count; lo += step) {
    const int64_t m = std::min(step, count - lo);
    auto begin = [&](int k) { return m * k / n; };
    char* mine = local_rounds_->data(rank_);
    if (lo > 0 || !synced) local_rounds_->Exchange(nullptr);
    StageSegments(src + lo * elem, m, elem);
    local_rounds_->Exchange(nullptr);
    for (int64_t i = begin(rank_); i < begin(rank_ + 1); i += publish) {
      const int64_t len = std::min(publish, begin(rank_ + 1) - i);
      const size_t bytes = static_cast<size_t>(len * elem);
      char* d = dst + (lo + i) * elem;
      char* sum = stream ? piece : d;
      ReduceWithAreas(src + (lo + i) * elem, sum, i, len, dtype, op, divisor);
      if (stream) StreamCopy(d, sum, bytes);
      std::memcpy(mine + i * elem, sum, bytes);
    }
    local_rounds_->Exchange(nullptr);
    for (int k = 1; k < n; ++k) {
      const int s = (rank_ + k) % n;
      put(dst + (lo + begin(s)) * elem, local_rounds_->data(s) + begin(s) * elem,
          static_cast<size_t>((begin(s + 1) - begin(s)) * elem));
    }
  }
  areas_free_ = false;  // peers may still be copying out of this rank's area
}

// Every output in the shared heap: the staged allreduce, but each rank writes the segment it
// reduced straight into every peer's output (a plain store into the peer's part of the heap,
// while the chunk is still in cache) instead of through its area, so nobody copies anything
// out. A step:
//  1. a sync (on the first step the caller's gather of the buffers): the areas are free;
//  2. every rank copies its input's segments s != r into its own area, at their offsets;
//  3. a sync (on the first step, when `staged_first`, 1 and 2 came before the caller's gather,
//     which was this sync);
//  4. rank r sums its own input's segment r with segment r of every peer's area into its output,
//     kPublishBytes at a time, and copies each summed piece into every peer's output.
// A last sync: every output is complete (and the areas free for the next call). Per rank that
// reads its input once and writes its own segment once plus the peers' copies of it ((n-1)S/n,
// what they would otherwise copy out), and its area is written once and read by the peers once:
// two passes over the data fewer than the staged path, with one sync fewer per step after the
// first. In place is safe for the same reason as there: rank r writes segment r of a peer's
// buffer only after the sync that follows the peer's copy of it into its area.
void MpiTransport::SharedAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                   ReduceOp op, int64_t divisor, bool staged_first) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int n = size_;
  const int64_t step = StepElements(elem);
  const int64_t publish = std::max<int64_t>(1, kPublishBytes / elem);
  const SharedHeap& heap = *local_rounds_->heap();
  peer_outputs_.resize(n);
  for (int r = 0; r < n; ++r)
    peer_outputs_[r] = heap.part(r) + static_cast<int64_t>(peer_buffers_[3 * r + 2]);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  // Streaming: each piece is summed into the scratch (in cache) and streamed into every output.
  const bool stream = Streams(in, out, count * elem);
  char* piece = stream ? Scratch(kPublishBytes) : nullptr;
  const CopyFn put = stream ? StreamCopy : PlainCopy;
  for (int64_t lo = 0; lo < count; lo += step) {
    const int64_t m = std::min(step, count - lo);
    auto begin = [&](int k) { return m * k / n; };
    if (lo > 0) local_rounds_->Exchange(nullptr);
    if (lo > 0 || !staged_first) {
      StageSegments(src + lo * elem, m, elem);
      local_rounds_->Exchange(nullptr);
    }
    for (int64_t i = begin(rank_); i < begin(rank_ + 1); i += publish) {
      const int64_t len = std::min(publish, begin(rank_ + 1) - i);
      const size_t bytes = static_cast<size_t>(len * elem);
      char* d = dst + (lo + i) * elem;
      char* sum = stream ? piece : d;
      ReduceWithAreas(src + (lo + i) * elem, sum, i, len, dtype, op, divisor);
      if (stream) StreamCopy(d, sum, bytes);
      for (int k = 1; k < n; ++k) put(peer_outputs_[(rank_ + k) % n] + (lo + i) * elem, sum, bytes);
    }
  }
  local_rounds_->Exchange(nullptr);
  areas_free_ = true;  // every peer's reads of the areas came before this sync
}

// The one-host paths over the rounds' shared memory. One sync gathers every rank's input and
// output addresses and where its output lies in the shared heap (-1: not there); it is the
// first sync of whichever path runs, so choosing costs nothing. Then, whichever measured faster
// (Choose): every output in the heap, the shared path or the direct one, at every size;
// otherwise the staged or the direct one up to kStagedMaxBytes, and above it the direct one.
// Without the direct path, the shared or staged one.
//
// Which is faster depends on the state the VM's memory is in (at 2 ranks, 1 MiB: the staged
// path 1.8x MPI and the direct one 0.9x in one state, 1.2-1.5x and 2.5-3x in the other; the
// shared one 1.65-2.07x against direct 0.90-5.31x, from launch to launch), so each power-of-two
// size class is decided by timing it, apart for calls with every output in the heap and the
// rest: its first kLocalStartCalls calls go through the areas, untimed (they take the one-time
// page faults of areas and heap blocks); then the two run in turns, kLocalBlock calls at a time
// (4 blocks), the first kLocalWarm calls of a block untimed (they find the other path's data in
// cache, and were measured up to 5x slower than the rest); then every rank takes the path whose
// median, the slowest rank's, was lower (the medians are allgathered: all ranks choose alike).
// kLocalFirstRecheck calls after the first choice, and every local_recheck_calls_ calls of the
// class after later ones, it is decided again the same way, without the untimed start (at most
// 32 calls in 2048 + 32 in steady state, half of them on the slower path); and at once when the
// watch (Choose) finds the path taken slower than the other was: the paths through the areas
// fall into a state 2-5x slower and out of it within a launch (64 MiB: 11 ms, then 28 ms, where
// the direct path took 14 ms; docs/benchmarks.md).
void MpiTransport::LocalAllreduce(const void* in, void* out, int64_t count, DataType dtype,
                                  ReduceOp op, int64_t divisor) {
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  const int64_t bytes = count * elem;
  const int size_class = SizeClass(bytes);
  const std::shared_ptr<SharedHeap>& heap = local_rounds_->heap();
  const int64_t offset = shared_enabled_.load(std::memory_order_relaxed) && heap
                             ? heap->OffsetOf(out, static_cast<size_t>(bytes))
                             : -1;
  const bool can_choose = direct() && count >= size_;
  auto next = [&](const LocalChoice& c) {  // 0: through the areas, 1: direct
    return !can_choose ? 0 : c.pick >= 0 ? c.pick : c.start > 0 ? 0 : (c.trials / kLocalBlock) % 2;
  };
  // This output in the heap, the shared path next if every output is, and the areas free (the
  // last call through them took the shared path, which ends with a sync): copy the first step
  // in before the gather, so that when every output is in the heap the gather is also the
  // shared path's sync after that copy (one sync fewer per call). Every rank decides alike
  // then: the same history of agreed paths on all. When some output is not in the heap the
  // copy was for nothing, and harmless: nobody reads the areas until a path fills them again.
  const bool small = bytes <= kStagedMaxBytes;
  const double start = can_choose && (small || offset >= 0) ? MPI_Wtime() : 0.0;
  const bool staged_first =
      offset >= 0 && areas_free_ && next(local_choice_[kLocalShared][size_class]) == 0;
  if (staged_first)
    StageSegments(static_cast<const char*>(in), std::min(count, StepElements(elem)), elem);
  const uint64_t mine[3] = {reinterpret_cast<uint64_t>(in), reinterpret_cast<uint64_t>(out),
                            static_cast<uint64_t>(offset)};
  peer_buffers_.resize(3 * static_cast<size_t>(size_));
  SmallAllgather(mine, sizeof(mine), peer_buffers_.data());
  bool all_shared = true, all_in_place = true;
  for (int r = 0; r < size_; ++r) {
    all_shared = all_shared && static_cast<int64_t>(peer_buffers_[3 * r + 2]) >= 0;
    all_in_place = all_in_place && peer_buffers_[3 * r] == peer_buffers_[3 * r + 1];
  }
  // (Every output in the heap is timed as one kind, in place or not: `staged_first` above was
  // decided from that kind's choice before the gather, and must be alike on every rank.)
  LocalChoice& c = local_choice_[all_shared     ? kLocalShared
                                 : all_in_place ? kLocalInPlace
                                                : kLocalOutOfPlace][size_class];
  const bool timed = can_choose && (all_shared || small);
  const int algorithm = timed ? next(c) : can_choose ? 1 : 0;
  if (algorithm == 1) {
    DirectAllreduce(in, out, count, dtype, op, divisor, true);
  } else if (all_shared) {
    SharedAllreduce(in, out, count, dtype, op, divisor, staged_first);
    shared_calls_.fetch_add(1, std::memory_order_relaxed);
  } else {
    StagedAllreduce(in, out, count, dtype, op, divisor, true);
  }
  if (timed) Choose(&c, algorithm, MPI_Wtime() - start);
}

void MpiTransport::ReduceWithAreas(const char* own, char* out, int64_t at, int64_t len,
                                   DataType dtype, ReduceOp op, int64_t divisor) {
  const int n = size_;
  const int64_t elem = static_cast<int64_t>(ElementSize(dtype));
  for (int k = 1; k < n; ++k) {
    const char* theirs = local_rounds_->data((rank_ + k) % n) + at * elem;
    const char* acc = k == 1 ? own : out;
    if (op == ReduceOp::kSum) {
      SumOf(out, acc, theirs, len, dtype, k == n - 1 ? divisor : 1);
    } else {
      ReduceOf(out, acc, theirs, len, dtype, op);
    }
  }
}

int64_t MpiTransport::set_streaming_store_bytes(int64_t bytes) {
  return g_streaming_store_bytes.exchange(bytes, std::memory_order_relaxed);
}
int64_t MpiTransport::streaming_store_bytes() {
  return g_streaming_store_bytes.load(std::memory_order_relaxed);
}
bool MpiTransport::Streams(const void* in, const void* out, int64_t bytes) {
  const int64_t from = streaming_store_bytes();
  return in != out && from > 0 && bytes >= from;
}

void MpiTransport::StageSegments(const char* src, int64_t m, int64_t elem) {
  const int n = size_;
  char* mine = local_rounds_->data(rank_);
  for (int k = 1; k < n; ++k) {
    const int s = (rank_ + k) % n;
    const int64_t lo = m * s / n, hi = m * (s + 1) / n;
    std::memcpy(mine + lo * elem, src + lo * elem, static_cast<size_t>((hi - lo) * elem));
  }
}

void MpiTransport::Choose(LocalChoice* c, int algorithm, double seconds) {
  if (c->pick >= 0) {
    // The state can change later (it did within launches): time both again now and then,
    // the first time soon (a choice made while the job was starting can be off; see
    // LocalAllreduce), without the untimed start; and at once when the path taken has become
    // slower than the other was (the watch: one small allgather every kLocalWatchCalls calls).
    c->watch[c->since_pick % kLocalWatchCalls] = seconds;
    const int period =
        c->picks == 1 ? std::min(kLocalFirstRecheck, local_recheck_calls_) : local_recheck_calls_;
    bool again = ++c->since_pick >= period;
    if (!again && c->since_pick % kLocalWatchCalls == 0) {
      // Every rank's median of these calls over what it may reach: more than 1 on any rank
      // decides again.
      const double median = MedianOf(c->watch, kLocalWatchCalls);
      const double ratio = median / (local_worse_ * c->other_median);
      choice_all_.resize(static_cast<size_t>(size_));
      SmallAllgather(&ratio, sizeof(ratio), choice_all_.data());
      again = *std::max_element(choice_all_.begin(), choice_all_.end()) > 1.0;
      if (again && rank_ == 0)
        BF_LOG(LogLevel::kDebug, "allreduce size class ", ClassBytes(c),
               " bytes: the path taken now takes ", median * 1e3, " ms (median of ",
               kLocalWatchCalls, " calls on rank 0), the other took ", c->other_median * 1e3,
               " ms; deciding again");
    }
    if (again) {
      const int picks = c->picks;
      *c = LocalChoice();
      c->start = 0;
      c->picks = picks;
    }
    return;
  }
  if (c->start > 0) {
    --c->start;
    return;
  }
  const int in_block = c->trials % kLocalBlock;
  if (in_block >= kLocalWarm)
    c->seconds[algorithm][(c->trials / (2 * kLocalBlock)) * (kLocalBlock - kLocalWarm) + in_block -
                          kLocalWarm] = seconds;
  if (++c->trials < 4 * kLocalBlock) return;
  const double medians[2] = {MedianOf(c->seconds[0], kLocalTrials),
                             MedianOf(c->seconds[1], kLocalTrials)};
  choice_all_.resize(2 * static_cast<size_t>(size_));
  SmallAllgather(medians, sizeof(medians), choice_all_.data());
  double slowest[2] = {0, 0};
  for (int r = 0; r < size_; ++r)
    for (int a = 0; a < 2; ++a) slowest[a] = std::max(slowest[a], choice_all_[2 * r + a]);
  c->pick = slowest[1] < slowest[0] ? 1 : 0;
  c->other_median = slowest[1 - c->pick];
  ++c->picks;
  if (rank_ == 0)
    BF_LOG(LogLevel::kDebug, "allreduce size class ", ClassBytes(c), " bytes",
           c >= local_choice_[kLocalInPlace]  ? " (in place)"
           : c >= local_choice_[kLocalShared] ? " (outputs in the shared heap)"
                                              : "",
           ": through the areas ", slowest[0] * 1e3, " ms, direct ", slowest[1] * 1e3,
           " ms (slowest rank's medians); takes ", c->pick == 1 ? "direct" : "the areas");
}

int64_t MpiTransport::ClassBytes(const LocalChoice* c) const {
  return int64_t{1} << (c - local_choice_[0]) % 64;
}

int MpiTransport::SizeClass(int64_t bytes) {
  int size_class = 0;
  while ((int64_t{2} << size_class) <= bytes && size_class < 62) ++size_class;
  return size_class;
}

int MpiTransport::local_choice(int64_t bytes, LocalKind kind) const {
  return local_choice_[kind][SizeClass(bytes)].pick;
}

}  // namespace bluefog
