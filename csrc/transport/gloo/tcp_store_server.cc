#include "transport/gloo/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/logging.h"
#include "core/status.h"
#include "transport/gloo/store_auth.h"
#include "transport/gloo/store_wire.h"

namespace bluefog {

using namespace store_wire;  // NOLINT: the wire's names, shared with the client

TcpStoreServer::TcpStoreServer(const std::string& addr, int port, std::string token,
                               std::chrono::milliseconds resolve_timeout,
                               std::chrono::milliseconds handshake_timeout)
    : token_(std::move(token)), handshake_timeout_(handshake_timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  AddrInfo res;
  const std::string service = std::to_string(port);
  // A name may not resolve yet when rank 0 starts: Kubernetes publishes a pod's DNS name (a
  // headless Service's record) only once the pod runs. Wait for it, up to the job's timeout.
  const auto deadline = std::chrono::steady_clock::now() + resolve_timeout;
  auto not_yet = [](int code) {
    return code == EAI_NONAME || code == EAI_AGAIN || code == EAI_NODATA;
  };
  int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &res.list);
  for (bool told = false; not_yet(rc) && std::chrono::steady_clock::now() < deadline;) {
    if (!told) {
      BF_LOG(LogLevel::kWarning, "rank 0: MASTER_ADDR=", addr, " does not resolve yet (",
             gai_strerror(rc), "); retrying for up to ", resolve_timeout.count() / 1000,
             " s (BLUEFOG_GLOO_TIMEOUT)");
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &res.list);
  }
  BF_ENFORCE(rc == 0, StatusCode::kInvalidArgument, "rank 0: MASTER_ADDR=", addr,
             " cannot be resolved (", gai_strerror(rc), "); set it to this host's address");
  std::string last_error = "no address";
  for (addrinfo* a = res.list; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  BF_ENFORCE(listen_fd_ >= 0, StatusCode::kPrecondition, "rank 0: cannot listen at ", addr, ":",
             port, " for the Gloo rendezvous (", last_error,
             "); is MASTER_PORT free and MASTER_ADDR an address of rank 0's host?");
  BF_ENFORCE(::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) == 0, StatusCode::kInternal,
             "pipe2 failed: ", std::strerror(errno));
  accept_ = std::thread(&TcpStoreServer::Accept, this);
}

TcpStoreServer::~TcpStoreServer() {
  stopping_ = true;
  char c = 0;
  (void)!::write(wake_fd_[1], &c, 1);
  if (accept_.joinable()) accept_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [id, conn] : connections_) {
      if (conn.fd >= 0) ::shutdown(conn.fd, SHUT_RDWR);
      threads.push_back(std::move(conn.thread));
    }
  }
  for (auto& t : threads) t.join();  // each closes its own connection
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
}

int TcpStoreServer::open_connections() {
  std::lock_guard<std::mutex> lock(mutex_);
  int open = 0;
  for (const auto& [id, conn] : connections_) open += conn.fd >= 0;
  return open;
}

void TcpStoreServer::Refused(const std::string& peer, const std::string& why) {
  // A flood of strangers must not become a flood of log lines: the first ones say who and why.
  constexpr int kLogged = 10;
  const int n = ++refused_;
  if (n <= kLogged)
    BF_LOG(LogLevel::kWarning, "rank 0, Gloo rendezvous server: refused a connection from ", peer,
           ": ", why, n == kLogged ? " (further refused connections are counted, not logged)" : "");
}

bool TcpStoreServer::EvictOldestLocked() {
  Connection* oldest = nullptr;
  for (auto& [id, conn] : connections_) {
    if (conn.fd < 0 || conn.authenticated || conn.evicted) continue;
    if (oldest == nullptr || conn.since < oldest->since) oldest = &conn;
  }
  if (oldest == nullptr) return false;
  // Only shut down: the connection's thread, blocked reading it, wakes and closes it.
  oldest->evicted = true;
  ::shutdown(oldest->fd, SHUT_RDWR);
  return true;
}

void TcpStoreServer::Reap() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (uint64_t id : ended_) {
      auto it = connections_.find(id);
      done.push_back(std::move(it->second.thread));
      connections_.erase(it);
    }
    ended_.clear();
  }
  for (auto& t : done) t.join();
}

void TcpStoreServer::Accept() {
  bool told_full = false;
  while (!stopping_) {
    Reap();
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      BF_LOG(LogLevel::kError,
             "rank 0, Gloo rendezvous server: poll failed: ", std::strerror(errno));
      return;
    }
    if (stopping_) return;
    if (fds[1].revents) {  // a connection ended: reaped at the top of the loop
      char drain[256];
      while (::read(wake_fd_[0], drain, sizeof(drain)) > 0) {
      }
      continue;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room from a stranger's connection, then try again; a rank's
        // connection is never closed for room.
        if (!told_full)
          BF_LOG(LogLevel::kWarning, "rank 0, Gloo rendezvous server: cannot accept (",
                 std::strerror(errno), "); closing connections that have not presented a token");
        told_full = true;
        bool evicted;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          evicted = EvictOldestLocked();
        }
        // Nothing to close: wait a little rather than spin on a listener that stays readable.
        if (!evicted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    told_full = false;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mutex_);
    int waiting = 0;
    for (const auto& [id, conn] : connections_)
      waiting += conn.fd >= 0 && !conn.authenticated && !conn.evicted;
    if (waiting >= kMaxUnauthenticated) EvictOldestLocked();
    const uint64_t id = next_id_++;
    Connection& conn = connections_[id];
    conn.fd = fd;
    conn.since = std::chrono::steady_clock::now();
    try {
      conn.thread = std::thread(&TcpStoreServer::Serve, this, id, fd);
    } catch (const std::system_error& e) {
      // No thread to be had (a thread limit): this connection is refused, the server goes on.
      ::close(fd);
      connections_.erase(id);
      BF_LOG(LogLevel::kWarning,
             "rank 0, Gloo rendezvous server: dropped a connection: ", e.what());
    }
  }
}

void TcpStoreServer::Serve(uint64_t id, int fd) {
  const std::string peer = PeerName(fd);
  int32_t rank = -1;
  const auto deadline = std::chrono::steady_clock::now() + handshake_timeout_;
  char magic[4];
  std::string client_nonce(kNonceBytes, '\0'), server_nonce;
  bool handshake = ReadAllBy(fd, magic, 4, deadline) && std::memcmp(magic, kStoreMagic, 4) == 0 &&
                   ReadAllBy(fd, client_nonce.data(), kNonceBytes, deadline) &&
                   ReadAllBy(fd, &rank, 4, deadline);
  Digest proof{};
  if (handshake) {
    try {
      server_nonce = NewNonce();
    } catch (const BluefogError& e) {  // on this connection's thread: refuse it, go on
      BF_LOG(LogLevel::kWarning, "rank 0, Gloo rendezvous server: ", e.what());
      server_nonce.assign(kNonceBytes, '\0');
      handshake = false;
    }
  }
  if (handshake) {
    const Digest mine = HandshakeProof(token_, Prover::kServer, client_nonce, server_nonce, rank);
    handshake = WriteAll(fd, server_nonce.data(), kNonceBytes) &&
                WriteAll(fd, mine.data(), mine.size()) &&
                ReadAllBy(fd, proof.data(), proof.size(), deadline);
  }
  if (!handshake) {
    rank = -1;
    bool evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evicted = connections_[id].evicted;
    }
    if (evicted)
      Refused(peer, Concat("closed to make room: more than ", kMaxUnauthenticated,
                           " connections were waiting for their handshake, or descriptors ran out "
                           "(a flood of connections to MASTER_PORT?)"));
    else if (std::chrono::steady_clock::now() >= deadline)
      Refused(peer, Concat("it sent no complete handshake within ",
                           handshake_timeout_.count() / 1000.0, " s"));
    else
      Refused(peer,
              "it did not open with bluefog's handshake (another program on MASTER_PORT, or "
              "a rank of another bluefog version?)");
  } else if (!EqualInConstantTime(proof, HandshakeProof(token_, Prover::kClient, client_nonce,
                                                        server_nonce, rank))) {
    rank = -1;
    handshake = false;
    Refused(peer,
            "its job token differs from this job's (every rank needs the same "
            "BLUEFOG_JOB_TOKEN, MASTER_ADDR, MASTER_PORT and WORLD_SIZE)");
    WriteAll(fd, &kNo, 1);
  }
  if (handshake) {
    // Two processes with one RANK: the first keeps it, the second is told at once (else it
    // waits for Gloo's pairs that the rank's other process answers, past every timeout).
    std::string holder;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [other, c] : connections_)
        if (other != id && c.fd >= 0 && c.authenticated && c.rank == rank) holder = c.peer;
      if (holder.empty()) {
        Connection& mine = connections_[id];
        mine.authenticated = true;
        mine.rank = rank;
        mine.peer = peer;
      }
    }
    if (!holder.empty()) {
      Refused(peer, Concat("it is rank ", rank, ", which the process at ", holder,
                           " already joined as (RANK set twice?)"));
      WriteAll(fd, &kTaken, 1);
      rank = -1;
    } else if (WriteAll(fd, &kYes, 1)) {
      ServeRequests(fd, peer);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // A rank's connection lasts as long as its process (or until its shutdown), so its end is
  // how the others learn which rank left when a Gloo connection breaks (GoneKey).
  if (!stopping_ && rank >= 0) data_[GoneKey(rank)] = {};
  // What the peer sent and nobody read would make close() answer with a reset instead of an
  // orderly end: the peer's last bytes are read first (as many as have arrived, at most 64 KiB).
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  // Closed under the lock, so that no eviction shuts down a descriptor number reused since.
  ::close(fd);
  connections_[id].fd = -1;
  ended_.push_back(id);
  // Wakes the accept thread to join this one (a full pipe already has a wake-up pending).
  const char c = 'r';
  (void)!::write(wake_fd_[1], &c, 1);
}

void TcpStoreServer::ServeRequests(int fd, const std::string& peer) {
  for (;;) {
    char op;
    uint32_t key_len = 0;
    if (!ReadAll(fd, &op, 1) || !ReadAll(fd, &key_len, 4)) break;
    if (key_len > kMaxKeyBytes || (op != kSet && op != kGet && op != kHas)) {
      BF_LOG(LogLevel::kWarning, "rank 0, Gloo rendezvous server: dropped the connection from ",
             peer, ": malformed request");
      break;
    }
    std::string key(key_len, '\0');
    if (!ReadAll(fd, key.data(), key_len)) break;
    if (op == kSet) {
      uint64_t n = 0;
      if (!ReadAll(fd, &n, 8) || n > kMaxValueBytes) break;
      std::vector<char> value(n);
      if (!ReadAll(fd, value.data(), n)) break;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        data_[key] = std::move(value);
      }
      if (!WriteAll(fd, &kDone, 1)) break;
      continue;
    }
    std::vector<char> value;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = data_.find(key);
      if (it != data_.end()) {
        found = true;
        if (op == kGet) value = it->second;
      }
    }
    if (!found || op == kHas) {
      if (!WriteAll(fd, found ? &kYes : &kNo, 1)) break;
      continue;
    }
    const uint64_t n = value.size();
    if (!WriteAll(fd, &kYes, 1) || !WriteAll(fd, &n, 8) || !WriteAll(fd, value.data(), n)) break;
  }
}

}  // namespace bluefog
