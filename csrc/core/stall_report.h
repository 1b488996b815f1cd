// When a rank has waited too long for the others, and what it tells the user: pure logic, no
// MPI. The runtime feeds it the clock and what is pending; tests feed it made-up times.
#pragma once

#include <string>
#include <vector>

#include "core/coordinator.h"

namespace bluefog {

class StallWatch {
 public:
  // Seconds of waiting before a warning (repeated at that interval) and before giving up; 0
  // turns either off.
  StallWatch(double check_seconds, double shutdown_seconds)
      : check_seconds_(check_seconds), shutdown_seconds_(shutdown_seconds) {}

  enum class Verdict { kQuiet, kWarn, kFail };
  // Whether to speak now, given the time and when the oldest pending request was submitted.
  // Looks at most every half second; warns at most once per check interval.
  Verdict Check(double now, double oldest_submitted);
  // Whether Check can ever speak: when false the runtime skips gathering what it needs.
  bool enabled() const { return check_seconds_ > 0 || shutdown_seconds_ > 0; }
  // Whether it is time to look again (at most every half second).
  bool Due(double now) const { return now - last_check_ >= 0.5; }

 private:
  double check_seconds_;
  double shutdown_seconds_;
  double last_check_ = 0;
  double last_report_ = 0;
};

// The message for a rank that has waited `waited` seconds with `mine` (sorted names) pending,
// while `waiting` lists the names some ranks announced and others did not.
std::string StallMessage(double waited, const std::vector<std::string>& mine,
                         const std::vector<WaitingTensor>& waiting);

}  // namespace bluefog
