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
  // The data of small requests, sent with their announcement so that no collective has to
  // move it (docs/design.md, "Small collectives ride in the round"). Either empty, or as long
  // as `announcements` (and `cached`), one string per entry, empty for none.
  std::vector<std::string> announcement_data;
  std::vector<std::string> cached_data;
  // The sender's requests agreed so far and their total wait in the negotiation, in units of
  // 10 us, both modulo 2^32 (core/straggler.h): 8 bytes when has_waits.
  bool has_waits = false;
  uint32_t agreed = 0;
  uint32_t wait_units = 0;
};

// The bytes EncodeRound adds for one entry's data of `bytes` bytes.
size_t DataCost(size_t bytes);

std::string EncodeRound(const RoundMessage& message);
// Throws BluefogError(kInternal) on malformed bytes.
RoundMessage DecodeRound(const char* data, size_t size);

}  // namespace bluefog
