// ember — the rendezvous store's handshake: the job's shared secret (a token), fresh random nonces and the keyed
// proofs that each side knows the token, exchanged before the first command.
//
//   server -> client   "EMBS" u8 version u8 mode (0 open, 1 token) nonce_s[32]
//   client -> server   "EMBC" nonce_c[32] proof_c[32]      proof_c = HMAC-SHA256(token, "ember-store client" 0 ns nc)
//   server -> client   a reply (u8 status, u64 length, payload): ok with proof_s[32], or refused with a reason
//                      proof_s = HMAC-SHA256(token, "ember-store server" 0 ns nc)
//
// Each side sends a fresh nonce, so neither proof can be replayed on another connection, and the two proofs are
// keyed hashes of different messages, so one cannot be reflected as the other. In open mode (no token) the proofs
// are not checked and are sent as zeros. Other protocols that prove the token (the tcp backend's ring greeting,
// dist/detail/tcp_greeting.hpp) use labelled_proof, whose messages cannot be taken for the store's.
#pragma once

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ember/config.hpp"
#include "ember/dist/detail/sha256.hpp"

namespace ember::dist::detail {

inline constexpr std::string_view kServerMagic = "EMBS", kClientMagic = "EMBC";
inline constexpr std::uint8_t kStoreProtocol = 1;
enum AuthMode : std::uint8_t { kAuthOpen = 0, kAuthToken = 1 };
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kServerHelloBytes = 4 + 1 + 1 + kNonceBytes;
inline constexpr std::size_t kClientHelloBytes = 4 + kNonceBytes + 32;
/// A token is at least this long: it must not be guessable offline from one observed handshake.
inline constexpr std::size_t kMinTokenBytes = 16, kMaxTokenBytes = 1024;

/// n bytes from the kernel's random number generator (getrandom(2); /dev/urandom where the call is missing).
inline void random_bytes(void* p, std::size_t n) {
  auto* c = static_cast<unsigned char*>(p);
  while (n > 0) {
    const ssize_t r = ::getrandom(c, n, 0);
    if (r > 0) {
      c += r;
      n -= std::size_t(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == ENOSYS) {
      const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
      EMBER_CHECK(fd >= 0, "dist: cannot read /dev/urandom for random bytes");
      while (n > 0) {
        const ssize_t k = ::read(fd, c, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        c += k;
        n -= std::size_t(k);
      }
      ::close(fd);
      EMBER_CHECK(n == 0, "dist: reading /dev/urandom failed");
      return;
    }
    EMBER_CHECK(false, "dist: getrandom failed (errno ", errno, ")");
  }
}

/// A new token: 32 random bytes as 64 hex digits.
inline std::string new_token() {
  unsigned char b[32];
  random_bytes(b, sizeof b);
  static constexpr char hex[] = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) {
    t += hex[c >> 4];
    t += hex[c & 15];
  }
  return t;
}

/// Checks a token's length; the message names `what` (the variable it came from), never the token itself.
inline void check_token(std::string_view token, std::string_view what) {
  EMBER_CHECK(token.size() >= kMinTokenBytes && token.size() <= kMaxTokenBytes, what, " holds ", token.size(),
              " bytes; a token needs ", kMinTokenBytes, " to ", kMaxTokenBytes, " (e.g. 32 random bytes in hex: "
              "`openssl rand -hex 32`)");
}

inline Digest handshake_proof(std::string_view token, std::string_view side, const unsigned char* nonce_s,
                              const unsigned char* nonce_c) {
  std::string msg = "ember-store ";
  msg += side;
  msg += '\0';
  msg.append(reinterpret_cast<const char*>(nonce_s), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(nonce_c), kNonceBytes);
  return hmac_sha256(token, msg);
}
/// What the client sends to prove it knows the token.
inline Digest client_proof(std::string_view token, const unsigned char* nonce_s, const unsigned char* nonce_c) {
  return handshake_proof(token, "client", nonce_s, nonce_c);
}
/// What the server answers to prove it knows the token too.
inline Digest server_proof(std::string_view token, const unsigned char* nonce_s, const unsigned char* nonce_c) {
  return handshake_proof(token, "server", nonce_s, nonce_c);
}

/// A proof for another of ember's protocols, named by `label` ("ring": the tcp backend's connections):
/// HMAC-SHA256(token, "ember-" label " " side 0 nonce_s nonce_c bound), where `bound` is what else the proof vouches
/// for (the sender's rank and group). The label keeps a proof made for one protocol from passing in another, the
/// store's included ("ember-store client" ...), and `side` one side's proof from passing as the other's.
inline Digest labelled_proof(std::string_view token, std::string_view label, std::string_view side,
                             const unsigned char* nonce_s, const unsigned char* nonce_c, std::string_view bound = {}) {
  std::string msg = "ember-";
  msg += label;
  msg += ' ';
  msg += side;
  msg += '\0';
  msg.append(reinterpret_cast<const char*>(nonce_s), kNonceBytes);
  msg.append(reinterpret_cast<const char*>(nonce_c), kNonceBytes);
  msg += bound;
  return hmac_sha256(token, msg);
}

}  // namespace ember::dist::detail
