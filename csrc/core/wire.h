// What one rank tells the others in a negotiation round, as bytes.
#pragma once

#include <string>
#include <vector>

#include "core/types.h"

namespace bluefog {

struct RoundMessage {
  bool shutdown = false;  // this rank is shutting down; every rank stops after this round
  std::vector<TensorMeta> announcements;
};

std::string EncodeRound(const RoundMessage& message);
// Throws BluefogError(kInternal) on malformed bytes.
RoundMessage DecodeRound(const char* data, size_t size);

}  // namespace bluefog
