// ember — SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous store's challenge-response
// authentication, and a comparison of digests whose time does not depend on where they differ. Small and portable,
// not fast: the store hashes a few dozen bytes per connection.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ember::dist::detail {

using Digest = std::array<unsigned char, 32>;

/// SHA-256, fed in pieces: `Sha256 h; h.update(a); h.update(b); Digest d = h.finish();`.
class Sha256 {
 public:
  Sha256() = default;
  void update(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    while (n > 0) {
      const std::size_t k = std::min(n, sizeof block_ - fill_);
      std::memcpy(block_ + fill_, p, k);
      fill_ += k;
      p += k;
      n -= k;
      if (fill_ == sizeof block_) {
        compress(block_);
        fill_ = 0;
      }
    }
  }
  void update(std::string_view s) { update(s.data(), s.size()); }
  /// The digest; the object is spent afterwards.
  Digest finish() {
    const std::uint64_t bits = total_ * 8;
    const unsigned char pad = 0x80;
    update(&pad, 1);
    const unsigned char zero = 0;
    while (fill_ != 56) update(&zero, 1);
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(bits >> (56 - 8 * i));
    update(len, 8);
    Digest d;
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) d[std::size_t(4 * i + j)] = static_cast<unsigned char>(h_[i] >> (24 - 8 * j));
    return d;
  }

 private:
  static std::uint32_t rotr(std::uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void compress(const unsigned char* b) {
    static constexpr std::uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = std::uint32_t(b[4 * i]) << 24 | std::uint32_t(b[4 * i + 1]) << 16 | std::uint32_t(b[4 * i + 2]) << 8 |
             std::uint32_t(b[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = bb;
      bb = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += bb;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  unsigned char block_[64] = {};
  std::size_t fill_ = 0;
  std::uint64_t total_ = 0;
};

inline Digest sha256(std::string_view s) {
  Sha256 h;
  h.update(s);
  return h.finish();
}

/// HMAC-SHA256 of `message` under `key` (RFC 2104; keys longer than the 64-byte block are hashed first).
inline Digest hmac_sha256(std::string_view key, std::string_view message) {
  unsigned char k[64] = {};
  if (key.size() > sizeof k) {
    const Digest d = sha256(key);
    std::memcpy(k, d.data(), d.size());
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  unsigned char ipad[64], opad[64];
  for (int i = 0; i < 64; ++i) {
    ipad[i] = static_cast<unsigned char>(k[i] ^ 0x36);
    opad[i] = static_cast<unsigned char>(k[i] ^ 0x5c);
  }
  Sha256 inner;
  inner.update(ipad, sizeof ipad);
  inner.update(message);
  const Digest ih = inner.finish();
  Sha256 outer;
  outer.update(opad, sizeof opad);
  outer.update(ih.data(), ih.size());
  return outer.finish();
}

/// Whether the n bytes at a and b are equal, in a time that depends on n only (every byte is read; no early exit),
/// so that a peer timing the answers learns nothing of where its guess of a digest went wrong.
inline bool equal_constant_time(const void* a, const void* b, std::size_t n) {
  const volatile unsigned char* x = static_cast<const volatile unsigned char*>(a);
  const volatile unsigned char* y = static_cast<const volatile unsigned char*>(b);
  unsigned char diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff = static_cast<unsigned char>(diff | (x[i] ^ y[i]));
  return diff == 0;
}

}  // namespace ember::dist::detail
