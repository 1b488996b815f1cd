// The negotiation round's message format, the same for every backend (Communicator::ExchangeAll):
// each rank fills one fixed slot — its message's whole length, then as much of the message as
// fits — and every rank gets every slot. Only when some rank's message is longer than a slot
// does a second step gather the rest, concatenated in rank order. The backends move the bytes;
// this file reads and writes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/communicator.h"

namespace bluefog {

constexpr size_t kExchangeSlotTotal =
    Communicator::kExchangeSlotHeader + Communicator::kExchangeSlotBytes;

// Writes `mine` into a slot of kExchangeSlotTotal bytes.
void FillExchangeSlot(char* slot, const std::string& mine);

// Every rank's message from `size` consecutive slots, each already sized to its whole length;
// `rest[r]` gets how many of rank r's bytes did not fit its slot. Returns whether any did not.
bool ReadExchangeSlots(const char* slots, int size, std::vector<std::string>* out,
                       std::vector<int64_t>* rest);

// The part of this rank's message after its slot, or nullptr when it fits.
const char* ExchangeRest(const std::string& mine);

// Copies the gathered rests (`rest[r]` bytes of each rank, in rank order, in `gathered`) behind
// what the slots held.
void AppendExchangeRests(const char* gathered, const std::vector<int64_t>& rest,
                         std::vector<std::string>* out);

}  // namespace bluefog
