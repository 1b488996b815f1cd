#include "transport/local/local_host.h"

#include <algorithm>
#include <cstring>

#include "transport/exchange_slots.h"
#include "transport/local/algorithms.h"

namespace bluefog {

LocalHost::LocalHost(Communicator* comm, std::shared_ptr<Tuning> tuning)
    : comm_(comm), tuning_(std::move(tuning)), rank_(comm->rank()), size_(comm->size()) {}

LocalHost::~LocalHost() = default;

std::unique_ptr<LocalHost> LocalHost::Create(Communicator* comm, std::shared_ptr<Tuning> tuning,
                                             const TransportOptions& options, bool every_size) {
  std::unique_ptr<LocalHost> host(new LocalHost(comm, std::move(tuning)));
  host->direct_ = std::make_unique<DirectAllreduce>(host.get(), options.deterministic);
  host->direct_->Probe();
  if (options.local_rounds) {
    const int64_t staged = std::max<int64_t>(options.staged_bytes, 0);
    host->rounds_ = LocalRounds::Create(
        comm, kExchangeSlotTotal, static_cast<size_t>(staged),
        staged > 0 ? static_cast<size_t>(std::max<int64_t>(options.shared_heap_bytes, 0)) : 0);
  }
  host->one_host_ =
      std::make_unique<OneHostAllreduce>(host.get(), host->direct_.get(), every_size, options);
  if (options.deterministic)
    host->rank_ordered_ =
        std::make_unique<RankOrderedAllreduce>(host->one_host_.get(), host->direct_.get());
  return host;
}

char* LocalHost::Scratch(int64_t bytes) {
  if (static_cast<int64_t>(scratch_.size()) < bytes) scratch_.resize(static_cast<size_t>(bytes));
  return scratch_.data();
}

void LocalHost::SmallAllgather(const void* mine, size_t bytes, void* all) {
  if (rounds_ && bytes <= kExchangeSlotTotal) {
    std::memcpy(rounds_->my_slot(), mine, bytes);
    const char* slots = rounds_->Exchange(nullptr);
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(all) + static_cast<size_t>(r) * bytes,
                  slots + static_cast<size_t>(r) * kExchangeSlotTotal, bytes);
    return;
  }
  gather_bytes_.assign(static_cast<size_t>(size_), static_cast<int64_t>(bytes));
  comm_->Allgatherv(mine, all, gather_bytes_);
}

std::vector<AllreduceAlgorithm*> LocalHost::algorithms() const {
  return {one_host_.get(), direct_.get()};
}

AllreduceAlgorithm* LocalHost::rank_ordered() const { return rank_ordered_.get(); }

bool LocalHost::direct() const { return direct_->enabled(); }
bool LocalHost::areas() const { return one_host_->areas(); }
int LocalHost::choice(int64_t bytes, int kind) const { return one_host_->Choice(bytes, kind); }

TransportPaths LocalPaths(const LocalHost* local) {
  TransportPaths p;
  if (local == nullptr) return p;
  p.direct = local->direct();
  p.staged = local->areas();
  p.shared_heap = local->heap() != nullptr;
  p.local_rounds = local->rounds() != nullptr;
  return p;
}

}  // namespace bluefog
