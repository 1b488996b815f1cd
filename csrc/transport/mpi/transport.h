// The only code that calls MPI. Every call runs on the runtime's background thread, on a
// communicator the library duplicated for itself, so user MPI traffic never mixes with ours.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"
#include "transport/mpi/local_rounds.h"

namespace bluefog {

struct TransportInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // Among the ranks with this local rank (one per host): this one's index and their number.
  int cross_rank = 0;
  int cross_size = 1;
  bool threads_multiple = false;  // MPI granted MPI_THREAD_MULTIPLE
  // Every host runs the same number of ranks, and host h holds ranks h*L .. h*L+L-1 (mpirun's
  // default --map-by slot): what machine-level (hierarchical) neighbour ops need.
  bool homogeneous = false;
};

class MpiTransport {
 public:
  MpiTransport() = default;
  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;
  ~MpiTransport();

  // Initializes MPI unless the application already did, and duplicates COMM_WORLD.
  TransportInfo Init();
  // Before Init: whether ExchangeAll among ranks of one host goes through shared memory
  // (LocalRounds) instead of MPI, for this transport and the process sets' made from it.
  void set_local_rounds(bool enabled) { local_rounds_enabled_ = enabled; }
  bool local_rounds() const { return local_rounds_ != nullptr; }
  // The communicator itself (an MPI_Comm in an opaque word), for the window service to duplicate.
  void* raw_comm() const { return comm_; }
  // rank and size in this transport's communicator.
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Frees what Init made; finalizes MPI if Init initialized it. Safe to call twice.
  void Shutdown();
  // A transport over the given ranks of this one's communicator (ascending), for a process
  // set. Collective over those ranks only; `tag` tells concurrent creations apart.
  std::unique_ptr<MpiTransport> CreateSubset(const std::vector<int>& ranks, int tag);

  // Collective: every rank passes its bytes and gets every rank's bytes, indexed by rank.
  // `on_wait` runs periodically while other ranks have not yet joined. Up to
  // kExchangeSlotBytes bytes per rank take one MPI_Iallgather of fixed slots; a rank with more
  // makes it a second collective (MPI_Allgatherv) for every rank.
  static constexpr size_t kExchangeSlotBytes = 1016;
  static constexpr size_t kExchangeSlotHeader = 8;  // the message's length, before its bytes
  std::vector<std::string> ExchangeAll(const std::string& mine,
                                       const std::function<void()>& on_wait);
  // Sum over all ranks, divided by `divisor` when it is above 1 (the average). Buffers of at
  // least `ring_threshold_bytes` use our ring algorithm over persistent scratch memory, which
  // folds the division into its last summing pass; smaller ones MPI_Allreduce (lowest
  // latency). `in` may equal `out` (in place); otherwise `in` is only read, which saves a copy.
  void AllreduceSum(const void* in, void* out, int64_t count, DataType dtype, int64_t divisor = 1) {
    Allreduce(in, out, count, dtype, ReduceOp::kSum, divisor);
  }
  // The same for any reduction; `divisor` must be 1 unless `op` is kSum. The caller decides
  // the divisor (PlanAverage); the transport only applies it where it is cheapest.
  void Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 int64_t divisor = 1);
  void set_ring_threshold_bytes(int64_t bytes) { ring_threshold_bytes_ = bytes; }
  // Large allreduces over several hosts run hierarchically (reduce within each host, allreduce
  // across hosts, allgather within each host) when the job has more than one host, more than
  // one rank on each and the same number on every host; `enabled` false keeps the flat ring.
  void set_hierarchical(bool enabled) { hierarchical_enabled_ = enabled; }
  bool hierarchical() const { return hierarchical_enabled_ && cross_ != nullptr; }
  // Two hosts: each slice reduced on alternate hosts (false: the ring across, for benchmarks).
  void set_two_host_split(bool on) { two_host_split_ = on; }
  // Large allreduces among ranks that all share one host read their peers' buffers directly
  // (cross-memory attach) instead of passing messages, when every rank could read every other
  // at Init (the same size threshold as the ring); `enabled` false keeps the ring.
  void set_direct(bool enabled) { direct_enabled_ = enabled; }
  bool direct() const { return direct_enabled_ && direct_ok_; }
  // Large allreduces among ranks that share one host may go through data areas in the rounds'
  // shared-memory segment (staged: each rank copies in what its peers reduce and copies out
  // what they reduced), `bytes` of each call at a time, when the rounds go through shared
  // memory: up to 16 MiB, whichever of it and the direct path measured faster for the size
  // (every size when the direct path is off); 0 leaves them to the direct path. Before Init.
  void set_staged_allreduce_bytes(int64_t bytes) { staged_bytes_ = bytes; }
  // Switches the staged path off and on after Init (benchmarks compare it with the direct one).
  void set_staged(bool enabled) { staged_enabled_ = enabled; }
  // Before Init: this many bytes per rank of the rounds' segment (when it has data areas) make a
  // heap of blocks every rank of the host can write into (shared_heap.h), the global
  // transport's only; large allreduce outputs come from it, and an allreduce whose outputs are
  // all there takes the shared path (each rank pushes its reduced segment into its peers'
  // outputs). 0: none.
  void set_shared_heap_bytes(int64_t bytes) { shared_heap_bytes_ = bytes; }
  // The heap, or nullptr (benchmarks take outputs from it).
  std::shared_ptr<SharedHeap> shared_heap() const {
    return local_rounds_ ? local_rounds_->heap() : nullptr;
  }
  // Switches the shared path off and on after Init, from any thread (benchmarks compare it
  // with the others); and how many allreduces took it so far.
  void set_shared(bool enabled) { shared_enabled_.store(enabled, std::memory_order_relaxed); }
  uint64_t shared_calls() const { return shared_calls_.load(std::memory_order_relaxed); }
  // One-host allreduces through the data areas (staged and shared paths) of at least this many
  // bytes write their outputs with non-temporal stores (StreamCopy): the outputs' old contents
  // are not read first, and the outputs do not push the inputs and areas out of cache (0: never;
  // BLUEFOG_STREAMING_STORES). Process-wide, any thread, any time; ranks need not agree (it
  // changes how a rank stores, not what). Returns the previous value.
  static int64_t set_streaming_store_bytes(int64_t bytes);
  static int64_t streaming_store_bytes();
  // One-host allreduces up to this size take whichever of the staged and the direct path
  // measured faster; above it the direct one. (With every output in the heap, the shared and
  // the direct path are timed at every size.) Measured at 2 ranks
  // on the 2-core VM (bench/transport_vs_mpi.cc, in-place MPI / bluefog, out of place): 64 MiB
  // staged 1.34-2.43x, direct 1.82-2.17x over 12 launches; shared 1.33-3.36x over 7
  // (docs/benchmarks.md).
  static constexpr int64_t kStagedMaxBytes = int64_t{16} << 20;
  bool staged() const {
    return staged_enabled_ && local_rounds_ != nullptr && local_rounds_->data_bytes() > 0;
  }
  // The calls a one-host path choice is made for, apart (the best path differs between them):
  // every output in the shared heap; otherwise every rank in place (input == output), or not.
  // Decided from the buffers every rank gathered, so every rank files a call alike.
  enum LocalKind { kLocalOutOfPlace = 0, kLocalShared = 1, kLocalInPlace = 2, kLocalKinds = 3 };
  // When both one-host paths are on, which one allreduces of `bytes` (their power-of-two size
  // class) of `kind` take: 0 through the areas (staged; with every output in the heap, the
  // shared path), 1 direct, -1 not decided yet (still timing both).
  int local_choice(int64_t bytes, LocalKind kind = kLocalOutOfPlace) const;
  // Calls of a class before its first choice: kLocalStartCalls on the path through the areas,
  // then 4 blocks of kLocalBlock, the two paths in turns.
  static constexpr int kLocalStartCalls = 16;
  static constexpr int kLocalBlock = 8;  // calls of one one-host path in a row while choosing
  static constexpr int kLocalChooseCalls = kLocalStartCalls + 4 * kLocalBlock;
  // The first choice of a class is made again after this many calls (or set_local_recheck's,
  // if fewer), later ones after local_recheck_calls_.
  static constexpr int kLocalFirstRecheck = 256;
  // After a choice, every kLocalWatchCalls calls of the class the ranks compare the median of
  // those calls with the median the other path had in the trials; when on any rank it is more
  // than kLocalWorse times that, the class is decided again at once (the state can change
  // within a launch).
  static constexpr int kLocalWatchCalls = 16;
  static constexpr double kLocalWorse = 1.25;
  // Tests only: decide again after this many calls of a class (2048).
  void set_local_recheck_for_testing(int calls) { local_recheck_calls_ = calls; }
  // Tests only: this rank's watch compares with the other path's median times `factor`
  // (kLocalWorse outside tests; 0 makes it report every watch).
  void set_local_worse_for_testing(double factor) { local_worse_ = factor; }
  // Tests only: reads from `rank` fail (a bad address), as a kernel refusing them would.
  void set_direct_fault_for_testing(int rank) { direct_fault_rank_for_testing_ = rank; }
  // The reduction over all ranks of `in` (the sum of counts_per_rank elements), of which this
  // rank receives its counts_per_rank[rank] elements into `out`, divided by `divisor` (kSum
  // only, as for Allreduce).
  void ReduceScatter(const void* in, void* out, const std::vector<int64_t>& counts_per_rank,
                     DataType dtype, ReduceOp op, int64_t divisor = 1);
  // Concatenates each rank's bytes in rank order into `out`.
  void Allgatherv(const void* in, void* out, const std::vector<int64_t>& bytes_per_rank);
  void Broadcast(void* buffer, int64_t bytes, int root);

  struct PeerBuffer {
    int rank;
    void* data;
    int64_t bytes;
  };
  // Point-to-point exchange with the given peers; returns when every transfer completed.
  // Every rank runs its exchanges in the same order, so one tag keeps pairs in step.
  void NeighborExchange(const std::vector<PeerBuffer>& sends, const std::vector<PeerBuffer>& recvs);

 private:
  void Check(int code, const char* call) const;
  // A transport over `comm` (an MPI_Comm this process owns), which it frees at Shutdown.
  std::unique_ptr<MpiTransport> Adopt(void* comm);
  void MpiAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op);
  void RingAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                     int64_t divisor);
  void HierarchicalAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                             int64_t divisor);
  void TwoHostSliceAllreduce(char* slice, int64_t count, DataType dtype, ReduceOp op,
                             int64_t divisor);
  // `gathered`/`synced`: LocalAllreduce's sync just gathered the peers' buffers.
  void DirectAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                       int64_t divisor, bool gathered = false);
  void StagedAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                       int64_t divisor, bool synced = false);
  // Every rank's output in the shared heap: pushed into the peers' outputs with plain stores.
  // `staged_first`: the first step's segments are already in this rank's area, and the
  // caller's gather was the sync after that.
  void SharedAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                       int64_t divisor, bool staged_first);
  // out[0, len) = own[0, len) reduced with elements [at, at + len) of every peer's area (the
  // last reduction also divides by `divisor`); `out` may equal `own`.
  void ReduceWithAreas(const char* own, char* out, int64_t at, int64_t len, DataType dtype,
                       ReduceOp op, int64_t divisor);
  // Copies segments s != rank of the `m` elements at `src` (one step) into this rank's area.
  void StageSegments(const char* src, int64_t m, int64_t elem);
  // Elements of a call the staged and shared paths take per step.
  int64_t StepElements(int64_t elem) const {
    return std::max<int64_t>(size_, static_cast<int64_t>(local_rounds_->data_bytes()) / elem);
  }
  // The one-host paths through the rounds' shared memory: the shared one when every output is
  // in the heap, else the staged or the direct one (staged_allreduce.cc).
  void LocalAllreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                      int64_t divisor);
  static int SizeClass(int64_t bytes);  // floor(log2(bytes))
  // Whether every rank of this (single-host) communicator can read every other's memory.
  void ProbeDirect();
  void AgreeDirect(const std::string& failure);

  bool initialized_ = false;
  bool owns_mpi_ = false;
  int rank_ = 0;
  int size_ = 1;
  void* comm_ = nullptr;  // MPI_Comm, kept opaque so this header does not include mpi.h
  void* local_comm_ = nullptr;
  bool has_local_comm_ = false;
  // Over the ranks with this rank's local rank, one per host (hierarchical allreduce only).
  std::unique_ptr<MpiTransport> cross_;
  bool hierarchical_enabled_ = true;
  bool two_host_split_ = true;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::vector<int> local_counts_;
  std::vector<int> local_displs_;
  void* bluefog_op_ = nullptr;  // MPI_Op over bluefog's kernels (see ReduceContext)
  bool local_rounds_enabled_ = true;
  std::unique_ptr<LocalRounds> local_rounds_;  // rounds through shared memory (one host)
  int64_t staged_bytes_ = int64_t{1} << 20;    // see set_staged_allreduce_bytes
  bool staged_enabled_ = true;
  int64_t shared_heap_bytes_ = 0;  // see set_shared_heap_bytes
  std::atomic<bool> shared_enabled_{true};
  std::atomic<uint64_t> shared_calls_{0};
  // No peer reads this rank's staging area until a path fills it again: the last call through
  // the areas (if any) took the shared path, which ends with a sync.
  bool areas_free_ = true;
  std::vector<char*> peer_outputs_;  // SharedAllreduce: every rank's output, in this mapping
  // Whether an allreduce of `bytes` streams its outputs (set_streaming_store_bytes): only out
  // of place, since in place the output's lines were just read into cache as the input.
  static bool Streams(const void* in, const void* out, int64_t bytes);
  static constexpr int kLocalWarm = 3;  // of a block's calls, untimed
  static constexpr int kLocalTrials = 2 * (kLocalBlock - kLocalWarm);  // timed calls of each
  struct LocalChoice {
    int start = kLocalStartCalls;  // untimed calls still to make before the trials
    int trials = 0;
    int pick = -1;
    int since_pick = 0;
    int picks = 0;                        // choices made so far
    double other_median = 0;              // the slowest rank's trial median of the path not taken
    double watch[kLocalWatchCalls] = {};  // the latest calls' seconds, since the choice
    double seconds[2][kLocalTrials] = {};
  };
  // The smallest size of `c`'s power-of-two class (for messages).
  int64_t ClassBytes(const LocalChoice* c) const;
  std::vector<double> choice_all_;  // every rank's medians (or watch ratios), reused
  // Records a timed call of `algorithm` while choosing; chooses after the last one.
  void Choose(LocalChoice* c, int algorithm, double seconds);
  // [LocalKind][power-of-two size class]
  LocalChoice local_choice_[kLocalKinds][64];
  int local_recheck_calls_ = 2048;  // calls of a class between two choices
  double local_worse_ = kLocalWorse;
  // The exchange's buffers, and its shared memory when `one_host` (exchange.cc).
  void SetUpExchange(bool one_host);
  // exchange_send_ from every rank into exchange_recv_, over MPI.
  void ExchangeSlots(const std::function<void()>& on_wait);
  // Every rank's `bytes` (the same on every rank) into `all`, in rank order: through the
  // shared-memory rounds when there are some (the direct allreduce's syncs), else MPI.
  void SmallAllgather(const void* mine, size_t bytes, void* all);
  std::vector<char> exchange_send_;
  std::vector<char> exchange_recv_;
  std::vector<int> counts_;
  std::vector<int> displs_;
  std::vector<char> requests_;  // MPI_Request storage, reused
  // Chunks received or read from peers by the ring, the direct and the two-host algorithms,
  // and the pieces the staged and shared paths sum before streaming them (one runs at a time);
  // grown once, so no per-call faults.
  std::vector<char> scratch_;
  char* Scratch(int64_t bytes);
  int64_t ring_threshold_bytes_ = int64_t{1} << 20;
  // Direct reads (see set_direct): each rank's process id, and the buffers of the current call.
  bool direct_enabled_ = true;
  bool direct_ok_ = false;
  std::vector<int> peer_pids_;
  int direct_fault_rank_for_testing_ = -1;
  uint64_t direct_token_ = 0;  // what peers read from this process to check they reach it
  // Per rank: input address, output address, output's offset in its heap part (or -1).
  std::vector<uint64_t> peer_buffers_;
  std::vector<int> agree_;  // AgreeDirect: each rank's first failed rank
};

}  // namespace bluefog
