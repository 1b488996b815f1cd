#include "core/op_rules.h"

#include <gtest/gtest.h>

namespace bluefog {
namespace {

bool Float(DataType d) {
  return d == DataType::kFloat16 || d == DataType::kBFloat16 || d == DataType::kFloat32 ||
         d == DataType::kFloat64;
}

TEST(OpRules, DtypesPerOp) {
  for (int v = 0; v < kNumDataTypes; ++v) {
    const DataType d = static_cast<DataType>(v);
    SCOPED_TRACE(DataTypeName(d));
    EXPECT_EQ(OpAcceptsDtype(OpType::kAllreduce, d), d != DataType::kBool);
    EXPECT_EQ(IsFloat(d), Float(d));
    EXPECT_TRUE(OpAcceptsDtype(OpType::kAllgather, d));
    EXPECT_TRUE(OpAcceptsDtype(OpType::kBroadcast, d));
    EXPECT_TRUE(OpAcceptsDtype(OpType::kNeighborAllgather, d));
    EXPECT_EQ(OpAcceptsDtype(OpType::kNeighborAllreduce, d), Float(d));
    EXPECT_EQ(OpAcceptsDtype(OpType::kNeighborAllgatherGrad, d), Float(d));
  }
}

TEST(OpRules, EveryRefusingOpSaysWhy) {
  for (int v = 0; v < kNumOpTypes; ++v) {
    const OpType op = static_cast<OpType>(v);
    bool refuses = false;
    for (int d = 0; d < kNumDataTypes; ++d)
      refuses |= !OpAcceptsDtype(op, static_cast<DataType>(d));
    EXPECT_EQ(refuses, std::string(DtypeRefusal(op)).size() > 0) << OpTypeName(op);
  }
}

TEST(OpRules, ConcatenatingOpsNeedDimensionZero) {
  EXPECT_TRUE(NeedsDimensionZero(OpType::kAllgather));
  EXPECT_TRUE(NeedsDimensionZero(OpType::kNeighborAllgather));
  EXPECT_TRUE(NeedsDimensionZero(OpType::kNeighborAllgatherGrad));
  EXPECT_FALSE(NeedsDimensionZero(OpType::kAllreduce));
  EXPECT_FALSE(NeedsDimensionZero(OpType::kBroadcast));
}

TEST(OpRules, ErrorsNameRankOpAndTensor) {
  Status s = OpError(StatusCode::kInvalidArgument, OpType::kBroadcast, "w", "bad root");
  EXPECT_EQ(s.message(), "bluefog broadcast of tensor 'w': bad root");
  EXPECT_EQ(WithRank(3, s).message(), "rank 3: bluefog broadcast of tensor 'w': bad root");
  EXPECT_EQ(WithRank(3, s).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(WithRank(3, Status::Ok()).ok());
  EXPECT_EQ(OpContext(OpType::kNeighborAllgatherGrad, "g"),
            "bluefog neighbor_allgather gradient of tensor 'g'");
}

TEST(OpRules, ReducescatterSplitsLikeHorovod) {
  // 10 rows over 4 ranks: 3, 3, 2, 2.
  EXPECT_EQ(ReducescatterRows(10, 4, 0), 3);
  EXPECT_EQ(ReducescatterRows(10, 4, 1), 3);
  EXPECT_EQ(ReducescatterRows(10, 4, 3), 2);
  EXPECT_EQ(ReducescatterFirstRow(10, 4, 2), 6);
  EXPECT_EQ(ReducescatterFirstRow(10, 4, 3), 8);
  // Fewer rows than ranks: the last ranks get none.
  EXPECT_EQ(ReducescatterRows(1, 3, 0), 1);
  EXPECT_EQ(ReducescatterRows(1, 3, 2), 0);
  EXPECT_EQ(ReducescatterFirstRow(1, 3, 2), 1);
  for (int size = 1; size <= 5; ++size) {
    for (int64_t rows = 0; rows <= 12; ++rows) {
      int64_t total = 0;
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(ReducescatterFirstRow(rows, size, r), total);
        total += ReducescatterRows(rows, size, r);
      }
      EXPECT_EQ(total, rows);
    }
  }
}

}  // namespace
}  // namespace bluefog
