// Shared by the window service's two halves (window_service.cc: the calling threads, create and
// free; window_thread.cc: the service thread): the wire format of its messages and the state
// of one operation and one window. Not part of any interface.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/window_service.h"

namespace bluefog {
namespace window_internal {

// The thread polls for messages; after a quiet spell it waits longer between polls, up to this
// (which bounds how long an idle target takes to notice a put).
constexpr auto kMinPause = std::chrono::microseconds(20);
constexpr auto kMaxPause = std::chrono::microseconds(1000);
// How long Stop keeps answering the other ranks' last messages (refusing their requests) before
// it gives up on them.
constexpr double kDrainSeconds = 1.0;
// While operations wait for replies and nothing arrives, the link is asked this often whether a
// peer left the job (WindowLink::CheckPeers).
constexpr double kPeerCheckSeconds = 1.0;
// Fault-tolerant mode: how often the store is asked which ranks left, while a reply is later
// than a healthy one would be (a lost rank's own replies never come, and a lock request queued
// at it breaks no connection of this rank's that Gloo reports).
constexpr double kTolerantPeerCheckSeconds = 0.02;
constexpr double kLateReplySeconds = 0.02;

enum Kind : int32_t {
  kPut = 1,
  kAccumulate,
  kAck,  // code != 0: an error, its text as data
  kGetRequest,
  kGetReply,
  kLock,
  kGrant,
  kUnlock,
  // Fault-tolerant mode: a lock request waits behind another holder (sent when it is queued and
  // again every third of the deadline), so the requester tells a busy mutex from a hung rank.
  kQueued,
};

struct Header {
  int32_t kind;
  int32_t window;
  int64_t op;  // the sender's handle, echoed in the reply
  double weight;
  double p;
  int64_t bytes;  // of the data message that follows (0: none)
  int32_t code;
  int32_t pad;
};

inline std::string RanksText(const std::vector<int32_t>& ranks) {
  return ShapeString(std::vector<int64_t>(ranks.begin(), ranks.end()));
}

inline double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace window_internal

// One step of an operation: messages of one kind to some ranks; a lock step asks one rank at a
// time, in ascending order, so two operations that lock overlapping ranks cannot deadlock.
struct WindowService::Op {
  int64_t handle = 0;
  const char* name = "";  // "win_put", ...: for its errors
  std::shared_ptr<Entry> entry;
  struct Step {
    window_internal::Kind kind;
    std::vector<int32_t> ranks;
    std::vector<double> weights;
  };
  std::deque<Step> steps;
  // The ranks whose mutex this op's lock step was granted (added when the grant arrives, so a
  // refused request is never released: that mutex may be held by this rank's win_mutex).
  // Released when the op ends if `release_at_end` (require_mutex), and always when it fails.
  std::vector<int32_t> granted;
  bool release_at_end = false;
  // win_mutex: its lock or unlock updates Entry::held; `holds` are the ranks a lock added
  // there, taken out again if it fails.
  bool win_mutex = false;
  std::vector<int32_t> holds;
  std::shared_ptr<std::vector<char>> payload;  // put / accumulate: the data
  double p = 1.0;                              // the sender's push-sum weight (before weights)
  bool with_p = false;
  int outstanding = 0;
  Status status;
  // Fault-tolerant mode: the ranks whose reply this op waits for, since when; and the weights of
  // its puts or accumulates not yet acknowledged (given back if their target is dropped).
  std::map<int32_t, double> waiting;
  std::map<int32_t, double> unacked;
  bool gives_back = false;  // accumulate, or with_p
};

struct WindowService::Entry {
  std::shared_ptr<Window> window;
  // Send buffers, reused: one is free when only this list holds it.
  std::vector<std::shared_ptr<std::vector<char>>> pool;
  int pending = 0;  // operations not yet finished
  // The mutex other ranks lock on this rank (service thread only).
  int holder = -1;
  std::deque<std::pair<int, int64_t>> waiters;
  // The ranks whose mutex of this window this rank's win_mutex holds or is acquiring (service
  // thread only): a lock of any of them by this rank is refused before it asks for anything.
  std::vector<int32_t> held;
};

struct WindowService::Outgoing {
  std::unique_ptr<WindowLink::Send> send;
  std::unique_ptr<window_internal::Header> header;
  std::shared_ptr<std::vector<char>> data;
};

}  // namespace bluefog
