#include "runtime/round_data.h"

#include <string>
#include <vector>

#include "transport/communicator.h"

namespace bluefog {

bool MayRideInRound(const TensorMeta& meta, int my_rank, int64_t threshold_bytes) {
  const bool op_ok = meta.op == OpType::kAllreduce || meta.op == OpType::kAllgather ||
                     (meta.op == OpType::kBroadcast && meta.root_rank == my_rank);
  const size_t bytes = meta.NumBytes();
  return op_ok && bytes > 0 && static_cast<int64_t>(bytes) <= threshold_bytes;
}

void KeepDataThatFits(RoundMessage* message) {
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
