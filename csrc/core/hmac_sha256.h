// SHA-256 and HMAC-SHA-256 (FIPS 180-4, RFC 2104): what the rendezvous store's handshake needs
// to prove that both ends hold the job's token without sending it. Pure, no dependencies.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace bluefog {

using Digest = std::array<uint8_t, 32>;

Digest Sha256(const std::string& data);
Digest HmacSha256(const std::string& key, const std::string& message);

// Whether a and b are equal, in a time that does not depend on where they first differ.
bool EqualInConstantTime(const Digest& a, const Digest& b);

// Lower-case hexadecimal.
std::string ToHex(const Digest& digest);

}  // namespace bluefog
