// The order in which MpiCommunicator::Allreduce asks its algorithms: the first that applies to
// a call runs it. Every condition is known alike on every rank, so every rank runs the same one.
#include "transport/mpi/allreduce/algorithms.h"
#include "transport/mpi/mpi_communicator.h"

namespace bluefog {

bool LargeCall(MpiCommunicator* comm, const AllreduceCall& call) {
  const int64_t threshold = comm->tuning().ring_threshold_bytes.load(std::memory_order_relaxed);
  return threshold > 0 && call.bytes >= threshold;
}

bool OneHostCall(MpiCommunicator* comm, const AllreduceCall& call) {
  if (LargeCall(comm, call)) return true;
  const Tuning& tuning = comm->tuning();
  const int64_t threshold = tuning.one_host_threshold_bytes.load(std::memory_order_relaxed);
  return threshold > 0 && call.bytes >= threshold && call.count >= comm->size() &&
         tuning.ring_threshold_bytes.load(std::memory_order_relaxed) > 0;
}

std::vector<std::unique_ptr<AllreduceAlgorithm>> MakeAllreduceList(MpiCommunicator* comm) {
  std::vector<std::unique_ptr<AllreduceAlgorithm>> list;
  auto direct = std::make_unique<DirectAllreduce>(comm);
  DirectAllreduce* direct_ptr = direct.get();
  list.push_back(std::make_unique<HierarchicalAllreduce>(comm));         // several hosts
  list.push_back(std::make_unique<OneHostAllreduce>(comm, direct_ptr));  // one host, areas
  list.push_back(std::move(direct));                                     // one host, no areas
  list.push_back(std::make_unique<RingAllreduce>(comm));                 // anywhere, large
  list.push_back(std::make_unique<MpiNativeAllreduce>(comm));            // everything else
  return list;
}

}  // namespace bluefog
