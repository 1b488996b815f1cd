// The timed choice between two paths for one kind of call: which of them the calls of each
// power-of-two size class take, decided by timing both in turns and agreed by every rank (the
// slowest rank's medians decide), made again now and then and at once when the path taken has
// become slower than the other was. Pure logic: the caller times its calls and supplies how the
// ranks agree (an allgather of a few doubles), so every rank makes the same choice as long as
// every rank records the same calls.
//
// Used for the one-host allreduce (path 0: through the data areas, 1: direct), whose faster path
// depends on the state the VM's memory is in, and changes within a launch (docs/design.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace bluefog {

class PathChooser {
 public:
  // A class's first kStartCalls calls take path 0 untimed (they pay the one-time page faults);
  // then the two paths run in turns, kBlock calls at a time (4 blocks), the first kWarm calls
  // of a block untimed (they find the other path's data in cache); then every rank takes the
  // path whose median, the slowest rank's, was lower.
  static constexpr int kStartCalls = 16;
  static constexpr int kBlock = 8;
  static constexpr int kWarm = 3;
  static constexpr int kTrialCalls = 4 * kBlock;
  static constexpr int kChooseCalls = kStartCalls + kTrialCalls;
  // The first choice of a class is made again after this many calls (or recheck_calls, if
  // fewer), later ones after recheck_calls; without the untimed start.
  static constexpr int kFirstRecheck = 256;
  static constexpr int kDefaultRecheck = 2048;
  // After a choice, every kWatchCalls calls the ranks compare the median of those calls with
  // the median the other path had in the trials; more than kWorse times that on any rank
  // decides the class again at once.
  static constexpr int kWatchCalls = 16;
  static constexpr double kWorse = 1.25;

  // Every rank's `n` doubles, in rank order, into `all` (n * ranks of them).
  using Agree = std::function<void(const double* mine, int n, double* all)>;
  // Told every choice made after timing both paths (on every rank alike): the kind, the size
  // class, the path and both paths' medians (the slowest rank's).
  using Chosen = std::function<void(int kind, int size_class, int path, const double* seconds)>;
  // `kinds`: labels of the kinds of call decided apart (for the debug log; "" for the plain one).
  PathChooser(int rank, int size, std::vector<std::string> kinds, Agree agree);

  static int SizeClass(int64_t bytes);  // floor(log2(bytes))
  // The path the next call of `kind` and `bytes` takes.
  int Next(int kind, int64_t bytes) const;
  // The path chosen for them, or -1 while still timing both.
  int Choice(int kind, int64_t bytes) const;
  // Records a call of `kind` and `bytes` that took `path` (Next's answer) in `seconds`.
  void Record(int kind, int64_t bytes, int path, double seconds);

  // A choice made before (a cache of earlier runs; every rank must seed the same): the class
  // takes `path` from its first call, without the untimed start or the trials, and keeps the
  // watch against `seconds` of the other path and the first recheck, like a choice just made.
  void Seed(int kind, int size_class, int path, const double* seconds);
  void set_chosen(Chosen chosen) { chosen_ = std::move(chosen); }

  // Tests: decide again after this many calls of a class (kDefaultRecheck), and compare the
  // watch with the other path's median times `factor` (kWorse; 0 makes every watch fire).
  void set_recheck_calls(int calls) { recheck_calls_ = calls; }
  void set_worse(double factor) { worse_ = factor; }

 private:
  static constexpr int kTrials = 2 * (kBlock - kWarm);  // timed calls of each path
  struct Class {
    int start = kStartCalls;  // untimed calls still to make before the trials
    int trials = 0;
    int pick = -1;
    int since_pick = 0;
    int picks = 0;            // choices made so far
    double other_median = 0;  // the slowest rank's trial median of the path not taken
    double watch[kWatchCalls] = {};
    double seconds[2][kTrials] = {};
  };
  Class& At(int kind, int64_t bytes) { return classes_[kind][SizeClass(bytes)]; }
  const Class& At(int kind, int64_t bytes) const { return classes_[kind][SizeClass(bytes)]; }
  void Watch(Class* c, int kind, int64_t bytes, double seconds);

  int rank_;
  int size_;
  std::vector<std::string> kinds_;
  Agree agree_;
  Chosen chosen_;
  std::vector<std::vector<Class>> classes_;  // [kind][size class]
  std::vector<double> all_;                  // every rank's medians (or watch ratios), reused
  int recheck_calls_ = kDefaultRecheck;
  double worse_ = kWorse;
};

}  // namespace bluefog
