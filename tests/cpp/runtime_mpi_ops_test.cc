// The runtime over real MPI, continued: alltoall, reducescatter, allocation failures and process
// sets (same executable and conventions as runtime_mpi_test.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

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

// Checked in the negotiation, so every rank gets the error (a rank refusing its own request
// would leave the others waiting for it).
TEST(RuntimeMpi, AlltoallSplitsMustMatchTheRows) {
  std::vector<float> in(4, 1.0f);
  auto p = std::make_unique<Pending>();
  Request req;
  req.meta.name = "alltoall.bad";
  req.meta.op = OpType::kAlltoall;
  req.meta.shape = {4};
  req.meta.splits = std::vector<int64_t>(Size(), 5);
  req.input = in.data();
  Pending* raw = p.get();
  req.done = [raw](const Status& s) { raw->promise.set_value(s); };
  ASSERT_TRUE(Runtime::Get().Enqueue(std::move(req)).ok());
  Status s = Wait(*p);
  EXPECT_EQ(s.code(), StatusCode::kPrecondition);
  EXPECT_NE(s.message().find("rank 0's splits"), std::string::npos) << s.message();
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
    req.meta.average = average;
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
    req.meta.average = true;
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

}  // namespace
}  // namespace bluefog
