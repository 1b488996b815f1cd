// BLUEFOG_DETERMINISTIC's allreduce: every element of a floating-point allreduce is reduced in
// rank order, (((x_0 + x_1) + x_2) + ...), whatever the size, the fusion and the backend, so
// the same inputs give the same bits from run to run. The other algorithms add the ranks'
// values in an order that depends on the element's position in the (fused) buffer and on the
// path taken, which float addition notices from three ranks on.
//
// A reduce-scatter in which every rank receives all n contributions of its 1/n slice
// (NeighborExchange with every peer), reduces them in rank order with the same kernels as the
// reduction from the round's data (Executor::CompleteInline, which already adds in rank order),
// then an allgather of the reduced slices. Per rank it sends and receives (n-1)/n of the buffer
// twice, as the ring does, in two steps instead of 2(n-1).
#pragma once

#include <memory>
#include <vector>

#include "transport/allreduce_algorithm.h"

namespace bluefog {

class Communicator;

// Takes every floating-point call of any op (integer sums are exact in any order) with at
// least one element.
std::unique_ptr<AllreduceAlgorithm> MakeDeterministicAllreduce(Communicator* comm);
// With the option on, a backend's list starts with `rank_ordered` (on one host the one-host
// paths in rank order, LocalHost::rank_ordered(), which give the same bits without messages;
// nullptr elsewhere), then `deterministic`, then the rest of `list`.
void PutDeterministicFirst(std::vector<AllreduceAlgorithm*>* list,
                           AllreduceAlgorithm* deterministic, AllreduceAlgorithm* rank_ordered);

}  // namespace bluefog
