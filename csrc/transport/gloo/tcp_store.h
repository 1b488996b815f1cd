// The Gloo backend's rendezvous: a key-value store over TCP. Rank 0 runs the server (a thread
// listening at MASTER_ADDR:MASTER_PORT, the job's only listener of its own); every rank, rank 0
// included, is a client implementing gloo::rendezvous::Store. The server keeps bytes under
// keys and hands them back; it never interprets, runs or forwards what it receives.
//
// A client and the server first prove to each other that they hold the job's token, by a
// challenge and response over fresh nonces (store_auth.h): the token itself never crosses the
// wire. The server closes, with a logged reason, every connection that fails, so a stray
// process or another job's rank that reaches this port cannot read or write the job's keys.
// With a random BLUEFOG_JOB_TOKEN (what bfrun sets) this keeps out anyone who does not know it;
// without one, the token is derived from the address and so guards against mistakes only.
//
// Whatever reaches the port cannot take the job's descriptors or threads: every connection is
// closed and its thread joined as soon as it ends; one that has not presented a token within
// the handshake timeout is closed; at most kMaxUnauthenticated wait for their handshake at once
// (a new one closes the oldest, so a rank arriving during a flood still gets in); and running
// out of descriptors (EMFILE) closes the oldest unauthenticated connection instead of stopping
// the server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "transport/gloo/store_auth.h"

namespace bluefog {

// Set by the server when rank `rank`'s connection to it ends (its process exited, or shut
// bluefog down): read by the ranks whose Gloo connection to it broke.
std::string GoneKey(int rank);

class TcpStoreServer {
 public:
  // Connections waiting for their handshake at once; a rank's takes milliseconds.
  static constexpr int kMaxUnauthenticated = 64;
  // The default time a connection has to complete its handshake.
  static constexpr int kHandshakeTimeoutS = 10;

  // Binds and listens at addr:port (throws BluefogError naming both when it cannot). A name
  // that does not resolve yet is retried for up to `resolve_timeout`. A connection that has not
  // presented its token within `handshake_timeout` is closed.
  TcpStoreServer(
      const std::string& addr, int port, std::string token,
      std::chrono::milliseconds resolve_timeout = std::chrono::milliseconds(0),
      std::chrono::milliseconds handshake_timeout = std::chrono::seconds(kHandshakeTimeoutS));
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  ~TcpStoreServer();

  // Connections refused (wrong token, no handshake, timed out, closed for room) so far.
  int refused() const { return refused_.load(); }
  // Connections open now, and their threads (tests: they return to the ranks' count).
  int open_connections();

 private:
  struct Connection {
    int fd = -1;  // -1 once its thread closed it
    bool authenticated = false;
    int rank = -1;         // the rank it proved, once authenticated
    std::string peer;      // its address, for the messages
    bool evicted = false;  // shut down to make room; its thread closes it
    std::chrono::steady_clock::time_point since;
    std::thread thread;
  };

  void Accept();
  // One connection, from its handshake to its end; closes it.
  void Serve(uint64_t id, int fd);
  // An authenticated connection's requests, until it ends or sends something malformed.
  void ServeRequests(int fd, const std::string& peer);
  // Joins the threads of connections that ended and forgets them.
  void Reap();
  // Shuts down the unauthenticated connection open longest (caller holds mutex_); false when
  // there is none.
  bool EvictOldestLocked();
  // Counts a refused connection, and logs the first few.
  void Refused(const std::string& peer, const std::string& why);

  std::string token_;
  std::chrono::milliseconds handshake_timeout_;
  int listen_fd_ = -1;
  // A pipe, written to wake the accept thread: to stop, or to join a connection's thread.
  int wake_fd_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::atomic<int> refused_{0};
  std::mutex mutex_;
  std::map<std::string, std::vector<char>> data_;
  std::map<uint64_t, Connection> connections_;  // by id; erased when reaped
  std::vector<uint64_t> ended_;                 // ids whose thread has returned
  uint64_t next_id_ = 0;
  std::thread accept_;
};

class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects to addr:port, retrying until `timeout` (the server may start later), and presents
  // `token`. Throws BluefogError when the server does not answer in time or refuses the token.
  // Every key is read and written under `prefix` (an elastic job's round, say "r3/").
  TcpStore(const std::string& addr, int port, const std::string& token, int rank,
           std::chrono::milliseconds timeout, std::string prefix = "");
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the store's timeout for the key.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Which of `keys` are not set yet (one query, no wait).
  std::vector<std::string> Missing(const std::vector<std::string>& keys);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  // One request and its answer; the connection is used by one call at a time.
  std::vector<char> Call(char op, const std::string& key, const std::vector<char>& value,
                         bool* found);

  std::string where_;
  std::string prefix_;
  int rank_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace bluefog
