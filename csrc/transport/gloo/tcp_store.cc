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

using namespace store_wire;  // NOLINT: the wire's names, shared with the server

std::string GoneKey(int rank) { return Concat("bluefog/gone/", rank); }

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
  // The server proves it holds the token before this rank proves it; this rank sends its proof
  // even to a server whose proof is wrong, so that the server names the mismatch in its log.
  const std::string client_nonce = NewNonce();
  std::string server_nonce(kNonceBytes, '\0');
  Digest server_proof{};
  const int32_t rank32 = rank;
  char answer = 0;
  const auto began = std::chrono::steady_clock::now();
  errno = 0;
  bool ok = WriteAll(fd_, kStoreMagic, 4) && WriteAll(fd_, client_nonce.data(), kNonceBytes) &&
            WriteAll(fd_, &rank32, 4) && ReadAll(fd_, server_nonce.data(), kNonceBytes) &&
            ReadAll(fd_, server_proof.data(), server_proof.size());
  const bool server_ok =
      ok && EqualInConstantTime(server_proof, HandshakeProof(token, Prover::kServer, client_nonce,
                                                             server_nonce, rank32));
  if (ok) {
    const Digest mine = HandshakeProof(token, Prover::kClient, client_nonce, server_nonce, rank32);
    ok = WriteAll(fd_, mine.data(), mine.size()) && ReadAll(fd_, &answer, 1);
  }
  if (!ok) {
    // Cut off mid-handshake: a slow link, an overloaded rank 0 or a flood of connections to its
    // port, not a wrong token (the server answers that with a no).
    const int error = errno;
    const double waited = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - began)
                              .count() /
                          1000.0;
    ::close(fd_);
    fd_ = -1;
    throw BluefogError(
        StatusCode::kAborted,
        Concat("rank ", rank, ": the handshake with the Gloo rendezvous server at ", where_,
               error == EAGAIN || error == EWOULDBLOCK
                   ? Concat(" timed out: no answer within ", waited, " s (BLUEFOG_GLOO_TIMEOUT)")
                   : Concat(" was cut off: the server closed the connection after ", waited, " s (",
                            error != 0 ? std::strerror(error) : "end of stream", ")"),
               ", before the tokens were compared. The server (rank 0's, or an elastic job's "
               "driver's) allows ",
               TcpStoreServer::kHandshakeTimeoutS,
               " s for the handshake and closes the connections waiting longest during a flood "
               "of connections: is the link to its host slow, or is it overloaded? Its log "
               "names the reason"));
  }
  if (ok && server_ok && answer == kTaken) {
    ::close(fd_);
    fd_ = -1;
    throw BluefogError(StatusCode::kPrecondition,
                       Concat("rank ", rank, ": another process already joined this job as rank ",
                              rank, " at the Gloo rendezvous server at ", where_,
                              "; every process needs its own RANK, from 0 to WORLD_SIZE-1 (is "
                              "RANK set twice, or is a rank of an earlier run still alive?)"));
  }
  if (!ok || !server_ok || answer != kYes) {
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
