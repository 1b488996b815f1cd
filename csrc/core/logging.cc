#include "core/logging.h"

#include <atomic>
#include <cstdio>

namespace bluefog {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}
}  // namespace

void SetLogContext(LogLevel level, int rank) {
  g_level = static_cast<int>(level);
  g_rank = rank;
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void LogLine(LogLevel level, const std::string& message) { LogLine(level, g_rank.load(), message); }

void LogLine(LogLevel level, int rank, const std::string& message) {
  // One fprintf per line so lines of concurrent threads do not interleave.
  std::fprintf(stderr, "[bluefog rank %d] %s: %s\n", rank, LevelName(level), message.c_str());
}

}  // namespace bluefog
