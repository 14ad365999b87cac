// ember — DataLoader: batches from a Dataset, loaded, transformed and collated by worker threads ahead of the
// consumer, like torch.utils.data.DataLoader (threads instead of processes: no pickling, shared memory for free).
//
//   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .num_workers = 2}, transform);
//   for (int epoch = 0; epoch < n; ++epoch) {
//     loader.set_epoch(epoch);                 // a new (reproducible) order and new augmentations
//     for (auto& batch : loader) { ... batch.data /* (B, 1, 28, 28) */ ... batch.target /* (B) */ }
//     loader.stats().wait_fraction();          // the share of the epoch the consumer waited for data
//   }
//
// Guarantees: the batches, their order and their contents depend only on (dataset, options.seed, epoch, sampler),
// never on num_workers or thread timing; at most num_workers * prefetch_factor batches are in flight; leaving a
// loop early (break, exception) stops and joins the workers; an exception thrown while loading or transforming a
// sample reaches the consumer as an ember::Error naming the sample index, at the batch where it happened.
//
// Its options are in data/loader_options.hpp, its statistics in data/loader_stats.hpp and the epoch's machinery that
// does not depend on the loader's types (workers, hand-over, errors) in data/detail/epoch_core.hpp; this includes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/cuda/device.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/detail/epoch_core.hpp"
#include "ember/data/loader_options.hpp"
#include "ember/data/loader_stages.hpp"
#include "ember/data/loader_stats.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/sampler.hpp"

namespace ember::data {

/// The transform of a loader that has none.
struct NoTransform {};

/// The default sampler: sequential, or a per-epoch permutation when options.shuffle is set.
struct DefaultSampler {
  bool shuffle = false;    ///< a permutation per epoch (RandomSampler) instead of 0, 1, ..., n-1
  std::uint64_t seed = 0;  ///< the permutations' seed (with epoch, it decides each epoch's order)
  /// The order of epoch `epoch` over a dataset of n samples.
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t epoch) const {
    return shuffle ? RandomSampler{seed}.indices(n, epoch) : SequentialSampler{}.indices(n, epoch);
  }
  /// The samples per epoch: all n.
  std::size_t size(std::size_t n) const { return n; }
};

namespace detail {

/// Applies a transform to one sample: transform(sample, rng) when it takes whole samples, else, for Examples,
/// transform(sample.data, rng).
template <class Tr, class S>
S apply_transform(const Tr& t, S&& s, Rng& g) {
  using Sample = std::remove_cvref_t<S>;
  if constexpr (std::is_same_v<Tr, NoTransform>) {
    return std::forward<S>(s);
  } else if constexpr (std::is_invocable_r_v<Sample, const Tr&, Sample, Rng&>) {
    return t(std::forward<S>(s), g);
  } else {
    static_assert(std::is_same_v<Sample, Example> && std::is_invocable_r_v<Tensor<float>, const Tr&, Tensor<float>, Rng&>,
                  "DataLoader: a transform must be callable as t(sample, Rng&) -> sample, or, for Examples, as "
                  "t(Tensor<float>, Rng&) -> Tensor<float>");
    Sample out = std::forward<S>(s);
    out.data = t(std::move(out.data), g);  // moved: a Compose may then transform it in place
    return out;
  }
}

/// Copies a batch's tensors into pinned host memory (DataLoaderOptions::pin_memory); other batch types stay as they
/// are.
template <class T>
void pin_batch(Tensor<T>& t) {
  if (!t.defined() || !t.device().is_cpu() || t.is_pinned()) return;
  Tensor<T> p = ember::detail::empty_pinned<T>(t.shape());
  ember::detail::gather_host(t, p.data());
  t = p;
}
inline void pin_batch(Batch& b) {
  pin_batch(b.data);
  pin_batch(b.target);
}
template <class B>
void pin_batch(B&) {}

/// Whether pin_memory can take effect: the pinned allocator is compiled in and a CUDA device is present.
inline bool can_pin_memory() {
  return ember::detail::part<ember::detail::PinnedAllocatorPart>() != nullptr && cuda::is_available();
}

}  // namespace detail

/// Batches of a dataset, as torch.utils.data.DataLoader: iterate it (`for (auto& batch : loader)`) once per
/// epoch. The samples are loaded, transformed (`Transform`, per sample, with its own random stream) and collated
/// into batches by `num_workers` threads ahead of the consumer, in the order the sampler `S` gives (sequential or
/// shuffled by default); the batches are the same whatever the number of workers, since each depends only on
/// (seed, epoch, position).
template <Dataset D, class Transform = NoTransform, Sampler S = DefaultSampler>
class DataLoader {
 public:
  using dataset_type = D;             ///< The dataset's type.
  using sample_type = sample_t<D>;    ///< What the dataset's get(i) returns (an Example for most datasets).
  /// What collate(samples, indices) returns for this sample type: a Batch for Examples.
  using batch_type = std::remove_cvref_t<decltype(collate(std::declval<const std::vector<sample_type>&>(),
                                                           std::declval<const std::vector<std::size_t>&>()))>;

  /// Sequential or shuffled (options.shuffle) batches, no transform. (A template so that an explicit instantiation
  /// of the class skips it for a transform without a default constructor: clang 14 ignores the constraint there.)
  template <class Tr = Transform>
    requires(std::is_same_v<S, DefaultSampler> && std::is_default_constructible_v<Tr>)
  DataLoader(D dataset, DataLoaderOptions opt = {})
      : DataLoader(std::move(dataset), opt, Tr{}, DefaultSampler{opt.shuffle, opt.seed}) {}
  /// With a transform run in the workers.
  DataLoader(D dataset, DataLoaderOptions opt, Transform transform) requires std::is_same_v<S, DefaultSampler>
      : DataLoader(std::move(dataset), opt, std::move(transform), DefaultSampler{opt.shuffle, opt.seed}) {}
  /// With a transform and a sampler (options.shuffle must then be false: the sampler decides the order).
  DataLoader(D dataset, DataLoaderOptions opt, Transform transform, S sampler);

  /// Batches per epoch.
  std::size_t size() const {
    const std::size_t n = parts_->sampler.size(parts_->dataset.size()), b = opt_.batch_size;
    return opt_.drop_last ? n / b : (n + b - 1) / b;
  }
  /// Sets the epoch the next iteration draws its order and augmentations from (as DistributedSampler.set_epoch).
  void set_epoch(std::uint64_t e) { epoch_ = e; }
  /// The epoch the next iteration uses (set_epoch's value; 0 at first).
  std::uint64_t epoch() const { return epoch_; }
  /// The next iteration starts at batch `k` of the epoch instead of 0 (resuming a run mid-epoch): the batches after
  /// it are the ones a full iteration would give, since each depends only on (seed, epoch, position). Applies to
  /// one iteration.
  void skip_batches(std::size_t k) { skip_ = k; }
  /// Statistics of the current (or last) epoch's iteration.
  LoaderStats stats() const { return *stats_; }
  /// The dataset the loader reads (PyTorch's loader.dataset).
  const D& dataset() const { return parts_->dataset; }
  /// The options the loader was made with.
  const DataLoaderOptions& options() const { return opt_; }
  /// The sampler that orders each epoch (PyTorch's loader.sampler).
  const S& sampler() const { return parts_->sampler; }

 private:
  // The dataset, transform and sampler, shared with the running epochs (and with copies of the loader: all three
  // are only used through const access).
  struct Parts {
    D dataset;
    Transform transform;
    S sampler;
  };

 public:
  class Run;
  struct Sentinel {};  ///< What end() returns: an Iterator equals it once the epoch's batches are exhausted.

  /// An input iterator over one epoch's batches. Destroying it (the end of a range-for, a break, an exception)
  /// stops and joins the workers. The epoch holds what it uses (dataset, transform, sampler, options), so an iterator
  /// stays valid after its loader is destroyed or moved, and runs the epoch to its end.
  class Iterator {
   public:
    using value_type = batch_type;           ///< A batch.
    using difference_type = std::ptrdiff_t;  ///< (Required of an iterator; iterators are not subtracted.)
    /// The current batch; it stays valid until the iterator advances (move from it to keep it longer).
    batch_type& operator*() const { return *run_->current; }
    /// The current batch's members.
    batch_type* operator->() const { return &*run_->current; }
    /// Moves to the next batch, waiting for the workers when it is not ready yet.
    Iterator& operator++() {
      run_->advance();
      return *this;
    }
    /// Advances as ++it does (and returns nothing: this is an input iterator).
    void operator++(int) { ++*this; }
    /// Whether the epoch is over.
    friend bool operator==(const Iterator& it, Sentinel) { return !it.run_ || !it.run_->current; }

   private:
    friend class DataLoader;
    explicit Iterator(std::shared_ptr<Run> r) : run_(std::move(r)) {}
    std::shared_ptr<Run> run_;
  };

  /// Starts an epoch: draws the sampler's order for the current epoch and starts the workers.
  Iterator begin();
  /// The end of an epoch, for range-for.
  Sentinel end() const { return {}; }

  /// One epoch's iteration: the batches, produced by detail::EpochCore's workers (or by the consumer itself).
  class Run {
   public:
    /// Starts the epoch of `l` (its current epoch, order and skip_batches), with l's workers.
    explicit Run(const DataLoader& l);
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;
    ~Run() { core_.shutdown(); }  // before the batches and the dataset the workers write and read

    /// Moves to the next batch (or to the end), waiting for it when it is not ready.
    void advance() {
      current.reset();
      if (const std::optional<std::size_t> b = core_.next()) {
        current = std::move(out_[*b]);
        out_[*b].reset();
      }
    }

    std::optional<batch_type> current;  ///< The batch the iterator points at; empty at the end of the epoch.

   private:
    static std::string produce_erased(void* self, std::size_t b) { return static_cast<Run*>(self)->produce(b); }
    // Loads, transforms and collates batch b into out_[b]. Sample k of the epoch gets the stream
    // Rng(seed, epoch, k).
    std::string produce(std::size_t b);

    // What the workers use, owned by the epoch: an iterator may outlive (or see a move of) its loader, and the
    // epoch then runs to its end on what it started with.
    std::shared_ptr<const Parts> parts_;
    std::uint64_t epoch_;
    std::vector<std::optional<batch_type>> out_;  // batch b, from when it is produced until it is handed out
    detail::EpochCore core_;
  };

 private:
  std::shared_ptr<const Parts> parts_;
  DataLoaderOptions opt_;
  std::uint64_t epoch_ = 0;
  std::size_t skip_ = 0;
  std::shared_ptr<LoaderStats> stats_;
};

// The loader's larger members, defined here rather than in the class so that they are not inline: with
// ember::precompiled, which holds the loaders of the built-in dataset, a TU then calls the library's copies.

template <Dataset D, class Transform, Sampler S>
EMBER_COLD DataLoader<D, Transform, S>::Run::Run(const DataLoader& l)
    : parts_(l.parts_), epoch_(l.epoch_), core_(l.opt_, l.stats_) {
  const std::size_t first = std::min(l.skip_, l.size());
  core_.plan(parts_->sampler.indices(parts_->dataset.size(), epoch_), parts_->dataset.size(), first,
             l.size() - first);
  out_.resize(core_.size());
  core_.start(&Run::produce_erased, this);
}

template <Dataset D, class Transform, Sampler S>
std::string DataLoader<D, Transform, S>::Run::produce(std::size_t b) {
  const auto& plan = core_.batch(b);
  const DataLoaderOptions& opt = core_.options();
  std::size_t at = 0;
  detail::StageAccount& account = detail::stage_account();
  account = {};
  try {
    std::vector<sample_type> samples;
    samples.reserve(plan.indices.size());
    for (; at < plan.indices.size(); ++at) {
      Rng g(opt.seed, epoch_, plan.first + at);
      sample_type s =
          detail::timed_phase(Stage::read, [&]() -> sample_type { return parts_->dataset.get(plan.indices[at]); });
      samples.push_back(detail::timed_phase(Stage::augment, [&]() -> sample_type {
        return detail::apply_transform(parts_->transform, std::move(s), g);
      }));
    }
    detail::timed_phase(Stage::collate, [&] { out_[b].emplace(collate(samples, plan.indices)); });
    if (opt.pin_memory && detail::can_pin_memory()) detail::pin_batch(*out_[b]);
    core_.set_times(b, account.times);
  } catch (const std::exception& e) {
    return detail::batch_error(plan.indices, at, b, e.what());
  } catch (...) {
    return detail::batch_error(plan.indices, at, b, nullptr);
  }
  return {};
}

template <Dataset D, class Transform, Sampler S>
EMBER_COLD DataLoader<D, Transform, S>::DataLoader(D dataset, DataLoaderOptions opt, Transform transform, S sampler)
    : parts_(std::make_shared<const Parts>(Parts{std::move(dataset), std::move(transform), std::move(sampler)})),
      opt_(opt), stats_(std::make_shared<LoaderStats>()) {
  EMBER_CHECK(opt.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", opt.batch_size);
  EMBER_CHECK(opt.num_workers >= 0, "DataLoader: num_workers must be non-negative, got ", opt.num_workers);
  EMBER_CHECK(opt.prefetch_factor >= 1, "DataLoader: prefetch_factor must be at least 1, got ",
              opt.prefetch_factor);
  if constexpr (!std::is_same_v<S, DefaultSampler>)
    EMBER_CHECK(!opt.shuffle, "DataLoader: shuffle = true together with a sampler; the sampler decides the order "
                              "(use RandomSampler, or DistributedSampler with shuffle), so leave shuffle false");
}

template <Dataset D, class Transform, Sampler S>
auto DataLoader<D, Transform, S>::begin() -> Iterator {
  auto run = std::make_shared<Run>(*this);
  skip_ = 0;
  run->advance();
  return Iterator(std::move(run));
}

template <Dataset D>
DataLoader(D, DataLoaderOptions) -> DataLoader<D>;
template <Dataset D>
DataLoader(D) -> DataLoader<D>;
template <Dataset D, class Tr>
DataLoader(D, DataLoaderOptions, Tr) -> DataLoader<D, Tr>;
template <Dataset D, class Tr, Sampler S>
DataLoader(D, DataLoaderOptions, Tr, S) -> DataLoader<D, Tr, S>;

}  // namespace ember::data
