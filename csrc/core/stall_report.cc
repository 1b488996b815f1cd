#include "core/stall_report.h"

#include <sstream>

namespace bluefog {

StallWatch::Verdict StallWatch::Check(double now, double oldest_submitted) {
  if (!enabled() || !Due(now)) return Verdict::kQuiet;
  last_check_ = now;
  const double waited = now - oldest_submitted;
  const bool fail = shutdown_seconds_ > 0 && waited >= shutdown_seconds_;
  const bool warn =
      check_seconds_ > 0 && waited >= check_seconds_ && now - last_report_ >= check_seconds_;
  if (!warn && !fail) return Verdict::kQuiet;
  last_report_ = now;
  return fail ? Verdict::kFail : Verdict::kWarn;
}

std::string StallMessage(double waited, const std::vector<std::string>& mine,
                         const std::vector<WaitingTensor>& waiting) {
  std::ostringstream out;
  out << "a collective submitted on this rank has waited " << static_cast<int>(waited)
      << " s for the other ranks. Waiting here:";
  for (size_t k = 0; k < mine.size() && k < 10; ++k) out << " '" << mine[k] << "'";
  if (mine.size() > 10) out << " ... (" << mine.size() << " in all)";
  out << ".";
  if (waiting.empty()) {
    out << " No other rank has announced these names yet: the other ranks have not reached a "
           "collective, or are blocked elsewhere.";
    return out.str();
  }
  out << " Submitted by some ranks but not all:";
  size_t shown = 0;
  for (const WaitingTensor& w : waiting) {
    if (++shown > 20) {
      out << " ... and " << waiting.size() - 20 << " more";
      break;
    }
    out << " '" << w.name << "' (missing ranks";
    for (int r : w.missing_ranks) out << " " << r;
    out << ")";
  }
  out << ". The missing ranks may have stopped calling collectives or use other names.";
  return out.str();
}

}  // namespace bluefog
