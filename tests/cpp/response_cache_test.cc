#include "core/response_cache.h"

#include <gtest/gtest.h>

#include "core/coordinator.h"
#include "core/status.h"

namespace bluefog {
namespace {

TensorMeta Meta(const std::string& name, std::vector<int64_t> shape) {
  TensorMeta m;
  m.name = name;
  m.shape = std::move(shape);
  return m;
}

// What the coordinator hands the runtime once both ranks announced these metas.
std::vector<Response> Agree(const std::vector<std::vector<TensorMeta>>& per_rank) {
  Coordinator c(2);
  for (const auto& metas : per_rank)
    for (int r = 0; r < 2; ++r) c.Announce(r, metas[r]);
  return c.TakeReady();
}

void Record(ResponseCache& cache, std::vector<Response> ready) { cache.Record(ready); }

TEST(ResponseCache, RemembersExactlyWhatEveryRankAgreedOn) {
  ResponseCache cache(8, 2);
  EXPECT_EQ(cache.Find(Meta("a", {4}), 0), -1);
  Record(cache, Agree({{Meta("a", {4}), Meta("a", {4})}, {Meta("b", {2}), Meta("b", {2})}}));
  EXPECT_EQ(cache.Find(Meta("a", {4}), 0), 0);
  EXPECT_EQ(cache.Find(Meta("b", {2}), 1), 1);
  EXPECT_EQ(cache.Get(1, 0).name, "b");
  // Same name, other metadata: not a hit, so it is announced in full and checked again.
  EXPECT_EQ(cache.Find(Meta("a", {5}), 0), -1);
  TensorMeta bcast = Meta("a", {4});
  bcast.op = OpType::kBroadcast;
  EXPECT_EQ(cache.Find(bcast, 0), -1);
  TensorMeta rows = Meta("a", {4});
  rows.input_rows = 7;  // the neighbor_allgather gradient's input rows are part of the meta
  EXPECT_EQ(cache.Find(rows, 0), -1);
  // Agreeing on the new metadata replaces the entry in place.
  Record(cache, Agree({{Meta("a", {5}), Meta("a", {5})}}));
  EXPECT_EQ(cache.Find(Meta("a", {5}), 1), 0);
  EXPECT_EQ(cache.Find(Meta("a", {4}), 1), -1);
  EXPECT_THROW(cache.Get(5, 0), BluefogError);
}

TEST(ResponseCache, KeepsEachRanksOwnNeighborLists) {
  TensorMeta r0 = Meta("n", {3}), r1 = Meta("n", {3});
  r0.op = r1.op = OpType::kNeighborAllreduce;
  r0.dtype = r1.dtype = DataType::kFloat32;
  r0.send_ranks = r0.recv_ranks = {1};
  r1.send_ranks = r1.recv_ranks = {0};
  ResponseCache cache(4, 2);
  Record(cache, Agree({{r0, r1}}));
  EXPECT_EQ(cache.Find(r0, 0), 0);
  EXPECT_EQ(cache.Find(r1, 1), 0);
  EXPECT_EQ(cache.Find(r1, 0), -1);  // rank 0 with rank 1's lists is a different request
  EXPECT_EQ(cache.Get(0, 1).send_ranks, std::vector<int32_t>{0});
}

TEST(ResponseCache, SkipsFailuresAndEvictsTheLeastRecentlyAgreed) {
  ResponseCache cache(2, 2);
  Record(cache, Agree({{Meta("bad", {1}), Meta("bad", {2})}}));  // shape mismatch
  EXPECT_EQ(cache.size(), 0u);
  Record(cache, Agree({{Meta("x", {1}), Meta("x", {1})}, {Meta("y", {1}), Meta("y", {1})}}));
  Record(cache, Agree({{Meta("x", {1}), Meta("x", {1})}}));  // x is now the more recent
  Record(cache, Agree({{Meta("z", {1}), Meta("z", {1})}}));  // full: y goes, z takes its slot
  EXPECT_EQ(cache.Find(Meta("y", {1}), 0), -1);
  EXPECT_EQ(cache.Find(Meta("z", {1}), 0), 1);
  EXPECT_EQ(cache.Find(Meta("x", {1}), 0), 0);
  ResponseCache off(0, 2);
  Record(off, Agree({{Meta("x", {1}), Meta("x", {1})}}));
  EXPECT_EQ(off.Find(Meta("x", {1}), 0), -1);
}

}  // namespace
}  // namespace bluefog
