// The point-to-point messages the window service (runtime/window_service.h) runs on: a small
// interface each backend implements over connections of its own (Communicator::CreateWindowLink),
// so that windows work on every backend and the service needs no backend's headers.
//
// A message is a header of the fixed size the link was made for, sent to one rank, optionally
// followed by one data message from the same sender to the same rank. The service relies on
// per-sender order: the headers from one rank arrive in the order sent, and each data message
// is received right after the header it follows. Failures throw BluefogError (or any
// std::exception), naming the rank where the backend knows it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace bluefog {

class WindowLink {
 public:
  // One message on its way out. Its buffer stays valid and untouched until Test says it is done
  // (or Cancel was called).
  class Send {
   public:
    virtual ~Send() = default;
    virtual bool Test() = 0;  // nonblocking: true once the buffer may be reused
    virtual void Cancel() = 0;
  };

  virtual ~WindowLink() = default;

  // Collective over every rank of the job.
  virtual void Barrier() = 0;
  // Nonblocking sends: a header (of header_bytes) and the data message that follows it.
  virtual std::unique_ptr<Send> SendHeader(int dst, const void* header) = 0;
  virtual std::unique_ptr<Send> SendData(int dst, const void* data, size_t bytes) = 0;
  // Nonblocking: whether a header from some rank (this one included) is waiting; if so its
  // sender goes into *src, and ReceiveHeader(*src, ...) takes it without blocking.
  virtual bool ProbeHeader(int* src) = 0;
  virtual void ReceiveHeader(int src, void* header) = 0;
  // Blocks for the data message that follows the header just received from `src`.
  virtual void ReceiveData(int src, void* data, size_t bytes) = 0;
  // Called by the service about once a second while its operations wait for replies and
  // nothing arrives: throws, naming them, when peers are known to have left the job (their
  // replies will never come). Backends that end the whole job on a lost peer need nothing here.
  virtual void CheckPeers() {}

  // Fault-tolerant mode (the service's, on request; before any message): from now on a peer
  // whose connection breaks fails nothing: its sends count as done, the link goes on with the
  // others, and the peer is reported by TakeLostPeers (CheckPeers too reports instead of
  // throwing). Returns false where the backend cannot do this.
  virtual bool TolerateLostPeers() { return false; }
  // The peers found lost since the last call (fault-tolerant mode).
  virtual std::vector<int> TakeLostPeers() { return {}; }
  // The service gave up on `rank` (lost, or silent past its deadline): sends to it are no
  // longer waited for, and new ones are dropped.
  virtual void DropPeer(int rank) { (void)rank; }
  // Frees the link's connections; `release` false: leave them as they are (the backend may be
  // in an unknown state after a failure). Idempotent.
  virtual void Free(bool release) = 0;
};

}  // namespace bluefog
