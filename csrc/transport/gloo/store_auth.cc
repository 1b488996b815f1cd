#include "transport/gloo/store_auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "core/status.h"

namespace bluefog {

std::string JobToken(const std::string& secret, const std::string& addr, int port, int world_size) {
  const std::string text = secret.empty() ? Concat("bluefog-job|", addr, "|", port, "|", world_size)
                                          : Concat("bluefog-token|", secret);
  return ToHex(Sha256(text));
}

Digest HandshakeProof(const std::string& token, Prover who, const std::string& client_nonce,
                      const std::string& server_nonce, int32_t rank) {
  std::string message = who == Prover::kServer ? "bluefog-store-server|" : "bluefog-store-client|";
  message += client_nonce;
  message += server_nonce;
  const uint32_t r = static_cast<uint32_t>(rank);
  for (int i = 0; i < 4; ++i) message.push_back(static_cast<char>(r >> (8 * i)));  // little-endian
  return HmacSha256(token, message);
}

std::string NewNonce() {
  std::string nonce(kNonceBytes, '\0');
  size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    BF_ENFORCE(n > 0, StatusCode::kInternal,
               "getrandom failed for the rendezvous store's handshake: ", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  return nonce;
}

}  // namespace bluefog
