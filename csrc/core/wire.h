// What one rank tells the others in a negotiation round, as bytes.
#pragma once

#include <string>
#include <vector>

#include "core/types.h"

namespace bluefog {

struct RoundMessage {
  bool shutdown = false;  // this rank is shutting down; every rank stops after this round
  std::vector<TensorMeta> announcements;
  // Announcements of requests the response cache holds, by slot, ascending: a bit set on the wire.
  std::vector<uint32_t> cached;
};

std::string EncodeRound(const RoundMessage& message);
// Throws BluefogError(kInternal) on malformed bytes.
RoundMessage DecodeRound(const char* data, size_t size);

}  // namespace bluefog
