// The window service's link on Gloo: a gloo::Context of its own (connected through the store
// under a key prefix of its own, as the MPI link duplicates the world communicator), with
// unbound buffers on two slots, one for headers and one for data.
//
// What this relies on in Gloo's TCP transport (gloo/transport/tcp, the 2022 release Debian
// ships): a send and a receive match by pair and slot, in the order each side posted them, and
// a receive posted for several source ranks (recv(std::vector<int>, slot)) takes one message
// from one of them and reports which. So the headers from one sender arrive in the order sent,
// and the k-th data message from a sender is the one after its k-th header that carries data.
// Gloo has no nonblocking test: a wait that times out closes every pair of the context. So a
// thread of the link waits for headers (one receive from every other rank posted at a time) and
// queues them, another waits for the sends to complete in turn; the service's thread only looks
// at flags and queues. Messages to this rank itself never touch Gloo (it has no pair to self).
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "core/status.h"
#include "transport/gloo/gloo_communicator.h"
#include "transport/gloo/tcp_store.h"

namespace bluefog {
namespace {

// Gloo's collectives use slot prefixes 0x01-0x08 and the neighbour exchange 0x20.
constexpr uint64_t kHeaderSlot = uint64_t{0x21} << 56;
constexpr uint64_t kDataSlot = uint64_t{0x22} << 56;
// The header thread's wait: until a header comes or Free aborts it (a wait that times out
// would close the context's pairs).
constexpr std::chrono::milliseconds kForever(std::chrono::hours(24 * 365));

std::string RanksText(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

struct PendingSend {
  std::vector<char> bytes;  // a copy: the caller's buffer may go before Gloo is done with it
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  int dst = 0;
  std::atomic<int> state{0};  // 0: on its way, 1: sent, 2: failed
  std::string error;
};

class GlooSend : public WindowLink::Send {
 public:
  explicit GlooSend(std::shared_ptr<PendingSend> p) : p_(std::move(p)) {}
  bool Test() override {
    const int state = p_->state.load();
    if (state == 2) throw BluefogError(StatusCode::kAborted, p_->error);
    return state == 1;
  }
  void Cancel() override {}  // Free stops the sending thread; the copy is the link's

 private:
  std::shared_ptr<PendingSend> p_;
};

class GlooWindowLink : public WindowLink {
 public:
  GlooWindowLink(std::shared_ptr<gloo::Context> context, std::shared_ptr<TcpStore> store, int rank,
                 int size, size_t header_bytes, std::chrono::milliseconds timeout)
      : context_(std::move(context)),
        store_(std::move(store)),
        rank_(rank),
        size_(size),
        header_bytes_(header_bytes),
        timeout_(timeout) {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) others_.push_back(r);
    if (others_.empty()) return;
    header_.resize(header_bytes_);
    header_buffer_ = context_->createUnboundBuffer(header_.data(), header_bytes_);
    receiver_ = std::thread(&GlooWindowLink::ReceiveHeaders, this);
    sender_ = std::thread(&GlooWindowLink::WaitSends, this);
  }
  ~GlooWindowLink() override { Free(true); }

  void Barrier() override {
    Guard("barrier", -1, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  std::unique_ptr<Send> SendHeader(int dst, const void* header) override {
    return Post(dst, kHeaderSlot, header, header_bytes_);
  }
  std::unique_ptr<Send> SendData(int dst, const void* data, size_t bytes) override {
    return Post(dst, kDataSlot, data, bytes);
  }

  bool ProbeHeader(int* src) override {
    if (!loop_headers_.empty()) {
      *src = rank_;
      return true;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!headers_.empty()) {
      *src = headers_.front().first;
      return true;
    }
    if (!error_.empty()) throw BluefogError(StatusCode::kAborted, error_);
    return false;
  }

  void ReceiveHeader(int src, void* header) override {
    if (src == rank_) {
      BF_ENFORCE(!loop_headers_.empty(), StatusCode::kInternal, "no header from this rank");
      std::memcpy(header, loop_headers_.front().data(), header_bytes_);
      loop_headers_.pop_front();
      return;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    BF_ENFORCE(!headers_.empty() && headers_.front().first == src, StatusCode::kInternal,
               "no header waiting from rank ", src);
    std::memcpy(header, headers_.front().second.data(), header_bytes_);
    headers_.pop_front();
  }

  void ReceiveData(int src, void* data, size_t bytes) override {
    if (src == rank_) {
      BF_ENFORCE(!loop_data_.empty() && loop_data_.front().size() == bytes, StatusCode::kInternal,
                 "no data of ", bytes, " bytes from this rank");
      std::memcpy(data, loop_data_.front().data(), bytes);
      loop_data_.pop_front();
      return;
    }
    Guard("receive", src, [&] {
      auto buffer = context_->createUnboundBuffer(data, bytes);
      buffer->recv(src, kDataSlot);
      buffer->waitRecv(timeout_);
    });
  }

  bool TolerateLostPeers() override {
    tolerant_ = true;
    return true;
  }

  std::vector<int> TakeLostPeers() override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int> lost(lost_.begin(), lost_.end());
    lost_.clear();
    return lost;
  }

  void DropPeer(int rank) override {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped_.insert(rank);
    if (current_send_ && current_send_->dst == rank) current_send_->buffer->abortWaitSend();
  }

  void CheckPeers() override {
    if (tolerant_) {
      std::vector<int> gone;
      try {
        gone = GoneRanks();
      } catch (const std::exception&) {
        return;  // rank 0's store is gone: the lost connections themselves still tell
      }
      std::lock_guard<std::mutex> lock(mutex_);
      lost_.insert(gone.begin(), gone.end());
      return;
    }
    std::vector<int> gone;
    try {
      std::vector<std::string> keys;
      for (int r : others_) keys.push_back(GoneKey(r));
      std::vector<std::string> missing = store_->Missing(keys);
      for (size_t k = 0; k < keys.size(); ++k)
        if (std::find(missing.begin(), missing.end(), keys[k]) == missing.end())
          gone.push_back(others_[k]);
    } catch (const std::exception& e) {
      throw BluefogError(StatusCode::kAborted,
                         Concat("rank ", rank_,
                                ": rank 0's rendezvous server is gone (has rank 0 exited?), and "
                                "window operations wait for replies: ",
                                e.what()));
    }
    BF_ENFORCE(gone.empty(), StatusCode::kAborted, "rank ", rank_, ": rank(s) ", RanksText(gone),
               " left the job while window operations waited for their replies");
  }

  void Free(bool release) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (freed_) return;
      freed_ = true;
      if (current_send_) current_send_->buffer->abortWaitSend();
      wake_.notify_all();
    }
    if (header_buffer_) header_buffer_->abortWaitRecv();
    if (receiver_.joinable()) receiver_.join();
    if (sender_.joinable()) sender_.join();
    // The buffers go before the context; then the context closes its connections.
    sends_.clear();
    current_send_.reset();
    header_buffer_.reset();
    (void)release;
    context_.reset();
  }

 private:
  std::unique_ptr<Send> Post(int dst, uint64_t slot, const void* data, size_t bytes) {
    auto p = std::make_shared<PendingSend>();
    p->bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    p->dst = dst;
    if (tolerant_) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (dropped_.count(dst)) {
        p->state = 1;
        return std::make_unique<GlooSend>(p);
      }
    }
    if (dst == rank_) {
      (slot == kHeaderSlot ? loop_headers_ : loop_data_).push_back(std::move(p->bytes));
      p->state = 1;
      return std::make_unique<GlooSend>(p);
    }
    try {
      Guard("send", dst, [&] {
        p->buffer = context_->createUnboundBuffer(p->bytes.data(), p->bytes.size());
        p->buffer->send(dst, slot);
      });
    } catch (const std::exception&) {
      if (!tolerant_) throw;
      std::lock_guard<std::mutex> lock(mutex_);
      lost_.insert(dst);
      p->state = 1;
      return std::make_unique<GlooSend>(p);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sends_.push_back(p);
      wake_.notify_all();
    }
    return std::make_unique<GlooSend>(p);
  }

  // Thread: one receive of a header from every other rank at a time, queued when it lands.
  // Fault-tolerant: a broken connection ends the receive for every source; the ranks the store
  // says left are taken out of the sources, and the receive is posted again for the others.
  void ReceiveHeaders() {
    std::vector<int> sources = others_;
    while (!sources.empty()) {
      try {
        header_buffer_->recv(sources, kHeaderSlot);
        int src = -1;
        if (!header_buffer_->waitRecv(&src, kForever)) return;  // Free
        std::lock_guard<std::mutex> lock(mutex_);
        headers_.emplace_back(src, header_);
        continue;
      } catch (const std::exception& e) {
        std::vector<int> gone;
        if (tolerant_) gone = GoneAmong(sources);
        std::lock_guard<std::mutex> lock(mutex_);
        if (freed_) return;
        if (gone.empty()) {
          error_ = Describe("receive", -1, e.what());
          return;
        }
        for (int r : gone) {
          lost_.insert(r);
          sources.erase(std::remove(sources.begin(), sources.end(), r), sources.end());
        }
      }
    }
  }

  std::vector<int> GoneRanks() {
    std::vector<std::string> keys;
    for (int r : others_) keys.push_back(GoneKey(r));
    std::vector<std::string> missing = store_->Missing(keys);
    std::vector<int> gone;
    for (size_t k = 0; k < keys.size(); ++k)
      if (std::find(missing.begin(), missing.end(), keys[k]) == missing.end())
        gone.push_back(others_[k]);
    return gone;
  }

  // The ranks of `among` that the store marks gone, asked for up to a second: the store may
  // learn of a death a moment after a connection broke.
  std::vector<int> GoneAmong(const std::vector<int>& among) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::vector<int> gone;
      try {
        for (int r : GoneRanks())
          if (std::find(among.begin(), among.end(), r) != among.end()) gone.push_back(r);
      } catch (const std::exception&) {
        return {};
      }
      if (!gone.empty()) return gone;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return {};
  }

  // Thread: waits for the sends to complete, in the order posted.
  void WaitSends() {
    while (true) {
      std::shared_ptr<PendingSend> p;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return freed_ || !sends_.empty(); });
        if (freed_) return;
        p = sends_.front();
        sends_.pop_front();
        if (tolerant_ && dropped_.count(p->dst)) {
          p->state = 1;
          continue;
        }
        current_send_ = p;
      }
      try {
        // Fault-tolerant: no timeout (one that expires closes every pair of the context); the
        // service drops a silent peer (DropPeer aborts this wait).
        if (p->buffer->waitSend(tolerant_ ? kForever : timeout_)) {
          p->state = 1;
        } else if (tolerant_) {
          p->state = 1;
        } else {
          p->error = Concat("rank ", rank_, ": the window service's send to rank ", p->dst,
                            " was stopped (shutdown)");
          p->state = 2;
        }
      } catch (const std::exception& e) {
        if (tolerant_) {
          std::lock_guard<std::mutex> lock(mutex_);
          lost_.insert(p->dst);
          p->state = 1;
        } else {
          p->error = Describe("send", p->dst, e.what());
          p->state = 2;
        }
      }
      std::lock_guard<std::mutex> lock(mutex_);
      current_send_.reset();
    }
  }

  template <typename F>
  void Guard(const char* what, int peer, F&& body) {
    try {
      body();
    } catch (const BluefogError&) {
      throw;
    } catch (const std::exception& e) {
      throw BluefogError(StatusCode::kAborted, Describe(what, peer, e.what()));
    }
  }

  // An error of the link: which ranks left the job, as rank 0's store saw it.
  std::string Describe(const char* what, int peer, const std::string& cause) {
    std::string gone;
    try {
      std::vector<std::string> keys;
      for (int r : others_) keys.push_back(GoneKey(r));
      for (int attempt = 0; attempt < 20 && gone.empty(); ++attempt) {
        std::vector<std::string> missing = store_->Missing(keys);
        std::vector<int> ranks;
        for (size_t k = 0; k < keys.size(); ++k)
          if (std::find(missing.begin(), missing.end(), keys[k]) == missing.end())
            ranks.push_back(others_[k]);
        if (!ranks.empty()) gone = Concat(" (rank(s) ", RanksText(ranks), " left the job)");
        if (gone.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (const std::exception&) {
      gone = " (rank 0's rendezvous server is gone too: has rank 0 exited?)";
    }
    return Concat("rank ", rank_, ": the window service's Gloo ", what,
                  peer >= 0 ? Concat(" with rank ", peer) : std::string(), " failed", gone, ": ",
                  cause, ". A peer may have exited, or not answered within BLUEFOG_GLOO_TIMEOUT (",
                  timeout_.count() / 1000, " s)");
  }

  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<TcpStore> store_;
  int rank_;
  int size_;
  size_t header_bytes_;
  std::chrono::milliseconds timeout_;
  std::vector<int> others_;
  std::atomic<bool> tolerant_{false};

  // The header thread's buffer (touched by it alone while it runs).
  std::vector<char> header_;
  std::unique_ptr<gloo::transport::UnboundBuffer> header_buffer_;
  std::thread receiver_;
  std::thread sender_;

  std::mutex mutex_;  // guards the members below
  std::condition_variable wake_;
  bool freed_ = false;
  std::deque<std::pair<int, std::vector<char>>> headers_;
  std::string error_;
  std::deque<std::shared_ptr<PendingSend>> sends_;
  std::shared_ptr<PendingSend> current_send_;
  std::set<int> lost_;     // found lost, not yet taken by the service
  std::set<int> dropped_;  // given up on by the service

  // Messages to this rank itself (the service's thread only).
  std::deque<std::vector<char>> loop_headers_;
  std::deque<std::vector<char>> loop_data_;
};

}  // namespace

std::unique_ptr<WindowLink> MakeGlooWindowLink(std::shared_ptr<gloo::Context> context,
                                               std::shared_ptr<TcpStore> store, int rank, int size,
                                               size_t header_bytes,
                                               std::chrono::milliseconds timeout) {
  return std::make_unique<GlooWindowLink>(std::move(context), std::move(store), rank, size,
                                          header_bytes, timeout);
}

}  // namespace bluefog
