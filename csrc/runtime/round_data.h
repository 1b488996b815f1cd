// The data that rides in a negotiation round: small allreduces and allgathers, and small
// broadcasts from this rank, send their bytes with their announcement; when every rank's (the
// root's) arrive, the request completes from them without a collective
// (Executor::CompleteInline). Used by Channel::RunRound.
#pragma once

#include <cstdint>

#include "core/types.h"
#include "core/wire.h"

namespace bluefog {

// Whether the rank `my_rank` sends `meta`'s bytes with its announcement: an allreduce, an
// allgather or a broadcast it roots, of 1 to `threshold_bytes` bytes.
bool MayRideInRound(const TensorMeta& meta, int my_rank, int64_t threshold_bytes);

// Clears the data entries that would make `message` longer than one exchange slot: a longer
// message costs every rank a second collective, more than the data saves.
void KeepDataThatFits(RoundMessage* message);

}  // namespace bluefog
