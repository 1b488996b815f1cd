#include "core/path_chooser.h"

#include <algorithm>

#include "core/logging.h"

namespace bluefog {
namespace {

// The median of t[0..n) (reorders them).
double MedianOf(double* t, int n) {
  std::nth_element(t, t + n / 2, t + n);
  return t[n / 2];
}

const char* PathName(int path) { return path == 1 ? "direct" : "the areas"; }

}  // namespace

PathChooser::PathChooser(int rank, int size, std::vector<std::string> kinds, Agree agree)
    : rank_(rank),
      size_(size),
      kinds_(std::move(kinds)),
      agree_(std::move(agree)),
      classes_(kinds_.size(), std::vector<Class>(64)) {}

int PathChooser::SizeClass(int64_t bytes) {
  int size_class = 0;
  while ((int64_t{2} << size_class) <= bytes && size_class < 62) ++size_class;
  return size_class;
}

int PathChooser::Next(int kind, int64_t bytes) const {
  const Class& c = At(kind, bytes);
  return c.pick >= 0 ? c.pick : c.start > 0 ? 0 : (c.trials / kBlock) % 2;
}

int PathChooser::Choice(int kind, int64_t bytes) const { return At(kind, bytes).pick; }

void PathChooser::Record(int kind, int64_t bytes, int path, double seconds) {
  Class* c = &At(kind, bytes);
  if (c->pick >= 0) {
    Watch(c, kind, bytes, seconds);
    return;
  }
  if (c->start > 0) {
    --c->start;
    return;
  }
  const int in_block = c->trials % kBlock;
  if (in_block >= kWarm)
    c->seconds[path][(c->trials / (2 * kBlock)) * (kBlock - kWarm) + in_block - kWarm] = seconds;
  if (++c->trials < kTrialCalls) return;
  const double medians[2] = {MedianOf(c->seconds[0], kTrials), MedianOf(c->seconds[1], kTrials)};
  all_.resize(2 * static_cast<size_t>(size_));
  agree_(medians, 2, all_.data());
  double slowest[2] = {0, 0};
  for (int r = 0; r < size_; ++r)
    for (int a = 0; a < 2; ++a) slowest[a] = std::max(slowest[a], all_[2 * r + a]);
  c->pick = slowest[1] < slowest[0] ? 1 : 0;
  c->other_median = slowest[1 - c->pick];
  ++c->picks;
  if (chosen_) chosen_(kind, SizeClass(bytes), c->pick, slowest);
  if (rank_ == 0)
    BF_LOG(LogLevel::kDebug, "allreduce size class ", int64_t{1} << SizeClass(bytes), " bytes",
           kinds_[kind].empty() ? "" : " (", kinds_[kind], kinds_[kind].empty() ? "" : ")",
           ": through the areas ", slowest[0] * 1e3, " ms, direct ", slowest[1] * 1e3,
           " ms (slowest rank's medians); takes ", PathName(c->pick));
}

void PathChooser::Seed(int kind, int size_class, int path, const double* seconds) {
  Class& c = classes_[kind][size_class];
  c = Class();
  c.start = 0;
  c.pick = path;
  c.picks = 1;
  c.other_median = seconds[1 - path];
}

// The state can change later (it did within launches): both paths are timed again now and
// then, the first time soon (a choice made while the job was starting can be off), without the
// untimed start; and at once when the path taken has become slower than the other was (the
// watch: one small agreement every kWatchCalls calls).
void PathChooser::Watch(Class* c, int kind, int64_t bytes, double seconds) {
  c->watch[c->since_pick % kWatchCalls] = seconds;
  const int period = c->picks == 1 ? std::min(kFirstRecheck, recheck_calls_) : recheck_calls_;
  bool again = ++c->since_pick >= period;
  if (!again && c->since_pick % kWatchCalls == 0) {
    // Every rank's median of these calls over what it may reach: more than 1 on any rank
    // decides again.
    const double median = MedianOf(c->watch, kWatchCalls);
    const double ratio = median / (worse_ * c->other_median);
    all_.resize(static_cast<size_t>(size_));
    agree_(&ratio, 1, all_.data());
    again = *std::max_element(all_.begin(), all_.end()) > 1.0;
    if (again && rank_ == 0)
      BF_LOG(LogLevel::kDebug, "allreduce size class ", int64_t{1} << SizeClass(bytes), " bytes",
             kinds_[kind].empty() ? "" : " (", kinds_[kind], kinds_[kind].empty() ? "" : ")",
             ": the path taken now takes ", median * 1e3, " ms (median of ", kWatchCalls,
             " calls on rank 0), the other took ", c->other_median * 1e3, " ms; deciding again");
  }
  if (again) {
    const int picks = c->picks;
    *c = Class();
    c->start = 0;
    c->picks = picks;
  }
}

}  // namespace bluefog
