// ember — the random stream of the data pipeline: a Philox counter stream keyed by (seed, epoch, position), so a
// sample's augmentation and an epoch's shuffle depend on those alone, never on which worker ran them or when.
#pragma once

#include <cstdint>

#include "ember/config.hpp"
#include "ember/core/random.hpp"

namespace ember::data {

namespace detail {
/// SplitMix64's finaliser: a bijective mix of 64 bits, used to derive stream keys.
constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace detail

/// A stream of random numbers for one sample (or one epoch's shuffle). Cheap to create: a key and a counter.
class Rng {
 public:
  /// The stream for (seed, a, b): e.g. (loader seed, epoch, position of the sample in the epoch).
  explicit Rng(std::uint64_t seed, std::uint64_t a = 0, std::uint64_t b = 0)
      : key_(detail::mix64(detail::mix64(detail::mix64(seed) ^ a) ^ (b + 0x632BE59BD9B4E019ULL))) {}

  /// 32 uniformly random bits.
  std::uint32_t next_u32() {
    if (pos_ == 4) {
      Generator::block(key_, counter_++, buf_);
      pos_ = 0;
    }
    return buf_[pos_++];
  }
  /// The next 64 random bits (two 32-bit draws, the first in the high half).
  std::uint64_t next_u64() {
    const std::uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  /// Uniform in [0, 1).
  float uniform() { return Generator::to_unit_float(next_u32()); }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  /// Uniform integer in [0, n) without modulo bias (n > 0).
  std::uint64_t below(std::uint64_t n) {
    EMBER_CHECK(n > 0, "Rng::below: the range must be non-empty");
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % n);  // multiple of n
    std::uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % n;
  }
  /// True with probability p.
  bool bernoulli(float p) { return uniform() < p; }

 private:
  std::uint64_t key_;
  std::uint64_t counter_ = 0;
  std::uint32_t buf_[4] = {};
  int pos_ = 4;
};

}  // namespace ember::data
