// Who the other ranks wait for. A request waits in the negotiation from its submission until
// every rank has submitted it: the rank that comes last hardly waits, the others wait for it.
// Each rank adds up its own requests' waits (NoteOwnWaits) and sends the totals in every
// negotiation round it takes part in; every rank records the totals it receives (Observe), in
// one-second buckets over the last minute. A rank's mean wait per request against the
// longest mean wait of any rank is how far behind the first rank it comes on average (its
// lag); the rank that waits least in the seconds that hold most of the requests whose ranks'
// waits differ is the straggler. Pure logic, thread-safe (every channel's thread, the C API).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace bluefog {

struct RankLag {
  int rank = 0;
  int64_t ops = 0;       // its requests agreed in the window
  double mean_wait = 0;  // seconds a request of its waited for the other ranks, on average
  double mean_lag = 0;   // the longest mean wait of any rank less its own
  int64_t last = 0;      // requests of the contested seconds in which it waited least
};

struct StragglerReport {
  double window = 0;           // seconds covered (at most the tracker's window)
  int64_t ops = 0;             // requests agreed in the window (the most of any rank)
  int64_t contested = 0;       // seconds whose ranks' mean waits differed by over the spread
  int64_t contested_ops = 0;   // the requests agreed in those seconds
  std::vector<RankLag> ranks;  // by world rank
  int straggler = -1;          // the rank the others consistently wait for, or -1
  // "straggler: the other ranks wait for rank 2: ..." or "" when none is named.
  std::string Text() const;
  std::string Json() const;
};

class StragglerTracker {
 public:
  // A rank is named when at least kMinContested seconds of the window had the ranks' mean
  // waits differ by more than `spread` and the seconds in which it waited least hold at least
  // kShare of their requests (so that a few long stalls of others do not outweigh it).
  static constexpr int64_t kMinContested = 3;
  static constexpr double kShare = 0.75;
  // Waits travel in units of 10 us, totals modulo 2^32.
  static constexpr double kWaitUnit = 1e-5;

  explicit StragglerTracker(int world_size = 0, double window = 60, double spread = 0.001);
  // Forgets everything and sizes for a job of `world_size` ranks.
  void Reset(int world_size);
  // `ops` requests of this rank's own were agreed, `seconds` after their submissions in all
  // (a round's worth at once: one lock per round, not per request).
  void NoteOwnWaits(uint32_t ops, double seconds);
  // This rank's totals for its round messages: requests agreed, and their waits in kWaitUnit.
  void OwnTotals(uint32_t* ops, uint32_t* wait_units) const;
  // World rank `rank`'s totals, as a round message of its carried them, received at `now`.
  struct Totals {
    int rank;
    uint32_t ops;
    uint32_t wait_units;
  };
  void Observe(double now, const Totals* totals, size_t count);
  void Observe(double now, int rank, uint32_t ops, uint32_t wait_units) {
    const Totals one{rank, ops, wait_units};
    Observe(now, &one, 1);
  }
  StragglerReport Report(double now) const;
  // Whether `interval` seconds have passed since the last time this returned true (the first
  // call starts the clock and returns false).
  bool Due(double now, double interval);

 private:
  struct PerRank {
    int64_t ops = 0;
    double wait = 0;
  };
  struct Bucket {
    int64_t second = -1;
    std::vector<PerRank> ranks;
  };
  void ObserveLocked(double now, const Totals& totals);
  struct Seen {
    bool known = false;
    uint32_t ops = 0;
    uint32_t wait_units = 0;
  };

  mutable std::mutex mutex_;
  int world_size_ = 0;
  double window_;
  double spread_;
  std::vector<Bucket> buckets_;  // ring, one per second of the window
  std::vector<Seen> seen_;       // each rank's last totals
  double started_ = -1;
  double last_due_ = -1;
  uint64_t own_ops_ = 0;
  double own_wait_ = 0;
};

}  // namespace bluefog
