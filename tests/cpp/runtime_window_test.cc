// Windows over real MPI (runs in runtime_mpi_tests, so also under the sanitizers): create on a
// ring, put / accumulate / get into the neighbours, mutexes, free, and the errors.
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "runtime/runtime.h"

#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

int Next() { return (Rank() + 1) % Size(); }
int Prev() { return (Rank() + Size() - 1) % Size(); }

WinPutOptions PutTo(std::vector<int32_t> dsts, std::vector<double> weights, bool accumulate = false,
                    bool require_mutex = false) {
  WinPutOptions o;
  o.dsts = std::move(dsts);
  o.weights = std::move(weights);
  o.accumulate = accumulate;
  o.require_mutex = require_mutex;
  return o;
}

WinUpdateOptions UpdateFrom(double self_weight, std::vector<int32_t> ranks,
                            std::vector<double> weights, bool reset, bool publish) {
  WinUpdateOptions o;
  o.self_weight = self_weight;
  o.ranks = std::move(ranks);
  o.weights = std::move(weights);
  o.reset = reset;
  o.publish = publish;
  return o;
}

// Creates window `name` of `n` floats with value `value` on a directed ring (rank r writes to
// r + 1): the agreed request, as bf.win_create submits it.
Status CreateRingWindow(const std::string& name, const std::vector<float>& value) {
  Request req;
  req.meta.name = name;
  req.meta.op = OpType::kWinCreate;
  req.meta.dtype = DataType::kFloat32;
  req.meta.shape = {static_cast<int64_t>(value.size())};
  if (Size() > 1) {
    req.meta.send_ranks = {Next()};
    req.meta.recv_ranks = {Prev()};
  }
  req.input = value.data();
  return Wait(*SubmitBuilt(std::move(req), sizeof(int32_t)));
}

Status FreeWindow(const std::string& name, int64_t pending = 0) {
  Request req;
  req.meta.name = name;
  req.meta.op = OpType::kWinFree;
  req.meta.dtype = DataType::kInt32;
  req.meta.splits = {pending};
  return Wait(*SubmitBuilt(std::move(req), sizeof(int32_t)));
}

Status WaitHandle(int64_t handle) {
  std::promise<Status> done;
  Runtime::Get().windows().Wait(handle, [&done](const Status& s) { done.set_value(s); });
  return done.get_future().get();
}

void Barrier() {
  float x = 0;
  ASSERT_TRUE(
      Wait(*Submit(OpType::kAllreduce, "window.barrier", DataType::kFloat32, {1}, &x)).ok());
}

TEST(RuntimeWindow, PutAccumulateGetUpdateAndFree) {
  if (Size() < 2) GTEST_SKIP();
  WindowService& win = Runtime::Get().windows();
  const int n = 1000;
  std::vector<float> mine(n, static_cast<float>(Rank()));
  ASSERT_TRUE(CreateRingWindow("ring", mine).ok());
  // Put 2 * (rank + 1) into the next rank's buffer, then accumulate once more the same.
  std::vector<float> value(n, static_cast<float>(Rank() + 1));
  ASSERT_TRUE(
      WaitHandle(win.Put("ring", {value.data(), DataType::kFloat32, {n}}, PutTo({Next()}, {2.0})))
          .ok());
  ASSERT_TRUE(
      WaitHandle(win.Put("ring", {value.data(), DataType::kFloat32, {n}},
                         PutTo({Next()}, {1.0}, /*accumulate=*/true, /*require_mutex=*/true)))
          .ok());
  Barrier();
  EXPECT_EQ(win.Versions("ring"), std::vector<int64_t>({2}));
  std::vector<float> out(n);
  win.Update("ring", {mine.data(), DataType::kFloat32, {n}}, out.data(),
             UpdateFrom(0.0, {Prev()}, {1.0}, /*reset=*/false, /*publish=*/false));
  for (float v : out) ASSERT_EQ(v, 3.0f * (Prev() + 1));
  EXPECT_EQ(win.Versions("ring"), std::vector<int64_t>({0}));
  Barrier();
  // A get reads the previous rank's published value: the value it put last, (prev + 1).
  ASSERT_TRUE(WaitHandle(win.Get("ring", {Prev()}, {0.5}, true)).ok());
  Barrier();  // every get served before anyone publishes its update
  win.Update("ring", {mine.data(), DataType::kFloat32, {n}}, out.data(),
             UpdateFrom(1.0, {Prev()}, {1.0}, /*reset=*/true, /*publish=*/true));
  for (float v : out) ASSERT_EQ(v, Rank() + 0.5f * (Prev() + 1));
  Barrier();
  ASSERT_TRUE(FreeWindow("ring").ok());
  EXPECT_EQ(win.PendingOps("ring"), -1);
}

TEST(RuntimeWindow, MutexesSerializeEveryRank) {
  // Every rank locks and unlocks rank 0's mutex many times at once: no deadlock, no error.
  std::vector<float> mine(4, 0.0f);
  ASSERT_TRUE(CreateRingWindow("mutex", mine).ok());
  WindowService& win = Runtime::Get().windows();
  for (int k = 0; k < 50; ++k) {
    ASSERT_TRUE(WaitHandle(win.Mutex("mutex", {0}, true)).ok());
    ASSERT_TRUE(WaitHandle(win.Mutex("mutex", {0}, false)).ok());
  }
  Barrier();
  ASSERT_TRUE(FreeWindow("mutex").ok());
}

TEST(RuntimeWindow, RequireMutexInsideWinMutexIsRefusedAndKeepsIt) {
  // Every rank holds the next rank's mutex; its require_mutex put there is refused before it
  // locks anything, and the win_mutex still holds the mutex (its unlock is accepted).
  if (Size() < 2) GTEST_SKIP();
  std::vector<float> mine(4, 1.0f);
  ASSERT_TRUE(CreateRingWindow("nested", mine).ok());
  WindowService& win = Runtime::Get().windows();
  ASSERT_TRUE(WaitHandle(win.Mutex("nested", {Next()}, true)).ok());
  Status put =
      WaitHandle(win.Put("nested", {mine.data(), DataType::kFloat32, {4}},
                         PutTo({Next()}, {1.0}, /*accumulate=*/false, /*require_mutex=*/true)));
  EXPECT_EQ(put.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      put.message().find(Concat("bluefog win_put of window 'nested': rank ", Rank(),
                                " holds the mutex of window 'nested' on [", Next(), "] already")),
      std::string::npos)
      << put.message();
  Status unlock = WaitHandle(win.Mutex("nested", {Next()}, false));
  EXPECT_TRUE(unlock.ok()) << unlock.message();
  Barrier();
  ASSERT_TRUE(FreeWindow("nested").ok());
}

TEST(RuntimeWindow, MistakesFailOnTheCallingRank) {
  std::vector<float> mine(8, 1.0f);
  ASSERT_TRUE(CreateRingWindow("errors", mine).ok());
  WindowService& win = Runtime::Get().windows();
  auto message = [](auto&& body) {
    try {
      body();
    } catch (const BluefogError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message([&] {
              win.Put("nope", {mine.data(), DataType::kFloat32, {8}}, PutTo({}, {}));
            }).find("there is no window of that name"),
            std::string::npos);
  EXPECT_NE(message([&] {
              win.Put("errors", {mine.data(), DataType::kFloat32, {4, 2}}, PutTo({}, {}));
            }).find("of shape [4, 2], but the window holds float32 of shape [8]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              win.Put("errors", {mine.data(), DataType::kFloat32, {8}}, PutTo({Rank()}, {1.0}));
            }).find("is not an out-neighbor"),
            std::string::npos);
  // Creating it again fails on every rank.
  EXPECT_FALSE(CreateRingWindow("errors", mine).ok());
  // Freeing while a rank says it has operations pending fails on every rank, naming it.
  Status early = FreeWindow("errors", Rank() == 0 ? 1 : 0);
  EXPECT_FALSE(early.ok());
  EXPECT_NE(early.message().find("rank 0 has 1 window operations"), std::string::npos)
      << early.message();
  ASSERT_TRUE(FreeWindow("errors").ok());
}

}  // namespace
}  // namespace bluefog
