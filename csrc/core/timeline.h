// Chrome-trace timeline (chrome://tracing, Perfetto): one JSON file per rank with each tensor's
// queue, negotiation and communication phases. Written only by the background thread.
#pragma once

#include <cstdio>
#include <string>
#include <unordered_map>

namespace bluefog {

class Timeline {
 public:
  ~Timeline() { Close(); }
  // Opens "<prefix><rank>.json". Throws BluefogError if the file cannot be created.
  void Open(const std::string& prefix, int rank);
  bool enabled() const { return file_ != nullptr; }
  // A phase of one tensor, as a complete ("X") event; times in seconds since any fixed origin.
  void Phase(const std::string& tensor, const char* phase, double start, double end);
  void Close();

 private:
  int TrackOf(const std::string& tensor);

  std::FILE* file_ = nullptr;
  int rank_ = 0;
  bool first_ = true;
  std::unordered_map<std::string, int> tracks_;
};

}  // namespace bluefog
