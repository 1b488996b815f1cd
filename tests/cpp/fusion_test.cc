#include "core/fusion.h"

#include <gtest/gtest.h>

namespace bluefog {
namespace {

Response Resp(const std::string& name, OpType op, int64_t elements,
              DataType dtype = DataType::kFloat32) {
  Response r;
  r.meta.name = name;
  r.meta.op = op;
  r.meta.dtype = dtype;
  r.meta.shape = {elements};
  return r;
}

std::vector<std::pair<size_t, size_t>> Ranges(const std::vector<Group>& groups) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Group& g : groups) out.emplace_back(g.begin, g.end);
  return out;
}

TEST(Fusion, RunsOfOneDtypeFuseUpToTheThreshold) {
  std::vector<Response> ready = {Resp("a", OpType::kAllreduce, 4), Resp("b", OpType::kAllreduce, 4),
                                 Resp("c", OpType::kAllreduce, 4),
                                 Resp("d", OpType::kAllreduce, 4, DataType::kFloat64)};
  auto groups = PlanGroups(ready, FusionLimits{32, 0});  // 16 bytes each in float32
  EXPECT_EQ(Ranges(groups), (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 3}, {3, 4}}));
}

TEST(Fusion, FailedAndOtherOpsRunAlone) {
  std::vector<Response> ready = {Resp("a", OpType::kAllreduce, 1), Resp("b", OpType::kAllreduce, 1),
                                 Resp("c", OpType::kAllgather, 1),
                                 Resp("d", OpType::kAllgather, 1)};
  ready[1].status = Status(StatusCode::kPrecondition, "disagree");
  auto groups = PlanGroups(ready, FusionLimits{1 << 20, 0});
  EXPECT_EQ(Ranges(groups),
            (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
}

TEST(Fusion, ReductionsAndTopologiesSplitGroups) {
  std::vector<Response> ready = {Resp("a", OpType::kAllreduce, 1), Resp("b", OpType::kAllreduce, 1),
                                 Resp("c", OpType::kNeighborAllreduce, 1),
                                 Resp("d", OpType::kNeighborAllreduce, 1),
                                 Resp("e", OpType::kNeighborAllreduce, 1)};
  ready[1].meta.reduce_op = ReduceOp::kMax;
  ready[4].topology_signature = "other";
  auto groups = PlanGroups(ready, FusionLimits{1 << 20, 0});
  EXPECT_EQ(Ranges(groups),
            (std::vector<std::pair<size_t, size_t>>{{0, 1}, {1, 2}, {2, 4}, {4, 5}}));
}

TEST(Fusion, LargeAllreducesRunAloneAndLast) {
  std::vector<Response> ready = {
      Resp("big1", OpType::kAllreduce, 1000), Resp("a", OpType::kAllreduce, 1),
      Resp("big2", OpType::kAllreduce, 2000), Resp("b", OpType::kAllreduce, 1)};
  auto groups = PlanGroups(ready, FusionLimits{1 << 20, 4000});
  EXPECT_EQ(Ranges(groups), (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 3}, {3, 4}}));
  EXPECT_EQ(ready[0].meta.name, "a");
  EXPECT_EQ(ready[1].meta.name, "b");
  EXPECT_EQ(ready[2].meta.name, "big1");
  EXPECT_EQ(ready[3].meta.name, "big2");
}

TEST(Fusion, AveragingIsDecidedOnce) {
  AveragePlan all = PlanAverage({true, true}, ReduceOp::kSum, 4);
  EXPECT_EQ(all.collective_divisor, 4);
  EXPECT_EQ(all.after, (std::vector<int64_t>{1, 1}));
  AveragePlan mixed = PlanAverage({true, false, true}, ReduceOp::kSum, 4);
  EXPECT_EQ(mixed.collective_divisor, 1);
  EXPECT_EQ(mixed.after, (std::vector<int64_t>{4, 1, 4}));
  AveragePlan none = PlanAverage({false}, ReduceOp::kSum, 4);
  EXPECT_EQ(none.collective_divisor, 1);
  AveragePlan one_rank = PlanAverage({true}, ReduceOp::kSum, 1);
  EXPECT_EQ(one_rank.collective_divisor, 1);
  EXPECT_EQ(one_rank.after, (std::vector<int64_t>{1}));
  AveragePlan scaled = PlanAverage({true, true}, ReduceOp::kSum, 4, {1.0, 0.5});
  EXPECT_EQ(scaled.collective_divisor, 1);  // the scaled slice must be divided on its own
  EXPECT_EQ(scaled.after, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(scaled.scale, (std::vector<double>{1.0, 0.5}));
  AveragePlan max = PlanAverage({false, false}, ReduceOp::kMax, 4);
  EXPECT_EQ(max.collective_divisor, 1);
}

TEST(Fusion, SixteenBitFloatsAreDividedBeforeTheSum) {
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    AveragePlan plan = PlanAverage({true, false}, ReduceOp::kSum, 3, {}, dtype);
    EXPECT_EQ(plan.collective_divisor, 1);
    EXPECT_EQ(plan.before, (std::vector<int64_t>{3, 1}));
    EXPECT_EQ(plan.after, (std::vector<int64_t>{1, 1}));
  }
  AveragePlan f32 = PlanAverage({true}, ReduceOp::kSum, 3, {}, DataType::kFloat32);
  EXPECT_EQ(f32.before, (std::vector<int64_t>{1}));
  EXPECT_EQ(f32.collective_divisor, 3);
}

}  // namespace
}  // namespace bluefog
