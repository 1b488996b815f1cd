// The path choices kept across runs (core/path_cache.h) in a temporary directory, and the path
// chooser seeded from them (core/path_chooser.h): a cached class takes its path from its first
// call and is still decided again when the watch fires.
#include "core/path_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/path_chooser.h"

namespace bluefog {
namespace {

constexpr const char* kMachine = "host-a | Some CPU @ 2.0GHz | 2 CPUs | 8000000 kB";

class PathCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char base[] = "/tmp/bf_path_cache_XXXXXX";
    ASSERT_NE(mkdtemp(base), nullptr);
    base_ = base;
    dir_ = base_ + "/user/bluefog";  // parents missing: made on save
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + base_ + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string Read(const std::string& file) {
    std::ifstream in(file);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  void Write(const std::string& file, const std::string& text) {
    std::ofstream out(file, std::ios::trunc);
    out << text;
  }
  // A cache holding two choices for 2 ranks and one for 4, saved.
  PathCache Saved() {
    PathCache cache(dir_, kMachine);
    CachedChoice a;
    a.path = 1;
    a.seconds[0] = 2.5e-3;
    a.seconds[1] = 1.25e-3;
    cache.Put(2, "in place", 21, a);
    CachedChoice b;
    b.seconds[0] = 1e-4;
    b.seconds[1] = 3e-4;
    cache.Put(2, "outputs in the shared heap", 14, b);
    cache.Put(4, "in place", 21, b);
    std::string why;
    EXPECT_TRUE(cache.Save(&why)) << why;
    return cache;
  }
  std::string base_, dir_;
};

TEST_F(PathCacheTest, RoundTripWithPrivateFileAndDirectory) {
  const PathCache saved = Saved();
  struct stat st;
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(saved.file().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  PathCache loaded(dir_, kMachine);
  std::string why;
  ASSERT_EQ(loaded.Load(&why), PathCache::Loaded::kLoaded) << why;
  EXPECT_EQ(loaded.size(), 3u);
  const CachedChoice* a = loaded.Find(2, "in place", 21);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->path, 1);
  EXPECT_DOUBLE_EQ(a->seconds[0], 2.5e-3);
  EXPECT_DOUBLE_EQ(a->seconds[1], 1.25e-3);
  EXPECT_EQ(loaded.Find(2, "in place", 20), nullptr);
  EXPECT_EQ(loaded.Find(3, "in place", 21), nullptr);
  ASSERT_NE(loaded.Find(2, "outputs in the shared heap", 14), nullptr);
  EXPECT_EQ(loaded.Find(2, "outputs in the shared heap", 14)->path, 0);
  EXPECT_EQ(loaded.Checksum(2), saved.Checksum(2));
  EXPECT_NE(loaded.Checksum(2), loaded.Checksum(4));
  EXPECT_EQ(loaded.Checksum(3), 0u);
}

TEST_F(PathCacheTest, SaveKeepsOtherJobsChoicesAndReplacesItsOwn) {
  Saved();
  PathCache other(dir_, kMachine);  // another job: loaded nothing, chose one class again
  CachedChoice c;
  c.path = 0;
  c.seconds[0] = 1e-3;
  c.seconds[1] = 2e-3;
  other.Put(2, "in place", 21, c);
  std::string why;
  ASSERT_TRUE(other.Save(&why)) << why;
  PathCache loaded(dir_, kMachine);
  ASSERT_EQ(loaded.Load(&why), PathCache::Loaded::kLoaded) << why;
  EXPECT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded.Find(2, "in place", 21)->path, 0);
  EXPECT_NE(loaded.Find(4, "in place", 21), nullptr);
}

TEST_F(PathCacheTest, MissingFileIsNotAWarning) {
  PathCache cache(dir_, kMachine);
  std::string why;
  EXPECT_EQ(cache.Load(&why), PathCache::Loaded::kMissing);
  EXPECT_EQ(cache.Checksum(2), 0u);
}

// Every damaged file: ignored with a reason, nothing held, and the next save replaces it.
TEST_F(PathCacheTest, DamagedFilesAreIgnoredAndRewritten) {
  const std::string good = Read(Saved().file());
  const std::string file = PathCache(dir_, kMachine).file();
  const size_t cut = good.find("end");
  ASSERT_NE(cut, std::string::npos);
  std::string bad_value = good;
  bad_value.replace(bad_value.find("\n2 21 1 ") + 6, 1, "7");  // path 7
  const std::vector<std::pair<std::string, std::string>> damaged = {
      {"", "not a path choices file"},
      {"garbage\x01\x02", "not a path choices file"},
      {"bluefog path choices 99\n", "another version"},
      {good.substr(0, cut), "cut short"},
      {good.substr(0, good.rfind("\n4 21") + 9), "does not parse"},  // "4 21 0 0"
      {good.substr(0, good.size() - 2) + "5\n", "does not parse"},   // wrong count
      {good + "2 3 0 1 1 in place\n", "does not parse"},             // after the end
      {bad_value, "does not parse"},
      {"bluefog path choices 1\nmachine host-b | Some CPU @ 2.0GHz | 2 CPUs | 8000000 kB\n" +
           good.substr(good.find('\n', good.find("machine")) + 1),
       "another machine"},
  };
  for (const auto& [text, reason] : damaged) {
    Write(file, text);
    PathCache cache(dir_, kMachine);
    cache.Put(9, "x", 1, CachedChoice());  // replaced by what loads: nothing
    std::string why;
    EXPECT_EQ(cache.Load(&why), PathCache::Loaded::kIgnored) << text;
    EXPECT_NE(why.find(reason), std::string::npos) << why;
    EXPECT_EQ(cache.size(), 0u);
    CachedChoice c;
    c.seconds[0] = c.seconds[1] = 1e-3;
    cache.Put(2, "in place", 5, c);
    ASSERT_TRUE(cache.Save(&why)) << why;
    PathCache again(dir_, kMachine);
    ASSERT_EQ(again.Load(&why), PathCache::Loaded::kLoaded) << why;
    EXPECT_EQ(again.size(), 1u);
  }
}

// The key: another machine's key never loads, and a hardware change is another key.
TEST_F(PathCacheTest, MachineKeyNamesThisHostAndItsHardware) {
  const std::string key = PathCache::MachineKey();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(key.compare(0, std::string(host).size(), host), 0) << key;
  EXPECT_NE(key.find(" CPUs | "), std::string::npos) << key;
  EXPECT_NE(key.find("kB"), std::string::npos) << key;  // /proc/meminfo's MemTotal
  Saved();
  PathCache upgraded(dir_, "host-a | Some CPU @ 2.0GHz | 4 CPUs | 8000000 kB");
  std::string why;
  EXPECT_EQ(upgraded.Load(&why), PathCache::Loaded::kIgnored);
  EXPECT_NE(why.find("another machine"), std::string::npos) << why;
}

TEST_F(PathCacheTest, DefaultDirectoryOrder) {
  EXPECT_EQ(PathCache::DefaultDir("/c", "/x", "/h"), "/c");
  EXPECT_EQ(PathCache::DefaultDir("", "/x", "/h"), "/x/bluefog");
  EXPECT_EQ(PathCache::DefaultDir(nullptr, nullptr, "/h"), "/h/.cache/bluefog");
  EXPECT_EQ(PathCache::DefaultDir(nullptr, "", ""), "");
}

TEST_F(PathCacheTest, UnwritableDirectoryIsAnErrorNotACrash) {
  PathCache cache("/proc/no/such/dir", kMachine);
  std::string why;
  EXPECT_FALSE(cache.Save(&why));
  EXPECT_NE(why.find("/proc/no"), std::string::npos) << why;
}

constexpr int64_t kBytes = int64_t{3} << 20;  // size class 21

PathChooser::Agree Alone() {
  return [](const double* mine, int n, double* all) {
    for (int k = 0; k < n; ++k) all[k] = mine[k];
  };
}

// A seeded class takes its path from the first call, times nothing and tells of no choice;
// when the path taken becomes slower than the other path's cached median, the watch decides
// again (both timed in turns, no untimed start) and the new choice is told.
TEST(PathChooserSeeded, TakesTheCachedPathAtOnceAndStillFlipsWhenTheWatchFires) {
  PathChooser c(0, 1, {"out of place", "in place"}, Alone());
  std::vector<int> told;
  c.set_chosen([&](int kind, int size_class, int path, const double* seconds) {
    EXPECT_EQ(kind, 1);
    EXPECT_EQ(size_class, 21);
    EXPECT_GT(seconds[1], seconds[0]);
    told.push_back(path);
  });
  const double seconds[2] = {2e-3, 1e-3};
  c.Seed(1, 21, 1, seconds);
  EXPECT_EQ(c.Choice(1, kBytes), 1);
  EXPECT_EQ(c.Choice(0, kBytes), -1);  // the other kind still learns
  // While direct keeps its speed the watch stays quiet.
  for (int i = 0; i < 4 * PathChooser::kWatchCalls; ++i) {
    ASSERT_EQ(c.Next(1, kBytes), 1) << i;
    c.Record(1, kBytes, 1, 1e-3);
  }
  EXPECT_EQ(c.Choice(1, kBytes), 1);
  // Direct now takes 3 ms, over 1.25x the areas' 2 ms: one watch period later the class is
  // timed again, straight into the trials.
  for (int i = 0; i < PathChooser::kWatchCalls; ++i) c.Record(1, kBytes, c.Next(1, kBytes), 3e-3);
  EXPECT_EQ(c.Choice(1, kBytes), -1);
  EXPECT_TRUE(told.empty());
  for (int i = 0; i < PathChooser::kTrialCalls; ++i) {
    const int path = c.Next(1, kBytes);
    EXPECT_EQ(path, (i / PathChooser::kBlock) % 2) << i;
    c.Record(1, kBytes, path, path == 0 ? 2e-3 : 3e-3);
  }
  EXPECT_EQ(c.Choice(1, kBytes), 0);
  EXPECT_EQ(told, std::vector<int>{0});
}

// A seeded class is decided again on the first recheck's schedule, like a choice just made.
TEST(PathChooserSeeded, RecheckScheduleStillRuns) {
  PathChooser c(0, 1, {""}, Alone());
  const double seconds[2] = {1e-3, 2e-3};
  c.Seed(0, 21, 0, seconds);
  c.set_recheck_calls(40);
  for (int i = 0; i < 39; ++i) c.Record(0, kBytes, c.Next(0, kBytes), 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), 0);
  c.Record(0, kBytes, 0, 1e-3);
  EXPECT_EQ(c.Choice(0, kBytes), -1);
  EXPECT_EQ(c.Next(0, kBytes), 0);  // trials: the first block through the areas
}

}  // namespace
}  // namespace bluefog
