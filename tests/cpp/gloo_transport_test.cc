// GlooCommunicator over real processes and Gloo's TCP transport, without the runtime and
// without MPI: gloo_launch.sh starts N copies with MASTER_ADDR, MASTER_PORT, RANK and
// WORLD_SIZE. Expected values are closed-form functions of (rank, size, index).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/reduce_kernels.h"
#include "core/status.h"
#include "transport/gloo/gloo_communicator.h"
#include "transport/gloo/tcp_store.h"

namespace bluefog {
namespace {

GlooCommunicator* transport = nullptr;
GlooSetup setup;
TransportInfo info;

// Rank r's element i: r + 1 + i % 5 (small, so products and half types stay exact).
double Value(int r, int64_t i) { return r + 1 + static_cast<double>(i % 5); }

double Expected(ReduceOp op, int64_t i) {
  double acc = Value(0, i);
  for (int r = 1; r < info.size; ++r) {
    const double v = Value(r, i);
    switch (op) {
      case ReduceOp::kSum: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
    }
  }
  return acc;
}

void Store(DataType dtype, void* data, int64_t i, double v) {
  switch (dtype) {
    case DataType::kFloat32: static_cast<float*>(data)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(data)[i] = v; break;
    case DataType::kInt32: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(data)[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(v); break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(v));
      break;
    default: FAIL() << "no test values for " << DataTypeName(dtype);
  }
}

double Load(DataType dtype, const void* data, int64_t i) {
  switch (dtype) {
    case DataType::kFloat32: return static_cast<const float*>(data)[i];
    case DataType::kFloat64: return static_cast<const double*>(data)[i];
    case DataType::kInt32: return static_cast<const int32_t*>(data)[i];
    case DataType::kInt64: return static_cast<const int64_t*>(data)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(data)[i];
    case DataType::kFloat16: return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kBFloat16: return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    default: return NAN;
  }
}

TEST(GlooTransport, InfoFromTheRendezvous) {
  EXPECT_EQ(info.rank, setup.rank);
  EXPECT_EQ(info.size, setup.size);
  EXPECT_STREQ(transport->backend(), "gloo");
  // One host: every rank is local, and the cross communicator has one rank.
  EXPECT_EQ(info.local_size, info.size);
  EXPECT_EQ(info.local_rank, info.rank);
  EXPECT_EQ(info.cross_size, 1);
  EXPECT_TRUE(info.homogeneous);
}

TEST(GlooTransport, AllreduceEveryOpAndDtype) {
  // 1 element, a few, and more than one Gloo segment (1 MiB) of float32.
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{300001}}) {
    for (DataType dtype :
         {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64,
          DataType::kUInt8, DataType::kFloat16, DataType::kBFloat16}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
        if (count > 7 && dtype != DataType::kFloat32 && dtype != DataType::kFloat16) continue;
        const size_t bytes = static_cast<size_t>(count) * ElementSize(dtype);
        std::vector<char> in(bytes), out(bytes);
        for (int64_t i = 0; i < count; ++i) Store(dtype, in.data(), i, Value(info.rank, i));
        transport->Allreduce(in.data(), out.data(), count, dtype, op);
        int bad = 0;
        for (int64_t i = 0; i < count && bad < 3; ++i) {
          const double want = Expected(op, i);
          const double got = Load(dtype, out.data(), i);
          if (got != want) {
            ++bad;
            ADD_FAILURE() << DataTypeName(dtype) << " " << ReduceOpName(op) << " count " << count
                          << " [" << i << "]: " << got << " != " << want;
          }
        }
      }
    }
  }
}

TEST(GlooTransport, AverageInPlace) {
  const int64_t count = 1000;
  std::vector<double> data(count);
  for (int64_t i = 0; i < count; ++i) data[i] = Value(info.rank, i);
  transport->Allreduce(data.data(), data.data(), count, DataType::kFloat64, ReduceOp::kSum,
                       info.size);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_DOUBLE_EQ(data[i], Expected(ReduceOp::kSum, i) / info.size) << i;
}

TEST(GlooTransport, ReduceScatterUnevenSlices) {
  std::vector<int64_t> counts(info.size);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < info.size; ++r) {
    counts[r] = 3 + 2 * r;
    if (r == info.rank) offset = total;
    total += counts[r];
  }
  std::vector<float> in(total), out(counts[info.rank]);
  for (int64_t i = 0; i < total; ++i) in[i] = static_cast<float>(Value(info.rank, i));
  transport->ReduceScatter(in.data(), out.data(), counts, DataType::kFloat32, ReduceOp::kSum);
  for (int64_t i = 0; i < counts[info.rank]; ++i)
    EXPECT_EQ(out[i], Expected(ReduceOp::kSum, offset + i)) << i;
}

// The ring reduce-scatter with every op, the average, a rank with an empty slice and slices of
// several MiB (each rank's slice r * 1 MiB + 5 elements, rank 0's empty).
TEST(GlooTransport, ReduceScatterOpsAverageAndEmptySlice) {
  std::vector<int64_t> counts(info.size);
  int64_t total = 0, offset = 0;
  for (int r = 0; r < info.size; ++r) {
    counts[r] = r == 0 ? 0 : r * (int64_t{1} << 18) + 5;
    if (r == info.rank) offset = total;
    total += counts[r];
  }
  std::vector<double> in(total), out(counts[info.rank] + 1, -7.0);
  for (int64_t i = 0; i < total; ++i) in[i] = Value(info.rank, i);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    transport->ReduceScatter(in.data(), out.data(), counts, DataType::kFloat64, op);
    for (int64_t i = 0; i < counts[info.rank]; ++i)
      ASSERT_DOUBLE_EQ(out[i], Expected(op, offset + i)) << ReduceOpName(op) << " " << i;
    EXPECT_EQ(out[counts[info.rank]], -7.0);  // nothing written past the slice
  }
  transport->ReduceScatter(in.data(), out.data(), counts, DataType::kFloat64, ReduceOp::kSum,
                           info.size);
  for (int64_t i = 0; i < counts[info.rank]; ++i)
    ASSERT_DOUBLE_EQ(out[i], Expected(ReduceOp::kSum, offset + i) / info.size) << i;
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(in[i], Value(info.rank, i));  // input kept
}

TEST(GlooTransport, AllgathervUnevenAndEmpty) {
  // Rank r sends r * 3 bytes (rank 0 nothing), each byte its rank.
  std::vector<int64_t> bytes(info.size);
  int64_t total = 0;
  for (int r = 0; r < info.size; ++r) total += bytes[r] = 3 * r;
  std::vector<char> in(bytes[info.rank], static_cast<char>(info.rank)), out(total, -1);
  transport->Allgatherv(in.data(), out.data(), bytes);
  int64_t at = 0;
  for (int r = 0; r < info.size; ++r)
    for (int64_t k = 0; k < bytes[r]; ++k) ASSERT_EQ(out[at++], r) << "from rank " << r;
}

TEST(GlooTransport, BroadcastFromEveryRoot) {
  for (int root = 0; root < info.size; ++root) {
    std::vector<int32_t> data(5000, info.rank == root ? 100 + root : -1);
    transport->Broadcast(data.data(), static_cast<int64_t>(data.size() * 4), root);
    for (int32_t v : data) ASSERT_EQ(v, 100 + root);
  }
}

TEST(GlooTransport, NeighborExchangeRing) {
  // Each rank sends to the next and receives from the previous, twice over (two buffers per
  // peer keep their order).
  const int next = (info.rank + 1) % info.size, prev = (info.rank + info.size - 1) % info.size;
  std::vector<int64_t> a(1000, info.rank), b(10, 10 * info.rank), ra(1000, -1), rb(10, -1);
  transport->NeighborExchange({{next, a.data(), 8000}, {next, b.data(), 80}},
                              {{prev, ra.data(), 8000}, {prev, rb.data(), 80}});
  for (int64_t v : ra) ASSERT_EQ(v, prev);
  for (int64_t v : rb) ASSERT_EQ(v, 10 * prev);
}

TEST(GlooTransport, ExchangeAllShortAndLong) {
  // Rank r's message: r * 1500 bytes (rank 0 empty, the others past the slot).
  auto message = [](int r) { return std::string(static_cast<size_t>(r) * 1500, 'a' + r); };
  for (int round = 0; round < 3; ++round) {
    const std::string mine = round == 1 ? std::string("short") : message(info.rank);
    std::vector<std::string> all = transport->ExchangeAll(mine, nullptr);
    ASSERT_EQ(all.size(), static_cast<size_t>(info.size));
    for (int r = 0; r < info.size; ++r)
      EXPECT_EQ(all[r], round == 1 ? std::string("short") : message(r)) << "rank " << r;
  }
}

TEST(GlooTransport, SubsetOfTheLastRanks) {
  // Ranks 1..n-1 form a set (every rank but 0), then allreduce over it.
  std::vector<int> ranks;
  for (int r = 1; r < info.size; ++r) ranks.push_back(r);
  if (info.rank == 0) return;
  std::unique_ptr<Communicator> sub = transport->CreateSubset(ranks, 7);
  ASSERT_EQ(sub->size(), info.size - 1);
  ASSERT_EQ(sub->rank(), info.rank - 1);
  int64_t v = info.rank, sum = 0;
  sub->Allreduce(&v, &sum, 1, DataType::kInt64, ReduceOp::kSum);
  EXPECT_EQ(sum, static_cast<int64_t>(info.size) * (info.size - 1) / 2);
  std::vector<std::string> all = sub->ExchangeAll(std::to_string(info.rank), nullptr);
  for (size_t k = 0; k < all.size(); ++k) EXPECT_EQ(all[k], std::to_string(k + 1));
  sub->Shutdown();
}

TEST(GlooTransport, WrongTokenRefused) {
  if (info.rank != 0) return;
  const int before = transport->refused_connections();
  try {
    TcpStore stray(setup.master_addr, setup.master_port, "not-this-jobs-token", 99,
                   std::chrono::seconds(5));
    FAIL() << "the server accepted a wrong token";
  } catch (const BluefogError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank's job token"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(transport->refused_connections(), before + 1);
}

TEST(GlooTransport, MissingRankTimesOutNamingIt) {
  if (info.rank != 0) return;
  // A job of size+1 at another port in which only this rank arrives.
  GlooSetup lonely = setup;
  lonely.master_port = std::atoi(std::getenv("GLOO_TEST_SPARE_PORT"));
  lonely.size = info.size + 1;
  lonely.timeout = std::chrono::seconds(1);
  lonely.token = JobToken("", lonely.master_addr, lonely.master_port, lonely.size);
  GlooCommunicator alone(lonely);
  try {
    alone.Init();
    FAIL() << "the rendezvous completed without the other ranks";
  } catch (const BluefogError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(Concat("rank(s) 1")), std::string::npos) << text;
    EXPECT_NE(text.find(Concat(" of ", info.size + 1, " never arrived")), std::string::npos)
        << text;
    EXPECT_NE(text.find("BLUEFOG_GLOO_TIMEOUT"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace bluefog

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr) {
      std::fprintf(stderr, "%s is not set; run through tests/cpp/gloo_launch.sh\n", name);
      std::exit(2);
    }
    return std::string(v);
  };
  using bluefog::setup;
  setup.master_addr = env("MASTER_ADDR");
  setup.master_port = std::stoi(env("MASTER_PORT"));
  setup.rank = std::stoi(env("RANK"));
  setup.size = std::stoi(env("WORLD_SIZE"));
  setup.timeout = std::chrono::seconds(60);
  setup.token = bluefog::JobToken("", setup.master_addr, setup.master_port, setup.size);
  bluefog::GlooCommunicator t(setup);
  bluefog::transport = &t;
  bluefog::info = t.Init();
  if (bluefog::info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  // Every rank's verdict decides the exit status of each.
  int worst = result;
  t.Allreduce(&result, &worst, 1, bluefog::DataType::kInt32, bluefog::ReduceOp::kMax);
  t.Shutdown();
  return worst;
}
