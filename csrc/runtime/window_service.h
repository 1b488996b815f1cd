// The windows' transport (bf.win_*): a thread of its own, on connections of its own (a
// WindowLink the backend makes: transport/window_link.h), that
// serves the other ranks' puts, accumulates, gets and mutex requests whether or not this rank's
// program is calling bluefog at the time (a passive target), and drives this rank's own
// operations to completion.
//
// Why messages and not one-sided puts (MPI_Put): Open MPI 4.1's one-sided components here either
// need the target to enter MPI before a passive-target put completes over TCP, or refuse
// MPI_THREAD_MULTIPLE (docs/windows.md has the measurements). A thread that polls for messages
// completes every operation within its polling interval on shared memory and TCP alike.
//
// Protocol (a header, then its data from the same sender when it has any): put / accumulate carry
// the sender's weight and push-sum weight and are acknowledged once written; a get request is
// answered with the target's published value; a lock is granted when the target's mutex for that
// window is free (waiters queue in arrival order) and released by an acknowledged unlock. An
// operation's handle finishes when every acknowledgement arrived, so a finished put is in the
// target's buffer. Once a rank begins to shut down (Close) it refuses every request but unlocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/window.h"
#include "transport/window_link.h"

namespace bluefog {

namespace window_internal {
struct Header;
}

// This rank's tensor in a window call: checked against the window's dtype and shape.
struct WinTensor {
  const void* data;
  DataType dtype;
  std::vector<int64_t> shape;
};

// win_put / win_accumulate: this rank's tensor to the out-neighbours `dsts`, each scaled by its
// weight; this rank's published value becomes the tensor scaled by `self_weight`.
struct WinPutOptions {
  std::vector<int32_t> dsts;
  std::vector<double> weights;
  double self_weight = 1.0;
  bool accumulate = false;     // add into the targets' buffers instead of replacing them
  bool require_mutex = false;  // hold every target's window mutex while writing there
  bool with_p = false;         // carry the push-sum weight along
};

// win_update: out = self_weight * self + the in-neighbours' buffers (`ranks`) by `weights`
// (Window::Update says the rest).
struct WinUpdateOptions {
  double self_weight = 1.0;
  std::vector<int32_t> ranks;
  std::vector<double> weights;
  bool reset = false;   // zero the buffers read (and their weights)
  bool publish = true;  // the result becomes this rank's published value
  bool with_p = false;  // combine the associated push-sum weights too
};

class WindowService {
 public:
  WindowService();
  WindowService(const WindowService&) = delete;
  WindowService& operator=(const WindowService&) = delete;
  ~WindowService();

  // `make_link` makes the service's link (collective: Communicator::CreateWindowLink over every
  // rank), called on the first window's creation; returns nullptr where the backend has none.
  void Attach(std::function<std::unique_ptr<WindowLink>(size_t header_bytes)> make_link, int rank,
              int size) {
    make_link_ = std::move(make_link);
    rank_ = rank;
    size_ = size;
  }

  // Fault-tolerant mode (docs/windows.md, "Fault-tolerant windows"), before the first window: a
  // neighbour whose connection breaks, or that leaves a message of this rank's operation
  // unanswered for `deadline_seconds`, is dropped by this rank for good (one warning). The
  // operation completes without it: a put's or accumulate's share meant for it stays with this
  // rank (Window::GiveBack); later operations skip it; a plain update renormalizes the weights
  // of the in-neighbours left (a push-sum one, with_p, still collects its buffer, which holds
  // mass it sent before it went). Needs a link that tolerates lost peers (Gloo).
  void SetFaultTolerance(bool on, double deadline_seconds) {
    fault_tolerant_ = on;
    deadline_ = deadline_seconds;
  }
  // Neither closed nor stopped: operations are taken.
  bool Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !stop_ && !closed_;
  }
  // The ranks this rank dropped (fault-tolerant mode), ascending.
  std::vector<int32_t> GoneRanks();

  // Collective: every rank calls these at the same agreed point (the global channel's thread).
  // Create returns the window's id; both throw BluefogError.
  int Create(WindowSpec spec, const void* initial, bool zero_init);
  void Free(const std::string& name);
  // Operations on window `name` that have not finished (-1: no such window).
  int PendingOps(const std::string& name);
  std::vector<std::string> Names();

  // Any thread. Each checks the call (window, dtype, shape, neighbours, weights) and throws
  // BluefogError for a mistake, else queues the operation and returns its handle.
  int64_t Put(const std::string& name, const WinTensor& tensor, const WinPutOptions& options);
  int64_t Get(const std::string& name, const std::vector<int32_t>& srcs,
              const std::vector<double>& weights, bool require_mutex);
  int64_t Mutex(const std::string& name, std::vector<int32_t> ranks, bool lock);
  // The local combination (Window::Update), after the same checks.
  void Update(const std::string& name, const WinTensor& self, void* out,
              const WinUpdateOptions& options);
  std::vector<int32_t> InRanks(const std::string& name);
  std::vector<int64_t> Versions(const std::string& name);
  double AssociatedP(const std::string& name);

  // Calls `done` once the operation finished (at once if it has) and forgets the handle.
  void Wait(int64_t handle, std::function<void(const Status&)> done);
  // 1: finished, 0: running, -1: no such handle (or already waited for).
  int Poll(int64_t handle);

  // Any thread, first thing in shutdown. From now on the other ranks' puts, accumulates, gets
  // and mutex requests to this rank's windows (and those waiting for its mutexes) are refused
  // with an error that says it shut down (`reason`), and this rank's new operations fail;
  // operations already running go on until Stop. Idempotent.
  void Close(const std::string& reason);

  // Fails what is pending with `reason`, stops the thread and frees the link (unless
  // `free_comms` is false: the backend may then be left as it is). Idempotent.
  void Stop(const std::string& reason, bool free_comms);

 private:
  struct Op;
  struct Entry;
  struct Outgoing;

  std::shared_ptr<Entry> Find(const char* op, const std::string& name);
  void CheckTensor(const char* op, const Entry& e, DataType dtype,
                   const std::vector<int64_t>& shape);
  void CheckRanks(const char* op, const Entry& e, const std::vector<int32_t>& ranks,
                  const std::vector<double>& weights, bool out);
  static void CheckSelfWeight(const char* op, const Entry& e, double self_weight);
  int64_t Queue(std::unique_ptr<Op> op, const std::shared_ptr<Entry>& e);
  std::shared_ptr<std::vector<char>> TakeBuffer(Entry& e);

  // The service thread.
  void Loop();
  void Begin(Op* op);
  void Advance(Op* op);
  void Finish(int64_t handle);
  void Receive(int src);
  void Send(int dst, int kind, int window, int64_t op, double weight, double p,
            std::shared_ptr<std::vector<char>> data, int64_t bytes);
  void SendError(int dst, int window, int64_t op, const Status& status);
  void Post(int dst, std::unique_ptr<window_internal::Header> header,
            std::shared_ptr<std::vector<char>> data);
  bool TestOutgoing();
  // Fault-tolerant mode.
  void MarkGone(int rank, const std::string& why);
  void Abandon(Op* op, int rank);
  double CheckDeadlines();  // returns how long the oldest reply has been waited for
  void SendQueued();
  void GrantNext(Entry& e);
  bool IsGone(int rank);
  bool Closed(std::string* reason);
  void RefuseWaiters(const std::string& reason);
  void Drain();

  std::function<std::unique_ptr<WindowLink>(size_t)> make_link_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<WindowLink> link_;  // made by the first Create
  bool fault_tolerant_ = false;
  double deadline_ = 2.0;
  std::thread thread_;
  std::atomic<bool> stopped_{false};

  std::mutex mutex_;  // guards the members below
  std::condition_variable wake_;
  bool stop_ = false;
  std::string stop_reason_;
  bool closed_ = false;  // Close was called (Stop implies it)
  std::string closed_reason_;
  int next_id_ = 0;
  int64_t next_handle_ = 1;
  std::map<std::string, std::shared_ptr<Entry>> by_name_;
  std::unordered_map<int, std::shared_ptr<Entry>> by_id_;
  std::deque<std::unique_ptr<Op>> queue_;
  struct Handle {
    bool done = false;
    Status status;
    std::function<void(const Status&)> waiter;
  };
  std::unordered_map<int64_t, Handle> handles_;
  std::set<int> gone_;  // fault-tolerant mode: the neighbours dropped

  // Only the service thread touches these.
  std::unordered_map<int64_t, std::unique_ptr<Op>> running_;
  std::list<Outgoing> outgoing_;  // a list: its element type may be incomplete here
  std::vector<char> scratch_;     // incoming data; grown to the largest window, never shrunk
  std::set<std::string> alone_;   // windows whose neighbours are all gone (said once)
};

}  // namespace bluefog
