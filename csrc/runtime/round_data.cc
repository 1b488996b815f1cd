// The data that rides in a negotiation round: small requests send their bytes with their
// announcement, as far as this rank's slot of the round has room (the rest of Channel is in
// channel.cc).
#include <cstdint>
#include <string>
#include <vector>

#include "core/wire.h"
#include "runtime/channel.h"

namespace bluefog {

// Small allreduces and allgathers, and small broadcasts from this rank, send their bytes with
// their announcement: when every rank's (the root's) arrive, the request completes from them
// without a collective (Executor::CompleteInline).
bool Channel::MayRideInRound(const TensorMeta& meta) const {
  const bool op_ok = meta.op == OpType::kAllreduce || meta.op == OpType::kAllgather ||
                     (meta.op == OpType::kBroadcast && meta.root_rank == info_.rank);
  const size_t bytes = meta.NumBytes();
  return op_ok && bytes > 0 && static_cast<int64_t>(bytes) <= inline_threshold_.load();
}

// Drops the data that would push this rank's message past its slot of the round: a longer
// message costs every rank a second collective, more than the data saves.
void Channel::KeepDataThatFits(RoundMessage* message) {
  std::vector<std::string*> data;
  size_t data_cost = 0;
  for (auto* list : {&message->announcement_data, &message->cached_data})
    for (std::string& d : *list)
      if (!d.empty()) {
        data.push_back(&d);
        data_cost += DataCost(d.size());
      }
  if (data.empty()) return;
  const size_t total = EncodeRound(*message).size();
  if (total <= Communicator::kExchangeSlotBytes) return;
  const size_t base = total - data_cost;
  size_t room =
      base < Communicator::kExchangeSlotBytes ? Communicator::kExchangeSlotBytes - base : 0;
  for (std::string* d : data) {
    if (DataCost(d->size()) <= room) {
      room -= DataCost(d->size());
    } else {
      d->clear();
    }
  }
}

}  // namespace bluefog
