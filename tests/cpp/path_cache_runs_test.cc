// The one-host path choices kept across runs (core/path_cache.h), over a real job: one launch
// of this program per run, in one cache directory (tests/cpp/path_cache_runs.sh runs them in
// turn). Usage: path_cache_runs_tests DIR MODE, MODE one of
//   learn    no usable file: every class learns (untimed start and trials); the file then holds
//            every class's choice
//   cached   the file of the run before: every class takes its cached path from the first call,
//            with no call spent learning; a watch that fires still decides that class again
//   relearn  (with TransportOptions::path_relearn) learns as without a file, and rewrites it
// The watch is kept quiet (a huge factor) except where a test fires it, so that a noisy machine
// cannot make a run learn again. Expected sums are closed-form.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/path_cache.h"
#include "core/path_chooser.h"
#include "launched_transport.h"
#include "transport/local/algorithms.h"
#include "transport/local/local_host.h"

namespace bluefog {
namespace {

Communicator* transport = nullptr;
TransportInfo info;
std::string dir, mode;

// Out of place, three size classes (2^16, 2^20 and 2^22 bytes), none in the shared heap.
const std::vector<int64_t> kCounts = {(int64_t{1} << 14) + 3, (int64_t{1} << 18) + 5,
                                      (int64_t{1} << 20) + 7};
constexpr int kKind = OneHostAllreduce::kOutOfPlace;

int Choice(int64_t count) { return transport->local_host()->choice(count * 4, kKind); }
uint64_t Learning() { return transport->tuning().learning_calls.load(); }

// `calls` allreduces of `count` floats, each checked exactly.
void Calls(int64_t count, int calls) {
  std::vector<float> in(count), out(count);
  for (int64_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 13 + info.rank);
  const int n = info.size;
  for (int call = 0; call < calls; ++call) {
    transport->AllreduceSum(in.data(), out.data(), count, DataType::kFloat32);
    for (int64_t i = 0; i < count; i += 31)
      ASSERT_EQ(out[i], static_cast<float>(n * (i % 13) + n * (n - 1) / 2)) << call << " " << i;
  }
}

// The file as this rank reads it: every class's path, the same as the job's choice.
void ExpectFileHoldsTheChoices() {
  PathCache cache(dir, PathCache::MachineKey());
  std::string why;
  ASSERT_EQ(cache.Load(&why), PathCache::Loaded::kLoaded) << why;
  for (int64_t count : kCounts) {
    const CachedChoice* c =
        cache.Find(info.size, "out of place", PathChooser::SizeClass(count * 4));
    ASSERT_NE(c, nullptr) << count;
    EXPECT_EQ(c->path, Choice(count)) << count;
  }
}

TEST(PathCacheRuns, LearnsOrStartsFromTheFile) {
  ASSERT_TRUE(transport->paths().staged && transport->paths().direct);
  transport->tuning().worse = 1e9;
  if (mode == "cached") {
    ExpectFileHoldsTheChoices();  // before the first call
  } else {
    for (int64_t count : kCounts) EXPECT_EQ(Choice(count), -1) << count;
  }
  for (int64_t count : kCounts) Calls(count, PathChooser::kChooseCalls + 4);
  const uint64_t want = mode == "cached" ? 0 : kCounts.size() * PathChooser::kChooseCalls;
  EXPECT_EQ(Learning(), want) << mode;
  for (int64_t count : kCounts) EXPECT_NE(Choice(count), -1) << count;
  // Rank 0 wrote every choice as it was made; everyone's reads are after the barrier-like
  // allreduce of the last call, which ran after the last choice.
  ExpectFileHoldsTheChoices();
}

// A cached choice that has become slow (forced on the last rank) is decided again on every
// rank within one watch period, and the new choice is written back.
TEST(PathCacheRuns, ACachedChoiceTheWatchFindsSlowIsMadeAgain) {
  if (mode != "cached") GTEST_SKIP() << "runs on a cached start";
  const int64_t count = kCounts[1];
  const uint64_t before = Learning();
  if (info.rank == info.size - 1) transport->tuning().worse = 0.0;
  Calls(count, PathChooser::kWatchCalls);
  transport->tuning().worse = 1e9;
  EXPECT_EQ(Choice(count), -1);
  Calls(count, PathChooser::kTrialCalls);
  EXPECT_EQ(Learning() - before, uint64_t{PathChooser::kTrialCalls});
  EXPECT_NE(Choice(count), -1);
  ExpectFileHoldsTheChoices();
}

}  // namespace
}  // namespace bluefog

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DIR learn|cached|relearn\n", argv[0]);
    return 2;
  }
  bluefog::dir = argv[1];
  bluefog::mode = argv[2];
  bluefog::TransportOptions options;
  options.path_cache_dir = bluefog::dir;
  options.path_relearn = bluefog::mode == "relearn";
  std::unique_ptr<bluefog::Communicator> t = bluefog::LaunchedTransport(options, &bluefog::info);
  bluefog::transport = t.get();
  if (bluefog::info.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  int worst = result;
  t->Allreduce(&result, &worst, 1, bluefog::DataType::kInt32, bluefog::ReduceOp::kMax);
  t->Shutdown();
  return worst;
}
