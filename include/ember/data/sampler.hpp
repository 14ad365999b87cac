// ember — samplers: the order in which an epoch visits a dataset's indices. Sequential, random (seeded, a new
// permutation per epoch), distributed (each rank a disjoint shard of equal size, reshuffled per epoch) and the
// quasi-random order of packed shards (ShardShuffleSampler), with a measure of how well an order mixes labels.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/rng.hpp"

namespace ember::data {

/// A sampler: `indices(n, epoch)` is the list of dataset indices (each < n) one epoch visits, in order, and
/// `size(n)` its length. The same (n, epoch) always gives the same list.
template <class S>
concept Sampler = requires(const S& s, std::size_t n, std::uint64_t epoch) {
  { s.indices(n, epoch) } -> std::same_as<std::vector<std::size_t>>;
  { s.size(n) } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// A permutation of 0..n-1 (Fisher–Yates), a pure function of (seed, epoch).
EMBER_HEADER_INLINE std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), std::size_t(0));
  Rng g(seed, epoch, 0x5A3B1E);
  for (std::size_t i = n; i > 1; --i) std::swap(p[i - 1], p[g.below(i)]);
  return p;
}
#endif
}  // namespace detail

/// 0, 1, ..., n-1 every epoch.
struct SequentialSampler {
  /// 0, 1, ..., n-1 (whatever the epoch).
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t /*epoch*/ = 0) const {
    std::vector<std::size_t> v(n);
    std::iota(v.begin(), v.end(), std::size_t(0));
    return v;
  }
  /// The samples per epoch: all n.
  std::size_t size(std::size_t n) const { return n; }
};

/// A permutation of 0..n-1 drawn from (seed, epoch): a new order each epoch, the same order for the same epoch.
struct RandomSampler {
  std::uint64_t seed = 0;  ///< With the epoch, it decides the permutation.
  /// The permutation of epoch `epoch`.
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t epoch = 0) const {
    return detail::permutation(n, seed, epoch);
  }
  /// The samples per epoch: all n.
  std::size_t size(std::size_t n) const { return n; }
};

/// Options of DistributedSampler.
struct DistributedSamplerOptions {
  bool shuffle = true;       ///< permute the dataset each epoch (the same permutation on every rank)
  std::uint64_t seed = 0;    ///< must be equal on every rank
  bool drop_last = false;    ///< drop the tail so the shards divide evenly; else pad by repeating indices
};

/// The shard of one rank, as torch.utils.data.DistributedSampler draws it: every rank computes the same
/// permutation of (seed, epoch), pads it to a multiple of world_size by repeating its start (or, with drop_last,
/// cuts it), and rank r takes positions r, r + world_size, ... So shards are disjoint (up to the padding) and
/// equally long, which keeps the ranks' collective calls in step. Call set_epoch (or DataLoader::set_epoch) every
/// epoch for a new order.
class DistributedSampler {
 public:
  /// The shard of rank `rank` (0 <= rank < world_size), as DistributedSampler(dataset, num_replicas, rank, ...).
  DistributedSampler(int rank, int world_size, DistributedSamplerOptions opt = {})
      : rank_(rank), world_(world_size), opt_(opt) {
    EMBER_CHECK(world_size >= 1, "DistributedSampler: world_size must be at least 1, got ", world_size);
    EMBER_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
                " is out of range for world_size ", world_size, " (expected 0 <= rank < world_size)");
  }

  /// Samples per rank for a dataset of n.
  std::size_t size(std::size_t n) const {
    const std::size_t w = std::size_t(world_);
    return opt_.drop_last ? n / w : (n + w - 1) / w;
  }
  /// This rank's indices for the given epoch.
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t epoch) const {
    std::vector<std::size_t> all =
        opt_.shuffle ? detail::permutation(n, opt_.seed, epoch) : SequentialSampler{}.indices(n);
    const std::size_t per = size(n), total = per * std::size_t(world_);
    if (total > n && n > 0) {
      for (std::size_t i = n; i < total; ++i) all.push_back(all[(i - n) % n]);  // pad by repeating the start
    }
    all.resize(total);
    std::vector<std::size_t> mine;
    mine.reserve(per);
    for (std::size_t i = std::size_t(rank_); i < total; i += std::size_t(world_)) mine.push_back(all[i]);
    return mine;
  }
  /// Indices for the epoch last passed to set_epoch.
  std::vector<std::size_t> indices(std::size_t n) const { return indices(n, epoch_); }
  /// Sets the epoch the order is drawn for (PyTorch's set_epoch).
  void set_epoch(std::uint64_t e) { epoch_ = e; }
  /// The epoch last set (0 at first).
  std::uint64_t epoch() const { return epoch_; }
  /// This sampler's rank.
  int rank() const { return rank_; }
  /// The number of ranks sharing the dataset.
  int world_size() const { return world_; }

 private:
  int rank_, world_;
  DistributedSamplerOptions opt_;
  std::uint64_t epoch_ = 0;
};

/// A quasi-random order for packed shards (ImageRecordDataset, WebDataset; FFCV's QUASI_RANDOM, WebDataset's shard
/// shuffle + buffer): the records are cut into blocks of `block` consecutive records, the blocks are shuffled, and
/// each group of `window` consecutive blocks is pooled and shuffled. A loader then reads `window` regions of the
/// shards at a time, each sequentially, instead of one random record per read; the price is that a batch draws from
/// window * block records rather than from the whole set. On a pack written in class order (pack_images without
/// shuffle) a batch then repeats labels about 1 + classes / window times as often as a full shuffle
/// (label_repeat_rate; 1.2 for 20 classes and the defaults); on a pack shuffled when written, about as rarely as a
/// full shuffle. Every record once per epoch; (seed, epoch) decide the order.
struct ShardShuffleSampler {
  std::uint64_t seed = 0;   ///< with the epoch, it decides the order
  std::size_t block = 32;   ///< records read in a row (32 images of ~60 KB: 2 MB)
  std::size_t window = 64;  ///< blocks pooled and shuffled together

  /// The order of epoch `epoch` over n records.
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t epoch) const {
    EMBER_CHECK(block >= 1 && window >= 1, "ShardShuffleSampler: block and window must be at least 1");
    const std::size_t nb = (n + block - 1) / block;
    const std::vector<std::size_t> blocks = detail::permutation(nb, seed, epoch);
    std::vector<std::size_t> out;
    out.reserve(n);
    Rng g(seed, epoch, 0x51A8D);
    for (std::size_t w0 = 0; w0 < nb; w0 += window) {
      const std::size_t first = out.size();
      for (std::size_t k = w0; k < std::min(nb, w0 + window); ++k)
        for (std::size_t i = blocks[k] * block; i < std::min(n, (blocks[k] + 1) * block); ++i) out.push_back(i);
      for (std::size_t i = out.size() - first; i > 1; --i)
        std::swap(out[first + i - 1], out[first + std::size_t(g.below(i))]);
    }
    return out;
  }
  /// The samples per epoch: all n.
  std::size_t size(std::size_t n) const { return n; }
};

/// Shuffle quality: how often two samples of one batch share a label, relative to a uniform shuffle (1: as good as
/// a full shuffle; the number of classes: every batch of one class). labels[i] is the label of dataset index i.
inline double label_repeat_rate(const std::vector<std::int64_t>& labels, const std::vector<std::size_t>& order,
                                std::size_t batch) {
  EMBER_CHECK(batch >= 2, "label_repeat_rate: batches of at least 2");
  std::vector<double> freq;
  for (std::int64_t l : labels) {
    if (std::size_t(l) >= freq.size()) freq.resize(std::size_t(l) + 1);
    freq[std::size_t(l)] += 1;
  }
  double expected = 0;
  const double n = double(labels.size());
  for (double f : freq) expected += (f / n) * ((f - 1) / (n - 1));
  double pairs = 0, same = 0;
  std::vector<double> count(freq.size());
  for (std::size_t b0 = 0; b0 + batch <= order.size(); b0 += batch) {
    std::fill(count.begin(), count.end(), 0.0);
    for (std::size_t i = b0; i < b0 + batch; ++i) count[std::size_t(labels[order[i]])] += 1;
    for (double c : count) same += c * (c - 1) / 2;
    pairs += double(batch) * double(batch - 1) / 2;
  }
  return pairs > 0 && expected > 0 ? (same / pairs) / expected : 0.0;
}

}  // namespace ember::data
