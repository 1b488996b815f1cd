// Allreduces across hosts over Gloo's TCP pairs in an MPI job. Open MPI's TCP transport moves
// bytes only while a rank is inside an MPI call, and a process sending and receiving through it
// at once moved about half the bytes per second of one doing either; Gloo's pairs have an I/O
// thread of their own (two pretend hosts at 1 Gbit/s: Gloo's ring 88% of the link, MPI's 49%).
// So where every rank of a communicator is not on one host, the MPI backend connects a data
// plane over it (transport/data_plane.h; the pairs' addresses exchanged through MPI) and
// measures both at init: the faster takes the calls from kCrossHostFromBytes. A fast fabric or
// a shared-memory path keeps MPI. BLUEFOG_CROSS_HOST=mpi or gloo decides without the probe.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "core/logging.h"
#include "core/status.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/comm_handle.h"
#include "transport/mpi/mpi_communicator.h"
#include "transport/registry.h"

namespace bluefog {
namespace {

// Calls from this size take the data plane where it was chosen.
constexpr int64_t kCrossHostFromBytes = 64 * 1024;
// The probe: this many bytes of float32, each way once to warm up, then kProbeRounds times
// each, alternating; each way's time its best round on the slowest rank.
constexpr int64_t kProbeBytes = int64_t{2} << 20;
constexpr int kProbeRounds = 3;
// Gloo must be this much faster to be chosen: on a tie MPI stays.
constexpr double kProbeMargin = 0.9;
// With "auto", a plane whose pairs cannot connect in this long is given up (a firewall, an
// interface the hosts do not share), and MPI's transport stays.
constexpr std::chrono::milliseconds kAutoConnectLimit(30000);

}  // namespace

const char* CrossHostAllreduce::name() const { return comm_->data_plane()->name(); }

bool CrossHostAllreduce::AppliesTo(const AllreduceCall& call) const {
  return comm_->tuning().cross_host.load(std::memory_order_relaxed) &&
         call.bytes >= kCrossHostFromBytes;
}

void CrossHostAllreduce::Run(const AllreduceCall& call) {
  comm_->tuning().cross_host_calls.fetch_add(1, std::memory_order_relaxed);
  comm_->data_plane()->Allreduce(call);
}

void MpiCommunicator::ConnectCrossHost(const std::string& how, bool world, int world_rank,
                                       bool speak) {
  if (how == "mpi") return;
  const bool probe = how == "auto";
  const BackendEntry* entry = FindDataPlane(probe ? "gloo" : how);
  if (entry == nullptr) {
    BF_ENFORCE(probe, StatusCode::kInvalidArgument, "rank ", world_rank,
               ": BLUEFOG_CROSS_HOST=", how,
               " is not a transport this build can use across hosts; use auto, mpi or one of: ",
               DataPlaneNames());
    return;  // auto, built without Gloo: MPI's transport
  }
  DataPlaneOptions o;
  o.iface = options_.gloo_iface;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(options_.gloo_timeout_seconds * 1000));
  if (probe) o.timeout = std::min(o.timeout, kAutoConnectLimit);
  o.world_rank = world_rank;
  std::string error;
  try {
    plane_ = entry->data_plane(*this, o);
  } catch (const std::exception& e) {
    error = e.what();
    plane_.reset();
  }
  int ok = error.empty() ? 1 : 0;
  Check(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, AsComm(comm_)), "MPI_Allreduce");
  if (!ok) {
    plane_.reset();
    if (!probe) {
      throw BluefogError(StatusCode::kAborted,
                         error.empty()
                             ? Concat("rank ", world_rank, ": BLUEFOG_CROSS_HOST=", how,
                                      ": another rank could not connect its pairs across hosts "
                                      "(its error says why)")
                             : error);
    }
    if (!error.empty() && LogEnabled(LogLevel::kWarning))
      LogLine(LogLevel::kWarning, world_rank,
              Concat(error, "; allreduces across hosts keep MPI's transport"));
    return;
  }
  if (probe) {
    std::vector<float> data(static_cast<size_t>(kProbeBytes / sizeof(float)), 1.0f);
    AllreduceCall call{data.data(),        data.data(),    static_cast<int64_t>(data.size()),
                       DataType::kFloat32, ReduceOp::kSum, 1,
                       kProbeBytes};
    double best[2] = {std::numeric_limits<double>::max(), std::numeric_limits<double>::max()};
    for (int round = 0; round <= kProbeRounds; ++round) {
      for (int way = 0; way < 2; ++way) {
        Check(MPI_Barrier(AsComm(comm_)), "MPI_Barrier");
        const auto start = std::chrono::steady_clock::now();
        if (way == 0) {
          RunAllreduce(allreduce_, call.in, call.out, call.count, call.dtype, call.op, 1);
        } else {
          plane_->Allreduce(call);
        }
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (round > 0) best[way] = std::min(best[way], s);
      }
    }
    Check(MPI_Allreduce(MPI_IN_PLACE, best, 2, MPI_DOUBLE, MPI_MAX, AsComm(comm_)),
          "MPI_Allreduce");
    tuning_->cross_host = best[1] < best[0] * kProbeMargin;
    if (speak && LogEnabled(LogLevel::kInfo))
      LogLine(LogLevel::kInfo, world_rank,
              Concat("allreduces across hosts from ", kCrossHostFromBytes / 1024, " KiB take ",
                     tuning_->cross_host ? "Gloo's TCP pairs" : "MPI's transport", " (probe of ",
                     kProbeBytes >> 20, " MiB: Gloo ", best[1] * 1e3, " ms, MPI ", best[0] * 1e3,
                     " ms; BLUEFOG_CROSS_HOST=mpi or gloo decides)"));
  } else {
    tuning_->cross_host = true;
  }
  allreduce_ = ForceAllreduce(MakeAllreduceList(this, local_.get(), &own_allreduce_),
                              options_.allreduce_algorithm, world, world_rank, backend());
}

}  // namespace bluefog
