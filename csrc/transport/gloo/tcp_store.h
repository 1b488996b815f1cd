// The Gloo backend's rendezvous: a key-value store over TCP. Rank 0 runs the server (a thread
// listening at MASTER_ADDR:MASTER_PORT, the job's only listener of its own); every rank, rank 0
// included, is a client implementing gloo::rendezvous::Store. The server keeps bytes under
// keys and hands them back; it never interprets, runs or forwards what it receives.
//
// A client first presents the job's token (JobToken); the server closes, with a logged reason,
// every connection whose token differs, so a stray process or another job's rank that reaches
// this port cannot read or write the job's keys. The token is a check against mistakes, not
// an authentication against an attacker on the network.
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

namespace bluefog {

// The job's token: a digest of BLUEFOG_JOB_TOKEN when it is set, else of the rendezvous
// address and the world size (so jobs at different addresses or sizes never mix).
std::string JobToken(const std::string& secret, const std::string& addr, int port, int world_size);

// Set by the server when rank `rank`'s connection to it ends (its process exited, or shut
// bluefog down): read by the ranks whose Gloo connection to it broke.
std::string GoneKey(int rank);

class TcpStoreServer {
 public:
  // Binds and listens at addr:port (throws BluefogError naming both when it cannot). A name
  // that does not resolve yet is retried for up to `resolve_timeout`.
  TcpStoreServer(const std::string& addr, int port, std::string token,
                 std::chrono::milliseconds resolve_timeout = std::chrono::milliseconds(0));
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  ~TcpStoreServer();

  // Connections refused for a wrong token so far (tests).
  int refused() const { return refused_.load(); }

 private:
  void Accept();
  void Serve(int fd);

  std::string token_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe: written to stop the threads
  std::atomic<bool> stopping_{false};
  std::atomic<int> refused_{0};
  std::mutex mutex_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> clients_;  // open connections, closed at stop
  std::vector<std::thread> threads_;
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
