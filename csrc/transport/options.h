// What a backend is configured with: TransportOptions, made from Config once at init; and
// Tuning, the switches that benches and tests turn while the job runs (one C API pair,
// bluefog_tuning_get/set, reaches them by name). Pure: no backend headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/config.h"

namespace bluefog {

struct TransportOptions {
  int64_t ring_threshold_bytes = Config().ring_threshold_bytes;
  int64_t one_host_threshold_bytes = Config().one_host_threshold_bytes;
  bool hierarchical = Config().hierarchical_allreduce;
  bool direct = Config().direct_allreduce;
  bool local_rounds = Config().local_rounds;
  int64_t staged_bytes = Config().staged_allreduce_bytes;
  int64_t shared_heap_bytes = Config().shared_outputs_bytes;
  int64_t streaming_store_bytes = Config().streaming_store_bytes;
  int64_t graph_join_us = Config().graph_join_us;
  std::string allreduce_algorithm;  // BLUEFOG_ALLREDUCE_ALGORITHM (allreduce_algorithm.h)
  bool deterministic = false;       // BLUEFOG_DETERMINISTIC (deterministic_allreduce.h)
  std::string cross_host = Config().cross_host;  // BLUEFOG_CROSS_HOST (data_plane.h)
  std::string gloo_iface;                        // BLUEFOG_GLOO_IFACE
  double gloo_timeout_seconds = Config().gloo_timeout_seconds;
  // The one-host path choices of earlier runs (core/path_cache.h): the directory of their file
  // (empty: none read or written), and whether to time every class again, ignoring the file.
  std::string path_cache_dir = Config().path_cache_dir;
  bool path_relearn = Config().path_relearn;

  static TransportOptions FromConfig(const Config& config) {
    TransportOptions o;
    o.ring_threshold_bytes = config.ring_threshold_bytes;
    o.one_host_threshold_bytes = config.one_host_threshold_bytes;
    o.hierarchical = config.hierarchical_allreduce;
    o.direct = config.direct_allreduce;
    o.local_rounds = config.local_rounds;
    o.staged_bytes = config.staged_allreduce_bytes;
    o.shared_heap_bytes = config.shared_outputs_bytes;
    o.streaming_store_bytes = config.streaming_store_bytes;
    o.graph_join_us = config.graph_join_us;
    o.allreduce_algorithm = config.allreduce_algorithm;
    o.deterministic = config.deterministic;
    o.cross_host = config.cross_host;
    o.gloo_iface = config.gloo_iface;
    o.gloo_timeout_seconds = config.gloo_timeout_seconds;
    o.path_cache_dir = config.path_cache_dir;
    o.path_relearn = config.path_relearn;
    return o;
  }
};

// Every field may be read on the communicator's thread while another thread sets it; a change
// applies from the next call on. Ranks need not agree on streaming_store_bytes (it changes how
// a rank stores, not what); every other switch must be turned alike on every rank between the
// same calls, as benches and tests do.
struct Tuning {
  explicit Tuning(const TransportOptions& o = TransportOptions())
      : ring_threshold_bytes(o.ring_threshold_bytes),
        one_host_threshold_bytes(o.one_host_threshold_bytes),
        hierarchical(o.hierarchical),
        direct(o.direct),
        streaming_store_bytes(o.streaming_store_bytes),
        graph_join_us(o.graph_join_us) {}

  // Allreduces of at least this many bytes take the large-buffer algorithms (0: never).
  std::atomic<int64_t> ring_threshold_bytes;
  // One host with data areas: allreduces of at least this many bytes take the one-host paths
  // even below ring_threshold_bytes (0: only from it; ring_threshold_bytes 0: never).
  std::atomic<int64_t> one_host_threshold_bytes;
  std::atomic<bool> hierarchical;
  // Two hosts: each slice reduced on alternate hosts (false: the ring across).
  std::atomic<bool> two_host_split{true};
  // MPI: a neighbour exchange with one peer on another host sends, then receives (or the
  // reverse), instead of both at once (MpiCommunicator::PhasedExchange).
  std::atomic<bool> phased_exchange{true};
  // MPI across hosts: calls take the data plane (Gloo's TCP pairs) where one is connected; set
  // at init by the probe or BLUEFOG_CROSS_HOST (mpi/cross_host.cc).
  std::atomic<bool> cross_host{false};
  std::atomic<bool> direct;
  std::atomic<bool> staged{true};
  std::atomic<bool> shared{true};
  // One-host allreduces through the data areas of at least this many bytes, out of place,
  // write their outputs with non-temporal stores (0: never).
  std::atomic<int64_t> streaming_store_bytes;
  // Tests only: the path chooser decides a size class again after this many calls, and its
  // watch compares with the other path's median times this factor (path_chooser.h).
  std::atomic<int64_t> recheck_calls{2048};
  std::atomic<double> worse{1.25};
  // Tests only: the direct path's reads from this rank fail (a bad address), as a kernel
  // refusing them would (-1: none).
  std::atomic<int64_t> direct_fault_rank{-1};
  // How long a graph kernel that joined a negotiation round itself waits there for the other
  // ranks before it hands the round to the channel's thread, in microseconds (0: graph kernels
  // hand every request over; Channel::Enqueue, Drive::kJoinRound; BLUEFOG_GRAPH_JOIN_WAIT).
  std::atomic<int64_t> graph_join_us;
  // Counts (read-only by name): allreduces that took the shared path, and those that took one
  // of the one-host paths (the timed choice).
  std::atomic<uint64_t> shared_calls{0};
  std::atomic<uint64_t> one_host_calls{0};
  // One-host calls of a size class still learning its path: the untimed start and the trials
  // (a class with a path cached from an earlier run has none).
  std::atomic<uint64_t> learning_calls{0};
  std::atomic<uint64_t> cross_host_calls{0};  // allreduces through the data plane

  // By name, for the C API: the value before, or false when `knob` is not one of
  // kKnobNames (and for the read-only counters).
  static constexpr const char* kKnobNames =
      "ring_threshold, one_host_threshold, hierarchical, two_host_split, phased_exchange, "
      "direct, staged, shared, streaming_stores, recheck_calls, worse_percent, "
      "direct_fault_rank, graph_join_us, cross_host, shared_calls, one_host_calls, "
      "learning_calls and cross_host_calls (read-only)";
  bool Get(const std::string& knob, int64_t* value) const;
  bool Set(const std::string& knob, int64_t value, int64_t* before);
};

}  // namespace bluefog
