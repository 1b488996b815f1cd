// Which agreed requests run together, and who divides for an average: pure planning, no MPI.
// Every rank plans from the same ready list, so every rank runs the same collectives in the
// same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/coordinator.h"

namespace bluefog {

struct FusionLimits {
  int64_t fusion_threshold_bytes = 0;  // largest packed group
  // Allreduces of at least this many bytes run alone (0: none do). See PlanGroups.
  int64_t solo_bytes = 0;
};

// Requests [begin, end) of the (reordered) ready list, run as one collective.
struct Group {
  size_t begin;
  size_t end;
};

// Reorders `ready` (stably) so that solo allreduces come last, and splits it into groups: a
// failed response alone; a run of allreduces (or of neighbor_allreduces with one topology
// signature) of one dtype and reduction that fits the fusion threshold; any other op alone.
std::vector<Group> PlanGroups(std::vector<Response>& ready, const FusionLimits& limits);

// How the average (and scaling) of a fused allreduce is made. The collective divides its result
// by `collective_divisor` (folded into the last summing pass where it can); request k's slice
// is then divided by `after[k]` where that is above 1, and multiplied by `scale[k]` where that
// is not 1. A group that only averages divides once, inside the collective; a mixed or scaled
// group divides only the averaging requests' slices. 16-bit floats divide each rank's input
// instead, by `before[k]`, ahead of the collective: their partial sums are rounded to 16 bits
// along the way, and a mean that fits (60000 in float16) would overflow as a sum.
struct AveragePlan {
  int64_t collective_divisor = 1;
  std::vector<int64_t> before;
  std::vector<int64_t> after;
  std::vector<double> scale;
};
// `scale` is empty (no scaling) or one factor per request.
AveragePlan PlanAverage(const std::vector<bool>& average, ReduceOp op, int size,
                        const std::vector<double>& scale = {}, DataType dtype = DataType::kFloat32);

}  // namespace bluefog
