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
#include <cstdio>
#include <cstring>
#include <system_error>

#include "core/logging.h"
#include "core/status.h"

namespace bluefog {
namespace {

// The wire: a connection opens with kMagic, the token's length (u32), the token and the
// client's rank (i32); the server answers kYes or kNo. Then requests: an op byte, the key's length
// (u32), the key and, for a set, the value's length (u64) and the value. A set is answered kDone; a
// get kYes, the length (u64) and the bytes, or kNo while the key is unset; a has kYes or kNo.
constexpr char kMagic[4] = {'B', 'F', 'G', '1'};
constexpr char kSet = 'S';
constexpr char kGet = 'G';
constexpr char kHas = 'H';
constexpr char kYes = 'Y';
constexpr char kNo = 'N';
constexpr char kDone = 'K';
// Anything larger is not a rendezvous message: the connection is dropped.
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;
constexpr uint32_t kMaxTokenBytes = 256;

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// ReadAll that gives up at `deadline`: a peer that sends its bytes one at a time, slowly, is
// held to the deadline of the whole read, not to a timeout per byte.
bool ReadAllBy(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return Concat(host, ":", port);
}

// 64-bit FNV-1a, twice with different seeds: a stable digest, not a secret.
uint64_t Fnv(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

}  // namespace

std::string GoneKey(int rank) { return Concat("bluefog/gone/", rank); }

std::string JobToken(const std::string& secret, const std::string& addr, int port, int world_size) {
  const std::string text = secret.empty() ? Concat("bluefog-job|", addr, "|", port, "|", world_size)
                                          : Concat("bluefog-token|", secret);
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx",
                static_cast<unsigned long long>(Fnv(text, 14695981039346656037ull)),
                static_cast<unsigned long long>(Fnv(text, 0x9e3779b97f4a7c15ull)));
  return hex;
}

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
  uint32_t len = 0;
  std::string token;
  bool handshake = ReadAllBy(fd, magic, 4, deadline) && std::memcmp(magic, kMagic, 4) == 0 &&
                   ReadAllBy(fd, &len, 4, deadline) && len <= kMaxTokenBytes;
  if (handshake) {
    token.resize(len);
    handshake = ReadAllBy(fd, token.data(), len, deadline) && ReadAllBy(fd, &rank, 4, deadline);
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
      Refused(peer, "it did not open with bluefog's handshake (another program on MASTER_PORT?)");
  } else if (token != token_) {
    rank = -1;
    handshake = false;
    Refused(peer,
            "its job token differs from this job's (every rank needs the same "
            "BLUEFOG_JOB_TOKEN, MASTER_ADDR, MASTER_PORT and WORLD_SIZE)");
    WriteAll(fd, &kNo, 1);
  }
  if (handshake) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      connections_[id].authenticated = true;
    }
    if (WriteAll(fd, &kYes, 1)) ServeRequests(fd, peer);
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

TcpStore::TcpStore(const std::string& addr, int port, const std::string& token, int rank,
                   std::chrono::milliseconds timeout, std::string prefix)
    : where_(Concat(addr, ":", port)), prefix_(std::move(prefix)), rank_(rank), timeout_(timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error = "no answer";
  while (fd_ < 0) {
    AddrInfo res;
    int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &res.list);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (addrinfo* a = res.list; a != nullptr && fd_ < 0; a = a->ai_next) {
        int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last_error = std::strerror(errno);
          ::close(fd);
        }
      }
    }
    if (fd_ >= 0) break;
    BF_ENFORCE(std::chrono::steady_clock::now() < deadline, StatusCode::kAborted, "rank ", rank,
               ": the Gloo rendezvous server at ", where_,
               " (MASTER_ADDR:MASTER_PORT, run by "
               "rank 0) did not answer within ",
               timeout.count() / 1000, " s (BLUEFOG_GLOO_TIMEOUT): ", last_error,
               ". Is rank 0 started, and are MASTER_ADDR and MASTER_PORT the same on every rank?");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A server that stops answering must not hang a rank forever.
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(std::max<int64_t>(1, timeout.count() / 1000));
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const uint32_t len = static_cast<uint32_t>(token.size());
  char answer = 0;
  const int32_t rank32 = rank;
  bool ok = WriteAll(fd_, kMagic, 4) && WriteAll(fd_, &len, 4) &&
            WriteAll(fd_, token.data(), token.size()) && WriteAll(fd_, &rank32, 4) &&
            ReadAll(fd_, &answer, 1);
  if (!ok || answer != kYes) {
    ::close(fd_);
    fd_ = -1;
    throw BluefogError(StatusCode::kPrecondition,
                       Concat("rank ", rank, ": the Gloo rendezvous server at ", where_,
                              " refused this rank's job token: every rank needs the same "
                              "BLUEFOG_JOB_TOKEN (or, without one, the same MASTER_ADDR, "
                              "MASTER_PORT and WORLD_SIZE); is another job using this port?"));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStore::Call(char op, const std::string& name, const std::vector<char>& value,
                                 bool* found) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string key = prefix_ + name;
  const uint32_t key_len = static_cast<uint32_t>(key.size());
  bool ok =
      WriteAll(fd_, &op, 1) && WriteAll(fd_, &key_len, 4) && WriteAll(fd_, key.data(), key.size());
  if (ok && op == kSet) {
    const uint64_t n = value.size();
    ok = WriteAll(fd_, &n, 8) && WriteAll(fd_, value.data(), value.size());
  }
  char answer = 0;
  ok = ok && ReadAll(fd_, &answer, 1);
  std::vector<char> out;
  if (ok && op == kGet && answer == kYes) {
    uint64_t n = 0;
    ok = ReadAll(fd_, &n, 8);
    if (ok) {
      out.resize(n);
      ok = ReadAll(fd_, out.data(), n);
    }
  }
  BF_ENFORCE(ok, StatusCode::kAborted, "rank ", rank_, ": lost the Gloo rendezvous server at ",
             where_, " (rank 0) while ", op == kSet ? "setting" : "reading", " key '", key,
             "'; has rank 0 exited?");
  if (found) *found = answer == kYes || answer == kDone;
  return out;
}

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  Call(kSet, key, data, nullptr);
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  bool found = false;
  std::vector<char> value = Call(kGet, key, {}, &found);
  BF_ENFORCE(found, StatusCode::kInternal, "rank ", rank_, ": key '", key,
             "' vanished from the Gloo rendezvous server");
  return value;
}

std::vector<std::string> TcpStore::Missing(const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    bool found = false;
    Call(kHas, key, {}, &found);
    if (!found) missing.push_back(key);
  }
  return missing;
}

void TcpStore::wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  std::vector<std::string> missing = keys;
  for (;;) {
    missing = Missing(missing);
    if (missing.empty()) return;
    BF_ENFORCE(std::chrono::steady_clock::now() < deadline, StatusCode::kAborted, "rank ", rank_,
               ": waited ", timeout.count() / 1000, " s (BLUEFOG_GLOO_TIMEOUT) for key '",
               missing.front(), "' of the Gloo rendezvous at ", where_, " (", missing.size(),
               " keys missing); did every rank start?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace bluefog
