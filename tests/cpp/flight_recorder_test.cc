#include "core/flight_recorder.h"

#include <gtest/gtest.h>

#include <string>

#include "core/timeline.h"

namespace bluefog {
namespace {

TEST(FlightRecorderTest, RecordsStatesInOrder) {
  FlightRecorder rec(4);
  const uint64_t a = rec.Begin("allreduce", "grad.0", 0, 4096, DataType::kFloat32);
  const uint64_t b = rec.Begin("win_put", "w", 2, 8, DataType::kFloat64);
  rec.Start(a);
  rec.End(a, true);
  rec.Start(b);
  rec.End(b, false);
  const std::vector<FlightEntry> all = rec.Snapshot();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, a);
  EXPECT_STREQ(all[0].name, "grad.0");
  EXPECT_EQ(all[0].state, FlightEntry::kDone);
  EXPECT_GT(all[0].started_at, 0);
  EXPECT_GE(all[0].ended_at, all[0].started_at);
  EXPECT_STREQ(all[1].kind, "win_put");
  EXPECT_EQ(all[1].process_set, 2);
  EXPECT_EQ(all[1].state, FlightEntry::kFailed);
}

TEST(FlightRecorderTest, KeepsTheLastEntriesAndIgnoresOverwrittenIds) {
  FlightRecorder rec(3);
  uint64_t first = rec.Begin("allreduce", "t0", 0, 1, DataType::kFloat32);
  for (int i = 1; i < 5; ++i)
    rec.Begin("allreduce", "t" + std::to_string(i), 0, 1, DataType::kFloat32);
  rec.End(first, true);  // its slot holds t3 now: untouched
  const std::vector<FlightEntry> all = rec.Snapshot();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_STREQ(all[0].name, "t2");
  EXPECT_STREQ(all[2].name, "t4");
  for (const FlightEntry& e : all) EXPECT_EQ(e.state, FlightEntry::kQueued);
}

TEST(FlightRecorderTest, PendingNamesWhatWaitsAndLimitsLines) {
  FlightRecorder rec(8);
  const uint64_t done = rec.Begin("broadcast", "b", 0, 4, DataType::kInt32);
  rec.End(done, true);
  const uint64_t run = rec.Begin("neighbor_allreduce", "x", 0, 16, DataType::kFloat32);
  rec.Start(run);
  rec.Begin("allreduce", "y", 1, 8, DataType::kFloat64);
  rec.Begin("allreduce", "z", 1, 8, DataType::kFloat64);
  const std::string text = rec.Pending(NowSeconds() + 5, 2);
  EXPECT_EQ(text.find("'b'"), std::string::npos) << text;
  EXPECT_NE(text.find("neighbor_allreduce 'x' (set 0, 16 B float32) queued 5."), std::string::npos)
      << text;
  EXPECT_NE(text.find("exchanging for 5."), std::string::npos) << text;
  EXPECT_NE(text.find("allreduce 'y' (set 1, 8 B float64)"), std::string::npos) << text;
  EXPECT_NE(text.find("... and 1 more"), std::string::npos) << text;
  EXPECT_EQ(FlightRecorder(4).Pending(NowSeconds(), 10), "");
}

TEST(FlightRecorderTest, OffRecordsNothingAndTruncatesLongNames) {
  FlightRecorder off(0);
  EXPECT_EQ(off.Begin("allreduce", "a", 0, 1, DataType::kFloat32), 0u);
  off.End(0, true);
  EXPECT_TRUE(off.Snapshot().empty());
  EXPECT_EQ(off.Json(NowSeconds()), "[\n]");
  FlightRecorder rec(2);
  rec.Begin("allreduce", std::string(500, 'n') + "\"q", 0, 1, DataType::kFloat32);
  EXPECT_EQ(std::string(rec.Snapshot()[0].name), std::string(sizeof(FlightEntry::name) - 1, 'n'));
  rec.Begin("allreduce", "quote\"d", 0, 1, DataType::kFloat32);
  EXPECT_NE(rec.Json(NowSeconds()).find("\"name\": \"quote\\\"d\""), std::string::npos);
  EXPECT_NE(rec.Json(NowSeconds()).find("\"started_s_ago\": null"), std::string::npos);
}

TEST(FlightRecorderTest, TotalsCountEveryBeginAlsoWhenOffAndAcrossResize) {
  FlightRecorder rec(0);
  rec.Begin("allreduce", "a", 0, 100, DataType::kFloat32);
  rec.Resize(2);
  for (int i = 0; i < 5; ++i) rec.Begin("win_put", "w", 0, 8, DataType::kFloat64);
  EXPECT_EQ(rec.totals().operations, 6u);
  EXPECT_EQ(rec.totals().bytes, 140);
}

TEST(FlightRecorderTest, WaitingCountsTheTimeAnyEntryIsQueuedOnce) {
  FlightRecorder rec(4);
  const uint64_t a = rec.Begin("allreduce", "a", 0, 1, DataType::kFloat32);
  const uint64_t b = rec.Begin("allreduce", "b", 0, 1, DataType::kFloat32);
  const double queued = rec.totals().waiting_seconds;
  EXPECT_GE(queued, 0.0);
  rec.Start(a);
  rec.End(b, true);
  const double done = rec.totals().waiting_seconds;
  EXPECT_GE(done, queued);
  rec.End(a, true);  // running, not queued: no more waiting
  EXPECT_EQ(rec.totals().waiting_seconds, done);
  for (int i = 0; i < 6; ++i) rec.Begin("allreduce", "c", 0, 1, DataType::kFloat32);
  rec.Resize(4);  // the queued entries are forgotten, and the waiting stops
  const double after = rec.totals().waiting_seconds;
  EXPECT_EQ(rec.totals().waiting_seconds, after);
}

TEST(FlightRecorderTest, KeepsTheLastStallWarning) {
  FlightRecorder rec(0);
  double at = -1;
  EXPECT_EQ(rec.LastStall(&at), "");
  EXPECT_EQ(at, 0.0);
  rec.NoteStall("first", 1.5);
  rec.NoteStall("rank 0: 'grad' (missing ranks 1)", 2.5);
  EXPECT_EQ(rec.LastStall(&at), "rank 0: 'grad' (missing ranks 1)");
  EXPECT_EQ(at, 2.5);
}

TEST(FlightRecorderTest, OldestPendingWithoutCopying) {
  FlightRecorder rec(4);
  double at = -1;
  EXPECT_FALSE(rec.OldestPending(&at));
  const uint64_t a = rec.Begin("allreduce", "a", 0, 4, DataType::kFloat32);
  const uint64_t b = rec.Begin("win_put", "w", 0, 4, DataType::kFloat32);
  rec.Start(b);  // running counts as pending
  const std::vector<FlightEntry> all = rec.Snapshot();
  ASSERT_TRUE(rec.OldestPending(&at));
  EXPECT_EQ(at, all[0].queued_at);
  rec.End(a, true);
  ASSERT_TRUE(rec.OldestPending(&at));
  EXPECT_EQ(at, all[1].queued_at);
  rec.End(b, false);
  EXPECT_FALSE(rec.OldestPending(&at));
}

}  // namespace
}  // namespace bluefog
