// The ranks of one host as a transport of their own, whichever backend connected them: the
// host's shared segment (negotiation rounds through futexes, every rank's data area, the shared
// heap), the direct path's probe, and the one-host allreduce algorithms (algorithms.h). A
// backend whose communicator's ranks all share one host makes one at set-up, asks its
// algorithms before its own and passes its negotiation rounds through its rounds. See
// docs/design.md, "One host".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/allreduce_algorithm.h"
#include "transport/communicator.h"
#include "transport/local/local_rounds.h"
#include "transport/options.h"

namespace bluefog {

class DirectAllreduce;
class OneHostAllreduce;
class RankOrderedAllreduce;

class LocalHost {
 public:
  // Collective over every rank of `comm` (more than one, all on this host): probes whether
  // every rank can reach every other's memory, and maps the shared segment unless
  // `options.local_rounds` is off (rounds then nullptr: the algorithms that need them do not
  // apply). `comm` carries the set-up's messages and the few syncs taken without rounds; it
  // must outlive this object. `tuning` is the backend's (shared with its subsets).
  // `every_size`: the backend's own allreduce is slower than the data areas at every size on
  // one host (Gloo's TCP loopback), so the one-host allreduce takes calls of any size, not
  // only from BLUEFOG_ONE_HOST_THRESHOLD (where MPI's shared-memory MPI_Allreduce stops being
  // the faster).
  static std::unique_ptr<LocalHost> Create(Communicator* comm, std::shared_ptr<Tuning> tuning,
                                           const TransportOptions& options, bool every_size);
  ~LocalHost();
  LocalHost(const LocalHost&) = delete;
  LocalHost& operator=(const LocalHost&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Tuning& tuning() const { return *tuning_; }
  LocalRounds* rounds() const { return rounds_.get(); }
  std::shared_ptr<SharedHeap> heap() const { return rounds_ ? rounds_->heap() : nullptr; }
  // Chunks read from peers and pieces summed before they are streamed (one algorithm runs at a
  // time); grown once, so no per-call faults.
  char* Scratch(int64_t bytes);
  // Every rank's `bytes` (the same on every rank) into `all`, in rank order: through the rounds
  // when there are some and it fits a slot, else the backend's Allgatherv.
  void SmallAllgather(const void* mine, size_t bytes, void* all);

  // The one-host algorithms in the order a backend asks them, before its own (owned here).
  std::vector<AllreduceAlgorithm*> algorithms() const;
  // With `options.deterministic`: the one-host paths in rank order for floating-point calls,
  // which a backend puts ahead of its deterministic algorithm (nullptr otherwise).
  AllreduceAlgorithm* rank_ordered() const;
  // The direct path probed fine and is switched on; the data areas are there and switched on.
  bool direct() const;
  bool areas() const;
  // Tests: which path the one-host allreduces of `bytes` of `kind` take (0 through the areas,
  // 1 direct, -1 still timing both); see OneHostAllreduce.
  int choice(int64_t bytes, int kind) const;

 private:
  LocalHost(Communicator* comm, std::shared_ptr<Tuning> tuning);

  Communicator* comm_;
  std::shared_ptr<Tuning> tuning_;
  int rank_;
  int size_;
  std::unique_ptr<LocalRounds> rounds_;
  std::unique_ptr<DirectAllreduce> direct_;
  std::unique_ptr<OneHostAllreduce> one_host_;
  std::unique_ptr<RankOrderedAllreduce> rank_ordered_;
  std::vector<char> scratch_;
  std::vector<int64_t> gather_bytes_;  // SmallAllgather without rounds
};

// The one-host paths `local` offers (all false for nullptr), for a backend's paths().
TransportPaths LocalPaths(const LocalHost* local);

}  // namespace bluefog
