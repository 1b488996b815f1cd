#include "core/straggler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace bluefog {

StragglerTracker::StragglerTracker(int world_size, double window, double spread)
    : window_(std::max(1.0, window)), spread_(spread) {
  Reset(world_size);
}

void StragglerTracker::Reset(int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  world_size_ = std::max(0, world_size);
  buckets_.assign(static_cast<size_t>(std::ceil(window_)), Bucket());
  seen_.assign(world_size_, Seen());
  started_ = -1;
  last_due_ = -1;
  own_ops_ = 0;
  own_wait_ = 0;
}

void StragglerTracker::NoteOwnWaits(uint32_t ops, double seconds) {
  if (ops == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  own_ops_ += ops;
  own_wait_ += std::max(0.0, seconds);
}

void StragglerTracker::OwnTotals(uint32_t* ops, uint32_t* wait_units) const {
  std::lock_guard<std::mutex> lock(mutex_);
  *ops = static_cast<uint32_t>(own_ops_);
  *wait_units = static_cast<uint32_t>(static_cast<uint64_t>(own_wait_ / kWaitUnit));
}

void StragglerTracker::Observe(double now, const Totals* totals, size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < count; ++i) ObserveLocked(now, totals[i]);
}

void StragglerTracker::ObserveLocked(double now, const Totals& totals) {
  const int rank = totals.rank;
  const uint32_t ops = totals.ops, wait_units = totals.wait_units;
  if (rank < 0 || rank >= world_size_) return;
  Seen& s = seen_[rank];
  // Differences modulo 2^32: a total that wrapped since the last message still adds up.
  const uint32_t d_ops = ops - s.ops;
  const uint32_t d_wait = wait_units - s.wait_units;
  const bool first = !s.known;
  s = Seen{true, ops, wait_units};
  if (first || d_ops == 0) return;
  if (started_ < 0) started_ = now;
  const int64_t second = static_cast<int64_t>(std::floor(now));
  Bucket& b = buckets_[static_cast<size_t>(second % static_cast<int64_t>(buckets_.size()))];
  if (b.second != second) {
    b.second = second;
    b.ranks.assign(world_size_, PerRank());
  }
  b.ranks[rank].ops += d_ops;
  b.ranks[rank].wait += d_wait * kWaitUnit;
}

StragglerReport StragglerTracker::Report(double now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  StragglerReport report;
  report.window = started_ < 0 ? 0 : std::min(window_, now - started_);
  std::vector<PerRank> sum(world_size_);
  std::vector<int64_t> least(world_size_, 0);
  const int64_t newest = static_cast<int64_t>(std::floor(now));
  for (const Bucket& b : buckets_) {
    if (b.second < 0 || b.second > newest || b.second <= newest - static_cast<int64_t>(window_))
      continue;
    double lo = 0, hi = 0;
    int lo_rank = -1, reported = 0;
    int64_t ops = 0;
    for (int r = 0; r < world_size_; ++r) {
      const PerRank& p = b.ranks[r];
      sum[r].ops += p.ops;
      sum[r].wait += p.wait;
      if (p.ops == 0) continue;
      ops = std::max(ops, p.ops);
      const double mean = p.wait / static_cast<double>(p.ops);
      if (reported++ == 0 || mean < lo) {
        lo = mean;
        lo_rank = r;
      }
      if (reported == 1 || mean > hi) hi = mean;
    }
    // A second counts when every rank reported in it and their waits differed.
    if (reported == world_size_ && reported >= 2 && hi - lo > spread_) {
      ++report.contested;
      report.contested_ops += ops;
      least[lo_rank] += ops;
    }
  }
  double longest = 0;
  for (int r = 0; r < world_size_; ++r) {
    RankLag lag;
    lag.rank = r;
    lag.ops = sum[r].ops;
    lag.mean_wait = sum[r].ops > 0 ? sum[r].wait / static_cast<double>(sum[r].ops) : 0;
    lag.last = least[r];
    longest = std::max(longest, lag.mean_wait);
    report.ops = std::max(report.ops, lag.ops);
    report.ranks.push_back(lag);
  }
  int most = -1;
  for (RankLag& lag : report.ranks) {
    lag.mean_lag = lag.ops > 0 ? longest - lag.mean_wait : 0;
    if (most < 0 || lag.last > report.ranks[most].last) most = lag.rank;
  }
  if (most >= 0 && report.contested >= kMinContested &&
      static_cast<double>(report.ranks[most].last) >=
          kShare * static_cast<double>(report.contested_ops))
    report.straggler = most;
  return report;
}

bool StragglerTracker::Due(double now, double interval) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (last_due_ < 0) {
    last_due_ = now;
    return false;
  }
  if (now - last_due_ < interval) return false;
  last_due_ = now;
  return true;
}

namespace {
std::string Ms(double seconds) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(seconds < 0.01 ? 2 : 1);
  out << seconds * 1e3 << " ms";
  return out.str();
}
}  // namespace

std::string StragglerReport::Text() const {
  if (straggler < 0) return "";
  const RankLag& s = ranks[straggler];
  std::ostringstream out;
  out << "straggler: the other ranks wait for rank " << straggler << ": it came last to " << s.last
      << " of the " << contested_ops << " collectives of the last "
      << static_cast<int>(std::ceil(window)) << " s whose ranks' waits differed (in " << contested
      << " s); its collectives come " << Ms(s.mean_lag)
      << " after the first rank's on average. Lag per rank:";
  // A large job's list stops at 16 ranks: bf.straggler_report() has every one.
  constexpr size_t kListed = 16;
  for (size_t i = 0; i < ranks.size() && i < kListed; ++i)
    out << (i == 0 ? " " : ", ") << ranks[i].rank << ": " << Ms(ranks[i].mean_lag);
  if (ranks.size() > kListed) out << ", ...";
  out << ". Look at what rank " << straggler
      << " does between steps (input, logging, checkpoints, a slower or busier host); "
         "bf.straggler_report() gives these numbers";
  return out.str();
}

std::string StragglerReport::Json() const {
  std::ostringstream out;
  out.precision(9);
  out << "{\"window_seconds\": " << window << ", \"ops\": " << ops
      << ", \"contested_seconds\": " << contested << ", \"contested_ops\": " << contested_ops
      << ", \"straggler\": ";
  if (straggler < 0)
    out << "null";
  else
    out << straggler;
  out << ", \"ranks\": [";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankLag& r = ranks[i];
    out << (i ? ", " : "") << "{\"rank\": " << r.rank << ", \"ops\": " << r.ops
        << ", \"mean_wait_seconds\": " << r.mean_wait << ", \"mean_lag_seconds\": " << r.mean_lag
        << ", \"last_ops\": " << r.last << "}";
  }
  out << "]}";
  return out.str();
}

}  // namespace bluefog
