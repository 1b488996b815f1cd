#include "core/straggler.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bluefog {
namespace {

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Ranks' totals as their round messages would carry them: `waits[r]` is how long each of rank
// r's requests waits, one request per `step` seconds from `from` to `to`.
struct Feeder {
  std::vector<uint32_t> ops;
  std::vector<double> total;
  void Feed(StragglerTracker* t, const std::vector<double>& waits, double from, double to,
            double step) {
    const size_t n = waits.size();
    ops.resize(n, 0);
    total.resize(n, 0.0);
    for (double now = from; now < to; now += step) {
      for (size_t r = 0; r < n; ++r) {
        ++ops[r];
        total[r] += waits[r];
        t->Observe(now, static_cast<int>(r), ops[r],
                   static_cast<uint32_t>(total[r] / StragglerTracker::kWaitUnit + 0.5));
      }
    }
  }
};

TEST(StragglerTest, NamesTheRankTheOthersWaitFor) {
  StragglerTracker t(3);
  Feeder f;
  // Ranks 0 and 2 wait 20 ms for each request, rank 1 0.2 ms: rank 1 comes 19.8 ms late.
  f.Feed(&t, {0.02, 0.0002, 0.02}, 1000, 1005, 0.05);
  const StragglerReport r = t.Report(1005.2);
  EXPECT_EQ(r.straggler, 1);
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_GE(r.contested, 4);
  EXPECT_EQ(r.ranks[1].last, r.contested_ops);
  EXPECT_GE(r.contested_ops, 95);
  EXPECT_NEAR(r.ranks[1].mean_lag, 0.0198, 1e-4);
  EXPECT_NEAR(r.ranks[0].mean_lag, 0.0, 1e-4);
  EXPECT_NEAR(r.ranks[0].mean_wait, 0.02, 1e-4);
  EXPECT_GE(r.ops, 95);
  const std::string text = r.Text();
  EXPECT_TRUE(Has(text, "straggler: the other ranks wait for rank 1: it came last to " +
                            std::to_string(r.contested_ops) + " of the " +
                            std::to_string(r.contested_ops) + " collectives"))
      << text;
  EXPECT_TRUE(Has(text, "19.8 ms after the first rank's")) << text;
  EXPECT_TRUE(Has(r.Json(), "\"straggler\": 1")) << r.Json();
}

TEST(StragglerTest, EqualWaitsOrTakingTurnsNameNoOne) {
  StragglerTracker t(2);
  Feeder f;
  f.Feed(&t, {0.01, 0.01}, 10, 14, 0.1);
  StragglerReport r = t.Report(14.5);
  EXPECT_EQ(r.contested, 0);
  EXPECT_EQ(r.straggler, -1);
  EXPECT_EQ(r.Text(), "");
  EXPECT_TRUE(Has(r.Json(), "\"straggler\": null")) << r.Json();
  // Each rank late for two seconds in turn: neither is the one.
  f.Feed(&t, {0.02, 0.0}, 14, 16, 0.1);
  f.Feed(&t, {0.0, 0.02}, 16, 18, 0.1);
  r = t.Report(18.5);
  EXPECT_GE(r.contested, 3);
  EXPECT_EQ(r.straggler, -1);
}

TEST(StragglerTest, FewContestedSecondsNameNoOneAndOldOnesAreForgotten) {
  StragglerTracker t(2, /*window=*/10);
  Feeder f;
  f.Feed(&t, {0.03, 0.0}, 100, 102, 0.1);  // two seconds: too few
  EXPECT_EQ(t.Report(102.5).straggler, -1);
  f.Feed(&t, {0.03, 0.0}, 102, 103, 0.1);
  EXPECT_EQ(t.Report(103.5).straggler, 1);
  // Ten seconds on, the window holds none of it.
  const StragglerReport r = t.Report(114);
  EXPECT_EQ(r.ops, 0);
  EXPECT_EQ(r.straggler, -1);
}

TEST(StragglerTest, TotalsWrapAroundAndOwnWaitsAddUp) {
  StragglerTracker t(2);
  // Rank 0's totals cross 2^32 between two messages.
  t.Observe(50.0, 0, 0xfffffff0u, 0xffffff00u);
  t.Observe(50.1, 0, 0x10u, 0x100u);  // 32 more requests, 512 more units
  t.Observe(50.0, 1, 5, 5);
  t.Observe(50.1, 1, 37, 5);
  const StragglerReport r = t.Report(50.5);
  EXPECT_EQ(r.ranks[0].ops, 32);
  EXPECT_NEAR(r.ranks[0].mean_wait, 512 * StragglerTracker::kWaitUnit / 32, 1e-12);
  EXPECT_EQ(r.ranks[1].ops, 32);
  EXPECT_EQ(r.ranks[1].mean_wait, 0);
  t.NoteOwnWaits(1, 0.5);
  t.NoteOwnWaits(1, 0.25);
  uint32_t ops = 0, units = 0;
  t.OwnTotals(&ops, &units);
  EXPECT_EQ(ops, 2u);
  EXPECT_EQ(units, 75000u);
}

TEST(StragglerTest, DueEveryInterval) {
  StragglerTracker t(2);
  EXPECT_FALSE(t.Due(0, 60));
  EXPECT_FALSE(t.Due(59, 60));
  EXPECT_TRUE(t.Due(60.5, 60));
  EXPECT_FALSE(t.Due(61, 60));
}

}  // namespace
}  // namespace bluefog
