// Negotiation rounds among ranks that share one host, through a shared-memory segment instead of
// MPI messages: each rank writes its slot, and the last to arrive wakes the others through a
// futex, so a waiting rank sleeps in the kernel and leaves its core to the ranks still working
// (what matters when ranks outnumber cores). See docs/design.md, "One host".
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "transport/shared_heap.h"

namespace bluefog {

class Communicator;

class LocalRounds {
 public:
  // Collective over every rank of `comm`, all of which share one host (set up through its
  // Broadcast and Allgatherv, whichever backend it is).
  // Rank 0 makes an anonymous segment (memfd: no name, nothing left behind by a killed job) and
  // the others open it through /proc; it is used only if every rank mapped it and found the
  // token rank 0 wrote there, otherwise (a kernel that refuses, ranks in other PID namespaces)
  // nullptr, on every rank alike. `slot_bytes` per rank and round; `data_bytes` in each rank's
  // data area (the staged allreduce's; 0: none), touched by its owner here so that no call
  // takes its page faults. `heap_bytes` per rank of the same segment, mapped separately, make
  // heap() (0: none); its pages are touched only when a block of them is first used.
  static std::unique_ptr<LocalRounds> Create(Communicator* comm, size_t slot_bytes,
                                             size_t data_bytes = 0, size_t heap_bytes = 0);
  ~LocalRounds();
  LocalRounds(const LocalRounds&) = delete;
  LocalRounds& operator=(const LocalRounds&) = delete;

  // This rank's slot of the next round, to fill before Exchange.
  char* my_slot() { return Slots(round_ % 2) + static_cast<size_t>(rank_) * slot_bytes_; }
  // Waits until every rank has filled its slot of this round and returns the `size` slots, in
  // rank order, valid until the Exchange after next. `on_wait` runs about every millisecond
  // after the first 5 ms of waiting.
  const char* Exchange(const std::function<void()>& on_wait) {
    Arrive();
    return Await(on_wait, std::chrono::microseconds(-1));
  }
  // Exchange in two halves: Arrive marks this rank's slot of the round filled; Await waits for
  // the other ranks of the round Arrive joined, at most `limit` (negative: as long as it takes),
  // and returns nullptr when that ran out (the round stays open: a later Await, from any thread
  // that took the rounds over, finishes it). A peer whose process is gone would never arrive:
  // every kPeerCheck of waiting its processes are looked at, and a dead one ends the wait with
  // TransportError(kAborted) naming it (what a lost rank's broken connection does on a backend's
  // own rounds).
  void Arrive();
  const char* Await(const std::function<void()>& on_wait, std::chrono::microseconds limit);
  static constexpr std::chrono::milliseconds kPeerCheck{100};

  // Rank `rank`'s data area, data_bytes() long, shared by every rank.
  char* data(int rank) {
    return static_cast<char*>(base_) + data_offset_ + static_cast<size_t>(rank) * data_bytes_;
  }
  size_t data_bytes() const { return data_bytes_; }
  // Every rank's part of the segment for large allreduce outputs (shared_heap.h), or nullptr.
  const std::shared_ptr<SharedHeap>& heap() const { return heap_; }

 private:
  struct Header;
  LocalRounds(void* base, size_t bytes, int rank, int size, size_t slot_bytes, size_t data_bytes);
  char* Slots(uint64_t parity);
  // Throws when a peer's process has exited (or is a zombie).
  void CheckPeers() const;

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  size_t slot_bytes_;
  size_t data_bytes_;
  size_t data_offset_;
  uint64_t round_ = 0;
  uint32_t waiting_ = 0;  // the round Arrive joined last
  uint64_t parity_ = 0;   // its slots
  std::shared_ptr<SharedHeap> heap_;
  std::vector<int64_t> pids_;  // every rank's process id, gathered at Create
};

}  // namespace bluefog
