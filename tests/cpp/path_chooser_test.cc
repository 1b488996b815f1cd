// The path chooser (core/path_chooser.h) without any communication: one rank, or the other
// ranks' agreements supplied by the test. The call counts come from the chooser's constants.
#include "core/path_chooser.h"

#include <gtest/gtest.h>

#include <vector>

namespace bluefog {
namespace {

constexpr int64_t kBytes = int64_t{3} << 20;  // size class 2^21

// Every rank but this one reports `others` (per agreement: the n doubles each rank passes).
PathChooser::Agree OthersSay(int size, std::vector<double> others) {
  return [size, others](const double* mine, int n, double* all) {
    for (int k = 0; k < n; ++k) all[k] = mine[k];
    for (int r = 1; r < size; ++r)
      for (int k = 0; k < n; ++k) all[r * n + k] = n == 2 ? others[k] : others.back();
  };
}

// Runs `calls` calls as the caller would: the path Next gives, timed `seconds[path]`.
void Calls(PathChooser* c, int calls, double seconds0, double seconds1, int kind = 0,
           int64_t bytes = kBytes) {
  for (int i = 0; i < calls; ++i) {
    const int path = c->Next(kind, bytes);
    c->Record(kind, bytes, path, path == 0 ? seconds0 : seconds1);
  }
}

TEST(PathChooser, SizeClasses) {
  EXPECT_EQ(PathChooser::SizeClass(1), 0);
  EXPECT_EQ(PathChooser::SizeClass(2), 1);
  EXPECT_EQ(PathChooser::SizeClass(3), 1);
  EXPECT_EQ(PathChooser::SizeClass(int64_t{1} << 20), 20);
  EXPECT_EQ(PathChooser::SizeClass((int64_t{1} << 21) - 1), 20);
}

TEST(PathChooser, StartsOnTheAreasThenAlternatesBlocksThenTakesTheFaster) {
  PathChooser c(0, 1, {""}, OthersSay(1, {}));
  for (int i = 0; i < PathChooser::kStartCalls; ++i) {
    EXPECT_EQ(c.Next(0, kBytes), 0) << i;
    c.Record(0, kBytes, 0, 1.0);
  }
  std::vector<int> taken;
  for (int i = 0; i < PathChooser::kTrialCalls; ++i) {
    EXPECT_EQ(c.Choice(0, kBytes), -1) << i;
    const int path = c.Next(0, kBytes);
    taken.push_back(path);
    c.Record(0, kBytes, path, path == 0 ? 2e-3 : 1e-3);
  }
  for (int i = 0; i < PathChooser::kTrialCalls; ++i)
    EXPECT_EQ(taken[i], (i / PathChooser::kBlock) % 2) << i;
  EXPECT_EQ(c.Choice(0, kBytes), 1);
  EXPECT_EQ(c.Next(0, kBytes), 1);
}

TEST(PathChooser, TheSlowestRanksMediansDecide) {
  // This rank finds direct faster; another finds it much slower than the areas.
  PathChooser c(0, 3, {""}, OthersSay(3, {1e-3, 5e-3}));
  Calls(&c, PathChooser::kChooseCalls, 2e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), 0);
}

TEST(PathChooser, WarmCallsOfABlockAreNotTimed) {
  // Each block's first kWarm calls are 100x slower on direct: ignored, so direct still wins.
  PathChooser c(0, 1, {""}, OthersSay(1, {}));
  Calls(&c, PathChooser::kStartCalls, 1, 1);
  for (int i = 0; i < PathChooser::kTrialCalls; ++i) {
    const int path = c.Next(0, kBytes);
    const bool warm = i % PathChooser::kBlock < PathChooser::kWarm;
    c.Record(0, kBytes, path, path == 0 ? 2e-3 : (warm ? 0.1 : 1e-3));
  }
  EXPECT_EQ(c.Choice(0, kBytes), 1);
}

TEST(PathChooser, KindsAndSizeClassesAreDecidedApart) {
  PathChooser c(0, 1, {"", "in place"}, OthersSay(1, {}));
  Calls(&c, PathChooser::kChooseCalls, 2e-3, 1e-3, 1);
  EXPECT_EQ(c.Choice(1, kBytes), 1);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
  EXPECT_EQ(c.Choice(1, kBytes * 2), -1);
  EXPECT_EQ(c.Next(0, kBytes), 0);
}

TEST(PathChooser, DecidedAgainSoonAfterTheFirstChoiceWithoutTheUntimedStart) {
  PathChooser c(0, 1, {""}, OthersSay(1, {}));
  Calls(&c, PathChooser::kChooseCalls, 2e-3, 1e-3);
  ASSERT_EQ(c.Choice(0, kBytes), 1);
  Calls(&c, PathChooser::kFirstRecheck - 1, 2e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), 1);
  Calls(&c, 1, 2e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
  // No untimed start now: the trials begin at once, and the areas got faster meanwhile.
  Calls(&c, PathChooser::kTrialCalls, 0.5e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), 0);
  // Later choices hold for recheck_calls calls.
  c.set_recheck_calls(100);
  Calls(&c, 99, 0.5e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), 0);
  Calls(&c, 1, 0.5e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
}

TEST(PathChooser, TheWatchDecidesAgainWhenThePathTakenGotSlower) {
  PathChooser c(0, 1, {""}, OthersSay(1, {}));
  Calls(&c, PathChooser::kChooseCalls, 2e-3, 1e-3);
  ASSERT_EQ(c.Choice(0, kBytes), 1);
  // Slower, but within kWorse of the other path's median: kept.
  Calls(&c, PathChooser::kWatchCalls, 2e-3, 2e-3 * PathChooser::kWorse * 0.9);
  EXPECT_EQ(c.Choice(0, kBytes), 1);
  // Beyond it: decided again at the next watch.
  Calls(&c, PathChooser::kWatchCalls - 1, 2e-3, 2e-3 * PathChooser::kWorse * 1.5);
  EXPECT_EQ(c.Choice(0, kBytes), 1);
  Calls(&c, 1, 2e-3, 2e-3 * PathChooser::kWorse * 1.5);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
}

TEST(PathChooser, AnotherRanksWatchDecidesForEveryRank) {
  // This rank's calls stay fast; another rank reports a ratio above 1.
  PathChooser c(0, 2, {""}, OthersSay(2, {1e-3, 1e-3, 2.0}));
  Calls(&c, PathChooser::kChooseCalls, 2e-3, 1e-3);
  ASSERT_NE(c.Choice(0, kBytes), -1);
  Calls(&c, PathChooser::kWatchCalls, 1e-3, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
}

}  // namespace
}  // namespace bluefog
