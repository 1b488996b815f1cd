#include "core/validation.h"

#include <gtest/gtest.h>

#include <cmath>

namespace bluefog {
namespace {

Request Req(OpType op, std::vector<int64_t> shape, DataType dtype = DataType::kFloat32) {
  Request r;
  r.meta.name = "t";
  r.meta.op = op;
  r.meta.shape = std::move(shape);
  r.meta.dtype = dtype;
  return r;
}

TEST(Validation, AcceptsPlainRequests) {
  EXPECT_TRUE(ValidateRequest(Req(OpType::kAllreduce, {2, 3})).ok());
  EXPECT_TRUE(ValidateRequest(Req(OpType::kAllreduce, {})).ok());
  EXPECT_TRUE(ValidateRequest(Req(OpType::kAllgather, {0}, DataType::kBool)).ok());
}

TEST(Validation, LocalMistakes) {
  Request r = Req(OpType::kAllreduce, {2});
  r.meta.name = "";
  EXPECT_EQ(ValidateRequest(r).message(),
            "bluefog allreduce of tensor '': the name is empty; pass a non-empty name or None");
  EXPECT_EQ(ValidateRequest(Req(OpType::kAllreduce, {2, -1})).message(),
            "bluefog allreduce of tensor 't': shape [2, -1] has a negative dimension");
  EXPECT_EQ(
      ValidateRequest(Req(OpType::kAllreduce, std::vector<int64_t>(kMaxDims + 1, 1))).message(),
      "bluefog allreduce of tensor 't': rank 65 exceeds 64");
  EXPECT_EQ(ValidateRequest(Req(OpType::kAllreduce, {2}, DataType::kBool)).message(),
            "bluefog allreduce of tensor 't': dtype bool cannot be summed; cast it to an integer "
            "or float dtype first");
  EXPECT_EQ(ValidateRequest(Req(OpType::kAllgather, {})).code(), StatusCode::kInvalidArgument);
  Request avg_min = Req(OpType::kAllreduce, {2});
  avg_min.meta.reduce_op = ReduceOp::kMin;
  avg_min.meta.average = true;
  EXPECT_EQ(ValidateRequest(avg_min).message(),
            "bluefog allreduce of tensor 't': reduction min applies to allreduce without "
            "averaging only");
  avg_min.meta.average = false;
  EXPECT_TRUE(ValidateRequest(avg_min).ok());
  Request scaled_int = Req(OpType::kAllreduce, {2}, DataType::kInt32);
  scaled_int.meta.scale = 0.5;
  EXPECT_NE(ValidateRequest(scaled_int).message().find("prescale_factor and postscale_factor"),
            std::string::npos);
  Request scaled = Req(OpType::kAllreduce, {2});
  scaled.meta.scale = 0.5;
  EXPECT_TRUE(ValidateRequest(scaled).ok());
}

TEST(Validation, LayoutMistakes) {
  Request b = Req(OpType::kBroadcast, {1});
  b.meta.root_rank = 4;
  EXPECT_EQ(ValidateForLayout(b, 0, 4).message(),
            "bluefog broadcast of tensor 't': root_rank 4 is outside [0, 4)");
  b.meta.root_rank = 3;
  EXPECT_TRUE(ValidateForLayout(b, 0, 4).ok());

  Request n = Req(OpType::kNeighborAllreduce, {2});
  n.meta.recv_ranks = {1, 2};
  n.recv_weights = {0.5, 0.5};
  EXPECT_TRUE(ValidateForLayout(n, 0, 3).ok());
  EXPECT_NE(ValidateForLayout(n, 1, 3).message().find("neighbor rank 1 is not another rank"),
            std::string::npos);  // itself
  n.meta.recv_ranks = {2, 1};
  EXPECT_NE(ValidateForLayout(n, 0, 3).message().find("unique and ascending"), std::string::npos);
  n.meta.recv_ranks = {1, 2};
  n.recv_weights = {1.0};
  EXPECT_NE(ValidateForLayout(n, 0, 3).message().find("1 receive weights for 2 source ranks"),
            std::string::npos);
  n.recv_weights = {0.5, 0.5};
  n.meta.dtype = DataType::kInt32;
  EXPECT_NE(ValidateForLayout(n, 0, 3).message().find("dtype int32 cannot be averaged"),
            std::string::npos);

  Request g = Req(OpType::kNeighborAllgather, {});
  EXPECT_NE(ValidateForLayout(g, 0, 2).message().find("needs a tensor of rank >= 1"),
            std::string::npos);
  Request grad = Req(OpType::kNeighborAllgatherGrad, {2}, DataType::kInt64);
  EXPECT_NE(ValidateForLayout(grad, 0, 2).message().find("dtype int64 has no gradient"),
            std::string::npos);
}

TEST(Validation, NamesWithNulAndWeightsThatAreNotFinite) {
  Request r = Req(OpType::kAllreduce, {2});
  r.meta.name = std::string("a\0b", 3);
  EXPECT_EQ(ValidateRequest(r).message(),
            "bluefog allreduce of tensor 'a\\0b': the name contains a NUL character, where a C "
            "string would end; pass a name without \\0");
  Request n = Req(OpType::kNeighborAllreduce, {2});
  n.self_weight = std::nan("");
  EXPECT_NE(ValidateForLayout(n, 0, 2).message().find("self_weight is nan; weights must be "
                                                      "finite"),
            std::string::npos)
      << ValidateForLayout(n, 0, 2).message();
  n.self_weight = 0.5;
  n.meta.recv_ranks = {1};
  n.recv_weights = {INFINITY};
  EXPECT_NE(ValidateForLayout(n, 0, 2).message().find("src_weights has inf for rank 1"),
            std::string::npos)
      << ValidateForLayout(n, 0, 2).message();
  n.recv_weights = {0.5};
  EXPECT_TRUE(ValidateForLayout(n, 0, 2).ok());
}

}  // namespace
}  // namespace bluefog
