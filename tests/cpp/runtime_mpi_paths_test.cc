// The runtime over real MPI, continued: which large-allreduce algorithm runs where
// (hierarchical across hosts, direct within one host) and its results in place and out of place
// (same executable and conventions as runtime_mpi_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

TEST(RuntimeMpi, HierarchicalAllreduceWhereExpected) {
  // Set by the two-pretend-hosts test: its allreduces must take the hierarchical path.
  const bool expected = std::getenv("BLUEFOG_EXPECT_HIERARCHICAL") != nullptr;
  EXPECT_EQ(Runtime::Get().paths().hierarchical, expected);
  // Those two hosts run two ranks each (0, 1 and 2, 3); otherwise everything is on one host.
  const TransportInfo& info = Runtime::Get().info();
  EXPECT_TRUE(info.homogeneous);
  EXPECT_EQ(info.cross_size, expected ? 2 : 1);
  EXPECT_EQ(info.cross_rank, expected ? Rank() / 2 : 0);
}

// Across hosts an MPI job's allreduces from 64 KiB take Gloo's pairs where BLUEFOG_CROSS_HOST
// or the probe chose them. BLUEFOG_EXPECT_CROSS_HOST (set by the pretend-hosts tests): 1, they
// must; 0, they must not. Either way sums and averages are exact.
TEST(RuntimeMpi, CrossHostAllreduceWhereExpected) {
  const char* expect = std::getenv("BLUEFOG_EXPECT_CROSS_HOST");
  if (expect == nullptr) GTEST_SKIP() << "not a pretend-hosts run";
  const int64_t before = Runtime::Get().GetTuning("cross_host_calls");
  const int n = Size();
  const int64_t count = (int64_t{1} << 18) + 5;  // 1 MiB of float32 and a few
  std::vector<float> data(count);
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 5 + Rank());
  for (bool average : {false, true}) {
    auto done = Submit(OpType::kAllreduce, average ? "cross.avg" : "cross.sum", DataType::kFloat32,
                       {count}, data.data(), average);
    ASSERT_TRUE(Wait(*done).ok());
    const float* out = reinterpret_cast<const float*>(done->output.data());
    for (int64_t i = 0; i < count; ++i) {
      const float sum = static_cast<float>(n * (i % 5) + n * (n - 1) / 2);
      ASSERT_EQ(out[i], average ? sum / n : sum) << i;
    }
  }
  const int64_t taken = Runtime::Get().GetTuning("cross_host_calls") - before;
  EXPECT_EQ(Runtime::Get().GetTuning("cross_host") != 0, std::string(expect) == "1");
  if (std::string(expect) == "1") {
    EXPECT_GE(taken, 2);
  } else {
    EXPECT_EQ(taken, 0);
  }
}

// Whether small collectives complete from the negotiation round's bytes in this run (the
// ring and direct tests turn it off, BLUEFOG_INLINE_THRESHOLD=0, to reach those paths).
bool InlineExpected() {
  const char* v = std::getenv("BLUEFOG_INLINE_THRESHOLD");
  return v == nullptr || std::string(v) != "0";
}

// Small allreduces (sum, average, scale, min), allgathers and broadcasts, eager (driven), joined
// (graph kernels) and handed off: exact results, and they complete from the round's data alone when
// it is on.
TEST(RuntimeMpi, SmallCollectivesFromTheRoundsData) {
  const size_t before = Runtime::Get().completed_inline();
  int expected_inline = 0;
  for (Drive drive : {Drive::kUntilDone, Drive::kJoinRound, Drive::kNo}) {
    const std::string tag = drive == Drive::kUntilDone   ? ".driven"
                            : drive == Drive::kJoinRound ? ".joined"
                                                         : ".queued";
    // Sum and average of float32; int32 averages truncate toward zero.
    std::vector<float> f(5);
    for (int i = 0; i < 5; ++i) f[i] = static_cast<float>(Rank() + 1) + 0.5f * i;
    auto sum = Submit(OpType::kAllreduce, "small.sum" + tag, DataType::kFloat32, {5}, f.data(),
                      false, -1, drive);
    ASSERT_TRUE(Wait(*sum).ok());
    auto avg = Submit(OpType::kAllreduce, "small.avg" + tag, DataType::kFloat32, {5}, f.data(),
                      true, -1, drive);
    ASSERT_TRUE(Wait(*avg).ok());
    const int n = Size();
    for (int i = 0; i < 5; ++i) {
      const float want = n * (n + 1) / 2.0f + n * 0.5f * i;
      EXPECT_EQ(reinterpret_cast<float*>(sum->output.data())[i], want);
      EXPECT_FLOAT_EQ(reinterpret_cast<float*>(avg->output.data())[i], want / n);
    }
    std::vector<int32_t> ints = {Rank() == 0 ? -7 : 2, 3};
    auto iavg = Submit(OpType::kAllreduce, "small.iavg" + tag, DataType::kInt32, {2}, ints.data(),
                       true, -1, drive);
    ASSERT_TRUE(Wait(*iavg).ok());
    const int32_t isum = -7 + 2 * (n - 1);
    EXPECT_EQ(reinterpret_cast<int32_t*>(iavg->output.data())[0], isum / n);
    EXPECT_EQ(reinterpret_cast<int32_t*>(iavg->output.data())[1], 3);
    // A scale factor and a minimum.
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin}) {
      Request req;
      req.meta.name = Concat("small.", ReduceOpName(op), tag);
      req.meta.op = OpType::kAllreduce;
      req.meta.dtype = DataType::kFloat64;
      req.meta.shape = {3};
      req.meta.reduce_op = op;
      if (op == ReduceOp::kSum) req.meta.scale = 0.25;
      std::vector<double> d = {1.0 * Rank(), -2.0 * Rank(), 4.0};
      req.input = d.data();
      auto p = SubmitBuilt(std::move(req), 3 * sizeof(double));
      ASSERT_TRUE(Wait(*p).ok());
      const double* out = reinterpret_cast<const double*>(p->output.data());
      const double ranks = n * (n - 1) / 2.0;
      if (op == ReduceOp::kSum) {
        EXPECT_EQ(out[0], 0.25 * ranks);
        EXPECT_EQ(out[1], -0.5 * ranks);
        EXPECT_EQ(out[2], 0.25 * 4.0 * n);
      } else {
        EXPECT_EQ(out[0], 0.0);
        EXPECT_EQ(out[1], -2.0 * (n - 1));
        EXPECT_EQ(out[2], 4.0);
      }
    }
    // An allgather of rank + 1 rows of 2 int64s each, then a broadcast from the last rank.
    std::vector<int64_t> rows(2 * (Rank() + 1));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 100 * Rank() + static_cast<int64_t>(i);
    auto g = Submit(OpType::kAllgather, "small.gather" + tag, DataType::kInt64, {Rank() + 1, 2},
                    rows.data(), false, -1, drive);
    ASSERT_TRUE(Wait(*g).ok());
    ASSERT_EQ(g->output.size(), sizeof(int64_t) * n * (n + 1));
    const int64_t* got = reinterpret_cast<const int64_t*>(g->output.data());
    for (int r = 0, at = 0; r < n; ++r)
      for (int i = 0; i < 2 * (r + 1); ++i, ++at) EXPECT_EQ(got[at], 100 * r + i);
    std::vector<int16_t> b = {static_cast<int16_t>(Rank()), 9};
    auto bc = Submit(OpType::kBroadcast, "small.bcast" + tag, DataType::kInt16, {2}, b.data(),
                     false, n - 1, drive);
    ASSERT_TRUE(Wait(*bc).ok());
    EXPECT_EQ(reinterpret_cast<int16_t*>(bc->output.data())[0], n - 1);
    EXPECT_EQ(reinterpret_cast<int16_t*>(bc->output.data())[1], 9);
    expected_inline += 7;
  }
  EXPECT_EQ(Runtime::Get().completed_inline() - before,
            InlineExpected() ? static_cast<size_t>(expected_inline) : 0u);
}

// More small requests at once than one rank's slot of a round holds: those that do not fit
// take the collective, and every result is still exact.
TEST(RuntimeMpi, SmallRequestsBeyondOneSlot) {
  constexpr int kRequests = 24;
  std::vector<std::vector<float>> inputs(kRequests);
  std::vector<std::unique_ptr<Pending>> pending;
  for (int k = 0; k < kRequests; ++k) {
    inputs[k].assign(64, static_cast<float>(Rank() * kRequests + k));  // 256 bytes each
    pending.push_back(
        Submit(OpType::kAllreduce, Concat("slot.", k), DataType::kFloat32, {64}, inputs[k].data()));
  }
  const int n = Size();
  for (int k = 0; k < kRequests; ++k) {
    ASSERT_TRUE(Wait(*pending[k]).ok());
    const float want = static_cast<float>(kRequests * n * (n - 1) / 2 + n * k);
    const float* out = reinterpret_cast<const float*>(pending[k]->output.data());
    for (int i = 0; i < 64; ++i) ASSERT_EQ(out[i], want) << "request " << k;
  }
}

TEST(RuntimeMpi, DirectAllreduceWhereExpected) {
  // On one host (every test here but the two pretend hosts) the ranks can read each other's
  // memory on the machines this runs on, unless BLUEFOG_DIRECT_ALLREDUCE=0 turns it off.
  // BLUEFOG_EXPECT_DIRECT=0: ranks in PID namespaces of their own, where a peer's process id
  // names another process (the probe must fail rather than read the wrong memory).
  const char* off = std::getenv("BLUEFOG_DIRECT_ALLREDUCE");
  const char* expect = std::getenv("BLUEFOG_EXPECT_DIRECT");
  const bool expected = Size() > 1 && std::getenv("BLUEFOG_EXPECT_HIERARCHICAL") == nullptr &&
                        !(off != nullptr && std::string(off) == "0") &&
                        !(expect != nullptr && std::string(expect) == "0");
  EXPECT_EQ(Runtime::Get().paths().direct, expected);
}

// Rounds go through shared memory wherever every rank is on one host and could map rank 0's
// segment (not in PID namespaces of their own, where /proc names other processes), unless
// BLUEFOG_LOCAL_ROUNDS=0.
TEST(RuntimeMpi, LocalRoundsWhereExpected) {
  const char* off = std::getenv("BLUEFOG_LOCAL_ROUNDS");
  const char* expect = std::getenv("BLUEFOG_EXPECT_DIRECT");
  const bool expected = Size() > 1 && std::getenv("BLUEFOG_EXPECT_HIERARCHICAL") == nullptr &&
                        !(off != nullptr && std::string(off) == "0") &&
                        !(expect != nullptr && std::string(expect) == "0");
  EXPECT_EQ(Runtime::Get().paths().local_rounds, expected);
  // The segment has no name in any file system (a memfd), so a killed job leaves none behind.
  // Across hosts the hierarchical path's communicator over this host's ranks has one too.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool mapped = false;
  while (std::getline(maps, line))
    mapped |= line.find("/memfd:bluefog-rounds") != std::string::npos;
  EXPECT_EQ(mapped, expected || std::getenv("BLUEFOG_EXPECT_HIERARCHICAL") != nullptr);
  // The staged allreduce where the rounds have their segment, unless BLUEFOG_STAGED_ALLREDUCE=0.
  const char* staged = std::getenv("BLUEFOG_STAGED_ALLREDUCE");
  EXPECT_EQ(Runtime::Get().paths().staged,
            expected && !(staged != nullptr && std::atoll(staged) == 0));
}

// Large allreduces in place (output = input, what TensorFlow's forwarded temporaries get) and
// out of place, over several scratch chunks and uneven segments: exact, and the same bits on
// every rank (each segment is reduced by one rank only).
TEST(RuntimeMpi, LargeAllreduceInPlaceAndOutOfPlaceAgree) {
  const int64_t count = (int64_t{1} << 19) * 3 + 2 * Size() + 1;
  std::vector<float> buf(count), in(count);
  for (int64_t i = 0; i < count; ++i)
    buf[i] = in[i] = static_cast<float>((i % 7) + 0.25 * Rank()) / 3.0f;
  Request req;
  req.meta.name = "inplace.large";
  req.meta.op = OpType::kAllreduce;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {count};
  req.meta.average = true;
  req.input = buf.data();
  req.output = buf.data();
  std::promise<Status> done;
  req.done = [&done](const Status& s) { done.set_value(s); };
  std::future<Status> f = done.get_future();
  ASSERT_TRUE(Runtime::Get().Enqueue(std::move(req)).ok());
  Status s = f.get();
  ASSERT_TRUE(s.ok()) << s.message();
  auto oop =
      Submit(OpType::kAllreduce, "outofplace.large", DataType::kFloat32, {count}, in.data(), true);
  ASSERT_TRUE(Wait(*oop).ok());
  const float* o = reinterpret_cast<const float*>(oop->output.data());
  ASSERT_EQ(std::memcmp(o, buf.data(), count * sizeof(float)), 0);
  const int n = Size();
  for (int64_t i = 0; i < count; i += 4099) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += static_cast<float>((i % 7) + 0.25 * r) / 3.0f;
    ASSERT_NEAR(buf[i], want / n, 1e-5) << i;
  }
  // The same bits everywhere: compare with rank 0's result.
  auto root = Submit(OpType::kBroadcast, "inplace.large.root", DataType::kFloat32, {count},
                     buf.data(), false, 0);
  ASSERT_TRUE(Wait(*root).ok());
  ASSERT_EQ(std::memcmp(root->output.data(), buf.data(), count * sizeof(float)), 0);
}

}  // namespace
}  // namespace bluefog
