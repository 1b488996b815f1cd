#include "core/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/logging.h"
#include "core/status.h"

namespace bluefog {
namespace {

constexpr char kClosing[] = "\n]\n";
constexpr size_t kClosingSize = sizeof(kClosing) - 1;

// Writes all of `data` at `offset`; false (errno set) on failure.
bool WriteAllAt(int fd, const std::string& data, off_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

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
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  BF_ENFORCE(fd >= 0, StatusCode::kInvalidArgument, "timeline: cannot create '", path,
             "': ", std::strerror(errno));
  char head[160];
  std::snprintf(head, sizeof(head),
                "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
                "{\"name\": \"bluefog rank %d\"}}",
                rank, rank);
  const std::string start = std::string(head) + kClosing;
  if (!WriteAllAt(fd, start, 0)) {
    const int err = errno;
    ::close(fd);
    BF_ENFORCE(false, StatusCode::kInvalidArgument, "timeline: cannot write '", path,
               "': ", std::strerror(err));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  CloseLocked();
  fd_ = fd;
  end_ = static_cast<off_t>(start.size() - kClosingSize);
  rank_ = rank;
  path_ = path;
  write_failed_ = false;
  enabled_ = true;
}

int Timeline::TrackOf(const std::string& tensor, std::string* out) {
  auto it = tracks_.find(tensor);
  if (it != tracks_.end()) return it->second;
  const int track = static_cast<int>(tracks_.size()) + 1;
  tracks_.emplace(tensor, track);
  char buf[128];
  std::snprintf(buf, sizeof(buf),
                ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                "\"args\": {\"name\": \"",
                rank_, track);
  *out += buf;
  *out += JsonEscape(tensor);
  *out += "\"}}";
  return track;
}

void Timeline::Phase(const std::string& tensor, const char* phase, double start, double end) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || write_failed_) return;
  std::string events;
  const int track = TrackOf(tensor, &events);
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, "
                "\"dur\": %.3f}",
                rank_, track, start * 1e6, (end - start) * 1e6);
  events += ",\n{\"name\": \"";
  events += JsonEscape(phase);
  events += buf;
  AppendLocked(events);
}

void Timeline::AppendLocked(const std::string& events) {
  if (!WriteAllAt(fd_, events + kClosing, end_)) {
    // A full disk: stop recording, once, leaving the events written so far (the file stays
    // valid JSON up to the failed write's start at worst, see bluefog/common/timeline.py).
    if (!write_failed_)
      BF_LOG(LogLevel::kError, "timeline: cannot write '", path_, "': ", std::strerror(errno),
             "; the timeline stops here");
    write_failed_ = true;
    enabled_ = false;
    return;
  }
  end_ += static_cast<off_t>(events.size());
}

void Timeline::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  CloseLocked();
}

void Timeline::CloseLocked() {
  enabled_ = false;
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  tracks_.clear();
}

}  // namespace bluefog
