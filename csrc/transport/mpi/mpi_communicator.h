// The MPI backend: the only code that calls MPI. Every call runs on the thread that owns the
// communicator, over a communicator the library duplicated for itself, so user MPI traffic
// never mixes with ours. The allreduce algorithms live in allreduce/, one file each; this
// class holds what they share (the communicators, scratch memory, the shared-memory rounds).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/types.h"
#include "transport/allreduce_algorithm.h"
#include "transport/communicator.h"
#include "transport/data_plane.h"
#include "transport/local/local_host.h"
#include "transport/options.h"

namespace bluefog {

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(const TransportOptions& options = TransportOptions());
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override;

  // Initializes MPI unless the application already did, and duplicates COMM_WORLD.
  TransportInfo Init();

  // Communicator
  const char* backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  TransportPaths paths() const override;
  Capabilities capabilities() const override {
    return {/*reinitializable=*/false, /*fails_fast=*/false, /*windows=*/true};
  }
  Tuning& tuning() override { return *tuning_; }
  std::shared_ptr<SharedHeap> shared_heap() const override {
    return local_ ? local_->heap() : nullptr;
  }
  LocalHost* local_host() const override { return local_.get(); }
  std::vector<AllreduceAlgorithm*> allreduce_algorithms() const override { return allreduce_; }
  std::unique_ptr<WindowLink> CreateWindowLink(size_t header_bytes) override;
  std::unique_ptr<Communicator> CreateSubset(const std::vector<int>& ranks, int tag) override;
  void Shutdown() override;
  std::vector<std::string> ExchangeAll(const std::string& mine,
                                       const std::function<void()>& on_wait) override;
  bool splits_exchange() const override { return true; }
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

  // For the algorithms (allreduce/): what they share.
  void* comm() const { return comm_; }              // an MPI_Comm (comm_handle.h)
  void* local_comm() const { return local_comm_; }  // this host's ranks
  void*& reduce_op() { return bluefog_op_; }        // an MPI_Op over bluefog's kernels
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // Over the ranks with this rank's local rank, one per host, when the hierarchical allreduce
  // can run (else nullptr).
  MpiCommunicator* cross() const { return cross_.get(); }
  // Over this host's ranks, with the one-host transport, where cross() is (else nullptr).
  MpiCommunicator* host() const { return host_.get(); }
  const TransportOptions& options() const { return options_; }
  // Throws BluefogError(kInternal) with MPI's text when `code` is not MPI_SUCCESS.
  void Check(int code, const char* call) const;
  // Chunks received from peers (one algorithm runs at a time); grown once, so no per-call
  // faults.
  char* Scratch(int64_t bytes);
  // Storage for `n` MPI_Request, reused.
  void* Requests(size_t n);
  // MPI_Waitall on `n` MPI_Request that leaves the core to others during a long wait.
  void WaitSparingly(void* requests, int n = 1);
  // Gloo's TCP pairs over this communicator's ranks (cross_host.cc), or nullptr.
  DataPlane* data_plane() const { return plane_.get(); }
  // Whether `rank` runs on another host than this rank.
  bool OnOtherHost(int rank) const { return host_of_[rank] != host_of_[rank_]; }

 private:
  // A communicator over `comm` (an MPI_Comm this process owns), which it frees at Shutdown.
  std::unique_ptr<MpiCommunicator> Adopt(void* comm);
  // The algorithms and the exchange's buffers; the host's transport (LocalHost) set up when
  // `one_host`. `world`: the job's communicator, where a BLUEFOG_ALLREDUCE_ALGORITHM that
  // cannot run is an error (ForceAllreduce).
  void SetUp(bool one_host, bool world);
  // exchange_send_ from every rank into exchange_recv_, over MPI: posted, then waited for at
  // most `limit` (negative: without one); false when that ran out.
  void StartExchangeSlots();
  bool AwaitExchangeSlots(const std::function<void()>& on_wait, std::chrono::microseconds limit);
  // Collective: connects a data plane over this communicator's ranks (on several hosts) as
  // BLUEFOG_CROSS_HOST (`how`) says, and for "auto" probes whether it beats MPI's transport
  // (Tuning::cross_host); then makes the allreduce list again (cross_host.cc). `world_rank`
  // for errors and logs; `speak`: this rank logs the choice.
  void ConnectCrossHost(const std::string& how, bool world, int world_rank, bool speak);
  // Collective: host_of_ from `shared` (this rank's host's ranks within comm_).
  void MapHosts(void* shared);
  // NeighborExchange's one peer on another host, sent to and received from in two phases.
  void PhasedExchange(const PeerBuffer& send, const PeerBuffer& recv);

  TransportOptions options_;
  std::shared_ptr<Tuning> tuning_;
  bool initialized_ = false;
  bool owns_mpi_ = false;
  int rank_ = 0;
  int size_ = 1;
  void* comm_ = nullptr;  // MPI_Comm, kept opaque so this header does not include mpi.h
  void* local_comm_ = nullptr;
  bool has_local_comm_ = false;
  std::unique_ptr<MpiCommunicator> cross_;
  std::unique_ptr<MpiCommunicator> host_;
  std::unique_ptr<DataPlane> plane_;
  int local_rank_ = 0;
  int local_size_ = 1;
  void* bluefog_op_ = nullptr;
  std::unique_ptr<LocalHost> local_;  // every rank on this host: its segment and paths
  std::vector<AllreduceAlgorithm*> allreduce_;
  std::vector<std::unique_ptr<AllreduceAlgorithm>> own_allreduce_;  // in allreduce_
  std::vector<char> exchange_send_;
  std::vector<char> exchange_recv_;
  std::vector<int64_t> rest_;         // the negotiation round's bytes beyond each rank's slot
  std::string exchange_rest_;         // this rank's part of them, kept from StartExchange
  void* exchange_request_ = nullptr;  // the posted MPI_Iallgather (an MPI_Request)
  std::vector<int> counts_;
  std::vector<int> displs_;
  std::vector<char> requests_;
  std::vector<char> scratch_;
  // Each rank's host: the rank (in comm_) of its host's first rank; and how many of comm_'s
  // ranks share this rank's host.
  std::vector<int> host_of_;
  int same_host_ = 1;
};

}  // namespace bluefog
