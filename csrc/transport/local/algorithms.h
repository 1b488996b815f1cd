// The one-host allreduce algorithms, over any backend (LocalHost holds what they share), one
// file each: what a backend asks first when its ranks share one host. docs/design.md has the
// table of when each runs and why.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/path_cache.h"
#include "core/path_chooser.h"
#include "transport/allreduce_algorithm.h"
#include "transport/options.h"

namespace bluefog {

class LocalHost;

// One host, every rank able to read every other's memory: each rank reads its peers' parts of
// its segment with cross-memory attach, sums them and pushes the result into their outputs
// (direct.cc).
class DirectAllreduce : public AllreduceAlgorithm {
 public:
  // `rank_order`: floating-point calls reduce each element as ((x0 + x1) + x2) ..., the order
  // of BLUEFOG_DETERMINISTIC (transport/deterministic_allreduce.h), instead of starting from
  // this rank's own part.
  DirectAllreduce(LocalHost* host, bool rank_order) : host_(host), rank_order_(rank_order) {}
  const char* name() const override { return "direct"; }
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override { Run(call, nullptr); }
  // `gathered`: every rank's (input, output, heap offset) addresses, three words per rank,
  // when the caller just gathered them (that gather is then this call's first sync).
  void Run(const AllreduceCall& call, const uint64_t* gathered);
  // Collective, once at set-up: whether every rank can reach every other's memory.
  void Probe();
  // Probed fine and switched on (Tuning::direct).
  bool enabled() const;

 private:
  // A barrier that also finds the lowest rank whose reads or writes failed, if any; then every
  // rank turns this path off and fails the call.
  void Agree(const std::string& failure);
  LocalHost* host_;
  bool rank_order_;
  bool ok_ = false;
  uint64_t token_ = 0;  // what peers read from this process to check they reach it
  std::vector<int> pids_;
  std::vector<uint64_t> buffers_;  // Run without `gathered`: the addresses it gathers
  std::vector<int> agree_;
};

// The data areas of the rounds' shared-memory segment (one per rank), which the staged and
// shared paths move each call's segments through (staged.cc).
class DataAreas {
 public:
  DataAreas(LocalHost* host, bool rank_order) : host_(host), rank_order_(rank_order) {}
  // The reduced part is written to the output and published this much at a time, so the
  // second write reads it from cache.
  static constexpr int64_t kPublishBytes = int64_t{64} << 10;
  // Switched on (Tuning::staged), with areas to use.
  bool enabled() const;
  // Elements of a call the paths take per step.
  int64_t StepElements(int64_t elem) const;
  // Copies segments s != rank of the `m` elements at `src` (one step) into this rank's area.
  void StageSegments(const char* src, int64_t m, int64_t elem);
  // out[0, len) = own[0, len) reduced with elements [at, at + len) of every peer's area (the
  // last reduction also divides by `divisor`); `out` may equal `own`. In rank order (floats,
  // when made so): ((x0 + x1) + x2) ..., own part among them at this rank's place.
  void ReduceWithAreas(const char* own, char* out, int64_t at, int64_t len, DataType dtype,
                       ReduceOp op, int64_t divisor);
  // Whether an allreduce of `bytes` streams its outputs (Tuning::streaming_store_bytes): only
  // out of place, since in place the output's lines were just read into cache as the input.
  bool Streams(const void* in, const void* out, int64_t bytes) const;
  // Copies with non-temporal stores when `stream`, else plainly.
  static void Put(bool stream, void* dst, const void* src, size_t bytes);
  // Reduces this rank's segment of the step of `m` elements at element `lo` (its input's
  // segment with every peer's area) into its output, kPublishBytes at a time; each piece is
  // summed in the scratch and streamed into the output when `stream`. Then `publish(at, sum,
  // bytes)` gets each summed piece while it is in cache (`at`: its first element in the step).
  template <typename Publish>
  void ReduceOwnSegment(const AllreduceCall& call, int64_t lo, int64_t m, bool stream,
                        Publish publish);
  // No peer reads this rank's area until a path fills it again: the last call through the
  // areas (if any) took the shared path, which ends with a sync.
  bool free = true;
  // The shared path: every rank's output, in this mapping (reused).
  std::vector<char*> peer_outputs;
  LocalHost* host() const { return host_; }

 private:
  int host_size() const;
  int host_rank() const;
  char* Scratch(int64_t bytes);
  LocalHost* host_;
  bool rank_order_;
  std::vector<char> aside_;  // in rank order, in place: this rank's own part, set aside
};

template <typename Publish>
void DataAreas::ReduceOwnSegment(const AllreduceCall& call, int64_t lo, int64_t m, bool stream,
                                 Publish publish) {
  const int64_t elem = static_cast<int64_t>(ElementSize(call.dtype));
  const int n = host_size(), rank = host_rank();
  const int64_t publish_elems = std::max<int64_t>(1, kPublishBytes / elem);
  const char* src = static_cast<const char*>(call.in);
  char* dst = static_cast<char*>(call.out);
  char* piece = stream ? Scratch(kPublishBytes) : nullptr;
  const int64_t end = m * (rank + 1) / n;
  for (int64_t i = m * rank / n; i < end; i += publish_elems) {
    const int64_t len = std::min(publish_elems, end - i);
    const size_t bytes = static_cast<size_t>(len * elem);
    char* d = dst + (lo + i) * elem;
    char* sum = stream ? piece : d;
    ReduceWithAreas(src + (lo + i) * elem, sum, i, len, call.dtype, call.op, call.divisor);
    if (stream) Put(true, d, sum, bytes);
    publish(i, static_cast<const char*>(sum), bytes);
  }
}

// Each rank copies in what its peers reduce and copies out what they reduced (staged.cc).
void StagedAllreduce(DataAreas* areas, const AllreduceCall& call, bool synced);
// Every output in the shared heap: each rank pushes its reduced segment into its peers'
// outputs (shared.cc). `gathered`: every rank's (input, output, heap offset of its output).
void SharedAllreduce(DataAreas* areas, const AllreduceCall& call, const uint64_t* gathered,
                     bool staged_first);

// One host, with data areas: one sync gathers every rank's buffers, then whichever of the paths
// through the areas (staged, or shared when every output is in the heap) and the direct one
// the path chooser picked for the call's size and kind (one_host.cc).
class OneHostAllreduce : public AllreduceAlgorithm {
 public:
  // The kinds of call the choice is made for apart (their best path differs): every output in
  // the shared heap; otherwise every rank in place (input == output), or not.
  enum Kind { kOutOfPlace = 0, kShared = 1, kInPlace = 2 };
  // `every_size`: take every call with an element per rank, not only those OneHostCall finds
  // large enough (for a backend whose own allreduce is slower at every size on one host).
  // Collective over the host's ranks: loads the path choices of earlier runs from
  // `options.path_cache_dir` (core/path_cache.h) and starts on them when every rank read the
  // same ones; local rank 0 writes each new choice back.
  OneHostAllreduce(LocalHost* host, DirectAllreduce* direct, bool every_size,
                   const TransportOptions& options);
  const char* name() const override { return "one-host"; }
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override;
  // Up to this size the chooser decides between the areas and the direct path; above it the
  // direct one (with every output in the heap, the shared and the direct path are timed at
  // every size).
  static constexpr int64_t kAreasMaxBytes = int64_t{16} << 20;
  int Choice(int64_t bytes, int kind) const { return chooser_.Choice(kind, bytes); }
  bool areas() const { return areas_.enabled(); }

 private:
  void StartFromCache(const TransportOptions& options);

  LocalHost* host_;
  DirectAllreduce* direct_;
  bool every_size_;
  DataAreas areas_;
  PathChooser chooser_;
  std::unique_ptr<PathCache> cache_;  // null: no cache directory
  bool save_failed_ = false;          // warned once
  std::vector<uint64_t> buffers_;     // every rank's (input, output, heap offset)
};

// BLUEFOG_DETERMINISTIC on one host: the one-host paths reduce in rank order (their
// `rank_order`), giving bit for bit what the deterministic algorithm gives without its messages
// (which took 2-5x the default's time at 1-64 MiB). This takes the floating-point calls that
// the one-host algorithm or the direct one would, ahead of the deterministic algorithm in a
// backend's list; integer sums, exact in any order, keep their paths.
class RankOrderedAllreduce : public AllreduceAlgorithm {
 public:
  RankOrderedAllreduce(OneHostAllreduce* one_host, DirectAllreduce* direct)
      : one_host_(one_host), direct_(direct) {}
  const char* name() const override { return "one-host-rank-order"; }
  bool AppliesTo(const AllreduceCall& call) const override;
  void Run(const AllreduceCall& call) override;

 private:
  OneHostAllreduce* one_host_;
  DirectAllreduce* direct_;
};

}  // namespace bluefog
