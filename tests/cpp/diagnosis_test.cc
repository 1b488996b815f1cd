#include "core/diagnosis.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace bluefog {
namespace {

FlightEntry Entry(uint64_t id, const char* kind, const char* name, FlightEntry::State state,
                  double queued_at, double ended_at = 0, int set = 0) {
  FlightEntry e;
  e.id = id;
  std::strncpy(e.kind, kind, sizeof(e.kind) - 1);
  std::strncpy(e.name, name, sizeof(e.name) - 1);
  e.state = state;
  e.queued_at = queued_at;
  e.ended_at = ended_at;
  e.process_set = set;
  return e;
}

std::vector<int> Everyone(int) { return {0, 1, 2, 3}; }

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Each rank's answer as it would arrive: encoded by the rank, decoded by the asker.
RankReport Answer(const std::vector<FlightEntry>& entries, const std::vector<OpBrief>& asked) {
  const std::string question = EncodeQuestion(asked, 2036);
  const RankReport mine = ReportFrom(entries, 100.0, DecodeQuestion(question), "host-a", 42);
  const std::string wire = EncodeReport(mine, 2036);
  EXPECT_FALSE(wire.empty());
  return DecodeReport(wire);
}

TEST(DiagnosisTest, NamesWhatTheMissingRanksDo) {
  // Rank 0 waits on allreduce 'grad.7' since t=59 (41 s at t=100).
  const std::vector<FlightEntry> mine = {
      Entry(1, "allreduce", "grad.6", FlightEntry::kDone, 50, 55),
      Entry(2, "allreduce", "grad.7", FlightEntry::kQueued, 59)};
  const std::vector<OpBrief> stalled = StalledOps(mine, 100.0, 30.0);
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].name, "grad.7");
  EXPECT_DOUBLE_EQ(stalled[0].age, 41.0);

  std::vector<RankReport> reports(4);
  reports[0] = ReportFrom(mine, 100.0, stalled, "host-a", 1);
  // Rank 1 waits too; rank 2 is in another collective; rank 3 is idle in Python.
  reports[1] = Answer({Entry(5, "allreduce", "grad.7", FlightEntry::kQueued, 58)}, stalled);
  reports[2] = Answer({Entry(9, "allreduce", "grad.6", FlightEntry::kDone, 50, 55),
                       Entry(10, "broadcast", "w", FlightEntry::kRunning, 59)},
                      stalled);
  reports[3] = Answer({Entry(3, "allreduce", "grad.6", FlightEntry::kDone, 50, 57)}, stalled);
  const std::string text = Diagnose(0, stalled, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(text, "allreduce 'grad.7' has waited 41.0 s on rank 0")) << text;
  EXPECT_TRUE(Has(text,
                  "rank 2 never called allreduce 'grad.7'; it is in broadcast 'w', "
                  "exchanging, since 41.0 s"))
      << text;
  EXPECT_TRUE(Has(text,
                  "rank 3 never called allreduce 'grad.7'; it is in no bluefog operation: "
                  "its last, allreduce 'grad.6', ended 43.0 s ago"))
      << text;
  EXPECT_FALSE(Has(text, "rank 1")) << text;  // it waits on the same operation
}

TEST(DiagnosisTest, SilentLostAndFinishedRanks) {
  const std::vector<OpBrief> stalled =
      StalledOps({Entry(2, "allgather", "x", FlightEntry::kRunning, 80)}, 100.0, 10.0);
  std::vector<RankReport> reports(4);
  reports[1].status = RankReport::kLost;
  reports[2].status = RankReport::kSilent;
  reports[3] = Answer({Entry(7, "allgather", "x", FlightEntry::kDone, 82, 85)}, stalled);
  const std::string text = Diagnose(0, stalled, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(text, "rank 1 is gone: its connection to this rank broke")) << text;
  EXPECT_TRUE(Has(text, "rank 2 did not answer within 3.0 s: it is stopped (SIGSTOP)")) << text;
  EXPECT_TRUE(Has(text, "rank 3 already finished allgather 'x' 15.0 s ago")) << text;

  // A name used every step: finished before this rank submitted it is an earlier step's.
  const std::vector<OpBrief> late =
      StalledOps({Entry(9, "allgather", "x", FlightEntry::kRunning, 90)}, 100.0, 5.0);
  reports[3] = Answer({Entry(7, "allgather", "x", FlightEntry::kDone, 70, 75)}, late);
  const std::string again = Diagnose(0, late, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(again,
                  "rank 3 has not called allgather 'x' again; it is in no bluefog "
                  "operation: its last, allgather 'x', ended 25.0 s ago"))
      << again;
}

TEST(DiagnosisTest, EveryRankPendingBlamesTheTransfer) {
  const std::vector<OpBrief> stalled =
      StalledOps({Entry(2, "allreduce", "big", FlightEntry::kRunning, 40)}, 100.0, 10.0);
  std::vector<RankReport> reports(4);
  for (int r = 1; r < 4; ++r)
    reports[r] = Answer({Entry(2, "allreduce", "big", FlightEntry::kRunning, 41)}, stalled);
  const std::string text = Diagnose(0, stalled, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(text, "Every other rank has it pending too")) << text;
}

TEST(DiagnosisTest, MutexHolderAndProcessSets) {
  // Rank 0 waits for window 'w''s mutex; rank 2 holds it (acquired, never released), rank 1
  // acquired and released it.
  const std::vector<OpBrief> stalled =
      StalledOps({Entry(4, "win_mutex_acquire", "w", FlightEntry::kRunning, 60)}, 100.0, 10.0);
  std::vector<RankReport> reports(4);
  reports[1] = Answer({Entry(1, "win_mutex_acquire", "w", FlightEntry::kDone, 10, 11),
                       Entry(2, "win_mutex_release", "w", FlightEntry::kDone, 12, 12)},
                      stalled);
  reports[2] = Answer({Entry(1, "win_mutex_acquire", "w", FlightEntry::kDone, 60, 70)}, stalled);
  reports[3] = Answer({}, stalled);
  std::string text = Diagnose(0, stalled, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(text, "rank 2 holds the mutex of window 'w' since 30.0 s")) << text;
  EXPECT_FALSE(Has(text, "rank 1 holds")) << text;
  EXPECT_FALSE(Has(text, "rank 3")) << text;

  // A process set's operation names only the set's members.
  const std::vector<OpBrief> in_set =
      StalledOps({Entry(2, "allreduce", "s", FlightEntry::kQueued, 50, 0, 1)}, 100.0, 10.0);
  for (int r = 1; r < 4; ++r) reports[r] = Answer({}, in_set);
  text = Diagnose(0, in_set, reports, 3.0, [](int set) {
    return set == 1 ? std::vector<int>{0, 3} : std::vector<int>{0, 1, 2, 3};
  });
  EXPECT_TRUE(Has(text, "(process set 1)")) << text;
  EXPECT_TRUE(Has(text, "rank 3 never called allreduce 's'")) << text;
  EXPECT_FALSE(Has(text, "rank 1")) << text;
}

TEST(DiagnosisTest, OnDemandListsEveryRankAndTheWireCuts) {
  std::vector<RankReport> reports(3);
  reports[0] = ReportFrom({}, 100.0, {}, "host-a", 7);
  reports[1] = Answer({Entry(3, "neighbor_allreduce", "x", FlightEntry::kQueued, 90)}, {});
  reports[2].status = RankReport::kSilent;
  RankReport with_frame = ReportFrom({}, 100.0, {}, "host-b", 9);
  with_frame.frame = "train.py:88 in step";
  reports[0] = DecodeReport(EncodeReport(with_frame, 2036));
  const std::string text = Diagnose(0, {}, reports, 3.0, Everyone);
  EXPECT_TRUE(Has(text,
                  "rank 0 (host-b, pid 9): it is in no bluefog operation and has finished "
                  "none it remembers; its main thread is at train.py:88 in step"))
      << text;
  EXPECT_TRUE(Has(text, "rank 1 (host-a, pid 42): it is in neighbor_allreduce 'x' since 10.0 s"))
      << text;
  EXPECT_TRUE(Has(text, "rank 2 did not answer")) << text;

  // Long names and many operations are cut to the message's room, tabs do not break fields.
  std::vector<FlightEntry> many;
  for (int i = 0; i < 40; ++i)
    many.push_back(
        Entry(i + 1, "allreduce", std::string(90, 'a' + i % 26).c_str(), FlightEntry::kQueued, 10));
  std::strcpy(many[0].name, "tab\there");
  const std::vector<OpBrief> asked = StalledOps(many, 100.0, 1.0);
  const std::string question = EncodeQuestion(asked, 500);
  EXPECT_LE(question.size(), 500u);
  EXPECT_EQ(DecodeQuestion(question)[0].name, "tab here");
  const std::string wire = EncodeReport(ReportFrom(many, 100.0, asked, "h", 1), 600);
  EXPECT_LE(wire.size(), 600u);
  EXPECT_EQ(DecodeReport(wire).pid, 1);
}

}  // namespace
}  // namespace bluefog
