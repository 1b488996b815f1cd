// The runtime over real MPI: run under mpirun with 2 and 4 ranks. Every rank runs the same
// tests in the same order; expected values are closed-form functions of (rank, size, index).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <vector>

#include "core/reduce_kernels.h"
#include "core/runtime.h"

namespace bluefog {
namespace {

int Rank() { return Runtime::Get().info().rank; }
int Size() { return Runtime::Get().info().size; }

// A submitted request whose result can be awaited.
struct Pending {
  std::promise<Status> promise;
  std::future<Status> future = promise.get_future();
  std::vector<char> output;
};

std::unique_ptr<Pending> Submit(OpType op, const std::string& name, DataType dtype,
                                std::vector<int64_t> shape, const void* input, bool average = false,
                                int root = -1) {
  auto p = std::make_unique<Pending>();
  Request req;
  req.meta.name = name;
  req.meta.op = op;
  req.meta.dtype = dtype;
  req.meta.shape = std::move(shape);
  req.meta.root_rank = root;
  req.input = input;
  req.average = average;
  if (op != OpType::kAllgather) {
    p->output.resize(req.meta.NumBytes());
    req.output = p->output.data();
  } else {
    Pending* raw = p.get();
    req.allocate_output = [raw, dtype](const std::vector<int64_t>& s) -> void* {
      int64_t n = 1;
      for (int64_t d : s) n *= d;
      raw->output.resize(n * ElementSize(dtype));
      return raw->output.data();
    };
  }
  Pending* raw = p.get();
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  Status s = Runtime::Get().Enqueue(std::move(req));
  if (!s.ok()) p->promise.set_value(s);
  return p;
}

Status Wait(Pending& p) { return p.future.get(); }

// Enqueues a request built by the caller (meta and input set), with an output of
// `output_bytes` filled with `fill`; Wait() on the result.
std::unique_ptr<Pending> SubmitBuilt(Request req, size_t output_bytes, char fill = 0) {
  auto p = std::make_unique<Pending>();
  p->output.assign(output_bytes, fill);
  req.output = p->output.data();
  Pending* raw = p.get();
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  Status s = Runtime::Get().Enqueue(std::move(req));
  if (!s.ok()) p->promise.set_value(s);
  return p;
}

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
  // own MPI op, 2^19 floats (2 MiB) through the ring.
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
  bad.average = true;
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
TEST(RuntimeMpi, AllgatherOutputAllocationFailureFailsOnlyThatRequest) {
  std::vector<float> in(3, static_cast<float>(Rank()));
  auto p = std::make_unique<Pending>();
  Request req;
  req.meta.name = "alloc_fails";
  req.meta.op = OpType::kAllgather;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {3};
  req.input = in.data();
  Pending* raw = p.get();
  req.allocate_output = [raw](const std::vector<int64_t>& shape) -> void* {
    if (Rank() == 0) throw std::bad_alloc();
    raw->output.resize(shape[0] * sizeof(float));
    return raw->output.data();
  };
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  ASSERT_TRUE(Runtime::Get().Enqueue(std::move(req)).ok());
  Status s = Wait(*p);
  if (Rank() == 0) {
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("rank 0: bluefog allgather of tensor 'alloc_fails': cannot "
                               "allocate the output of shape [" +
                               std::to_string(3 * Size()) + "]"),
              std::string::npos)
        << s.message();
  } else {
    ASSERT_TRUE(s.ok()) << s.message();
    const float* out = reinterpret_cast<const float*>(p->output.data());
    for (int e = 0; e < 3 * Size(); ++e) EXPECT_EQ(out[e], static_cast<float>(e / 3)) << e;
  }
  float x = 1;
  auto after = Submit(OpType::kAllreduce, "after_alloc_failure", DataType::kFloat32, {1}, &x);
  ASSERT_TRUE(Wait(*after).ok());
  EXPECT_EQ(*reinterpret_cast<const float*>(after->output.data()), static_cast<float>(Size()));
}

// Rank r sends j + r + 1 rows of 2 elements to rank j; each row holds 100 * r + j. Rank r then
// receives r + j + 1 rows from rank j, in rank order, each holding 100 * j + r.
TEST(RuntimeMpi, AlltoallUnevenSplits) {
  const int n = Size(), me = Rank();
  std::vector<int64_t> splits;
  std::vector<float> in;
  for (int j = 0; j < n; ++j) {
    splits.push_back(j + me + 1);
    for (int k = 0; k < 2 * (j + me + 1); ++k) in.push_back(100.0f * me + j);
  }
  auto p = std::make_unique<Pending>();
  std::vector<int64_t> received(n, -1);
  Request req;
  req.meta.name = "alltoall.uneven";
  req.meta.op = OpType::kAlltoall;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {static_cast<int64_t>(in.size() / 2), 2};
  req.meta.splits = splits;
  req.input = in.data();
  req.received_splits = received.data();
  Pending* raw = p.get();
  req.allocate_output = [raw](const std::vector<int64_t>& shape) -> void* {
    raw->output.resize(shape[0] * shape[1] * sizeof(float));
    return raw->output.data();
  };
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  ASSERT_TRUE(Runtime::Get().Enqueue(std::move(req)).ok());
  ASSERT_TRUE(Wait(*p).ok());
  const float* out = reinterpret_cast<const float*>(p->output.data());
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(received[j], me + j + 1) << j;
    for (int k = 0; k < 2 * (me + j + 1); ++k) ASSERT_EQ(out[at++], 100.0f * j + me) << j;
  }
  EXPECT_EQ(at * sizeof(float), p->output.size());
}

TEST(RuntimeMpi, AlltoallSplitsMustMatchTheRows) {
  std::vector<float> in(4, 1.0f);
  Request req;
  req.meta.name = "alltoall.bad";
  req.meta.op = OpType::kAlltoall;
  req.meta.shape = {4};
  req.meta.splits = std::vector<int64_t>(Size(), 5);
  req.input = in.data();
  req.done = [](const Status&) {};
  Status s = Runtime::Get().Enqueue(std::move(req));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("add up to " + std::to_string(5 * Size()) + " rows"),
            std::string::npos)
      << s.message();
}

// 2 * size + 1 rows: the first rank gets one extra row. Row i holds (i + 1) * (rank + 1).
TEST(RuntimeMpi, ReducescatterSumAndAverage) {
  const int n = Size(), me = Rank();
  const int64_t rows = 2 * n + 1;
  std::vector<double> in(rows * 3);
  for (int64_t i = 0; i < rows * 3; ++i) in[i] = static_cast<double>((i / 3 + 1) * (me + 1));
  const int64_t my_rows = me == 0 ? 3 : 2;
  const int64_t first = me == 0 ? 0 : 2 * me + 1;
  for (bool average : {false, true}) {
    Request req;
    req.meta.name = average ? "rs.avg" : "rs.sum";
    req.meta.op = OpType::kReducescatter;
    req.meta.dtype = DataType::kFloat64;
    req.meta.shape = {rows, 3};
    req.input = in.data();
    req.average = average;
    auto p = SubmitBuilt(std::move(req), my_rows * 3 * sizeof(double));
    ASSERT_TRUE(Wait(*p).ok());
    const double* out = reinterpret_cast<const double*>(p->output.data());
    const double ranks_sum = n * (n + 1) / 2.0;
    for (int64_t e = 0; e < my_rows * 3; ++e) {
      const double want = (first + e / 3 + 1) * ranks_sum / (average ? n : 1);
      ASSERT_DOUBLE_EQ(out[e], want) << e;
    }
  }
}

// Even and odd ranks each get a process set. The even set's allreduce must finish while the
// odd ranks wait on a global allreduce that the even ranks join only afterwards: if the set's
// collective waited for ranks outside it, this would hang (and ctest's timeout would fail it).
TEST(RuntimeMpi, ProcessSetsDoNotWaitForRanksOutsideThem) {
  const int n = Size(), me = Rank();
  std::vector<int> even, odd;
  for (int r = 0; r < n; ++r) (r % 2 ? odd : even).push_back(r);
  const int even_id = Runtime::Get().AddProcessSet(even);
  const int odd_id = Runtime::Get().AddProcessSet(odd);
  EXPECT_NE(even_id, odd_id);
  const std::vector<int>& mine = me % 2 ? odd : even;
  const int my_id = me % 2 ? odd_id : even_id;
  int set_rank = -1, set_size = -1;
  ASSERT_TRUE(Runtime::Get().SetLayout(my_id, &set_rank, &set_size));
  EXPECT_EQ(set_size, static_cast<int>(mine.size()));
  EXPECT_EQ(mine[set_rank], me);

  float gate_in = 1;
  auto run_set_ops = [&] {
    std::vector<float> in(3, static_cast<float>(me + 1));
    Request req;
    req.meta.name = "set.sum";
    req.meta.op = OpType::kAllreduce;
    req.meta.shape = {3};
    req.input = in.data();
    req.average = true;
    req.process_set = my_id;
    auto p = SubmitBuilt(std::move(req), 3 * sizeof(float));
    ASSERT_TRUE(Wait(*p).ok());
    float want = 0;
    for (int r : mine) want += static_cast<float>(r + 1);
    want /= static_cast<float>(mine.size());
    EXPECT_EQ(reinterpret_cast<const float*>(p->output.data())[2], want);
    // broadcast from the set's last rank, named by its job-wide rank
    float value = static_cast<float>(me);
    Request b;
    b.meta.name = "set.bcast";
    b.meta.op = OpType::kBroadcast;
    b.meta.shape = {1};
    b.meta.root_rank = mine.back();
    b.input = &value;
    b.process_set = my_id;
    auto q = SubmitBuilt(std::move(b), sizeof(float));
    ASSERT_TRUE(Wait(*q).ok());
    EXPECT_EQ(*reinterpret_cast<const float*>(q->output.data()), static_cast<float>(mine.back()));
  };
  if (me % 2 == 0) run_set_ops();
  auto gate = Submit(OpType::kAllreduce, "set.gate", DataType::kFloat32, {1}, &gate_in);
  ASSERT_TRUE(Wait(*gate).ok());
  if (me % 2 == 1) run_set_ops();

  // A rank outside a set is refused its collectives, before any communication.
  if (n > 1) {
    Request other;
    other.meta.name = "set.other";
    other.meta.op = OpType::kAllreduce;
    other.meta.shape = {1};
    other.input = &gate_in;
    other.process_set = me % 2 ? even_id : odd_id;
    other.done = [](const Status&) {};
    Status s = Runtime::Get().Enqueue(std::move(other));
    EXPECT_NE(s.message().find("is not in process set"), std::string::npos) << s.message();
  }
  // Ranks that register different sets get an error on every rank.
  if (n > 1) {
    try {
      Runtime::Get().AddProcessSet({me});
      ADD_FAILURE() << "registering different sets succeeded";
    } catch (const BluefogError& e) {
      EXPECT_NE(std::string(e.what()).find("ranks disagree on the process set's ranks"),
                std::string::npos)
          << e.what();
    }
  }
  Runtime::Get().RemoveProcessSet(even_id);
  Runtime::Get().RemoveProcessSet(odd_id);
  Request late;
  late.meta.name = "set.late";
  late.meta.shape = {1};
  late.input = &gate_in;
  late.process_set = my_id;
  late.done = [](const Status&) {};
  Status s = Runtime::Get().Enqueue(std::move(late));
  EXPECT_NE(s.message().find("is not registered"), std::string::npos) << s.message();
}

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
  auto after =
      bluefog::Submit(bluefog::OpType::kAllreduce, "late", bluefog::DataType::kFloat32, {1}, &x);
  bluefog::Status s = bluefog::Wait(*after);
  if (s.code() != bluefog::StatusCode::kAborted ||
      s.message().find("shut down") == std::string::npos) {
    std::fprintf(stderr, "after shutdown: unexpected status %d: %s\n", static_cast<int>(s.code()),
                 s.message().c_str());
    result = 1;
  }
  return result;
}
