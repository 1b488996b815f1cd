// The communicator interface: the primitives the runtime needs from a backend. The runtime,
// its channels and executors see only this; a backend (csrc/transport/<name>/) implements it.
// Every call is collective over the communicator's ranks unless it says otherwise, and every
// one runs on the thread that owns the communicator (a channel's background thread, or a
// caller driving an eager round or a graph kernel joining one while holding that channel).
// Failures throw BluefogError.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"
#include "transport/window_link.h"

namespace bluefog {

class AllreduceAlgorithm;
class LocalHost;
class SharedHeap;
struct Tuning;

// Where this rank sits in the job, as the backend found it at Init.
struct TransportInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // Among the ranks with this local rank (one per host): this one's index and their number.
  int cross_rank = 0;
  int cross_size = 1;
  bool threads_multiple = false;  // the backend may be called from several threads at once
  // Every host runs the same number of ranks, and host h holds ranks h*L .. h*L+L-1 (mpirun's
  // default --map-by slot): what machine-level (hierarchical) neighbour ops need.
  bool homogeneous = false;
};

// Which of the backend's allreduce paths this communicator can take (for logs and tests).
struct TransportPaths {
  bool hierarchical = false;  // several hosts, the same number of ranks on each
  bool direct = false;        // one host, every rank can read every other's memory
  bool staged = false;        // one host, data areas in the rounds' shared memory
  bool shared_heap = false;   // one host, outputs every rank can write into
  bool local_rounds = false;  // negotiation rounds through shared memory
};

// What a backend can do, asked by the runtime instead of its name. Every field defaults to
// "cannot": a backend states what it offers.
struct Capabilities {
  // Init may run again in this process after Shutdown (MPI cannot be restarted).
  bool reinitializable = false;
  // A failed call leaves nothing pending, so shutting down at once after one is safe, and is
  // what makes the peers still waiting on this rank fail at once rather than after their
  // timeout.
  bool fails_fast = false;
  // CreateWindowLink gives the window service its connections (one-sided window ops).
  bool windows = false;
};

// A buffer sent to or received from one peer (NeighborExchange).
struct PeerBuffer {
  int rank;
  void* data;
  int64_t bytes;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const char* backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual TransportPaths paths() const = 0;
  virtual Capabilities capabilities() const { return Capabilities(); }
  // The switches benches and tests turn at run time, shared with every subset made from this
  // communicator (options.h).
  virtual Tuning& tuning() = 0;
  // Outputs every rank of this host can write into (shared_heap.h), or nullptr.
  virtual std::shared_ptr<SharedHeap> shared_heap() const { return nullptr; }
  // The ranks of this host as a transport (transport/local/), when every rank of this
  // communicator is on this host; else nullptr.
  virtual LocalHost* local_host() const { return nullptr; }
  // The allreduce algorithms in the order Allreduce asks them (the first that applies runs).
  virtual std::vector<AllreduceAlgorithm*> allreduce_algorithms() const { return {}; }
  // The window service's connections (window_link.h), made for headers of `header_bytes`:
  // collective over every rank of this communicator (the world one), at the same point;
  // nullptr where the backend has none.
  virtual std::unique_ptr<WindowLink> CreateWindowLink(size_t header_bytes) { return nullptr; }

  // A communicator over the given ranks of this one (ascending), for a process set.
  // Collective over those ranks only; `tag` tells concurrent creations apart.
  virtual std::unique_ptr<Communicator> CreateSubset(const std::vector<int>& ranks, int tag) = 0;
  // Frees what Init made. Safe to call twice.
  virtual void Shutdown() = 0;

  // The negotiation round: every rank passes its bytes and gets every rank's, indexed by rank.
  // `on_wait` runs periodically while other ranks have not yet joined. Messages up to
  // kExchangeSlotBytes cost one exchange of fixed slots; a longer one makes it two for every
  // rank.
  static constexpr size_t kExchangeSlotBytes = 1016;
  static constexpr size_t kExchangeSlotHeader = 8;  // the message's length, before its bytes
  virtual std::vector<std::string> ExchangeAll(const std::string& mine,
                                               const std::function<void()>& on_wait) = 0;
  // ExchangeAll in two halves, for a thread that may hand the rest of the wait to another (a
  // graph kernel joining a round, Channel::Enqueue): StartExchange posts this rank's message;
  // FinishExchange waits for the others at most `limit` (negative: as long as it takes) and
  // returns false when that ran out, the round still open (a later FinishExchange finishes it,
  // from the thread that took the communicator over). Only where splits_exchange() is the limit
  // kept; otherwise (these defaults) FinishExchange runs the whole ExchangeAll and waits as long
  // as it takes.
  virtual bool splits_exchange() const { return false; }
  virtual void StartExchange(const std::string& mine) { unsent_ = mine; }
  virtual bool FinishExchange(std::vector<std::string>* all, const std::function<void()>& on_wait,
                              std::chrono::microseconds /*limit*/) {
    *all = ExchangeAll(unsent_, on_wait);
    return true;
  }

  // The reduction over all ranks, divided by `divisor` when it is above 1 (the average; kSum
  // only: the caller decides the divisor, the backend applies it where it is cheapest). `in`
  // may equal `out` (in place); otherwise `in` is only read.
  virtual void Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                         int64_t divisor = 1) = 0;
  void AllreduceSum(const void* in, void* out, int64_t count, DataType dtype, int64_t divisor = 1) {
    Allreduce(in, out, count, dtype, ReduceOp::kSum, divisor);
  }
  // The reduction over all ranks of `in` (the sum of counts_per_rank elements), of which this
  // rank receives its counts_per_rank[rank] elements into `out`, divided by `divisor` (kSum
  // only, as for Allreduce).
  virtual void ReduceScatter(const void* in, void* out, const std::vector<int64_t>& counts_per_rank,
                             DataType dtype, ReduceOp op, int64_t divisor = 1) = 0;
  // Concatenates each rank's bytes in rank order into `out`.
  virtual void Allgatherv(const void* in, void* out,
                          const std::vector<int64_t>& bytes_per_rank) = 0;
  virtual void Broadcast(void* buffer, int64_t bytes, int root) = 0;
  // Point-to-point exchange with the given peers; returns when every transfer completed.
  // Every rank runs its exchanges in the same order.
  virtual void NeighborExchange(const std::vector<PeerBuffer>& sends,
                                const std::vector<PeerBuffer>& recvs) = 0;

 private:
  std::string unsent_;  // the default StartExchange's message, for FinishExchange
};

}  // namespace bluefog
