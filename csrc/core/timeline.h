// Chrome-trace timeline (chrome://tracing, Perfetto): one JSON file per rank with each tensor's
// queue, negotiation and communication phases. Written by whichever thread runs the world
// channel's rounds; opened and closed at init and shutdown, or by the user at any time
// (bf.start_timeline / stop_timeline), hence the lock.
#pragma once

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

namespace bluefog {

class Timeline {
 public:
  ~Timeline() { Close(); }
  // Opens "<prefix><rank>.json". Throws BluefogError if the file cannot be created.
  void Open(const std::string& prefix, int rank);
  // Opens exactly `path` (closing the file open now, if any). Throws like Open.
  void OpenPath(const std::string& path, int rank);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // A phase of one tensor, as a complete ("X") event; times in seconds since any fixed origin.
  void Phase(const std::string& tensor, const char* phase, double start, double end);
  void Close();

 private:
  int TrackOf(const std::string& tensor);
  void CloseLocked();

  std::mutex mutex_;  // guards the members below
  std::atomic<bool> enabled_{false};
  std::FILE* file_ = nullptr;
  int rank_ = 0;
  bool first_ = true;
  std::unordered_map<std::string, int> tracks_;
};

}  // namespace bluefog
