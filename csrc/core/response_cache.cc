#include "core/response_cache.h"

#include <utility>

#include "core/status.h"

namespace bluefog {

bool SameMeta(const TensorMeta& a, const TensorMeta& b) {
  return a.name == b.name && a.op == b.op && a.dtype == b.dtype && a.root_rank == b.root_rank &&
         a.reduce_op == b.reduce_op && a.average == b.average && a.scale == b.scale &&
         a.shape == b.shape && a.send_ranks == b.send_ranks && a.recv_ranks == b.recv_ranks &&
         a.input_rows == b.input_rows && a.splits == b.splits && a.group_size == b.group_size;
}

ResponseCache::ResponseCache(size_t capacity, int size) : capacity_(capacity), size_(size) {}

int64_t ResponseCache::Find(const TensorMeta& meta, int rank) const {
  auto it = by_name_.find(meta.name);
  if (it == by_name_.end()) return -1;
  return SameMeta(slots_[it->second].rank_metas[rank], meta) ? static_cast<int64_t>(it->second)
                                                             : -1;
}

const TensorMeta& ResponseCache::Get(uint32_t slot, int rank) const {
  BF_ENFORCE(slot < slots_.size() && !slots_[slot].rank_metas.empty() && rank >= 0 && rank < size_,
             StatusCode::kInternal, "negotiation message names cache slot ", slot,
             ", which is empty on this rank (ranks' caches diverged)");
  return slots_[slot].rank_metas[rank];
}

void ResponseCache::Record(std::vector<Response>& ready) {
  if (capacity_ == 0) return;
  for (Response& r : ready) {
    if (!r.status.ok() || static_cast<int>(r.rank_metas.size()) != size_) continue;
    ++clock_;
    uint32_t slot;
    auto it = by_name_.find(r.meta.name);
    if (it != by_name_.end()) {
      slot = it->second;
    } else if (slots_.size() < capacity_) {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    } else {
      slot = 0;  // full: evict the least recently agreed entry (lowest slot on a tie)
      for (uint32_t s = 1; s < slots_.size(); ++s)
        if (slots_[s].last_used < slots_[slot].last_used) slot = s;
      by_name_.erase(slots_[slot].rank_metas[0].name);
    }
    slots_[slot].rank_metas = std::move(r.rank_metas);
    slots_[slot].last_used = clock_;
    by_name_[r.meta.name] = slot;
  }
}

}  // namespace bluefog
