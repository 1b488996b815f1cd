// How a client of the rendezvous store and the server prove to each other that they hold the
// job's token, without sending it (bluefog/common/gloo_store.py speaks the same):
//
//   client -> server   "BFG2", the client's nonce (16 random bytes), its rank (i32)
//   server -> client   the server's nonce (16 bytes), HandshakeProof(kServer, ...) (32 bytes)
//   client -> server   HandshakeProof(kClient, ...) (32 bytes)
//   server -> client   'Y' (the client is the job's) or 'N'
//
// A proof is HMAC-SHA-256 keyed with the token over a label, both nonces and the rank, so
// what crosses the wire cannot be replayed on another connection (fresh nonces each time),
// tells nothing of the token, and a server's proof cannot stand in for a client's.
#pragma once

#include <cstdint>
#include <string>

#include "core/hmac_sha256.h"

namespace bluefog {

constexpr char kStoreMagic[4] = {'B', 'F', 'G', '2'};
constexpr size_t kNonceBytes = 16;

enum class Prover { kServer, kClient };

// The job's token, the key of every proof: SHA-256 of BLUEFOG_JOB_TOKEN when it is set, else of
// the rendezvous address and the world size (then it keeps jobs at different addresses or
// sizes apart, but anyone who knows the address can compute it).
std::string JobToken(const std::string& secret, const std::string& addr, int port, int world_size);

Digest HandshakeProof(const std::string& token, Prover who, const std::string& client_nonce,
                      const std::string& server_nonce, int32_t rank);

// kNonceBytes from the kernel's random source (getrandom); throws BluefogError when it fails.
std::string NewNonce();

}  // namespace bluefog
