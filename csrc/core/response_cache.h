// Requests agreed before, so a repeated one is announced as a bit instead of its metadata.
// Every rank records the same ready lists in the same order, so every rank's cache holds the
// same entries in the same slots and a slot number means the same thing everywhere. Pure logic.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/coordinator.h"
#include "core/types.h"

namespace bluefog {

bool SameMeta(const TensorMeta& a, const TensorMeta& b);

class ResponseCache {
 public:
  // capacity 0 disables the cache.
  ResponseCache(size_t capacity, int size);

  // The slot whose entry has exactly `meta` as `rank`'s announcement, or -1.
  int64_t Find(const TensorMeta& meta, int rank) const;
  // `rank`'s announcement in `slot`; throws kInternal for an empty or unknown slot.
  const TensorMeta& Get(uint32_t slot, int rank) const;
  // After a round, the requests every rank agreed on, in ready order. A new name takes a free
  // slot, or the least recently agreed one's when full; a known name's entry is replaced.
  // Takes each response's rank_metas (moved, not copied: this runs for every request).
  void Record(std::vector<Response>& ready);
  size_t size() const { return by_name_.size(); }

 private:
  struct Entry {
    std::vector<TensorMeta> rank_metas;  // empty: free slot
    uint64_t last_used = 0;
  };
  size_t capacity_;
  int size_;
  uint64_t clock_ = 0;
  std::vector<Entry> slots_;
  std::unordered_map<std::string, uint32_t> by_name_;
};

}  // namespace bluefog
