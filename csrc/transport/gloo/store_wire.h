// The rendezvous store's wire, below its handshake (store_auth.h), and the socket reads and
// writes that the server (tcp_store_server.cc) and the client (tcp_store.cc) share.
#pragma once

#include <netdb.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace bluefog {
namespace store_wire {

// After the handshake, requests: an op byte,
// the key's length (u32), the key and, for a set, the value's length (u64) and the value. A set
// is answered kDone; a get kYes, the length (u64) and the bytes, or kNo while the key is unset; a
// has kYes or kNo.
constexpr char kSet = 'S';
constexpr char kGet = 'G';
constexpr char kHas = 'H';
constexpr char kYes = 'Y';
constexpr char kNo = 'N';
constexpr char kDone = 'K';
// The handshake's answer to a rank whose number another connected process already holds.
constexpr char kTaken = 'T';
// Anything larger is not a rendezvous message: the connection is dropped.
constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint64_t kMaxValueBytes = uint64_t{64} << 20;

// False when the peer closed or failed before all n bytes went or came.
bool WriteAll(int fd, const void* data, size_t n);
bool ReadAll(int fd, void* data, size_t n);
// ReadAll that gives up at `deadline`: a peer that sends its bytes one at a time, slowly, is
// held to the deadline of the whole read, not to a timeout per byte.
bool ReadAllBy(int fd, void* data, size_t n, std::chrono::steady_clock::time_point deadline);
// "host:port" of the connection's peer.
std::string PeerName(int fd);

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

}  // namespace store_wire
}  // namespace bluefog
