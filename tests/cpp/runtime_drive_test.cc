// Who runs the rounds (Channel::Enqueue's Drive), over real MPI under mpirun with 2 and 4 ranks
// (part of runtime_mpi_tests): eager callers driving until done, graph kernels joining one
// round, and both beside requests handed to the background thread. Every rank runs the same
// tests in the same order; expected values are closed-form functions of (rank, size, index).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime.h"

#include "runtime_test_util.h"

namespace bluefog {
namespace {

using namespace testing_util;

// `calls` sequential allreduces submitted with `drive`, every `large_every`-th one large (the
// one-host paths, the ring) and the rest small (from the round's data or MPI), each checked
// exactly: how many had finished when Enqueue returned (-1 after a wrong result).
int SequentialAllreducesFinishedInline(const std::string& prefix, Drive drive, int calls,
                                       int large_every, int64_t large_count) {
  const int n = Size();
  int finished_inline = 0;
  for (int k = 0; k < calls; ++k) {
    const int64_t count = k % large_every == large_every - 1 ? large_count + k : 16 + k;
    std::vector<float> in(count, static_cast<float>(Rank() + k));
    auto p = Submit(OpType::kAllreduce, prefix + std::to_string(k % 7), DataType::kFloat32, {count},
                    in.data(), false, -1, drive);
    finished_inline += p->finished_in_enqueue;
    EXPECT_TRUE(Wait(*p).ok()) << prefix << k;
    const float* out = reinterpret_cast<const float*>(p->output.data());
    const float expected = static_cast<float>(n * (n - 1) / 2 + n * k);
    EXPECT_EQ(out[0], expected) << prefix << k;
    EXPECT_EQ(out[count - 1], expected) << prefix << k;
    if (out[0] != expected || out[count - 1] != expected) return -1;
  }
  return finished_inline;
}

// Eager callers run the rounds themselves while nothing else is pending (Enqueue's `drive`):
// most sequential requests have finished when Enqueue returns, with the same results as when
// the background thread runs them, small (MPI_Allreduce) and large (the ring) alike.
TEST(RuntimeMpi, DrivenRequestsFinishOnTheCallingThread) {
  const int n = Size();
  const int total = 60;
  const int finished_inline =
      SequentialAllreducesFinishedInline("driven.", Drive::kUntilDone, total, 10, int64_t{1} << 18);
  std::vector<float> g(8 * (Rank() + 1), 1.0f);
  auto gathered = Submit(OpType::kAllgather, "driven.gather", DataType::kFloat32, {Rank() + 1, 8},
                         g.data(), false, -1, Drive::kUntilDone);
  ASSERT_TRUE(Wait(*gathered).ok());
  EXPECT_EQ(gathered->output.size(), sizeof(float) * 8 * n * (n + 1) / 2);
  // The background thread takes a request only when it is woken for one, which sequential
  // driven requests never do: nearly all finish inline (a margin for the rare spurious wakeup).
  EXPECT_GT(finished_inline, total / 2) << finished_inline << " of " << total;
}

// Driven and handed-off requests from two threads at once (each thread in the same order on
// every rank, the two interleaved differently on each): each request completes with the right
// values, whoever ran its rounds.
TEST(RuntimeMpi, DrivenAndBackgroundRequestsTogether) {
  const int n = Size();
  auto run = [n](bool drive) {
    for (int k = 0; k < 40; ++k) {
      const int j = drive ? k : 39 - k;
      std::vector<float> in(32 + j, static_cast<float>(Rank() * j));
      auto p = Submit(OpType::kAllreduce, std::string(drive ? "d." : "b.") + std::to_string(j),
                      DataType::kFloat32, {32 + j}, in.data(), false, -1,
                      drive ? Drive::kUntilDone : Drive::kNo);
      if (!Wait(*p).ok()) return false;
      if (reinterpret_cast<const float*>(p->output.data())[31 + j] != j * n * (n - 1) / 2.0f)
        return false;
    }
    return true;
  };
  auto background = std::async(std::launch::async, run, false);
  EXPECT_TRUE(run(true));
  EXPECT_TRUE(background.get());
}

// Graph kernels join one round (Drive::kJoinRound): with the others arriving within the wait
// (a long one here), sequential requests finish on the calling thread, small (from the round's
// data or MPI) and large (the one-host paths, the ring) alike, with the same results.
TEST(RuntimeMpi, JoinedRoundsFinishOnTheCallingThread) {
  const int64_t wait_before = Runtime::Get().SetTuning("graph_join_us", 2000000);
  const int total = 40;
  const int finished_inline =
      SequentialAllreducesFinishedInline("joined.", Drive::kJoinRound, total, 8, int64_t{1} << 19);
  Runtime::Get().SetTuning("graph_join_us", wait_before);
  EXPECT_GT(finished_inline, total / 2) << finished_inline << " of " << total;
}

// A rank that comes late to a round a graph kernel joined: the kernel's thread returns after
// its wait, the channel's thread finishes the open round, and the results are exact. And two
// ranks joining rounds for different tensors (each rank's one thread submits A and B in its own
// order) do not wait for each other: each round ends the join, the rest runs in the background.
TEST(RuntimeMpi, JoinedRoundsHandOnWhatTheOthersAreLateFor) {
  const int n = Size();
  const int64_t wait_before = Runtime::Get().SetTuning("graph_join_us", 1000);
  std::vector<float> in(64, static_cast<float>(Rank() + 1));
  if (Rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  auto late = Submit(OpType::kAllreduce, "joined.late", DataType::kFloat32, {64}, in.data(), false,
                     -1, Drive::kJoinRound);
  const double enqueue_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (Rank() == 0 && n > 1) {
    EXPECT_FALSE(late->finished_in_enqueue);
    EXPECT_LT(enqueue_s, 0.05);  // the 1 ms wait, not the late rank's 100 ms
  }
  ASSERT_TRUE(Wait(*late).ok());
  EXPECT_EQ(reinterpret_cast<const float*>(late->output.data())[63], n * (n + 1) / 2.0f);

  std::vector<float> a(32, 1.0f), b(48, 2.0f);
  const bool a_first = Rank() % 2 == 0;
  auto first =
      Submit(OpType::kAllreduce, a_first ? "joined.a" : "joined.b", DataType::kFloat32,
             {a_first ? 32 : 48}, a_first ? a.data() : b.data(), false, -1, Drive::kJoinRound);
  auto second =
      Submit(OpType::kAllreduce, a_first ? "joined.b" : "joined.a", DataType::kFloat32,
             {a_first ? 48 : 32}, a_first ? b.data() : a.data(), false, -1, Drive::kJoinRound);
  ASSERT_TRUE(Wait(*first).ok());
  ASSERT_TRUE(Wait(*second).ok());
  const float* got_a = reinterpret_cast<const float*>((a_first ? first : second)->output.data());
  const float* got_b = reinterpret_cast<const float*>((a_first ? second : first)->output.data());
  EXPECT_EQ(got_a[31], static_cast<float>(n));
  EXPECT_EQ(got_b[47], 2.0f * n);
  Runtime::Get().SetTuning("graph_join_us", wait_before);
}

// A mismatch found in a round the caller drives fails on every rank as it does otherwise.
TEST(RuntimeMpi, DrivenShapeMismatchFailsEveryRank) {
  std::vector<float> in(8, 1.0f);
  auto bad = Submit(OpType::kAllreduce, "driven.mismatch", DataType::kFloat32,
                    {Rank() == 0 ? 2 : 4}, in.data(), false, -1, Drive::kUntilDone);
  Status s = Wait(*bad);
  EXPECT_EQ(s.code(), StatusCode::kPrecondition);
  EXPECT_NE(s.message().find("'driven.mismatch'"), std::string::npos) << s.message();
  auto good = Submit(OpType::kAllreduce, "driven.after", DataType::kFloat32, {8}, in.data(), false,
                     -1, Drive::kUntilDone);
  ASSERT_TRUE(Wait(*good).ok());
  EXPECT_EQ(reinterpret_cast<const float*>(good->output.data())[0], static_cast<float>(Size()));
}

}  // namespace
}  // namespace bluefog
