// A 64-bit fingerprint of a byte range, for comparing replicas across ranks (check_replicas):
// not cryptographic, but fast (four independent lanes of 8-byte words) and exact for the
// common case of a small change: a change confined to one aligned 8-byte word of the input
// always changes the fingerprint (every step from that word to the result is a bijection).
// Other changes collide with probability about 2^-64. The value depends only on the bytes and
// their count, so every rank of a job (one build, one byte order) computes the same for the
// same data. Pure, no dependencies.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bluefog {

uint64_t Fingerprint64(const void* data, size_t bytes);

}  // namespace bluefog
