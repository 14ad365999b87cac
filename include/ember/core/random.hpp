// ember — a seedable counter-based random generator (Philox-4x32-10): the stream is a pure function of
// (seed, offset), so results do not depend on how work is split across threads or devices.
#pragma once

#include <cmath>
#include <cstdint>

#include "ember/config.hpp"

namespace ember {

/// A counter-based random number generator (PyTorch's `torch.Generator`): its state is a seed and an offset, the
/// number of 128-bit blocks drawn so far, so saving and restoring both reproduces the stream exactly.
class Generator {
 public:
  /// A generator at the start of `seed`'s stream.
  explicit Generator(std::uint64_t seed = 0x853c49e6748fea9bULL) : seed_(seed) {}

  /// Restarts the generator at the start of `seed`'s stream (PyTorch's manual_seed).
  void manual_seed(std::uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  /// The seed (PyTorch's initial_seed()).
  std::uint64_t seed() const { return seed_; }
  /// How many 128-bit blocks have been used; with the seed, the whole state (checkpoints save both).
  std::uint64_t offset() const { return offset_; }
  /// Moves to block o of the seed's stream (what loading a checkpoint does).
  void set_offset(std::uint64_t o) { offset_ = o; }

  /// Reserves n blocks of four 32-bit values and returns the first block's counter.
  std::uint64_t reserve(std::uint64_t n) {
    const std::uint64_t c = offset_;
    offset_ += n;
    return c;
  }

  /// The four 32-bit values of block `counter`.
  EMBER_HOST_DEVICE static void block(std::uint64_t seed, std::uint64_t counter, std::uint32_t out[4]) {
    std::uint32_t c0 = std::uint32_t(counter), c1 = std::uint32_t(counter >> 32), c2 = 0, c3 = 0;
    std::uint32_t k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c0, p1 = std::uint64_t(0xCD9E8D57u) * c2;
      const std::uint32_t n0 = std::uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = std::uint32_t(p0 >> 32) ^ c3 ^ k1;
      c1 = std::uint32_t(p1);
      c3 = std::uint32_t(p0);
      c0 = n0;
      c2 = n2;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
  }

  /// Blocks counter0 .. counter0 + n - 1 into out (four values each, as block() writes them), eight counters at a
  /// time in the lanes of 64-bit vectors (GCC/Clang vector extensions, so the code is vector whatever the
  /// optimiser's heuristics: left to itself, GCC vectorises the widening multiplies in some callers and not others).
  static void blocks(std::uint64_t seed, std::uint64_t counter0, std::uint64_t n, std::uint32_t* out) {
    std::uint64_t i = 0;
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__CUDACC__)
    typedef std::uint64_t V __attribute__((vector_size(64)));
    constexpr int W = 8;
    const V lo32 = V{} + 0xFFFFFFFFull;
    for (; i + W <= n; i += W) {
      V c0, c1, c2 = V{}, c3 = V{};
      for (int l = 0; l < W; ++l) {
        const std::uint64_t c = counter0 + i + std::uint64_t(l);
        c0[l] = c & 0xFFFFFFFFull;
        c1[l] = c >> 32;
      }
      std::uint64_t k0 = std::uint32_t(seed), k1 = std::uint32_t(seed >> 32);
      for (int r = 0; r < 10; ++r) {
        const V p0 = c0 * 0xD2511F53ull, p1 = c2 * 0xCD9E8D57ull;
        const V n0 = ((p1 >> 32) ^ c1 ^ k0) & lo32, n2 = ((p0 >> 32) ^ c3 ^ k1) & lo32;
        c1 = p1 & lo32;
        c3 = p0 & lo32;
        c0 = n0;
        c2 = n2;
        k0 = std::uint32_t(k0 + 0x9E3779B9u);
        k1 = std::uint32_t(k1 + 0xBB67AE85u);
      }
      for (int l = 0; l < W; ++l) {
        std::uint32_t* o = out + (i + std::uint64_t(l)) * 4;
        o[0] = std::uint32_t(c0[l]);
        o[1] = std::uint32_t(c1[l]);
        o[2] = std::uint32_t(c2[l]);
        o[3] = std::uint32_t(c3[l]);
      }
    }
#endif
    for (; i < n; ++i) block(seed, counter0 + i, out + i * 4);
  }

  /// Uniform float in [0, 1) from 24 random bits.
  EMBER_HOST_DEVICE static float to_unit_float(std::uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }
  /// Uniform double in [0, 1) from 53 random bits.
  EMBER_HOST_DEVICE static double to_unit_double(std::uint32_t a, std::uint32_t b) {
    return double((std::uint64_t(a) << 21) ^ (b >> 11)) * (1.0 / 9007199254740992.0);
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_ = 0;
};

/// The process-wide default generator (what torch.manual_seed sets).
inline Generator& default_generator() {
  static Generator g;
  return g;
}
inline void manual_seed(std::uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace ember
