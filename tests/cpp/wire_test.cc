#include "core/wire.h"

#include <gtest/gtest.h>

#include "core/status.h"

namespace bluefog {
namespace {

TEST(Wire, RoundTrip) {
  RoundMessage m;
  m.shutdown = true;
  TensorMeta a;
  a.name = "layer/kernel:0";
  a.op = OpType::kBroadcast;
  a.dtype = DataType::kBFloat16;
  a.root_rank = 3;
  a.shape = {5, 0, 7};
  TensorMeta b;
  b.name = std::string(3000, 'x');  // longer than one exchange slot
  m.announcements = {a, b};
  std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  EXPECT_TRUE(back.shutdown);
  ASSERT_EQ(back.announcements.size(), 2u);
  EXPECT_EQ(back.announcements[0].name, a.name);
  EXPECT_EQ(back.announcements[0].op, OpType::kBroadcast);
  EXPECT_EQ(back.announcements[0].dtype, DataType::kBFloat16);
  EXPECT_EQ(back.announcements[0].root_rank, 3);
  EXPECT_EQ(back.announcements[0].shape, a.shape);
  EXPECT_EQ(back.announcements[1].name, b.name);
  EXPECT_TRUE(back.announcements[1].shape.empty());
}

TEST(Wire, AlltoallCarriesItsSplits) {
  RoundMessage m;
  TensorMeta a;
  a.name = "a2a";
  a.op = OpType::kAlltoall;
  a.shape = {6, 2};
  a.splits = {1, 0, 5};
  m.announcements = {a};
  std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  ASSERT_EQ(back.announcements.size(), 1u);
  EXPECT_EQ(back.announcements[0].op, OpType::kAlltoall);
  EXPECT_EQ(back.announcements[0].splits, a.splits);
}

TEST(Wire, WinFreeCarriesItsPendingCount) {
  RoundMessage m;
  TensorMeta f;
  f.name = "w";
  f.op = OpType::kWinFree;
  f.dtype = DataType::kInt32;
  f.splits = {3};
  m.announcements = {f};
  std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  ASSERT_EQ(back.announcements.size(), 1u);
  EXPECT_EQ(back.announcements[0].splits, f.splits);
}

TEST(Wire, NeighborAllgatherGradCarriesItsInputRows) {
  RoundMessage m;
  TensorMeta g;
  g.name = "x.grad";
  g.op = OpType::kNeighborAllgatherGrad;
  g.dtype = DataType::kFloat64;
  g.shape = {2, 3};
  g.send_ranks = {1, 4};
  g.recv_ranks = {4};
  g.input_rows = 9;
  TensorMeta other = g;
  other.op = OpType::kNeighborAllgather;
  other.input_rows = 9;  // not carried: only the gradient op has input rows
  m.announcements = {g, other};
  std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  ASSERT_EQ(back.announcements.size(), 2u);
  EXPECT_EQ(back.announcements[0].input_rows, 9);
  EXPECT_EQ(back.announcements[0].send_ranks, g.send_ranks);
  EXPECT_EQ(back.announcements[0].recv_ranks, g.recv_ranks);
  EXPECT_EQ(back.announcements[1].input_rows, -1);
  EXPECT_EQ(back.announcements[1].op, OpType::kNeighborAllgather);
}

TEST(Wire, AllreduceCarriesItsReduction) {
  RoundMessage m;
  TensorMeta a;
  a.name = "m";
  a.op = OpType::kAllreduce;
  a.reduce_op = ReduceOp::kProduct;
  m.announcements = {a};
  std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  EXPECT_EQ(back.announcements[0].reduce_op, ReduceOp::kProduct);
  bytes.back() = 9;  // no such reduction
  EXPECT_THROW(DecodeRound(bytes.data(), bytes.size()), BluefogError);
}

TEST(Wire, CachedSlotsTravelAsABitSet) {
  RoundMessage m;
  m.cached = {0, 7, 8, 1023};
  m.announcements.resize(1);
  m.announcements[0].name = "new";
  std::string bytes = EncodeRound(m);
  // 4 bytes of flags, 4 of bit-set length, 128 of bits, then the one full announcement.
  EXPECT_LT(bytes.size(), 4u + 4u + 128u + 64u);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  EXPECT_EQ(back.cached, m.cached);
  ASSERT_EQ(back.announcements.size(), 1u);
  EXPECT_EQ(back.announcements[0].name, "new");
  // A hundred cached requests fit in 13 bytes, far below one 1 KiB exchange slot.
  RoundMessage hundred;
  for (uint32_t s = 0; s < 100; ++s) hundred.cached.push_back(s);
  // (and 4 bytes for the count of entries carrying data: none)
  EXPECT_EQ(EncodeRound(hundred).size(), 4u + 4u + 13u + 4u + 4u);
}

TEST(Wire, RoundCarriesTheSendersWaitTotals) {
  RoundMessage m;
  m.has_waits = true;
  m.agreed = 0xfffffffeu;
  m.wait_units = 12345;
  m.shutdown = true;
  const std::string bytes = EncodeRound(m);
  EXPECT_EQ(bytes.size(), 4u + 8u + 4u + 4u + 4u);
  const RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  EXPECT_TRUE(back.has_waits && back.shutdown);
  EXPECT_EQ(back.agreed, 0xfffffffeu);
  EXPECT_EQ(back.wait_units, 12345u);
  EXPECT_FALSE(DecodeRound(EncodeRound(RoundMessage()).data(), 16).has_waits);
}

TEST(Wire, SmallRequestsCarryTheirData) {
  RoundMessage m;
  m.announcements.resize(2);
  m.announcements[0].name = "a";
  m.announcements[1].name = "b";
  m.announcement_data = {"", std::string("\x01\x00\x02", 3)};
  m.cached = {3, 9};
  m.cached_data = {"xyzw", ""};
  const std::string plain = [&] {
    RoundMessage no_data = m;
    no_data.announcement_data.clear();
    no_data.cached_data.clear();
    return EncodeRound(no_data);
  }();
  std::string bytes = EncodeRound(m);
  EXPECT_EQ(bytes.size(), plain.size() + DataCost(3) + DataCost(4));
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  ASSERT_EQ(back.announcement_data.size(), 2u);
  EXPECT_EQ(back.announcement_data[0], "");
  EXPECT_EQ(back.announcement_data[1], std::string("\x01\x00\x02", 3));
  ASSERT_EQ(back.cached_data.size(), 2u);
  EXPECT_EQ(back.cached_data[0], "xyzw");
  EXPECT_EQ(back.cached_data[1], "");
  // Without data the lists stay empty.
  RoundMessage none = DecodeRound(plain.data(), plain.size());
  EXPECT_TRUE(none.announcement_data.empty());
  EXPECT_TRUE(none.cached_data.empty());
  // Data for an entry that does not exist is malformed.
  m.cached_data = {"", "", "extra"};
  bytes = EncodeRound(m);
  EXPECT_THROW(DecodeRound(bytes.data(), bytes.size()), BluefogError);
}

TEST(Wire, EmptyAndTruncated) {
  std::string bytes = EncodeRound(RoundMessage{});
  EXPECT_EQ(DecodeRound(bytes.data(), bytes.size()).announcements.size(), 0u);
  RoundMessage m;
  m.announcements.resize(1);
  m.announcements[0].name = "t";
  bytes = EncodeRound(m);
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_THROW(DecodeRound(bytes.data(), cut), BluefogError) << "cut at " << cut;
}

TEST(Wire, GroupedRequestsCarryTheirGroupSize) {
  RoundMessage m;
  TensorMeta a;
  a.name = "g.3";
  a.op = OpType::kReducescatter;
  a.group_size = 5;
  m.announcements = {a};
  const std::string bytes = EncodeRound(m);
  RoundMessage back = DecodeRound(bytes.data(), bytes.size());
  EXPECT_EQ(back.announcements[0].group_size, 5);
}

}  // namespace
}  // namespace bluefog
