// The runtime over real MPI, continued: which large-allreduce algorithm runs where
// (hierarchical across hosts, direct within one host) and its results in place and out of place
// (same executable and conventions as runtime_mpi_test.cc).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

TEST(RuntimeMpi, HierarchicalAllreduceWhereExpected) {
  // Set by the two-pretend-hosts test: its allreduces must take the hierarchical path.
  const bool expected = std::getenv("BLUEFOG_EXPECT_HIERARCHICAL") != nullptr;
  EXPECT_EQ(Runtime::Get().hierarchical_allreduce(), expected);
  // Those two hosts run two ranks each (0, 1 and 2, 3); otherwise everything is on one host.
  const TransportInfo& info = Runtime::Get().info();
  EXPECT_TRUE(info.homogeneous);
  EXPECT_EQ(info.cross_size, expected ? 2 : 1);
  EXPECT_EQ(info.cross_rank, expected ? Rank() / 2 : 0);
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
  EXPECT_EQ(Runtime::Get().direct_allreduce(), expected);
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
