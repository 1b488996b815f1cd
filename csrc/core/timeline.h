// Chrome-trace timeline (chrome://tracing, Perfetto): one JSON file per rank with each tensor's
// queue, negotiation and communication phases (pid = rank, one track per tensor). Written by
// whichever thread runs the world channel's rounds; opened and closed at init and shutdown, or
// by the user at any time (bf.start_timeline / stop_timeline), hence the lock.
//
// The file is complete JSON at every moment, not only after Close: each event goes out in one
// pwrite that replaces the closing "\n]\n" with ",\n{event}\n]\n". So a rank that is killed
// leaves a valid file holding every event recorded before, and bfrun can merge the ranks'
// files into one (bluefog/common/timeline.py).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

namespace bluefog {

// Seconds on the steady clock: the times Phase takes, and what the runtime stamps requests with.
inline double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// `s` escaped for a JSON string (tensor names go into the timeline and the flight recorder).
std::string JsonEscape(const std::string& s);

class Timeline {
 public:
  ~Timeline() { Close(); }
  // Opens "<prefix><rank>.json", or for a prefix ending in ".json" (a file name, Horovod's
  // --timeline-filename) that name on rank 0 and "<stem>.rank<rank>.json" on the others.
  // Throws BluefogError if the file cannot be created.
  void Open(const std::string& prefix, int rank);
  // Opens exactly `path` (closing the file open now, if any). Throws like Open.
  void OpenPath(const std::string& path, int rank);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // A phase of one tensor, as a complete ("X") event; times in seconds since any fixed origin.
  void Phase(const std::string& tensor, const char* phase, double start, double end);
  void Close();

 private:
  // The track of `tensor`; a new track's metadata event is appended to *out.
  int TrackOf(const std::string& tensor, std::string* out);
  // Writes `events` (each starting with ",\n") before the closing bracket.
  void AppendLocked(const std::string& events);
  void CloseLocked();

  std::mutex mutex_;  // guards the members below
  std::atomic<bool> enabled_{false};
  int fd_ = -1;
  off_t end_ = 0;  // where the closing "\n]\n" starts
  int rank_ = 0;
  std::string path_;
  bool write_failed_ = false;
  std::unordered_map<std::string, int> tracks_;
};

}  // namespace bluefog
