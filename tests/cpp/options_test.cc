// The transport's options (from Config) and its run-time switches by name (transport/options.h).
#include "transport/options.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace bluefog {
namespace {

TEST(TransportOptions, FromConfig) {
  const std::map<std::string, std::string> env = {{"BLUEFOG_RING_THRESHOLD", "4096"},
                                                  {"BLUEFOG_DIRECT_ALLREDUCE", "0"},
                                                  {"BLUEFOG_STAGED_ALLREDUCE", "8192"},
                                                  {"BLUEFOG_STREAMING_STORES", "0"},
                                                  {"BLUEFOG_ONE_HOST_THRESHOLD", "32768"}};
  const Config config = Config::FromLookup([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  const TransportOptions o = TransportOptions::FromConfig(config);
  EXPECT_EQ(o.ring_threshold_bytes, 4096);
  EXPECT_FALSE(o.direct);
  EXPECT_TRUE(o.hierarchical);
  EXPECT_EQ(o.staged_bytes, 8192);
  EXPECT_EQ(o.streaming_store_bytes, 0);
  EXPECT_EQ(o.one_host_threshold_bytes, 32 << 10);
  const Tuning t(o);
  EXPECT_EQ(t.one_host_threshold_bytes.load(), 32 << 10);
  EXPECT_EQ(t.ring_threshold_bytes.load(), 4096);
  EXPECT_FALSE(t.direct.load());
  EXPECT_EQ(t.streaming_store_bytes.load(), 0);
}

TEST(Tuning, ByName) {
  Tuning t;
  int64_t before = -1, value = -1;
  ASSERT_TRUE(t.Set("streaming_stores", 1, &before));
  EXPECT_EQ(before, Config().streaming_store_bytes);
  ASSERT_TRUE(t.Get("streaming_stores", &value));
  EXPECT_EQ(value, 1);
  ASSERT_TRUE(t.Set("staged", 0, &before));
  EXPECT_EQ(before, 1);
  EXPECT_FALSE(t.staged.load());
  ASSERT_TRUE(t.Set("worse_percent", 0, &before));
  EXPECT_EQ(before, 125);
  EXPECT_EQ(t.worse.load(), 0.0);
  // Unknown knobs, and the read-only count.
  EXPECT_FALSE(t.Set("no_such_knob", 1, &before));
  EXPECT_FALSE(t.Get("no_such_knob", &value));
  EXPECT_FALSE(t.Set("shared_calls", 5, &before));
  ASSERT_TRUE(t.Get("shared_calls", &value));
  EXPECT_EQ(value, 0);
  EXPECT_FALSE(t.Set("one_host_calls", 5, &before));
  ASSERT_TRUE(t.Get("one_host_calls", &value));
  EXPECT_EQ(value, 0);
  ASSERT_TRUE(t.Set("one_host_threshold", 0, &before));
  EXPECT_EQ(before, Config().one_host_threshold_bytes);
}

}  // namespace
}  // namespace bluefog
