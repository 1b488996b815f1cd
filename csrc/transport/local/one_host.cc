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
// other was. The choices of earlier runs on this machine start each class on its path at once
// (core/path_cache.h), with the same watch and rechecks.

#include <algorithm>
#include <chrono>

#include "core/logging.h"
#include "core/op_rules.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"
#include "transport/shared_heap.h"

namespace bluefog {

namespace {

// The kinds' names, in Kind's order: the debug log's and the cache file's.
const std::vector<std::string> kKindNames = {"out of place", "outputs in the shared heap",
                                             "in place"};

}  // namespace

OneHostAllreduce::OneHostAllreduce(LocalHost* host, DirectAllreduce* direct, bool every_size,
                                   const TransportOptions& options)
    : host_(host),
      direct_(direct),
      every_size_(every_size),
      areas_(host, options.deterministic),
      chooser_(host->rank(), host->size(), kKindNames,
               [host](const double* mine, int n, double* all) {
                 host->SmallAllgather(mine, n * sizeof(double), all);
               }) {
  StartFromCache(options);
}

// Every rank reads the file and the ranks compare what they read (a hash of this rank count's
// choices): only when all read the same do they start from it, so every rank seeds alike; a
// file written between two ranks' reads, or a rank with another cache directory, means timing
// every class as without a cache. The gather runs whatever the options, so that ranks started
// with different ones never wait on each other.
void OneHostAllreduce::StartFromCache(const TransportOptions& options) {
  const int n = host_->size();
  uint64_t mine = 0;
  if (!options.path_cache_dir.empty()) {
    cache_ = std::make_unique<PathCache>(options.path_cache_dir, PathCache::MachineKey());
    std::string why;
    if (!options.path_relearn && cache_->Load(&why) == PathCache::Loaded::kIgnored &&
        host_->rank() == 0)
      BF_LOG(LogLevel::kWarning, "ignoring the one-host path choices in ", cache_->file(), ": ",
             why, "; timing the paths again and rewriting it");
    mine = cache_->Checksum(n);
  }
  std::vector<uint64_t> all(static_cast<size_t>(n));
  host_->SmallAllgather(&mine, sizeof(mine), all.data());
  const bool alike = std::all_of(all.begin(), all.end(), [&](uint64_t c) { return c == mine; });
  if (!alike && host_->rank() == 0)
    BF_LOG(LogLevel::kInfo, "the ranks of this host read different one-host path choices (",
           options.path_cache_dir.empty() ? "none" : cache_->file(),
           " on rank 0); timing the paths again");
  if (alike && mine != 0) {
    for (int kind = 0; kind < static_cast<int>(kKindNames.size()); ++kind)
      for (int size_class = 0; size_class < 63; ++size_class)
        if (const CachedChoice* c = cache_->Find(n, kKindNames[kind], size_class))
          chooser_.Seed(kind, size_class, c->path, c->seconds);
  }
  if (!cache_ || host_->rank() != 0) return;
  chooser_.set_chosen([this, n](int kind, int size_class, int path, const double* seconds) {
    CachedChoice c;
    c.path = path;
    c.seconds[0] = seconds[0];
    c.seconds[1] = seconds[1];
    if (!(c.seconds[0] > 0 && c.seconds[1] > 0)) return;  // a clock that did not move
    // A save takes about a millisecond (read, merge, write, rename) on the call that chose:
    // skipped when the file already says the same within the watch's margin (most rechecks).
    const CachedChoice* had = cache_->Find(n, kKindNames[kind], size_class);
    const auto near = [](double a, double b) {
      return a <= PathChooser::kWorse * b && b <= PathChooser::kWorse * a;
    };
    if (had && had->path == path && near(had->seconds[0], c.seconds[0]) &&
        near(had->seconds[1], c.seconds[1]))
      return;
    cache_->Put(n, kKindNames[kind], size_class, c);
    std::string why;
    if (!cache_->Save(&why) && !save_failed_) {
      save_failed_ = true;
      BF_LOG(LogLevel::kWarning, "cannot keep the one-host path choices for later runs: ", why);
    }
  });
}

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
  if (timed && chooser_.Choice(kind, call.bytes) < 0)
    tuning.learning_calls.fetch_add(1, std::memory_order_relaxed);
  if (timed)
    chooser_.Record(kind, call.bytes, path,
                    std::chrono::duration<double>(Clock::now() - start).count());
  tuning.one_host_calls.fetch_add(1, std::memory_order_relaxed);
}

bool RankOrderedAllreduce::AppliesTo(const AllreduceCall& call) const {
  return IsFloat(call.dtype) && (one_host_->AppliesTo(call) || direct_->AppliesTo(call));
}

void RankOrderedAllreduce::Run(const AllreduceCall& call) {
  if (one_host_->AppliesTo(call)) {
    one_host_->Run(call);
  } else {
    direct_->Run(call);
  }
}

}  // namespace bluefog
