#include "core/flight_recorder.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/timeline.h"

namespace bluefog {
namespace {

const char* StateName(FlightEntry::State s) {
  switch (s) {
    case FlightEntry::kQueued: return "queued";
    case FlightEntry::kRunning: return "running";
    case FlightEntry::kDone: return "done";
    case FlightEntry::kFailed: return "failed";
  }
  return "?";
}

void CopyTruncated(char* dst, size_t size, const char* src, size_t len) {
  const size_t n = std::min(len, size - 1);
  std::memcpy(dst, src, n);
  dst[n] = '\0';
}

}  // namespace

void FlightRecorder::Resize(size_t capacity) {
  const double now = NowSeconds();
  std::lock_guard<std::mutex> lock(mutex_);
  if (queued_ > 0) totals_.waiting_seconds += now - waiting_since_;
  queued_ = 0;
  capacity_ = capacity;
  ring_.assign(capacity, FlightEntry());
}

void FlightRecorder::UnqueueLocked(double now) {
  if (--queued_ == 0) totals_.waiting_seconds += now - waiting_since_;
}

FlightEntry* FlightRecorder::SlotLocked(uint64_t id) {
  if (id == 0 || capacity_ == 0) return nullptr;
  FlightEntry& e = ring_[id % capacity_];
  return e.id == id ? &e : nullptr;
}

uint64_t FlightRecorder::Begin(const char* kind, const std::string& name, int process_set,
                               int64_t bytes, DataType dtype) {
  const double now = NowSeconds();
  std::lock_guard<std::mutex> lock(mutex_);
  ++totals_.operations;
  totals_.bytes += bytes;
  if (capacity_ == 0) return 0;
  const uint64_t id = next_id_++;
  FlightEntry& e = ring_[id % capacity_];
  if (e.id != 0 && e.state == FlightEntry::kQueued) UnqueueLocked(now);
  if (queued_++ == 0) waiting_since_ = now;
  e.id = id;
  CopyTruncated(e.kind, sizeof(e.kind), kind, std::strlen(kind));
  CopyTruncated(e.name, sizeof(e.name), name.data(), name.size());
  e.process_set = process_set;
  e.bytes = bytes;
  e.dtype = dtype;
  e.state = FlightEntry::kQueued;
  e.queued_at = now;
  e.started_at = 0;
  e.ended_at = 0;
  return id;
}

void FlightRecorder::Start(uint64_t id) {
  if (id == 0) return;
  const double now = NowSeconds();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* e = SlotLocked(id); e != nullptr && e->state == FlightEntry::kQueued) {
    UnqueueLocked(now);
    e->state = FlightEntry::kRunning;
    e->started_at = now;
  }
}

void FlightRecorder::End(uint64_t id, bool ok) {
  if (id == 0) return;
  const double now = NowSeconds();
  std::lock_guard<std::mutex> lock(mutex_);
  if (FlightEntry* e = SlotLocked(id)) {
    if (e->state == FlightEntry::kQueued) UnqueueLocked(now);
    e->state = ok ? FlightEntry::kDone : FlightEntry::kFailed;
    e->ended_at = now;
  }
}

FlightRecorder::Totals FlightRecorder::totals() const {
  const double now = NowSeconds();
  std::lock_guard<std::mutex> lock(mutex_);
  Totals out = totals_;
  if (queued_ > 0) out.waiting_seconds += now - waiting_since_;
  return out;
}

void FlightRecorder::NoteStall(const std::string& message, double at) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_stall_ = message;
  last_stall_at_ = at;
}

std::string FlightRecorder::LastStall(double* at) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (at != nullptr) *at = last_stall_at_;
  return last_stall_;
}

bool FlightRecorder::OldestPending(double* queued_at) const {
  std::lock_guard<std::mutex> lock(mutex_);
  bool any = false;
  for (const FlightEntry& e : ring_) {
    if (e.id == 0 || (e.state != FlightEntry::kQueued && e.state != FlightEntry::kRunning))
      continue;
    if (!any || e.queued_at < *queued_at) *queued_at = e.queued_at;
    any = true;
  }
  return any;
}

std::vector<FlightEntry> FlightRecorder::Snapshot() const {
  std::vector<FlightEntry> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FlightEntry& e : ring_)
      if (e.id != 0) out.push_back(e);
  }
  std::sort(out.begin(), out.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.id < b.id; });
  return out;
}

std::string FlightRecorder::Pending(double now, size_t limit) const {
  std::string out;
  size_t lines = 0, more = 0;
  for (const FlightEntry& e : Snapshot()) {
    if (e.state != FlightEntry::kQueued && e.state != FlightEntry::kRunning) continue;
    if (lines == limit) {
      ++more;
      continue;
    }
    char buf[320];
    int n = std::snprintf(buf, sizeof(buf), "\n  %s '%s' (set %d, %lld B %s) queued %.1f s ago",
                          e.kind, e.name, e.process_set, static_cast<long long>(e.bytes),
                          DataTypeName(e.dtype), now - e.queued_at);
    if (e.state == FlightEntry::kRunning && n > 0 && static_cast<size_t>(n) < sizeof(buf))
      std::snprintf(buf + n, sizeof(buf) - n, ", exchanging for %.1f s", now - e.started_at);
    out += buf;
    ++lines;
  }
  if (more > 0) out += "\n  ... and " + std::to_string(more) + " more";
  return out;
}

std::string FlightRecorder::Json(double now) const {
  std::string out = "[";
  bool first = true;
  for (const FlightEntry& e : Snapshot()) {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "\"process_set\": %d, \"bytes\": %lld, \"dtype\": \"%s\", \"state\": \"%s\", "
                  "\"queued_s_ago\": %.6f, \"started_s_ago\": %s, \"ended_s_ago\": %s}",
                  e.process_set, static_cast<long long>(e.bytes), DataTypeName(e.dtype),
                  StateName(e.state), now - e.queued_at,
                  e.started_at > 0 ? std::to_string(now - e.started_at).c_str() : "null",
                  e.ended_at > 0 ? std::to_string(now - e.ended_at).c_str() : "null");
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"id\": " + std::to_string(e.id) + ", \"kind\": \"" + JsonEscape(e.kind) +
           "\", \"name\": \"" + JsonEscape(e.name) + "\", " + buf;
  }
  out += "\n]";
  return out;
}

}  // namespace bluefog
