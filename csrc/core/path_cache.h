// The path chooser's choices kept across runs (core/path_chooser.h): one small text file per
// host under a per-user directory, so that a new process starts each size class on the path
// an earlier run chose instead of timing both again. Keyed by the machine (MachineKey: the
// host name and what changes with its hardware), then by the number of ranks on the host, the
// kind of call and the size class. Pure logic apart from the file and /proc reads; no MPI.
//
// The file (version line, machine line, one line per class, an end line with the count):
//   bluefog path choices 1
//   machine <MachineKey()>
//   <ranks> <size class> <path> <seconds through the areas> <seconds direct> <kind>
//   end <lines>
// The seconds are the slowest rank's medians when the choice was made. Saving writes a
// temporary file and renames it over the old one, so concurrent writers never leave a mixed
// file (the last one wins); a file that does not parse, is cut short, has another version or
// another machine is ignored (Load says why) and rewritten by the next save.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

namespace bluefog {

struct CachedChoice {
  int path = 0;                // 0 through the areas, 1 direct
  double seconds[2] = {0, 0};  // each path's median (slowest rank) when it was chosen
};

class PathCache {
 public:
  static constexpr int kVersion = 1;
  // `dir`: where the file lives (made 0700 on save when missing); `machine`: MachineKey() in
  // production, anything in tests.
  PathCache(std::string dir, std::string machine);

  // This host's name, the CPU model, the number of CPUs online and the memory in kB (/proc).
  static std::string MachineKey();
  // BLUEFOG_CACHE_DIR, else $XDG_CACHE_HOME/bluefog, else $HOME/.cache/bluefog (values of
  // those variables; empty ones count as unset); empty when none is set.
  static std::string DefaultDir(const char* bluefog_cache_dir, const char* xdg_cache_home,
                                const char* home);

  // The file: <dir>/path_choices.<host name>.txt (one per host, for home directories that
  // several hosts share).
  const std::string& file() const { return file_; }

  enum class Loaded { kMissing, kLoaded, kIgnored };
  // Replaces the choices held with the file's; kIgnored (and none held) when it is not a
  // complete file of this version and machine, with the reason in *why.
  Loaded Load(std::string* why);
  // Writes the choices held, after those of the file now on disk (when it loads) that these do
  // not replace, so jobs of other rank counts keep theirs. False with the reason in *why.
  bool Save(std::string* why) const;

  const CachedChoice* Find(int ranks, const std::string& kind, int size_class) const;
  void Put(int ranks, const std::string& kind, int size_class, const CachedChoice& choice);
  // A hash of every choice for `ranks` ranks (0 when there is none): equal on ranks that hold
  // the same choices.
  uint64_t Checksum(int ranks) const;
  size_t size() const { return choices_.size(); }

 private:
  using Key = std::tuple<int, std::string, int>;  // ranks, kind, size class
  std::string Text() const;
  static Loaded Parse(const std::string& text, const std::string& machine,
                      std::map<Key, CachedChoice>* choices, std::string* why);

  std::string dir_;
  std::string machine_;
  std::string file_;
  std::map<Key, CachedChoice> choices_;
};

}  // namespace bluefog
