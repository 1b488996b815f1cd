// A rank that leaves a one-host job: the others, waiting for it in a round through the host's
// shared memory, fail within seconds with an error naming it, instead of sleeping on the futex
// for good (Gloo, started by gloo_launch.sh at 3 ranks: the last rank exits after set-up).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "core/status.h"
#include "launched_transport.h"
#include "transport/local/local_host.h"

namespace bluefog {
namespace {

TEST(LocalPeerLoss, WaitersFailNamingTheLostRank) {
  TransportInfo info;
  std::unique_ptr<Communicator> t = LaunchedTransport(TransportOptions(), &info);
  ASSERT_NE(t->local_host(), nullptr);
  ASSERT_NE(t->local_host()->rounds(), nullptr);
  const int lost = info.size - 1;
  // Every rank set up; then the last one leaves without a word.
  std::vector<std::string> all = t->ExchangeAll("ready", nullptr);
  ASSERT_EQ(all.size(), static_cast<size_t>(info.size));
  if (info.rank == lost) _exit(0);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  for (int round = 0; round < 3 && error.empty(); ++round) {
    try {
      t->ExchangeAll("next", nullptr);  // the lost rank never arrives
    } catch (const TransportError& e) {
      error = e.what();
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(error.empty()) << "rank " << info.rank << " was not told rank " << lost << " left";
  // The lost rank, and perhaps a waiter that failed and exited before this one looked.
  const size_t named = error.find("rank(s) ");
  ASSERT_NE(named, std::string::npos) << error;
  const std::string list = error.substr(named, error.find(" left the job") - named);
  EXPECT_NE(list.find(std::to_string(lost)), std::string::npos) << error;
  EXPECT_LT(waited, 10.0);
  _exit(::testing::Test::HasFailure() ? 1 : 0);  // the communicator's peers are gone
}

}  // namespace
}  // namespace bluefog
