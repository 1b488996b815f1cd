// The flight recorder: this rank's last N operations (collectives, neighbour ops, window puts,
// gets and mutexes) with their state and times, kept always so that a stall, an error that ends
// the job, SIGUSR1 or bf.flight_recorder() can say what each rank was doing, and since when.
// Pure logic: the runtime calls Begin when a request is queued, Start when its collective runs
// and End when it finished; the entries live in a fixed ring (no allocation per operation), so
// recording costs a lock and a few stores.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/types.h"

namespace bluefog {

struct FlightEntry {
  enum State : uint8_t { kQueued, kRunning, kDone, kFailed };
  uint64_t id = 0;  // 1, 2, ... in order of Begin; 0: an empty slot
  char kind[24] = {};
  char name[96] = {};  // truncated to fit
  int process_set = 0;
  int64_t bytes = 0;
  DataType dtype = DataType::kFloat32;
  State state = kQueued;
  double queued_at = 0;  // NowSeconds()
  double started_at = 0;
  double ended_at = 0;
};

class FlightRecorder {
 public:
  // `capacity` entries (0: records nothing).
  explicit FlightRecorder(size_t capacity = kDefaultCapacity) { Resize(capacity); }
  static constexpr size_t kDefaultCapacity = 256;

  // Forgets every entry and keeps `capacity` from now on.
  void Resize(size_t capacity);
  size_t capacity() const { return capacity_; }

  // A new entry, queued now; returns its id for Start and End (0 when the recorder is off).
  uint64_t Begin(const char* kind, const std::string& name, int process_set, int64_t bytes,
                 DataType dtype);
  // The entry's collective (or the window operation's exchange) runs from now on.
  void Start(uint64_t id);
  // The entry finished, or failed. An id whose slot was reused since is ignored.
  void End(uint64_t id, bool ok);

  // Operations begun since the process started and the bytes of their tensors (counted also
  // while the recorder is off, and kept across Resize), and the wall time during which at
  // least one recorded operation was queued, i.e. this rank waited for the others (the rank
  // they all wait for waits least): the job page's traffic and straggler per rank.
  struct Totals {
    uint64_t operations = 0;
    int64_t bytes = 0;
    double waiting_seconds = 0;
  };
  Totals totals() const;

  // The runtime's last stall report (the hang doctor's diagnosis, or the waiting tensors and the
  // ranks that have not submitted them), kept for the job page; `at` is its NowSeconds(). LastStall
  // returns an empty message and at = 0 before any.
  void NoteStall(const std::string& message, double at);
  std::string LastStall(double* at) const;

  // The entries still held, oldest first.
  std::vector<FlightEntry> Snapshot() const;
  // When the oldest entry not finished was queued (NowSeconds()); false when none is pending.
  // Copies nothing: what a periodic check calls before it needs the entries themselves.
  bool OldestPending(double* queued_at) const;
  // The entries not finished, oldest first, as lines for a person ("allreduce 'grad.3' (set 0,
  // 4096 B float32) queued 12.3 s ago, running since 12.1 s"), `now` the current NowSeconds().
  // At most `limit` lines; empty when nothing is pending.
  std::string Pending(double now, size_t limit) const;
  // Every entry held as a JSON array of objects, times relative to `now` (seconds ago).
  std::string Json(double now) const;

 private:
  FlightEntry* SlotLocked(uint64_t id);
  void UnqueueLocked(double now);

  mutable std::mutex mutex_;
  size_t capacity_ = 0;
  uint64_t next_id_ = 1;
  Totals totals_;
  int queued_ = 0;  // entries held in state kQueued
  std::string last_stall_;
  double last_stall_at_ = 0;
  double waiting_since_ = 0;
  std::vector<FlightEntry> ring_;
};

}  // namespace bluefog
