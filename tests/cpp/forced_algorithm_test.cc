// BLUEFOG_ALLREDUCE_ALGORITHM over either backend (launched_transport.h), read as the runtime
// reads it (Config, then TransportOptions): the algorithm it names takes every call it applies
// to, or, where it cannot run (the one-host path across hosts, another backend's, no such
// name), Init fails on every rank with an error naming it, the rank and the algorithms there
// are. BLUEFOG_TEST_EXPECT_ERROR: the text that error must contain (unset: none expected);
// BLUEFOG_TEST_CROSS_HOST_ERROR: that error is about the transport across hosts (Gloo's pairs in
// an MPI job, BLUEFOG_CROSS_HOST), not the algorithm.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "launched_transport.h"
#include "transport/allreduce_algorithm.h"

namespace bluefog {
namespace {

TEST(ForcedAlgorithm, RunsOrFailsClearly) {
  const Config config = Config::FromEnvironment();
  ASSERT_FALSE(config.allreduce_algorithm.empty()) << "set BLUEFOG_ALLREDUCE_ALGORITHM";
  const char* expected_error = std::getenv("BLUEFOG_TEST_EXPECT_ERROR");
  TransportInfo info;
  std::unique_ptr<Communicator> t;
  std::string error;
  try {
    t = LaunchedTransport(TransportOptions::FromConfig(config), &info);
  } catch (const BluefogError& e) {
    error = e.what();
  }
  if (expected_error != nullptr) {
    ASSERT_FALSE(error.empty()) << "Init should have failed";
    EXPECT_NE(error.find(expected_error), std::string::npos) << error;
    EXPECT_NE(error.find("rank "), std::string::npos) << error;
    if (std::getenv("BLUEFOG_TEST_CROSS_HOST_ERROR") != nullptr) return;  // not the algorithm's
    EXPECT_NE(error.find("BLUEFOG_ALLREDUCE_ALGORITHM=" + config.allreduce_algorithm),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("allreduce algorithms"), std::string::npos) << error;
    return;
  }
  ASSERT_TRUE(error.empty()) << error;
  const std::vector<AllreduceAlgorithm*> list = t->allreduce_algorithms();
  ASSERT_FALSE(list.empty());
  EXPECT_EQ(config.allreduce_algorithm, list.front()->name());
  EXPECT_EQ(std::string(t->backend()), list.back()->name());  // what it does not apply to
  EXPECT_LE(list.size(), 2u);
  // Exact through it: sum over ranks r of (i % 7 + r), 4 MiB and a few elements.
  const int n = info.size;
  const int64_t count = (int64_t{1} << 20) + 3;
  std::vector<float> data(count);
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(i % 7 + info.rank);
  t->AllreduceSum(data.data(), data.data(), count, DataType::kFloat32);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_EQ(data[i], static_cast<float>(n * (i % 7) + n * (n - 1) / 2)) << i;
  t->Shutdown();
}

}  // namespace
}  // namespace bluefog
