#include "transport/exchange_slots.h"

#include <algorithm>
#include <cstring>

namespace bluefog {
namespace {

constexpr size_t kHeader = Communicator::kExchangeSlotHeader;
constexpr size_t kPayload = Communicator::kExchangeSlotBytes;

}  // namespace

void FillExchangeSlot(char* slot, const std::string& mine) {
  const uint64_t total = mine.size();
  std::memcpy(slot, &total, sizeof(total));
  std::memcpy(slot + kHeader, mine.data(), std::min(mine.size(), kPayload));
}

bool ReadExchangeSlots(const char* slots, int size, std::vector<std::string>* out,
                       std::vector<int64_t>* rest) {
  out->assign(static_cast<size_t>(size), std::string());
  rest->assign(static_cast<size_t>(size), 0);
  bool overflow = false;
  for (int r = 0; r < size; ++r) {
    const char* slot = slots + static_cast<size_t>(r) * kExchangeSlotTotal;
    uint64_t len;
    std::memcpy(&len, slot, sizeof(len));
    (*out)[r].assign(slot + kHeader, std::min<uint64_t>(len, kPayload));
    (*out)[r].resize(len);
    (*rest)[r] = static_cast<int64_t>(len > kPayload ? len - kPayload : 0);
    overflow |= (*rest)[r] > 0;
  }
  return overflow;
}

const char* ExchangeRest(const std::string& mine) {
  return mine.size() > kPayload ? mine.data() + kPayload : nullptr;
}

void AppendExchangeRests(const char* gathered, const std::vector<int64_t>& rest,
                         std::vector<std::string>* out) {
  int64_t offset = 0;
  for (size_t r = 0; r < rest.size(); ++r) {
    if (rest[r] > 0) std::memcpy(&(*out)[r][kPayload], gathered + offset, rest[r]);
    offset += rest[r];
  }
}

}  // namespace bluefog
