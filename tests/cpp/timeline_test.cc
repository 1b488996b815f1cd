#include "core/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace bluefog {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string TempPath(const char* name) {
  return ::testing::TempDir() + name + std::to_string(::getpid()) + ".json";
}

// The file is a complete JSON array after every event, before Close: what a killed rank leaves.
TEST(Timeline, FileIsClosedJsonAfterEveryEvent) {
  const std::string path = TempPath("timeline_every_event");
  Timeline t;
  t.OpenPath(path, 3);
  std::string text = Read(path);
  EXPECT_EQ(text.substr(0, 2), "[\n");
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  EXPECT_EQ(Count(text, "\"pid\": 3"), 1);  // the process name
  t.Phase("grad/a", "QUEUE", 1.0, 1.5);
  t.Phase("grad/a", "ALLREDUCE", 1.5, 2.0);
  t.Phase("b\"q", "NEGOTIATE", 2.0, 2.25);
  text = Read(path);
  EXPECT_EQ(text.substr(text.size() - 3), "\n]\n");
  EXPECT_EQ(Count(text, "]"), 1);  // one closing bracket: each event replaced the previous one
  EXPECT_EQ(Count(text, "\"ph\": \"X\""), 3);
  EXPECT_EQ(Count(text, "\"thread_name\""), 2);                     // one track per tensor
  EXPECT_NE(text.find("\"name\": \"b\\\"q\""), std::string::npos);  // escaped
  EXPECT_NE(text.find("\"ts\": 1500000.000, \"dur\": 500000.000"), std::string::npos);
  t.Close();
  EXPECT_EQ(Read(path), text);  // Close adds nothing: the file was already complete
  EXPECT_FALSE(t.enabled());
  ::unlink(path.c_str());
}

TEST(Timeline, FileNamePrefixNamesRanks) {
  const std::string base = ::testing::TempDir() + "timeline_names" + std::to_string(::getpid());
  Timeline zero, one;
  zero.Open(base + ".json", 0);
  one.Open(base + ".json", 1);
  EXPECT_EQ(Count(Read(base + ".json"), "bluefog rank 0"), 1);
  EXPECT_EQ(Count(Read(base + ".rank1.json"), "bluefog rank 1"), 1);
  zero.Close();
  one.Close();
  ::unlink((base + ".json").c_str());
  ::unlink((base + ".rank1.json").c_str());
}

}  // namespace
}  // namespace bluefog
