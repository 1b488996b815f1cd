#include "core/path_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <locale>
#include <sstream>

namespace bluefog {
namespace {

constexpr const char* kVersionLine = "bluefog path choices ";

// The first line of /proc/<file> that starts with `field`, after its ':' and blanks.
std::string ProcField(const char* file, const char* field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, std::strlen(field), field) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// Letters, digits, '.', '-' and '_' of `name`; any other byte as '_'.
std::string FileSafe(const std::string& name) {
  std::string safe = name.empty() ? "unknown" : name;
  for (char& ch : safe)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-') ch = '_';
  return safe;
}

// Makes `dir` and any missing parent, each 0700.
bool MakeDirs(const std::string& dir, std::string* why) {
  for (size_t at = 1; at <= dir.size(); ++at) {
    if (at < dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = "cannot make " + part + ": " + std::strerror(errno);
      return false;
    }
  }
  return true;
}

std::string ReadAll(const std::string& file, bool* found) {
  std::ifstream in(file, std::ios::binary);
  *found = static_cast<bool>(in);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

}  // namespace

PathCache::PathCache(std::string dir, std::string machine)
    : dir_(std::move(dir)),
      machine_(std::move(machine)),
      file_(dir_ + "/path_choices." + FileSafe(HostName()) + ".txt") {}

std::string PathCache::MachineKey() {
  std::string cpu = ProcField("/proc/cpuinfo", "model name");
  if (cpu.empty()) cpu = ProcField("/proc/cpuinfo", "CPU part");  // arm64
  std::ostringstream key;
  key << HostName() << " | " << (cpu.empty() ? "unknown CPU" : cpu) << " | "
      << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs | " << ProcField("/proc/meminfo", "MemTotal");
  return key.str();
}

std::string PathCache::DefaultDir(const char* bluefog_cache_dir, const char* xdg_cache_home,
                                  const char* home) {
  if (bluefog_cache_dir && *bluefog_cache_dir) return bluefog_cache_dir;
  if (xdg_cache_home && *xdg_cache_home) return std::string(xdg_cache_home) + "/bluefog";
  if (home && *home) return std::string(home) + "/.cache/bluefog";
  return "";
}

PathCache::Loaded PathCache::Parse(const std::string& text, const std::string& machine,
                                   std::map<Key, CachedChoice>* choices, std::string* why) {
  std::istringstream in(text);
  in.imbue(std::locale::classic());
  std::string line;
  if (!std::getline(in, line) || line.compare(0, std::strlen(kVersionLine), kVersionLine) != 0) {
    *why = "not a path choices file";
    return Loaded::kIgnored;
  }
  if (line != kVersionLine + std::to_string(kVersion)) {
    *why = "written by another version (\"" + line + "\")";
    return Loaded::kIgnored;
  }
  if (!std::getline(in, line) || in.eof()) {
    *why = "cut short (no complete machine line)";
    return Loaded::kIgnored;
  }
  if (line != "machine " + machine) {
    *why = "written on another machine or hardware (\"" + line + "\", this one is \"" + machine +
           "\")";
    return Loaded::kIgnored;
  }
  int lines = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    fields.imbue(std::locale::classic());
    std::string word, after;
    int count = -1;
    if (line.compare(0, 4, "end ") == 0 && (fields >> word >> count) && count == lines &&
        !std::getline(in, after))
      return Loaded::kLoaded;
    int ranks = 0, size_class = -1;
    CachedChoice c;
    fields.str(line);
    fields.clear();
    if (!(fields >> ranks >> size_class >> c.path >> c.seconds[0] >> c.seconds[1]) || ranks < 1 ||
        size_class < 0 || size_class > 62 || (c.path != 0 && c.path != 1) || !(c.seconds[0] > 0) ||
        !(c.seconds[1] > 0) || !std::isfinite(c.seconds[0]) || !std::isfinite(c.seconds[1])) {
      *why = "line " + std::to_string(lines + 3) + " does not parse (\"" + line + "\")";
      choices->clear();
      return Loaded::kIgnored;
    }
    std::string kind;
    std::getline(fields, kind);
    if (!kind.empty() && kind[0] == ' ') kind.erase(0, 1);
    (*choices)[Key(ranks, kind, size_class)] = c;
    ++lines;
  }
  *why = "cut short (no end line after " + std::to_string(lines) + " choices)";
  choices->clear();
  return Loaded::kIgnored;
}

PathCache::Loaded PathCache::Load(std::string* why) {
  choices_.clear();
  bool found = false;
  const std::string text = ReadAll(file_, &found);
  if (!found) return Loaded::kMissing;
  return Parse(text, machine_, &choices_, why);
}

std::string PathCache::Text() const {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out.precision(9);
  out << kVersionLine << kVersion << "\nmachine " << machine_ << "\n";
  for (const auto& [key, c] : choices_)
    out << std::get<0>(key) << ' ' << std::get<2>(key) << ' ' << c.path << ' ' << c.seconds[0]
        << ' ' << c.seconds[1] << ' ' << std::get<1>(key) << '\n';
  out << "end " << choices_.size() << '\n';
  return out.str();
}

bool PathCache::Save(std::string* why) const {
  if (!MakeDirs(dir_, why)) return false;
  PathCache merged(*this);
  {
    bool found = false;
    std::string ignored;
    std::map<Key, CachedChoice> on_disk;
    if (Parse(ReadAll(file_, &found), machine_, &on_disk, &ignored) == Loaded::kLoaded)
      merged.choices_.insert(on_disk.begin(), on_disk.end());  // keeps ours where both have one
  }
  const std::string text = merged.Text();
  // A name no other writer uses (process ids repeat across PID namespaces; the clock does not).
  const std::string temp =
      file_ + ".tmp." + std::to_string(getpid()) + "." +
      std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot write " + temp + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool written = done == text.size();
  const int write_errno = errno;
  if (close(fd) != 0 || !written || rename(temp.c_str(), file_.c_str()) != 0) {
    *why = "cannot write " + file_ + ": " + std::strerror(written ? errno : write_errno);
    unlink(temp.c_str());
    return false;
  }
  return true;
}

const CachedChoice* PathCache::Find(int ranks, const std::string& kind, int size_class) const {
  const auto it = choices_.find(Key(ranks, kind, size_class));
  return it == choices_.end() ? nullptr : &it->second;
}

void PathCache::Put(int ranks, const std::string& kind, int size_class,
                    const CachedChoice& choice) {
  choices_[Key(ranks, kind, size_class)] = choice;
}

uint64_t PathCache::Checksum(int ranks) const {
  // FNV-1a over the lines of `ranks`, in the map's order (the same on every rank).
  uint64_t hash = 0;
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out.precision(17);
  for (const auto& [key, c] : choices_)
    if (std::get<0>(key) == ranks)
      out << std::get<2>(key) << ' ' << c.path << ' ' << c.seconds[0] << ' ' << c.seconds[1] << ' '
          << std::get<1>(key) << '\n';
  const std::string text = out.str();
  if (text.empty()) return hash;
  hash = 14695981039346656037ull;
  for (unsigned char ch : text) hash = (hash ^ ch) * 1099511628211ull;
  return hash;
}

}  // namespace bluefog
