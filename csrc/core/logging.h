// Rank-prefixed log lines on stderr, filtered by BLUEFOG_LOG_LEVEL.
#pragma once

#include "core/config.h"
#include "core/status.h"

namespace bluefog {

void SetLogContext(LogLevel level, int rank);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const std::string& message);
// For lines written before SetLogContext knows the rank (a transport's rendezvous).
void LogLine(LogLevel level, int rank, const std::string& message);

#define BF_LOG(level, ...)                                                                       \
  do {                                                                                           \
    if (::bluefog::LogEnabled(level)) ::bluefog::LogLine(level, ::bluefog::Concat(__VA_ARGS__)); \
  } while (0)

}  // namespace bluefog
