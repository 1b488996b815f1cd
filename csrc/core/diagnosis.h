// The hang doctor's reasoning: what a rank answers about itself when another asks (its pending
// operations, its last finished one, the window mutexes it holds, and whether it has the
// asker's stalled operations), how that travels (a short text in a fixed-size message), and the
// diagnosis an asking rank prints from every rank's answer ("rank 3 never called allreduce
// 'grad.7'; it is in broadcast 'w' since 41.0 s"). Pure logic: runtime/doctor.h asks and
// answers over the backend's point-to-point link.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/flight_recorder.h"

namespace bluefog {

// One operation as the doctor speaks of it.
struct OpBrief {
  std::string kind;  // "allreduce", "win_mutex_acquire", ...
  std::string name;
  int process_set = 0;
  // For an asked operation on the answering rank: 'P' pending there, 'D' finished there,
  // 'N' not among the operations it remembers. For the rank's own operations: 'Q' queued,
  // 'R' running (exchanging), 'D' done, 'F' failed.
  char state = 'N';
  double age = 0;  // seconds since it was queued (pending), ended (done), or acquired (mutex)
};

// One rank's answer, or the lack of one.
struct RankReport {
  enum Status { kSilent, kAnswered, kLost };
  Status status = kSilent;
  std::string host;
  int pid = 0;
  std::vector<OpBrief> pending;  // oldest first, at most kMaxPending
  OpBrief last_done;             // state 'N': none remembered
  std::vector<OpBrief> mutexes;  // held: name = window, age = held for
  std::vector<OpBrief> asked;    // the asker's operations, with this rank's state of each
  std::string frame;             // the main thread's Python line ("train.py:88 in step"), or ''
  static constexpr size_t kMaxPending = 6;
};

// The operations of `entries` pending for at least `min_age` seconds at `now`, oldest first.
std::vector<OpBrief> StalledOps(const std::vector<FlightEntry>& entries, double now,
                                double min_age);
// What this rank answers: from its recorder's entries, about `asked`.
RankReport ReportFrom(const std::vector<FlightEntry>& entries, double now,
                      const std::vector<OpBrief>& asked, const std::string& host, int pid);

// The wire: a question (the asker's stalled operations) and an answer, each a text of at most
// `limit` bytes (names are cut, and the lists shortened, to fit).
std::string EncodeQuestion(const std::vector<OpBrief>& ops, size_t limit);
std::vector<OpBrief> DecodeQuestion(const std::string& text);
std::string EncodeReport(const RankReport& report, size_t limit);
RankReport DecodeReport(const std::string& text);  // status kAnswered

// The diagnosis on rank `me`: for each of its stalled operations, what the other ranks of its
// process set (`members(set)`, job-wide ranks) are doing instead. `reports` is indexed by rank.
// With no stalled operation (an on-demand consultation), what every rank is doing.
std::string Diagnose(int me, const std::vector<OpBrief>& stalled,
                     const std::vector<RankReport>& reports, double answer_wait,
                     const std::function<std::vector<int>(int)>& members);

}  // namespace bluefog
