// One rank's submission of one collective, and how the runtime reports back.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/types.h"

namespace bluefog {

struct Request {
  TensorMeta meta;
  int process_set = 0;          // the set whose ranks run it (0: every rank)
  const void* input = nullptr;  // meta.NumBytes() bytes, valid until `done` runs
  void* output = nullptr;       // allreduce, broadcast: same size as input, set by the caller
  // allgather: called on the background thread with the result's shape once every rank's first
  // dimension is known; returns the buffer to fill. May throw BluefogError.
  std::function<void*(const std::vector<int64_t>& shape)> allocate_output;
  // alltoall: where the runtime writes how many rows each rank sent this rank (one per rank).
  int64_t* received_splits = nullptr;
  // neighbor_allreduce: output = self_weight * input + sum_k recv_weights[k] * (tensor received
  // from meta.recv_ranks[k]); when send_weights is not empty, the copy sent to
  // meta.send_ranks[k] is scaled by send_weights[k] first.
  double self_weight = 1.0;
  std::vector<double> recv_weights;
  std::vector<double> send_weights;
  // win_create: the receive buffers start at zero instead of at the input.
  bool zero_init = false;
  // Set by the runtime: when the request was queued and when this rank announced it.
  double enqueued_at = 0;
  double announced_at = 0;
  uint64_t flight_id = 0;  // its entry in the flight recorder (core/flight_recorder.h)
  // Called exactly once, on the thread running the rounds (Drive), when the request finished or
  // failed.
  std::function<void(const Status&)> done;
};

// Who runs the negotiation rounds and the collective of a request (Channel::Enqueue): the
// channel's background thread (kNo); the submitting thread until the request is done (eager
// calls, which wait for it anyway); or the submitting thread for one round it joins, as long as
// the other ranks join it within a short wait, the rest handed to the background thread (graph
// kernels, whose executor thread must not wait for ranks still computing).
enum class Drive { kNo, kUntilDone, kJoinRound };

}  // namespace bluefog
