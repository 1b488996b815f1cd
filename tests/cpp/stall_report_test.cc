#include "core/stall_report.h"

#include <gtest/gtest.h>

namespace bluefog {
namespace {

using Verdict = StallWatch::Verdict;

TEST(StallWatch, OffWhenBothTimesAreZero) {
  StallWatch w(0, 0);
  EXPECT_FALSE(w.enabled());
  EXPECT_EQ(w.Check(1000, 0), Verdict::kQuiet);
}

TEST(StallWatch, WarnsOncePerIntervalThenFails) {
  StallWatch w(10, 25);
  EXPECT_EQ(w.Check(5, 0), Verdict::kQuiet);     // waited 5 s
  EXPECT_EQ(w.Check(10, 0), Verdict::kWarn);     // 10 s
  EXPECT_EQ(w.Check(11, 0), Verdict::kQuiet);    // warned 1 s ago
  EXPECT_EQ(w.Check(11.2, 0), Verdict::kQuiet);  // looked 0.2 s ago
  EXPECT_EQ(w.Check(20, 0), Verdict::kWarn);
  EXPECT_EQ(w.Check(25, 0), Verdict::kFail);
}

TEST(StallWatch, FailsWithoutWarnings) {
  StallWatch w(0, 3);
  EXPECT_EQ(w.Check(2, 0), Verdict::kQuiet);
  EXPECT_EQ(w.Check(3, 0), Verdict::kFail);
}

TEST(StallMessage, NamesWhatWaitsAndWhoIsMissing) {
  std::string m = StallMessage(12.7, {"a", "b"}, {});
  EXPECT_NE(m.find("waited 12 s"), std::string::npos);
  EXPECT_NE(m.find("Waiting here: 'a' 'b'."), std::string::npos);
  EXPECT_NE(m.find("No other rank has announced"), std::string::npos);
  WaitingTensor w{"grad.3", {0, 2}, {1, 3}};
  m = StallMessage(5, {"grad.3"}, {w});
  EXPECT_NE(m.find("'grad.3' (missing ranks 1 3)"), std::string::npos);
}

TEST(StallMessage, LongListsAreCut) {
  std::vector<std::string> mine;
  std::vector<WaitingTensor> waiting;
  for (int i = 0; i < 30; ++i) {
    mine.push_back("t" + std::to_string(i));
    waiting.push_back({"t" + std::to_string(i), {0}, {1}});
  }
  std::string m = StallMessage(5, mine, waiting);
  EXPECT_NE(m.find("... (30 in all)"), std::string::npos);
  EXPECT_NE(m.find("... and 10 more"), std::string::npos);
}

}  // namespace
}  // namespace bluefog
