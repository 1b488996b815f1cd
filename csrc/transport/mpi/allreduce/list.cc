// The order in which MpiCommunicator::Allreduce asks its algorithms: the first that applies to
// a call runs it. Every condition is known alike on every rank, so every rank runs the same one.
#include "transport/local/local_host.h"
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {

std::vector<AllreduceAlgorithm*> MakeAllreduceList(
    MpiCommunicator* comm, LocalHost* local,
    std::vector<std::unique_ptr<AllreduceAlgorithm>>* owned) {
  std::vector<AllreduceAlgorithm*> list;
  if (local) list = local->algorithms();  // one host
  owned->clear();
  owned->push_back(std::make_unique<HierarchicalAllreduce>(comm));  // several hosts
  if (comm->data_plane())                                           // across hosts, where chosen
    owned->push_back(std::make_unique<CrossHostAllreduce>(comm));
  owned->push_back(std::make_unique<RingAllreduce>(comm));       // anywhere, large
  owned->push_back(std::make_unique<MpiNativeAllreduce>(comm));  // everything else
  for (const auto& a : *owned) list.push_back(a.get());
  return list;
}

}  // namespace bluefog
