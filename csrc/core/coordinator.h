// Matches requests across ranks by name. Pure logic, no MPI: every rank feeds it the same
// announcements in the same order, so every rank derives the same ready list in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace bluefog {

// A request every rank has announced: run it (status ok) or fail it on every rank.
struct Response {
  TensorMeta meta;                  // as announced by rank 0
  std::vector<int64_t> first_dims;  // HasPerRankFirstDim ops: each rank's size of dimension 0
  // alltoall: every rank's splits, rank after rank (size x size): rank j sends
  // all_splits[j * size + r] rows to rank r.
  std::vector<int64_t> all_splits;
  // Neighbor ops: every rank's send and receive lists, encoded; equal signatures mean every rank
  // exchanges with the same peers, so the runtime may fuse those requests.
  std::string topology_signature;
  Status status;
  // Every rank's announcement, in rank order (status ok only): what the response cache keeps.
  std::vector<TensorMeta> rank_metas;
  // Small allreduces, allgathers and broadcasts whose data came with the announcements (every
  // rank's, in rank order; a broadcast's root's only): the executor completes them from these
  // bytes without a collective. Empty otherwise, and always when a rank had joined.
  std::vector<std::string> inline_data;
  // Ranks that had joined (bf.join()) instead of announcing: the coordinator stood in for them
  // (allreduce: their meta, to be run with the reduction's identity; allgather: zero rows).
  // Ascending.
  std::vector<int> joined;
  // join: the last rank to join.
  int last_joined = -1;
  // A failure that only some ranks announced (the others had joined, or sent a smaller group):
  // those ranks, ascending. The other ranks must leave alone any request of theirs by this
  // name, which is a later one. Empty: every rank announced it.
  std::vector<int> only_ranks;
};

struct WaitingTensor {
  std::string name;
  std::vector<int> ready_ranks;
  std::vector<int> missing_ranks;
};

class Coordinator {
 public:
  // `world_ranks` (empty for the global set): a process set's job-wide ranks, by index. A
  // process set's coordinator does not stand in for joined ranks: join() covers the global
  // set's collectives only, so a set's request that lacks only joined members fails on every
  // member that submitted it.
  explicit Coordinator(int size, std::vector<int> world_ranks = {});

  // Records that `rank` submitted `meta`, with its data when the rank sent it in the round
  // (empty: none). Throws kInternal if that rank already has the name pending (the runtime
  // rejects such duplicates before they are announced).
  void Announce(int rank, const TensorMeta& meta, std::string data = {});
  // Requests completed by announcements since the last call, in completion order.
  std::vector<Response> TakeReady();
  // Names announced by some ranks and not yet by all, sorted by name.
  std::vector<WaitingTensor> Waiting() const;
  size_t num_pending() const { return table_.size(); }

 private:
  struct Entry {
    std::vector<std::optional<TensorMeta>> metas;
    int count = 0;
    std::vector<std::string> data;  // per rank, empty: none (sized when the first arrives)
    int data_count = 0;
  };
  Response Complete(Entry& entry) const;
  // Completes `entry` into ready_ (the caller erases it). A grouped request whose ranks
  // disagree on the group's size also fails, at the end of the round, the group's tensors that
  // only the ranks with the larger groups announced (FailGroupLeftovers): no rank waits for them.
  void PushReady(Entry& entry);
  void FailGroupLeftovers();
  // Whether every rank that has not announced `entry` has joined.
  bool OnlyJoinedMissing(const Entry& entry) const;
  // Completes, in name order, the entries that now lack only joined ranks.
  void CompleteForJoined();

  int size_;
  std::vector<int> world_ranks_;  // process sets only
  std::unordered_map<std::string, Entry> table_;
  std::vector<Response> ready_;
  // Ranks that have joined and are waiting for the others to join.
  std::vector<bool> joined_;
  int num_joined_ = 0;
  int last_joined_ = -1;
  struct GroupFailure {
    std::string base;
    int32_t min_size;
    std::string detail;
  };
  std::vector<GroupFailure> group_failures_;  // this round's
};

// Checks that ranks' metadata agree under the op's rules; returns the error for every rank, or ok.
Status CheckAgreement(const std::vector<std::optional<TensorMeta>>& metas);
// The allgathers and neighbor_allgather's gradient: ranks may differ in dimension 0.
bool HasPerRankFirstDim(OpType op);

}  // namespace bluefog
