#include "core/coordinator.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace bluefog {
namespace {

TensorMeta Meta(const std::string& name, OpType op, std::vector<int64_t> shape,
                DataType dtype = DataType::kFloat32, int root = -1) {
  TensorMeta m;
  m.name = name;
  m.op = op;
  m.shape = std::move(shape);
  m.dtype = dtype;
  m.root_rank = root;
  return m;
}

TEST(Coordinator, ReadyOnlyWhenEveryRankAnnounced) {
  Coordinator c(3);
  c.Announce(0, Meta("a", OpType::kAllreduce, {2}));
  c.Announce(2, Meta("a", OpType::kAllreduce, {2}));
  EXPECT_TRUE(c.TakeReady().empty());
  ASSERT_EQ(c.Waiting().size(), 1u);
  EXPECT_EQ(c.Waiting()[0].missing_ranks, std::vector<int>({1}));
  c.Announce(1, Meta("a", OpType::kAllreduce, {2}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok());
  EXPECT_EQ(c.num_pending(), 0u);
}

TEST(Coordinator, HandsOnTheDataWhenEveryRankSentIt) {
  Coordinator c(3);
  const std::string bytes8(8, 'x');  // two float32s
  c.Announce(0, Meta("a", OpType::kAllreduce, {2}), bytes8);
  c.Announce(1, Meta("a", OpType::kAllreduce, {2}), std::string(8, 'y'));
  c.Announce(2, Meta("a", OpType::kAllreduce, {2}), std::string(8, 'z'));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].inline_data,
            std::vector<std::string>({bytes8, std::string(8, 'y'), std::string(8, 'z')}));
  // One rank without its data (its slot was full): the collective runs as usual.
  c.Announce(0, Meta("b", OpType::kAllreduce, {2}), bytes8);
  c.Announce(1, Meta("b", OpType::kAllreduce, {2}));
  c.Announce(2, Meta("b", OpType::kAllreduce, {2}), bytes8);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].inline_data.empty());
  // Bytes that do not match the rank's own shape are never used.
  c.Announce(0, Meta("c", OpType::kAllreduce, {2}), bytes8);
  c.Announce(1, Meta("c", OpType::kAllreduce, {2}), std::string(4, 'y'));
  c.Announce(2, Meta("c", OpType::kAllreduce, {2}), bytes8);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].inline_data.empty());
  // Nor when ranks disagree: the mismatch error is what every rank gets.
  c.Announce(0, Meta("d", OpType::kAllreduce, {2}), bytes8);
  c.Announce(1, Meta("d", OpType::kAllreduce, {3}), std::string(12, 'y'));
  c.Announce(2, Meta("d", OpType::kAllreduce, {2}), bytes8);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].status.ok());
  EXPECT_TRUE(ready[0].inline_data.empty());
}

TEST(Coordinator, InlineDataOfAllgathersAndBroadcasts) {
  Coordinator c(2);
  // Allgather: each rank's own rows.
  c.Announce(0, Meta("g", OpType::kAllgather, {1, 2}), std::string(8, 'a'));
  c.Announce(1, Meta("g", OpType::kAllgather, {3, 2}), std::string(24, 'b'));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].inline_data,
            std::vector<std::string>({std::string(8, 'a'), std::string(24, 'b')}));
  // Broadcast: the root's bytes are enough.
  c.Announce(0, Meta("b", OpType::kBroadcast, {1}, DataType::kFloat32, 1));
  c.Announce(1, Meta("b", OpType::kBroadcast, {1}, DataType::kFloat32, 1), std::string(4, 'r'));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_EQ(ready[0].inline_data.size(), 2u);
  EXPECT_EQ(ready[0].inline_data[1], std::string(4, 'r'));
  // ... and needed.
  c.Announce(0, Meta("b2", OpType::kBroadcast, {1}, DataType::kFloat32, 1), std::string(4, 'r'));
  c.Announce(1, Meta("b2", OpType::kBroadcast, {1}, DataType::kFloat32, 1));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].inline_data.empty());
}

TEST(Coordinator, NoInlineDataWhileARankHasJoined) {
  Coordinator c(2);
  c.Announce(1, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  c.Announce(0, Meta("x", OpType::kAllreduce, {1}), std::string(4, 'a'));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].joined, std::vector<int>({1}));
  EXPECT_TRUE(ready[0].inline_data.empty());
}

TEST(Coordinator, AlltoallCollectsEverySplitAndChecksTrailingShapes) {
  Coordinator c(2);
  TensorMeta a = Meta("a", OpType::kAlltoall, {3, 4});
  a.splits = {1, 2};
  TensorMeta b = Meta("a", OpType::kAlltoall, {1, 4});
  b.splits = {0, 1};
  c.Announce(0, a);
  c.Announce(1, b);
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok()) << ready[0].status.message();
  EXPECT_EQ(ready[0].all_splits, (std::vector<int64_t>{1, 2, 0, 1}));

  TensorMeta d = Meta("a", OpType::kAlltoall, {2, 5});
  d.splits = {1, 1};
  c.Announce(0, a);
  c.Announce(1, d);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].status.message().find("alltoall tensors may differ only in their first"),
            std::string::npos)
      << ready[0].status.message();
}

// One rank's bad splits fail the alltoall on every rank, naming that rank: a sum that wraps
// around to the rows must not pass (receivers would size outputs from the huge entries).
TEST(Coordinator, AlltoallSplitsAreCheckedForEveryRank) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
      {{kMax, kMax, 2},
       "rank 2's splits [" + std::to_string(kMax) + ", " + std::to_string(kMax) +
           ", 2] add up to more than an int64 holds"},
      {{-1, 1, 0}, "rank 2's splits [-1, 1, 0] has a negative entry"},
      {{1, 1, 1}, "rank 2's splits [1, 1, 1] add up to 3 rows, but the tensor has 0 rows"},
      {{0, 0}, "rank 2's splits has 2 entries for 3 ranks"},
  };
  for (const auto& [splits, want] : cases) {
    Coordinator c(3);
    for (int r = 0; r < 3; ++r) {
      TensorMeta m = Meta("a", OpType::kAlltoall, {r == 2 ? 0 : 3, 4});
      m.splits = r == 2 ? splits : std::vector<int64_t>{1, 1, 1};
      c.Announce(r, m);
    }
    auto ready = c.TakeReady();
    ASSERT_EQ(ready.size(), 1u);
    EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
    EXPECT_NE(ready[0].status.message().find(want), std::string::npos) << ready[0].status.message();
  }
}

TEST(Coordinator, JoinedRanksAreStoodInForUntilEveryRankJoins) {
  Coordinator c(3);
  c.Announce(0, Meta("x", OpType::kAllreduce, {4}));  // before rank 1 joins: waits for it
  EXPECT_TRUE(c.TakeReady().empty());
  c.Announce(1, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  EXPECT_TRUE(c.TakeReady().empty());  // rank 2 has not announced x yet
  c.Announce(2, Meta("x", OpType::kAllreduce, {4}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok()) << ready[0].status.message();
  EXPECT_EQ(ready[0].joined, std::vector<int>({1}));

  c.Announce(0, Meta("g", OpType::kAllgather, {2, 3}));
  c.Announce(2, Meta("g", OpType::kAllgather, {5, 3}));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok());
  EXPECT_EQ(ready[0].first_dims, std::vector<int64_t>({2, 0, 5}));

  c.Announce(0, Meta("b", OpType::kBroadcast, {1}, DataType::kFloat32, 0));
  c.Announce(2, Meta("b", OpType::kBroadcast, {1}, DataType::kFloat32, 0));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].status.message().find("rank(s) [1] have called join()"), std::string::npos)
      << ready[0].status.message();

  c.Announce(2, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  c.Announce(0, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].meta.op, OpType::kJoin);
  EXPECT_EQ(ready[0].last_joined, 0);
  // The join is over: a rank missing from the next allreduce is waited for again.
  c.Announce(0, Meta("y", OpType::kAllreduce, {1}));
  c.Announce(2, Meta("y", OpType::kAllreduce, {1}));
  EXPECT_TRUE(c.TakeReady().empty());
}

TEST(Coordinator, RanksMustAgreeOnAveraging) {
  Coordinator c(2);
  TensorMeta a = Meta("a", OpType::kAllreduce, {2});
  a.average = true;
  c.Announce(0, a);
  c.Announce(1, Meta("a", OpType::kAllreduce, {2}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_NE(ready[0].status.message().find("ranks disagree on the averaging"), std::string::npos)
      << ready[0].status.message();
}

TEST(Coordinator, CompletionOrderFollowsLastAnnouncement) {
  Coordinator c(2);
  c.Announce(0, Meta("x", OpType::kAllreduce, {1}));
  c.Announce(0, Meta("y", OpType::kAllreduce, {1}));
  c.Announce(1, Meta("y", OpType::kAllreduce, {1}));
  c.Announce(1, Meta("x", OpType::kAllreduce, {1}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].meta.name, "y");
  EXPECT_EQ(ready[1].meta.name, "x");
}

TEST(Coordinator, ShapeMismatchNamesTensorAndValues) {
  Coordinator c(2);
  c.Announce(0, Meta("w", OpType::kAllreduce, {2, 3}));
  c.Announce(1, Meta("w", OpType::kAllreduce, {3}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
  const std::string& msg = ready[0].status.message();
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0 has [2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1 has [3]"), std::string::npos) << msg;
}

TEST(Coordinator, OpDtypeAndRootMismatches) {
  Coordinator c(2);
  c.Announce(0, Meta("op", OpType::kAllreduce, {1}));
  c.Announce(1, Meta("op", OpType::kAllgather, {1}));
  c.Announce(0, Meta("dt", OpType::kAllreduce, {1}, DataType::kFloat32));
  c.Announce(1, Meta("dt", OpType::kAllreduce, {1}, DataType::kInt32));
  c.Announce(0, Meta("root", OpType::kBroadcast, {1}, DataType::kFloat32, 0));
  c.Announce(1, Meta("root", OpType::kBroadcast, {1}, DataType::kFloat32, 1));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_NE(ready[0].status.message().find("rank 1 has allgather"), std::string::npos);
  EXPECT_NE(ready[1].status.message().find("rank 1 has int32"), std::string::npos);
  EXPECT_NE(ready[2].status.message().find("root rank"), std::string::npos);
}

TEST(Coordinator, AllgatherFirstDimensionMayDiffer) {
  Coordinator c(3);
  for (int r = 0; r < 3; ++r) c.Announce(r, Meta("g", OpType::kAllgather, {r + 1, 4}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok()) << ready[0].status.message();
  EXPECT_EQ(ready[0].first_dims, std::vector<int64_t>({1, 2, 3}));

  c.Announce(0, Meta("h", OpType::kAllgather, {1, 4}));
  c.Announce(1, Meta("h", OpType::kAllgather, {1, 5}));
  c.Announce(2, Meta("h", OpType::kAllgather, {1, 4}));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
}

// Rank r's gradient holds one block per send rank k, sized like rank k's output (shape[0]).
TEST(Coordinator, NeighborAllgatherGradChecksEachRanksBlocks) {
  auto announce = [](Coordinator& c, const std::string& name, int64_t rank0_rows) {
    // A ring of 3: rank r sends to r + 1 and receives from r - 1; output rows are r + 1.
    for (int r = 0; r < 3; ++r) {
      TensorMeta m = Meta(name, OpType::kNeighborAllgatherGrad, {r + 1, 2});
      m.send_ranks = {(r + 1) % 3};
      m.recv_ranks = {(r + 2) % 3};
      m.input_rows = r == 0 ? rank0_rows : (r + 1) % 3 + 1;
      c.Announce(r, m);
    }
  };
  Coordinator c(3);
  announce(c, "ok", 2);
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].status.ok()) << ready[0].status.message();
  EXPECT_EQ(ready[0].first_dims, std::vector<int64_t>({1, 2, 3}));

  announce(c, "bad", 5);
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
  EXPECT_NE(ready[0].status.message().find("rank 0's upstream gradient has 5 rows"),
            std::string::npos)
      << ready[0].status.message();
  EXPECT_NE(ready[0].status.message().find("ranks [1] have 2 rows"), std::string::npos)
      << ready[0].status.message();
}

TEST(Coordinator, ReductionMismatchNamesEachRanksOp) {
  Coordinator c(3);
  for (int r = 0; r < 3; ++r) {
    TensorMeta m = Meta("x", OpType::kAllreduce, {4});
    m.reduce_op = r == 2 ? ReduceOp::kMin : ReduceOp::kMax;
    c.Announce(r, m);
  }
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
  EXPECT_NE(ready[0].status.message().find("ranks disagree on the reduction: rank 0 has max, "
                                           "rank 2 has min"),
            std::string::npos)
      << ready[0].status.message();
}

TEST(Coordinator, DuplicateAnnouncementIsInternalError) {
  Coordinator c(2);
  c.Announce(0, Meta("d", OpType::kAllreduce, {1}));
  EXPECT_THROW(c.Announce(0, Meta("d", OpType::kAllreduce, {1})), BluefogError);
}

TEST(Coordinator, NameReusableAfterCompletion) {
  Coordinator c(2);
  for (int step = 0; step < 3; ++step) {
    c.Announce(1, Meta("s", OpType::kAllreduce, {step}));
    c.Announce(0, Meta("s", OpType::kAllreduce, {step}));
    auto ready = c.TakeReady();
    ASSERT_EQ(ready.size(), 1u);
    EXPECT_TRUE(ready[0].status.ok());
  }
}

TEST(Coordinator, GroupSizeMismatchFailsEveryTensorOfTheGroup) {
  Coordinator c(2);
  auto grouped = [](const std::string& name, int32_t n) {
    TensorMeta m = Meta(name, OpType::kAllreduce, {2});
    m.group_size = n;
    return m;
  };
  // Rank 1 announces first, with one tensor fewer; rank 0's extra tensor comes after the first
  // mismatch in the same round.
  c.Announce(1, grouped("g.0", 2));
  c.Announce(1, grouped("g.1", 2));
  c.Announce(1, grouped("other", 0));
  c.Announce(0, grouped("g.0", 3));
  c.Announce(0, grouped("g.1", 3));
  c.Announce(0, grouped("g.2", 3));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 3u);
  for (const Response& r : ready) {
    EXPECT_EQ(r.status.code(), StatusCode::kPrecondition) << r.meta.name;
    EXPECT_NE(r.status.message().find("number of tensors in the group"), std::string::npos)
        << r.status.message();
    EXPECT_NE(r.status.message().find("rank 0 has 3, rank 1 has 2"), std::string::npos)
        << r.status.message();
  }
  EXPECT_EQ(ready[2].meta.name, "g.2");
  EXPECT_EQ(ready[2].only_ranks, std::vector<int>({0}));  // rank 1 must not touch its g.2
  ASSERT_EQ(c.num_pending(), 1u);                         // "other" still waits for rank 0
}

TEST(Coordinator, ProcessSetsDoNotStandInForJoinedMembers) {
  Coordinator c(2, {3, 5});  // a set of job-wide ranks 3 and 5
  c.Announce(0, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  c.Announce(1, Meta("x", OpType::kAllreduce, {4}));
  auto ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].status.code(), StatusCode::kPrecondition);
  EXPECT_NE(ready[0].status.message().find("rank(s) [3] of this process set have called join()"),
            std::string::npos)
      << ready[0].status.message();
  EXPECT_EQ(ready[0].only_ranks, std::vector<int>({1}));
  c.Announce(1, Meta("join.0", OpType::kJoin, {}, DataType::kInt32));
  ready = c.TakeReady();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_TRUE(ready[0].status.ok());
  EXPECT_EQ(ready[0].meta.op, OpType::kJoin);
}

}  // namespace
}  // namespace bluefog
