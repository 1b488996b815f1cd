// The one-host allreduce over the rounds' shared memory: one sync gathers every rank's input
// and output addresses and where its output lies in the shared heap (-1: not there); it is the
// first sync of whichever path runs, so choosing costs nothing. Then the path the chooser
// (core/path_chooser.h) picked for the call's size class and kind: every output in the heap,
// the shared path or the direct one, at every size; otherwise the staged or the direct one up
// to kAreasMaxBytes, and above it the direct one. Without the direct path, the shared or staged
// one.
//
// Which is faster depends on the state the VM's memory is in, and changes within a launch
// (docs/benchmarks.md), so each size class is decided by timing both, apart for the three kinds
// of call, and decided again now and then and whenever the path taken becomes slower than the
// other was.

#include <algorithm>
#include <chrono>

#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"
#include "transport/shared_heap.h"

namespace bluefog {

OneHostAllreduce::OneHostAllreduce(LocalHost* host, DirectAllreduce* direct, bool every_size)
    : host_(host),
      direct_(direct),
      every_size_(every_size),
      areas_(host),
      chooser_(host->rank(), host->size(), {"", "outputs in the shared heap", "in place"},
               [host](const double* mine, int n, double* all) {
                 host->SmallAllgather(mine, n * sizeof(double), all);
               }) {}

bool OneHostAllreduce::AppliesTo(const AllreduceCall& call) const {
  // BLUEFOG_RING_THRESHOLD=0 keeps every call on the backend's own allreduce, as on MPI.
  const Tuning& tuning = host_->tuning();
  const bool sized = every_size_
                         ? call.count >= host_->size() &&
                               tuning.ring_threshold_bytes.load(std::memory_order_relaxed) > 0
                         : OneHostCall(tuning, host_->size(), call);
  return sized && host_->size() > 1 && areas_.enabled();
}

void OneHostAllreduce::Run(const AllreduceCall& call) {
  const int n = host_->size();
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const std::shared_ptr<SharedHeap>& heap = host_->rounds()->heap();
  Tuning& tuning = host_->tuning();
  const int64_t offset = tuning.shared.load(std::memory_order_relaxed) && heap
                             ? heap->OffsetOf(call.out, static_cast<size_t>(call.bytes))
                             : -1;
  chooser_.set_recheck_calls(static_cast<int>(tuning.recheck_calls.load()));
  chooser_.set_worse(tuning.worse.load());
  const bool can_choose = direct_->enabled() && call.count >= n;
  auto next = [&](Kind kind) { return can_choose ? chooser_.Next(kind, call.bytes) : 0; };
  // This output in the heap, the shared path next if every output is, and the areas free (the
  // last call through them took the shared path, which ends with a sync): copy the first step
  // in before the gather, so that when every output is in the heap the gather is also the
  // shared path's sync after that copy (one sync fewer per call). Every rank decides alike
  // then: the same history of agreed paths on all. When some output is not in the heap the
  // copy was for nothing, and harmless: nobody reads the areas until a path fills them again.
  const bool small = call.bytes <= kAreasMaxBytes;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start =
      can_choose && (small || offset >= 0) ? Clock::now() : Clock::time_point();
  const bool staged_first = offset >= 0 && areas_.free && next(kShared) == 0;
  if (staged_first)
    areas_.StageSegments(static_cast<const char*>(call.in),
                         std::min(call.count, areas_.StepElements(elem)), elem);
  const uint64_t mine[3] = {reinterpret_cast<uint64_t>(call.in),
                            reinterpret_cast<uint64_t>(call.out), static_cast<uint64_t>(offset)};
  buffers_.resize(3 * static_cast<size_t>(n));
  host_->SmallAllgather(mine, sizeof(mine), buffers_.data());
  bool all_shared = true, all_in_place = true;
  for (int r = 0; r < n; ++r) {
    all_shared = all_shared && static_cast<int64_t>(buffers_[3 * r + 2]) >= 0;
    all_in_place = all_in_place && buffers_[3 * r] == buffers_[3 * r + 1];
  }
  // (Every output in the heap is timed as one kind, in place or not: `staged_first` above was
  // decided from that kind's choice before the gather, and must be alike on every rank.)
  const Kind kind = all_shared ? kShared : all_in_place ? kInPlace : kOutOfPlace;
  const bool timed = can_choose && (all_shared || small);
  const int path = timed ? next(kind) : can_choose ? 1 : 0;
  if (path == 1) {
    direct_->Run(call, buffers_.data());
  } else if (all_shared) {
    SharedAllreduce(&areas_, call, buffers_.data(), staged_first);
    tuning.shared_calls.fetch_add(1, std::memory_order_relaxed);
  } else {
    StagedAllreduce(&areas_, call, true);
  }
  if (timed)
    chooser_.Record(kind, call.bytes, path,
                    std::chrono::duration<double>(Clock::now() - start).count());
  tuning.one_host_calls.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace bluefog
