// The runtime over real MPI: run under mpirun with 2 and 4 ranks. Every rank runs the same
// tests in the same order; expected values are closed-form functions of (rank, size, index).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "core/reduce_kernels.h"
#include "runtime/runtime.h"

#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

TEST(RuntimeMpi, AllreduceSumAndAverageFloat) {
  std::vector<float> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 13 + Rank());
  auto sum = Submit(OpType::kAllreduce, "sum", DataType::kFloat32, {10, 100}, in.data());
  auto avg = Submit(OpType::kAllreduce, "avg", DataType::kFloat32, {1000}, in.data(), true);
  ASSERT_TRUE(Wait(*sum).ok());
  ASSERT_TRUE(Wait(*avg).ok());
  const int n = Size();
  const float* s = reinterpret_cast<const float*>(sum->output.data());
  const float* a = reinterpret_cast<const float*>(avg->output.data());
  for (size_t i = 0; i < in.size(); ++i) {
    const float expected = static_cast<float>(n * (i % 13) + n * (n - 1) / 2);
    ASSERT_EQ(s[i], expected) << i;
    ASSERT_FLOAT_EQ(a[i], expected / n) << i;
  }
}

// Over the ring threshold and the ring's 1 MiB chunk, with a count that splits unevenly into
// segments and chunks: the chunked reduce-scatter and the folded average must be exact.
TEST(RuntimeMpi, LargeAllreduceSumAndAverageAcrossChunks) {
  const int64_t count = int64_t{3} * 400007 + Size() - 1;  // ~4.8 MB of floats
  std::vector<float> in(count);
  for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 101) * (Rank() + 1));
  auto sum = Submit(OpType::kAllreduce, "large.sum", DataType::kFloat32, {count}, in.data());
  auto avg = Submit(OpType::kAllreduce, "large.avg", DataType::kFloat32, {count}, in.data(), true);
  std::vector<int32_t> ints(count, Rank() + 1);
  auto iavg = Submit(OpType::kAllreduce, "large.int", DataType::kInt32, {count}, ints.data(), true);
  ASSERT_TRUE(Wait(*sum).ok());
  ASSERT_TRUE(Wait(*avg).ok());
  ASSERT_TRUE(Wait(*iavg).ok());
  const int n = Size();
  const float* s = reinterpret_cast<const float*>(sum->output.data());
  const float* a = reinterpret_cast<const float*>(avg->output.data());
  const int32_t* ia = reinterpret_cast<const int32_t*>(iavg->output.data());
  for (int64_t i = 0; i < count; ++i) {
    const float expected = static_cast<float>((i % 101) * n * (n + 1) / 2);
    ASSERT_EQ(s[i], expected) << i;
    ASSERT_EQ(a[i], expected / static_cast<float>(n)) << i;
    ASSERT_EQ(ia[i], (n * (n + 1) / 2) / n) << i;
  }
}

// Across hosts the ring keeps several chunks in flight each way and the two-host split of the
// hierarchical allreduce several receives: a count whose segments span more chunks than are in
// flight (reusing each receive slot), split unevenly, for the sum, the average and the max.
TEST(RuntimeMpi, AllreduceOfManyChunksInFlight) {
  const int64_t count = int64_t{13} * 262144 * Size() / 2 + 2 * Size() + 1;  // 13 MiB at 2 ranks
  std::vector<float> in(count);
  for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 97) + Rank());
  auto sum = Submit(OpType::kAllreduce, "deep.sum", DataType::kFloat32, {count}, in.data());
  auto avg = Submit(OpType::kAllreduce, "deep.avg", DataType::kFloat32, {count}, in.data(), true);
  Request req;
  req.meta.name = "deep.max";
  req.meta.op = OpType::kAllreduce;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {count};
  req.meta.reduce_op = ReduceOp::kMax;
  req.input = in.data();
  auto max = SubmitBuilt(std::move(req), count * static_cast<int64_t>(sizeof(float)));
  ASSERT_TRUE(Wait(*sum).ok());
  ASSERT_TRUE(Wait(*avg).ok());
  ASSERT_TRUE(Wait(*max).ok());
  const int n = Size();
  const float* s = reinterpret_cast<const float*>(sum->output.data());
  const float* a = reinterpret_cast<const float*>(avg->output.data());
  const float* m = reinterpret_cast<const float*>(max->output.data());
  for (int64_t i = 0; i < count; ++i) {
    const float expected = static_cast<float>(n * (i % 97) + n * (n - 1) / 2);
    ASSERT_EQ(s[i], expected) << i;
    ASSERT_EQ(a[i], expected / static_cast<float>(n)) << i;
    ASSERT_EQ(m[i], static_cast<float>((i % 97) + n - 1)) << i;
  }
}

// Large allreduces run alone (not fused) and last; the small ones around them still fuse. Mixed
// and submitted together, every result must be right whatever the order of execution.
TEST(RuntimeMpi, LargeAndSmallAllreducesSubmittedTogether) {
  std::vector<std::vector<float>> inputs;
  std::vector<std::unique_ptr<Pending>> pending;
  for (int k = 0; k < 12; ++k) {
    const int64_t count = k % 4 == 1 ? (int64_t{1} << 18) + k : 100 + k;  // 1 MiB+ or small
    inputs.emplace_back(count, static_cast<float>(Rank() + k));
    pending.push_back(Submit(OpType::kAllreduce, "mixed." + std::to_string(k), DataType::kFloat32,
                             {count}, inputs.back().data(), k % 3 == 0));
  }
  const int n = Size();
  for (int k = 0; k < 12; ++k) {
    ASSERT_TRUE(Wait(*pending[k]).ok()) << k;
    const float sum = static_cast<float>(n * k + n * (n - 1) / 2);
    const float want = k % 3 == 0 ? sum / static_cast<float>(n) : sum;
    const float* out = reinterpret_cast<const float*>(pending[k]->output.data());
    for (size_t e = 0; e < inputs[k].size(); ++e) ASSERT_EQ(out[e], want) << k << " " << e;
  }
}

TEST(RuntimeMpi, AllreduceHalfAndInt) {
  std::vector<uint16_t> h(64, FloatToHalf(static_cast<float>(Rank() + 1)));
  std::vector<int64_t> i(64, Rank() + 1);
  auto ph = Submit(OpType::kAllreduce, "half", DataType::kFloat16, {64}, h.data());
  auto pi = Submit(OpType::kAllreduce, "int", DataType::kInt64, {8, 8}, i.data(), true);
  ASSERT_TRUE(Wait(*ph).ok());
  ASSERT_TRUE(Wait(*pi).ok());
  const int n = Size();
  const uint16_t* hs = reinterpret_cast<const uint16_t*>(ph->output.data());
  const int64_t* is = reinterpret_cast<const int64_t*>(pi->output.data());
  for (int k = 0; k < 64; ++k) {
    EXPECT_EQ(HalfToFloat(hs[k]), n * (n + 1) / 2.0f);
    EXPECT_EQ(is[k], (n * (n + 1) / 2) / n);
  }
}

TEST(RuntimeMpi, ManyConcurrentRequestsInRankDependentOrder) {
  // Odd ranks submit in reverse order; negotiation must still pair requests by name.
  constexpr int kCount = 60;
  std::vector<std::vector<float>> inputs(kCount);
  std::vector<std::unique_ptr<Pending>> pending(kCount);
  std::vector<int> order(kCount);
  std::iota(order.begin(), order.end(), 0);
  if (Rank() % 2) std::reverse(order.begin(), order.end());
  for (int k : order) {
    inputs[k].assign(k + 1, static_cast<float>(Rank() * 100 + k));
    pending[k] = Submit(OpType::kAllreduce, "many." + std::to_string(k), DataType::kFloat32,
                        {k + 1}, inputs[k].data());
  }
  const int n = Size();
  for (int k = 0; k < kCount; ++k) {
    ASSERT_TRUE(Wait(*pending[k]).ok()) << k;
    const float* out = reinterpret_cast<const float*>(pending[k]->output.data());
    for (int e = 0; e <= k; ++e) ASSERT_EQ(out[e], 100.0f * n * (n - 1) / 2 + n * k);
  }
}

TEST(RuntimeMpi, AllgatherVariableFirstDimension) {
  const int rows = Rank() + 1;
  std::vector<int32_t> in(rows * 3);
  for (int e = 0; e < rows * 3; ++e) in[e] = Rank() * 1000 + e;
  auto p = Submit(OpType::kAllgather, "gather", DataType::kInt32, {rows, 3}, in.data());
  ASSERT_TRUE(Wait(*p).ok());
  const int32_t* out = reinterpret_cast<const int32_t*>(p->output.data());
  size_t pos = 0;
  for (int r = 0; r < Size(); ++r)
    for (int e = 0; e < (r + 1) * 3; ++e) ASSERT_EQ(out[pos++], r * 1000 + e);
  EXPECT_EQ(pos * sizeof(int32_t), p->output.size());
}

TEST(RuntimeMpi, BroadcastFromEveryRoot) {
  for (int root = 0; root < Size(); ++root) {
    std::vector<double> in(17, Rank() + 0.5);
    auto p = Submit(OpType::kBroadcast, "bcast." + std::to_string(root), DataType::kFloat64, {17},
                    in.data(), false, root);
    ASSERT_TRUE(Wait(*p).ok());
    const double* out = reinterpret_cast<const double*>(p->output.data());
    for (int e = 0; e < 17; ++e) ASSERT_EQ(out[e], root + 0.5);
  }
}

TEST(RuntimeMpi, ShapeMismatchFailsEveryRankThenRecovers) {
  std::vector<float> in(8, 1.0f);
  auto bad =
      Submit(OpType::kAllreduce, "mismatch", DataType::kFloat32, {Rank() == 0 ? 2 : 4}, in.data());
  Status s = Wait(*bad);
  EXPECT_EQ(s.code(), StatusCode::kPrecondition);
  EXPECT_NE(s.message().find("'mismatch'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank " + std::to_string(Rank()) + ":"), std::string::npos);
  auto good = Submit(OpType::kAllreduce, "after_mismatch", DataType::kFloat32, {8}, in.data());
  ASSERT_TRUE(Wait(*good).ok());
  EXPECT_EQ(reinterpret_cast<const float*>(good->output.data())[0], static_cast<float>(Size()));
}

// Repeated names go out as response-cache bits after their first agreement. A cached name with
// new metadata on every rank is agreed again; one on some ranks only fails on every rank, as
// an uncached mismatch does, and the cached entry keeps working afterwards.
TEST(RuntimeMpi, RepeatedNamesThroughTheResponseCache) {
  std::vector<float> in(64);
  for (int step = 0; step < 6; ++step) {
    for (int k = 0; k < 20; ++k) {
      std::fill(in.begin(), in.end(), static_cast<float>(Rank() + step + k));
      const int64_t len = step < 3 ? 16 : 32;  // every rank changes shape at step 3
      auto p = Submit(OpType::kAllreduce, "cached." + std::to_string(k), DataType::kFloat32, {len},
                      in.data(), k % 2 == 1);
      ASSERT_TRUE(Wait(*p).ok()) << step << " " << k;
      const float sum = static_cast<float>(Size() * (step + k) + Size() * (Size() - 1) / 2);
      const float* out = reinterpret_cast<const float*>(p->output.data());
      for (int64_t e = 0; e < len; ++e)
        ASSERT_EQ(out[e], k % 2 == 1 ? sum / static_cast<float>(Size()) : sum) << step << k;
    }
  }
  auto bad = Submit(OpType::kAllreduce, "cached.0", DataType::kFloat32, {Rank() == 0 ? 32 : 16},
                    in.data());
  Status s = Wait(*bad);
  if (Size() > 1) {
    EXPECT_EQ(s.code(), StatusCode::kPrecondition) << s.message();
    EXPECT_NE(s.message().find("'cached.0'"), std::string::npos) << s.message();
  }
  auto again = Submit(OpType::kAllreduce, "cached.0", DataType::kFloat32, {32}, in.data());
  ASSERT_TRUE(Wait(*again).ok());
}

TEST(RuntimeMpi, LocalValidationBeforeCommunication) {
  std::vector<float> in(4, 1.0f);
  auto root =
      Submit(OpType::kBroadcast, "badroot", DataType::kFloat32, {4}, in.data(), false, Size());
  EXPECT_EQ(Wait(*root).code(), StatusCode::kInvalidArgument);
  bool flags[2] = {true, false};
  auto boolsum = Submit(OpType::kAllreduce, "boolsum", DataType::kBool, {2}, flags);
  EXPECT_EQ(Wait(*boolsum).code(), StatusCode::kInvalidArgument);
  auto scalar = Submit(OpType::kAllgather, "scalar", DataType::kFloat32, {}, in.data());
  EXPECT_EQ(Wait(*scalar).code(), StatusCode::kInvalidArgument);
}

TEST(RuntimeMpi, DuplicateNameInFlightIsRejected) {
  std::vector<float> in(4, 1.0f);
  // Rank 0 submits "dup" twice while the first is surely in flight: the other ranks submit
  // "dup" only after the "dup.ready" collective, which rank 0 joins after its check. (Submitting
  // "dup" on every rank at once let the first complete before the second on a slow run, which
  // then waited forever for a partner.)
  std::unique_ptr<Pending> first;
  if (Rank() == 0) {
    first = Submit(OpType::kAllreduce, "dup", DataType::kFloat32, {4}, in.data());
    auto second = Submit(OpType::kAllreduce, "dup", DataType::kFloat32, {4}, in.data());
    Status s = Wait(*second);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("already in flight"), std::string::npos) << s.message();
  }
  auto ready = Submit(OpType::kAllreduce, "dup.ready", DataType::kFloat32, {4}, in.data());
  EXPECT_TRUE(Wait(*ready).ok());
  if (Rank() != 0) first = Submit(OpType::kAllreduce, "dup", DataType::kFloat32, {4}, in.data());
  EXPECT_TRUE(Wait(*first).ok());
}

TEST(RuntimeMpi, FusedNeighborAllreducesWithTheirOwnWeights) {
  // Ring: receive from the left, send to the right; several requests submitted together fuse.
  // Request k: self weight 1/(k+2), left weight 1 - 1/(k+2), and odd k scale what they send by k.
  const int n = Size();
  if (n < 2) return;
  const int left = (Rank() - 1 + n) % n;
  const int right = (Rank() + 1) % n;
  constexpr int kCount = 6;
  std::vector<std::vector<double>> inputs(kCount);
  std::vector<std::unique_ptr<Pending>> pending;
  for (int k = 0; k < kCount; ++k) {
    inputs[k].assign(k + 3, 10.0 * Rank() + k);
    auto p = std::make_unique<Pending>();
    p->output.resize(inputs[k].size() * sizeof(double));
    Request req;
    req.meta.name = "nbr." + std::to_string(k);
    req.meta.op = OpType::kNeighborAllreduce;
    req.meta.dtype = DataType::kFloat64;
    req.meta.shape = {static_cast<int64_t>(inputs[k].size())};
    req.meta.send_ranks = {right};
    req.meta.recv_ranks = {left};
    if (n == 2) req.meta.recv_ranks = req.meta.send_ranks;  // left == right
    req.input = inputs[k].data();
    req.output = p->output.data();
    req.self_weight = 1.0 / (k + 2);
    req.recv_weights = {1.0 - 1.0 / (k + 2)};
    if (k % 2) req.send_weights = {static_cast<double>(k)};
    Pending* raw = p.get();
    req.done = [raw](const Status& s) { raw->promise.set_value(s); };
    Status s = Runtime::Get().Enqueue(std::move(req));
    if (!s.ok()) p->promise.set_value(s);
    pending.push_back(std::move(p));
  }
  for (int k = 0; k < kCount; ++k) {
    Status s = Wait(*pending[k]);
    ASSERT_TRUE(s.ok()) << s.message();
    const double* out = reinterpret_cast<const double*>(pending[k]->output.data());
    const double scale = (k % 2) ? k : 1.0;
    const double expected =
        (10.0 * Rank() + k) / (k + 2) + (1.0 - 1.0 / (k + 2)) * scale * (10.0 * left + k);
    for (size_t e = 0; e < inputs[k].size(); ++e) ASSERT_DOUBLE_EQ(out[e], expected) << k;
  }
}

TEST(RuntimeMpi, MinMaxProductOnBothPaths) {
  // Element e of rank r: ((e + r) % 5) - 2. 7 elements go through MPI_Allreduce with bluefog's
  // own MPI op, 2^19 floats (2 MiB) through the ring or the direct path.
  for (int64_t n : {int64_t{7}, int64_t{1} << 19}) {
    std::vector<float> in(n);
    for (int64_t e = 0; e < n; ++e) in[e] = static_cast<float>((e + Rank()) % 5 - 2);
    for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      Request req;
      req.meta.name = Concat("reduce.", ReduceOpName(op), ".", n);
      req.meta.op = OpType::kAllreduce;
      req.meta.dtype = DataType::kFloat32;
      req.meta.shape = {n};
      req.meta.reduce_op = op;
      req.input = in.data();
      auto p = SubmitBuilt(std::move(req), n * sizeof(float));
      Status s = Wait(*p);
      ASSERT_TRUE(s.ok()) << s.message();
      const float* out = reinterpret_cast<const float*>(p->output.data());
      for (int64_t e = 0; e < n; e += (n > 100 ? 997 : 1)) {
        float want = op == ReduceOp::kProduct ? 1.0f : static_cast<float>(e % 5 - 2);
        for (int r = 0; r < Size(); ++r) {
          const float v = static_cast<float>((e + r) % 5 - 2);
          if (op == ReduceOp::kMin) want = std::min(want, v);
          if (op == ReduceOp::kMax) want = std::max(want, v);
          if (op == ReduceOp::kProduct) want *= v;
        }
        ASSERT_EQ(out[e], want) << ReduceOpName(op) << " n=" << n << " e=" << e;
      }
    }
  }
  // Averaging is for sums only: refused before any communication.
  Request bad;
  bad.meta.name = "reduce.bad";
  bad.meta.op = OpType::kAllreduce;
  bad.meta.shape = {1};
  bad.meta.reduce_op = ReduceOp::kMax;
  bad.meta.average = true;
  float one = 1.0f, out = 0.0f;
  bad.input = &one;
  bad.output = &out;
  bad.done = [](const Status&) {};
  EXPECT_EQ(Runtime::Get().Enqueue(std::move(bad)).code(), StatusCode::kInvalidArgument);
}

TEST(RuntimeMpi, NeighborAllgatherGradSendsEachBlockHome) {
  // Rank r's output has r + 1 rows of 2. Rank r "gathered" from every other rank, so its input
  // holds one block per other rank k (k + 1 rows) filled with 100 * r + k; rank k's output is
  // the sum over r != k of 100 * r + k. A lone rank has nothing to receive: zeros.
  const int n = Size();
  std::vector<int32_t> others;
  int64_t in_rows = 0;
  for (int k = 0; k < n; ++k)
    if (k != Rank()) others.push_back(k), in_rows += k + 1;
  std::vector<float> in;
  for (int k : others) in.insert(in.end(), (k + 1) * 2, 100.0f * Rank() + k);
  Request req;
  req.meta.name = "nag.grad";
  req.meta.op = OpType::kNeighborAllgatherGrad;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {Rank() + 1, 2};
  req.meta.send_ranks = others;
  req.meta.recv_ranks = others;
  req.meta.input_rows = in_rows;
  req.input = in.data();
  // The output starts as garbage, which the result must overwrite.
  auto p = SubmitBuilt(std::move(req), (Rank() + 1) * 2 * sizeof(float), 1);
  Status s = Wait(*p);
  ASSERT_TRUE(s.ok()) << s.message();
  float expected = 0;
  for (int r : others) expected += 100.0f * r + Rank();
  const float* out = reinterpret_cast<const float*>(p->output.data());
  for (int e = 0; e < (Rank() + 1) * 2; ++e) ASSERT_EQ(out[e], expected) << e;
}

// An allgather whose output cannot be allocated on one rank (the framework's allocator throws
// std::bad_alloc) fails there with the reason, still takes part in the exchange, and leaves the
// runtime usable on every rank.

TEST(RuntimeMpi, ZeroElementTensors) {
  auto p = Submit(OpType::kAllreduce, "empty", DataType::kFloat32, {0, 5}, nullptr);
  EXPECT_TRUE(Wait(*p).ok());
  auto g = Submit(OpType::kAllgather, "empty_gather", DataType::kFloat32, {0, 5}, nullptr);
  EXPECT_TRUE(Wait(*g).ok());
  EXPECT_TRUE(g->output.empty());
}

}  // namespace
}  // namespace bluefog

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  bluefog::Runtime::Get().Init();
  // Only rank 0 prints the per-test lines; every rank's failures still fail its exit code.
  if (bluefog::Runtime::Get().info().rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int result = RUN_ALL_TESTS();
  bluefog::Runtime::Get().Shutdown();
  // After shutdown, requests fail with a clear error instead of hanging.
  float x = 0;
  auto after = bluefog::testing_util::Submit(bluefog::OpType::kAllreduce, "late",
                                             bluefog::DataType::kFloat32, {1}, &x);
  bluefog::Status s = bluefog::testing_util::Wait(*after);
  if (s.code() != bluefog::StatusCode::kAborted ||
      s.message().find("shut down") == std::string::npos) {
    std::fprintf(stderr, "after shutdown: unexpected status %d: %s\n", static_cast<int>(s.code()),
                 s.message().c_str());
    result = 1;
  }
  return result;
}
