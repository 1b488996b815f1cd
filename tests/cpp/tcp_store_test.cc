// The Gloo rendezvous server (TcpStoreServer) against connections that are not a rank's:
// garbage, idle and slow ones, by the thousand. One process, real sockets on loopback; the
// server's descriptors and threads are this process's, read from /proc/self.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "transport/gloo/tcp_store.h"

namespace bluefog {
namespace {

using std::chrono::milliseconds;

int Count(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - (std::string(dir) == "/proc/self/fd");  // the DIR's own descriptor
}
int Descriptors() { return Count("/proc/self/fd"); }
int Threads() { return Count("/proc/self/task"); }

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Waits up to `limit` for `done`; true when it came.
template <typename F>
bool Within(milliseconds limit, F done) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

class TcpStoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = FreePort();
    token_ = JobToken("", "127.0.0.1", port_, 2);
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", port_, token_);
    fds_ = Descriptors();
    threads_ = Threads();
  }
  // A rank's store works: a key set through one client reads back through another.
  void ExpectRankGetsIn(const std::string& key) {
    TcpStore a("127.0.0.1", port_, token_, 0, milliseconds(5000));
    TcpStore b("127.0.0.1", port_, token_, 1, milliseconds(5000));
    a.set(key, {'o', 'k'});
    EXPECT_EQ(b.get(key), (std::vector<char>{'o', 'k'}));
  }
  // Descriptors and threads back to what they were before the strangers came (± 5).
  void ExpectBackToStart() {
    EXPECT_TRUE(Within(milliseconds(10000),
                       [&] { return Descriptors() <= fds_ + 5 && Threads() <= threads_ + 5; }))
        << Descriptors() << " descriptors (" << fds_ << " before), " << Threads() << " threads ("
        << threads_ << " before)";
  }

  int port_ = 0;
  std::string token_;
  std::unique_ptr<TcpStoreServer> server_;
  int fds_ = 0;
  int threads_ = 0;
};

TEST_F(TcpStoreServerTest, GarbageConnectionsAreClosedAndReaped) {
  // More than a default descriptor limit (1024) of them: each one the server kept would be one
  // descriptor less for the job.
  const char garbage[] = "GET / HTTP/1.1\r\n\r\n";
  for (int i = 0; i < 1100; ++i) {
    int fd = Connect(port_);
    ASSERT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
    (void)!::send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL);
    ::close(fd);
  }
  // Each is refused once its thread has read it (some may still wait in the listen backlog).
  EXPECT_TRUE(Within(milliseconds(30000), [&] { return server_->refused() == 1100; }))
      << server_->refused();
  ExpectBackToStart();
  ExpectRankGetsIn("after-garbage");
  ExpectBackToStart();
}

TEST_F(TcpStoreServerTest, IdleConnectionsAreBoundedAndTimedOut) {
  // 300 strangers connect and send nothing: the server keeps at most 64 of them, and a rank
  // arriving meanwhile still gets in.
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) {
    int fd = Connect(port_);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    idle.push_back(fd);
  }
  EXPECT_TRUE(
      Within(milliseconds(10000),
             [&] { return Descriptors() <= fds_ + 300 + TcpStoreServer::kMaxUnauthenticated + 5; }))
      << Descriptors() - fds_ - 300 << " descriptors of the server's";
  ExpectRankGetsIn("during-idle");
  // The last ones (not closed for room) are closed after the handshake timeout (10 s).
  char c;
  EXPECT_TRUE(
      Within(milliseconds(20000), [&] { return ::recv(idle.back(), &c, 1, MSG_DONTWAIT) == 0; }));
  for (int fd : idle) ::close(fd);
  ExpectBackToStart();
}

TEST_F(TcpStoreServerTest, SlowHandshakeIsHeldToItsDeadline) {
  // The job's own opening (magic, nonce, rank), one byte every 500 ms (12 s in all): closed at
  // the 10 s deadline of the whole handshake, not kept alive by each byte.
  std::string hello(kStoreMagic, 4);
  const int32_t rank = 1;
  hello.append(kNonceBytes, 'n').append(reinterpret_cast<const char*>(&rank), 4);
  int fd = Connect(port_);
  ASSERT_GE(fd, 0);
  const auto start = std::chrono::steady_clock::now();
  bool closed = false;
  for (size_t i = 0; i < hello.size() && !closed; ++i) {
    (void)!::send(fd, &hello[i], 1, MSG_NOSIGNAL);
    std::this_thread::sleep_for(milliseconds(500));
    char c;
    closed = ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
  }
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(closed);
  EXPECT_LT(took, std::chrono::seconds(15));
  ::close(fd);
  ExpectBackToStart();
}

TEST_F(TcpStoreServerTest, WrongTokenIsRefusedAndCounted) {
  try {
    TcpStore stray("127.0.0.1", port_, JobToken("another job", "", 0, 0), 1, milliseconds(5000));
    FAIL() << "the server accepted a wrong token";
  } catch (const BluefogError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank's job token"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(server_->refused(), 1);
  ExpectRankGetsIn("after-wrong-token");
}

// Two processes started with one RANK: the second is told so at once, the first keeps the rank
// (and is not marked gone by the second's end); the rank is free again once the first has left.
TEST_F(TcpStoreServerTest, ASecondProcessWithTheSameRankIsRefused) {
  auto first = std::make_unique<TcpStore>("127.0.0.1", port_, token_, 1, milliseconds(5000));
  try {
    TcpStore second("127.0.0.1", port_, token_, 1, milliseconds(5000));
    FAIL() << "the server let two processes join as rank 1";
  } catch (const BluefogError& e) {
    EXPECT_NE(std::string(e.what()).find("another process already joined this job as rank 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(server_->refused(), 1);
  TcpStore rank0("127.0.0.1", port_, token_, 0, milliseconds(5000));
  std::this_thread::sleep_for(milliseconds(200));  // the refused connection's end is handled
  EXPECT_EQ(rank0.Missing({GoneKey(1)}).size(), 1u) << "rank 1 marked gone by the refused one";
  first->set("still-rank-1", {'y'});
  first.reset();
  EXPECT_TRUE(Within(milliseconds(5000), [&] { return rank0.Missing({GoneKey(1)}).empty(); }));
  TcpStore again("127.0.0.1", port_, token_, 1, milliseconds(5000));
  EXPECT_EQ(again.get("still-rank-1"), (std::vector<char>{'y'}));
}

// A listener that records what a client sends and answers with the server's half of the
// handshake computed over `token` (the job's or not).
class FakeServer {
 public:
  FakeServer(int port, std::string token) : token_(std::move(token)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ::listen(fd_, 4);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeServer() { Finish(); }
  // Every byte the client sent, once it closed its connection.
  std::string Finish() {
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return received_;
  }

 private:
  void Serve() {
    int c = ::accept(fd_, nullptr, nullptr);
    char hello[4 + kNonceBytes + 4];
    ASSERT_EQ(::recv(c, hello, sizeof(hello), MSG_WAITALL), static_cast<ssize_t>(sizeof(hello)));
    received_.assign(hello, sizeof(hello));
    int32_t rank;
    std::memcpy(&rank, hello + 4 + kNonceBytes, 4);
    const std::string server_nonce(kNonceBytes, 's');
    const Digest mine = HandshakeProof(token_, Prover::kServer, std::string(hello + 4, kNonceBytes),
                                       server_nonce, rank);
    (void)!::send(c, server_nonce.data(), kNonceBytes, MSG_NOSIGNAL);
    (void)!::send(c, mine.data(), mine.size(), MSG_NOSIGNAL);
    char proof[32];
    if (::recv(c, proof, sizeof(proof), MSG_WAITALL) == 32) received_.append(proof, 32);
    (void)!::send(c, "Y", 1, MSG_NOSIGNAL);  // says yes to anything: the client must not trust it
    char rest[256];
    for (ssize_t n; (n = ::recv(c, rest, sizeof(rest), 0)) > 0;) received_.append(rest, n);
    ::close(c);
  }
  std::string token_;
  std::string received_;
  int fd_ = -1;
  std::thread thread_;
};

TEST(TcpStoreHandshake, TheTokenNeverCrossesTheWire) {
  const int port = FreePort();
  const std::string secret = "the job's secret";
  const std::string token = JobToken(secret, "", 0, 0);
  FakeServer server(port, token);
  auto client = std::make_unique<TcpStore>("127.0.0.1", port, token, 3, milliseconds(5000));
  client.reset();
  const std::string sent = server.Finish();
  EXPECT_EQ(sent.size(), 4 + kNonceBytes + 4 + 32);  // the client's whole handshake came
  EXPECT_EQ(sent.find(token), std::string::npos);
  EXPECT_EQ(sent.find(secret), std::string::npos);
  EXPECT_EQ(sent.find(token.substr(0, 8)), std::string::npos);
}

TEST(TcpStoreHandshake, AServerWithoutTheTokenIsNotTrusted) {
  // A process that took the port first and answers "yes" to anything: the rank refuses it
  // (it cannot prove it holds the token) instead of handing it the job's keys.
  const int port = FreePort();
  FakeServer server(port, JobToken("not the job's", "", 0, 0));
  try {
    TcpStore client("127.0.0.1", port, JobToken("the job's", "", 0, 0), 0, milliseconds(5000));
    FAIL() << "the rank trusted a server without the job's token";
  } catch (const BluefogError& e) {
    EXPECT_NE(std::string(e.what()).find("refused this rank's job token"), std::string::npos)
        << e.what();
  }
  server.Finish();
}

// A rank whose handshake is cut off (a slow link: the server's deadline passes first) or never
// answered is told so, not that its token was refused.
TEST_F(TcpStoreServerTest, AHandshakePastTheServersDeadlineIsNotCalledAWrongToken) {
  server_.reset();  // this port's server, again with no time for a handshake
  server_ = std::make_unique<TcpStoreServer>("127.0.0.1", port_, token_, milliseconds(0),
                                             milliseconds(0));
  try {
    TcpStore slow("127.0.0.1", port_, token_, 1, milliseconds(5000));
    FAIL() << "a handshake past the server's deadline got in";
  } catch (const BluefogError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1: the handshake with the Gloo rendezvous server at 127.0.0.1:" +
                        std::to_string(port_) + " was cut off: the server closed the connection"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("allows 10 s for the handshake"), std::string::npos) << what;
    EXPECT_EQ(what.find("refused this rank's job token"), std::string::npos) << what;
  }
  EXPECT_EQ(server_->refused(), 1);
}

TEST(TcpStoreHandshake, AServerThatNeverAnswersIsATimeoutNotAWrongToken) {
  // A listener that never accepts: the connection is made (the kernel's backlog), the
  // handshake is never answered.
  const int port = FreePort();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ::listen(fd, 4);
  try {
    TcpStore client("127.0.0.1", port, JobToken("", "127.0.0.1", port, 2), 1, milliseconds(1000));
    FAIL() << "a handshake nobody answered succeeded";
  } catch (const BluefogError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(" timed out: no answer within 1"), std::string::npos) << what;
    EXPECT_EQ(what.find("refused this rank's job token"), std::string::npos) << what;
  }
  ::close(fd);
}

}  // namespace
}  // namespace bluefog
