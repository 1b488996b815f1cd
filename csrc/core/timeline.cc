#include "core/timeline.h"

#include <cerrno>
#include <cstring>

#include "core/status.h"

namespace bluefog {
namespace {

// Tensor names go into JSON strings: escape what JSON requires.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void Timeline::Open(const std::string& prefix, int rank) {
  // A file name (Horovod's --timeline-filename timeline.json): rank 0 writes it, rank r
  // "timeline.rank<r>.json", as bf.start_timeline names them. A prefix: "<prefix><rank>.json".
  const std::string ext = ".json";
  const bool file_name = prefix.size() > ext.size() &&
                         prefix.compare(prefix.size() - ext.size(), ext.size(), ext) == 0;
  if (!file_name) {
    OpenPath(prefix + std::to_string(rank) + ext, rank);
  } else if (rank == 0) {
    OpenPath(prefix, rank);
  } else {
    OpenPath(prefix.substr(0, prefix.size() - ext.size()) + ".rank" + std::to_string(rank) + ext,
             rank);
  }
}

void Timeline::OpenPath(const std::string& path, int rank) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  BF_ENFORCE(file != nullptr, StatusCode::kInvalidArgument, "timeline: cannot create '", path,
             "': ", std::strerror(errno));
  std::lock_guard<std::mutex> lock(mutex_);
  CloseLocked();
  file_ = file;
  rank_ = rank;
  std::fputs("[\n", file_);
  std::fprintf(file_,
               "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
               "\"bluefog rank %d\"}}",
               rank_, rank_);
  first_ = false;
  enabled_ = true;
}

int Timeline::TrackOf(const std::string& tensor) {
  auto it = tracks_.find(tensor);
  if (it != tracks_.end()) return it->second;
  const int track = static_cast<int>(tracks_.size()) + 1;
  tracks_.emplace(tensor, track);
  std::fprintf(file_,
               ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
               "\"args\": {\"name\": \"%s\"}}",
               rank_, track, JsonEscape(tensor).c_str());
  return track;
}

void Timeline::Phase(const std::string& tensor, const char* phase, double start, double end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!file_) return;
  const int track = TrackOf(tensor);
  std::fprintf(file_,
               "%s\n{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
               "\"dur\": %.3f}",
               first_ ? "" : ",", JsonEscape(phase).c_str(), rank_, track, start * 1e6,
               (end - start) * 1e6);
  first_ = false;
}

void Timeline::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  CloseLocked();
}

void Timeline::CloseLocked() {
  enabled_ = false;
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
  tracks_.clear();
}

}  // namespace bluefog
