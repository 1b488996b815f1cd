// The Gloo backend: the communicator over Gloo's TCP transport, for jobs started without an
// MPI launcher (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). The only code that calls Gloo.
// Rendezvous through TcpStore (rank 0 runs its server); one gloo::Context per communicator,
// so a process set's thread never shares one with another thread. Reductions run bluefog's
// own kernels (core/reduce_kernels.h), so every dtype and op reduces as on MPI.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "transport/allreduce_algorithm.h"
#include "transport/communicator.h"
#include "transport/data_plane.h"
#include "transport/local/local_host.h"
#include "transport/options.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace bluefog {

class TcpStore;
class TcpStoreServer;

// Where the job meets: from Config (MASTER_ADDR, ...), or set by tests.
struct GlooSetup {
  std::string master_addr;
  int master_port = 0;
  int rank = 0;
  int size = 1;
  int local_rank = -1;  // -1: from the hostnames every rank announces
  int local_size = -1;
  std::string token;  // JobToken(...)
  // The address peers reach this rank's Gloo connections at; empty: this host's address on
  // the route to MASTER_ADDR (127.0.0.1 when that is a loopback address), else its name.
  std::string host;
  std::string iface;  // BLUEFOG_GLOO_IFACE: listen on this interface instead (`host` unused)
  std::chrono::milliseconds timeout{300000};
  // An elastic round (bfrun --gloo --min-np): every key under this prefix; the store served
  // by bfrun rather than rank 0; and the rendezvous given up at once when the driver sets
  // `<prefix>abort` (it started a newer round without one of this round's ranks).
  std::string prefix;
  bool external_store = false;
};

// The key an elastic driver sets (under the round's prefix) to end a round's rendezvous.
constexpr const char* kAbortKey = "bluefog/abort";

// The window service's link over `context` (window_link.cc).
std::unique_ptr<WindowLink> MakeGlooWindowLink(std::shared_ptr<gloo::Context> context,
                                               std::shared_ptr<TcpStore> store, int rank, int size,
                                               size_t header_bytes,
                                               std::chrono::milliseconds timeout);

// Gloo's TCP pairs as a data plane over `over` (data_plane.cc; transport/data_plane.h).
std::unique_ptr<DataPlane> MakeGlooDataPlane(Communicator& over, const DataPlaneOptions& options);

// The number of ranks on each host when every host runs the same number (> 1) and host h holds
// ranks h*L .. h*L+L-1, on several hosts; else 0 (hierarchical.cc).
int HomogeneousLocalSize(const std::vector<std::string>& hosts);
class GlooCommunicator;
// The hierarchical allreduce over `world`'s hosts of `local_size` ranks each (hierarchical.cc).
std::unique_ptr<AllreduceAlgorithm> MakeGlooHierarchical(GlooCommunicator* world, int local_size);

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(GlooSetup setup, const TransportOptions& options = TransportOptions());
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;
  ~GlooCommunicator() override;

  // The rendezvous: rank 0 starts the store's server; every rank announces itself and waits
  // for the others (throws BluefogError naming the ranks that did not arrive within the
  // timeout), then Gloo connects every pair.
  TransportInfo Init();

  // Tests: connections the server (rank 0) refused for a wrong token.
  int refused_connections() const;

  // Communicator
  const char* backend() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  TransportPaths paths() const override {
    TransportPaths p = LocalPaths(local_.get());
    p.hierarchical = hierarchical_ != nullptr && tuning_->hierarchical;
    return p;
  }
  Capabilities capabilities() const override {
    return {/*reinitializable=*/true, /*fails_fast=*/true, /*windows=*/true};
  }
  Tuning& tuning() override { return *tuning_; }
  std::shared_ptr<SharedHeap> shared_heap() const override {
    return local_ ? local_->heap() : nullptr;
  }
  LocalHost* local_host() const override { return local_.get(); }
  std::vector<AllreduceAlgorithm*> allreduce_algorithms() const override { return allreduce_; }
  std::unique_ptr<Communicator> CreateSubset(const std::vector<int>& ranks, int tag) override;
  // window_link.cc: a context of its own, under the store's prefix bluefog/windows/<n>.
  std::unique_ptr<WindowLink> CreateWindowLink(size_t header_bytes) override;
  void Shutdown() override;
  std::vector<std::string> ExchangeAll(const std::string& mine,
                                       const std::function<void()>& on_wait) override;
  // Split in two halves where the ranks share one host's rounds; else the defaults.
  bool splits_exchange() const override { return rounds() != nullptr; }
  void StartExchange(const std::string& mine) override;
  bool FinishExchange(std::vector<std::string>* all, const std::function<void()>& on_wait,
                      std::chrono::microseconds limit) override;
  void Allreduce(const void* in, void* out, int64_t count, DataType dtype, ReduceOp op,
                 int64_t divisor = 1) override;
  void ReduceScatter(const void* in, void* out, const std::vector<int64_t>& counts_per_rank,
                     DataType dtype, ReduceOp op, int64_t divisor = 1) override;
  void Allgatherv(const void* in, void* out, const std::vector<int64_t>& bytes_per_rank) override;
  void Broadcast(void* buffer, int64_t bytes, int root) override;
  void NeighborExchange(const std::vector<PeerBuffer>& sends,
                        const std::vector<PeerBuffer>& recvs) override;

 private:
  GlooCommunicator(const GlooCommunicator& parent, int rank, int size);
  // Connects this communicator's context through the keys under `prefix` (every rank of it
  // calls this), then sets up the ranks' host as a transport when they all share one (per
  // `hosts`, every rank's host name), and the allreduce list.
  void Connect(const std::string& prefix, const std::vector<std::string>& hosts);
  LocalRounds* rounds() const { return local_ ? local_->rounds() : nullptr; }
  // What does not fit a slot of the negotiation round, once every rank's slot showed its length.
  void ExchangeRests(const char* slots, const std::string& mine, std::vector<std::string>* out);
  // For an error of a Gloo call: " (rank(s) R left the job)" when rank 0's server saw those
  // ranks' connections end, a note when the server is gone too, else empty.
  std::string GoneNote();
  // Gloo's own allreduce, the list's last.
  void RingAllreduce(const AllreduceCall& call);
  // Runs one Gloo call, turning its exceptions into BluefogError naming rank and op.
  template <typename F>
  void Run(const char* op, F&& body);

  GlooSetup setup_;
  TransportOptions options_;
  std::shared_ptr<Tuning> tuning_;
  std::shared_ptr<TcpStoreServer> server_;  // rank 0 of the world only
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;      // job-wide rank of each of this communicator's ranks
  std::vector<std::string> hosts_;    // each rank's host name, announced at the rendezvous
  std::unique_ptr<LocalHost> local_;  // every rank on this host: its segment and paths
  std::vector<AllreduceAlgorithm*> allreduce_;
  std::unique_ptr<AllreduceAlgorithm> deterministic_;  // when on: first but for local_'s
  std::unique_ptr<AllreduceAlgorithm> ring_;           // Gloo's own allreduce, last in allreduce_
  std::unique_ptr<AllreduceAlgorithm> hierarchical_;   // the world's, on several alike hosts
  std::string exchange_mine_;  // StartExchange's message, for what does not fit its slot
  // How many subsets over each list of ranks this communicator made: a set removed and made
  // again (with its old id) must not find the old subset's addresses in the store.
  std::map<std::string, int> subset_creations_;
  bool initialized_ = false;
  int window_links_ = 0;
  std::vector<char> exchange_send_;
  std::vector<char> exchange_recv_;
  std::vector<char> scratch_;
  std::vector<int64_t> slice_offsets_;  // ReduceScatter's, per rank
};

// Runs one Gloo call, turning its exceptions into BluefogError naming rank and op (here so that
// each file of the backend can use it).
template <typename F>
void GlooCommunicator::Run(const char* op, F&& body) {
  try {
    body();
  } catch (const BluefogError& e) {
    if (e.code() == StatusCode::kAborted) throw TransportError(e.code(), e.what());
    throw;
  } catch (const std::exception& e) {
    throw TransportError(StatusCode::kAborted,
                         Concat("rank ", world_ranks_.empty() ? rank_ : world_ranks_[rank_],
                                ": Gloo ", op, " failed", GoneNote(), ": ", e.what(),
                                ". A peer may have exited, or not called it within "
                                "BLUEFOG_GLOO_TIMEOUT (",
                                setup_.timeout.count() / 1000, " s)"));
  }
}

}  // namespace bluefog
