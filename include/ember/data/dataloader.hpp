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
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/core/hint.hpp"
#include "ember/cuda/device.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/loader_stages.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/sampler.hpp"
#include "ember/profile/range.hpp"

namespace ember::data {

/// DataLoader settings, named as in torch.utils.data.DataLoader and with its defaults (not in its order; seed plays
/// its generator's part):
///   data::DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .num_workers = 2}, transform);
struct DataLoaderOptions {
  /// The samples per batch, >= 1 (PyTorch's batch_size=None, no batching, is not supported).
  std::size_t batch_size = 1;
  bool shuffle = false;       ///< a new permutation each epoch (from seed and epoch); ignored with a custom sampler
  bool drop_last = false;     ///< drop the last batch when it is smaller than batch_size
  int num_workers = 0;        ///< 0: load in the consumer's thread; n: n worker threads
  int prefetch_factor = 2;    ///< batches each worker may have ready ahead of the consumer
  /// Batches in page-locked host memory, so `batch.data.to(Device::cuda(), true)` is asynchronous: the workers copy
  /// each collated batch's tensors (a Batch's data and target, or a batch that is a tensor) into memory from the
  /// pinned allocator (cuda/pinned.hpp). Needs ember's CUDA backend and a CUDA device; without them the flag does
  /// nothing (batches stay in ordinary host memory), as in PyTorch, and never fails.
  bool pin_memory = false;
  std::uint64_t seed = 0;     ///< seeds the shuffle and every sample's augmentation stream
};

/// What one epoch's iteration cost the consumer: time waiting for batches vs. total time (the "accelerator idle
/// because of data" figure is wait_fraction()), and what the loading itself spent its time on, stage by stage.
struct LoaderStats {
  double wait_seconds = 0;   ///< time the consumer spent blocked on the loader (all of the loading when num_workers = 0)
  double total_seconds = 0;  ///< time from the start of the epoch's iteration to the last batch handed out
  std::size_t batches = 0;  ///< batches handed out so far this epoch
  std::size_t samples = 0;  ///< samples in those batches
  /// Loading time per stage (read: the dataset's get(); decode; augment: the transform; collate), summed over the
  /// threads that loaded the batches handed out so far: CPU seconds, which with n workers can reach n times the
  /// epoch's wall time.
  StageTimes stages;
  /// wait_seconds / total_seconds: the fraction of the epoch the consumer was blocked on data (0 before any time).
  double wait_fraction() const { return total_seconds > 0 ? wait_seconds / total_seconds : 0.0; }
  /// samples / total_seconds: the loader's throughput as the consumer saw it (0 before any time).
  double samples_per_second() const { return total_seconds > 0 ? double(samples) / total_seconds : 0.0; }
};

/// What to change when an epoch's statistics say the consumer (the model) waited for data a quarter of the epoch or
/// more (epochs of at least 2 s); empty otherwise. Names the stage that took most of the loading time when the
/// statistics have stage times. DataLoader prints it once per process as a hint (core/hint.hpp).
EMBER_HEADER_INLINE std::string input_bound_hint(const LoaderStats& s, int num_workers);
#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE std::string input_bound_hint(const LoaderStats& s, int num_workers) {
  if (s.total_seconds < 2.0 || s.wait_fraction() < 0.25) return {};
  const std::string pct = std::to_string(int(s.wait_fraction() * 100 + 0.5)) + "%";
  std::string h;
  if (num_workers == 0)
    h = "DataLoader: the model waited for data " + pct + " of the epoch, loading in its own thread "
        "(num_workers = 0); set num_workers (2 or more) so that worker threads prepare the next batches";
  else
    h = "DataLoader: the model waited for data " + pct + " of the epoch with " + std::to_string(num_workers) +
        " workers; more workers, packed record files (data::RecordWriter) or cheaper transforms would feed it";
  const double total = s.stages.total();
  if (total > 0) {
    const Stage big = s.stages.largest();
    const char* fix = big == Stage::read     ? "packed shards read sequentially (data::ImageRecordDataset)"
                      : big == Stage::decode ? "a smaller decode (ImagePipeline's reduced_decode, images packed at a "
                                               "smaller size with ember_pack_images --max-side)"
                      : big == Stage::augment ? "cheaper transforms (a smaller output size, fewer colour changes)"
                                              : "collating into the batch directly (ImagePipeline)";
    h += "; loading time is mostly " + std::string(stage_name(big)) + " (" +
         std::to_string(int(100 * s.stages[big] / total + 0.5)) + "%): try " + fix;
  }
  return h;
}
#endif

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
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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
inline bool can_pin_memory() { return ember::detail::pinned_allocator != nullptr && cuda::is_available(); }

/// The message of a batch that failed: sample `at` of `indices` (or the collation, when at is past the end).
EMBER_HEADER_INLINE std::string batch_error(const std::vector<std::size_t>& indices, std::size_t at, std::size_t b,
                                            const char* what);

/// What one epoch's iteration does whatever the dataset, transform and sampler (compiled once, not per loader
/// type): the batches' plans, the worker threads that claim batches and have them produced at most `window`
/// ahead of the consumer, the hand-over in order, the statistics and the errors. The typed DataLoader::Run owns
/// the batches themselves; `produce(ctx, b)` loads batch b into Run's storage and returns "" or an error message.
/// Each worker claims the next batch nobody has started (rather than a fixed share), so a worker that loses its
/// core for a while falls behind without holding the others back; the contents do not depend on who loads a batch.
class EpochCore {
 public:
  using Produce = std::string (*)(void* ctx, std::size_t b);
  struct BatchPlan {
    std::size_t first = 0;             // position of its first sample in the epoch's order
    std::vector<std::size_t> indices;  // dataset indices
    std::string error;                 // guarded by mu_ while workers run
    bool ready = false;                // guarded by mu_: produced (or failed)
    StageTimes times;                  // written by its producer before `ready`
  };

  /// Starts the clock and clears `stats` (drawing the order counts as waiting).
  EMBER_HEADER_INLINE EpochCore(const DataLoaderOptions& opt, std::shared_ptr<LoaderStats> stats);
  EpochCore(const EpochCore&) = delete;
  EpochCore& operator=(const EpochCore&) = delete;
  ~EpochCore() { shutdown(); }

  /// Splits the epoch's `order` (checked against the dataset's size) into batches, from batch `first` on.
  EMBER_HEADER_INLINE void plan(const std::vector<std::size_t>& order, std::size_t dataset_size, std::size_t first,
                                std::size_t num_batches);
  /// Starts the workers (none with num_workers = 0: the consumer then produces each batch itself).
  EMBER_HEADER_INLINE void start(Produce produce, void* ctx);
  /// The next batch, produced and ready to be moved out of the owner's storage; nullopt at the end of the epoch.
  /// Throws the batch's error (and then ends the epoch).
  EMBER_HEADER_INLINE std::optional<std::size_t> next();
  /// Stops and joins the workers.
  EMBER_HEADER_INLINE void shutdown();
  std::size_t size() const { return batches_.size(); }
  const BatchPlan& batch(std::size_t b) const { return batches_[b]; }
  /// The producer of batch b records what loading it took (before it is handed over).
  void set_times(std::size_t b, const StageTimes& t) { batches_[b].times = t; }
  const DataLoaderOptions& options() const { return opt_; }

 private:
  EMBER_HEADER_INLINE void work();
  EMBER_HEADER_INLINE std::string take(std::size_t b);

  DataLoaderOptions opt_;
  std::shared_ptr<LoaderStats> stats_;
  Clock::time_point t0_;
  std::vector<BatchPlan> batches_;
  Produce produce_ = nullptr;
  void* ctx_ = nullptr;
  std::size_t next_ = 0;      // consumer: next batch to hand out
  std::size_t consumed_ = 0;  // guarded by mu_: batches taken by the consumer
  static constexpr std::size_t kNone = std::size_t(-1);
  std::size_t waiting_for_ = kNone;  // guarded by mu_: the batch the consumer is blocked on
  std::size_t next_claim_ = 0;       // guarded by mu_: the first batch no worker has claimed
  std::size_t window_ = 0;
  bool failed_ = false;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::vector<std::thread> workers_;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE std::string batch_error(const std::vector<std::size_t>& indices, std::size_t at, std::size_t b,
                                            const char* what) {
  if (!what)
    return ember::detail::concat("DataLoader: loading sample ", at < indices.size() ? indices[at] : std::size_t(0),
                                 " (batch ", b, ") failed with an exception that is not a std::exception");
  return at < indices.size()
             ? ember::detail::concat("DataLoader: loading sample ", indices[at], " (batch ", b, ") failed: ", what)
             : ember::detail::concat("DataLoader: collating batch ", b, " failed: ", what);
}

EMBER_HEADER_INLINE EpochCore::EpochCore(const DataLoaderOptions& opt, std::shared_ptr<LoaderStats> stats)
    : opt_(opt), stats_(std::move(stats)), t0_(Clock::now()) {
  *stats_ = LoaderStats{};
}

EMBER_HEADER_INLINE void EpochCore::plan(const std::vector<std::size_t>& order, std::size_t dataset_size,
                                         std::size_t first, std::size_t num_batches) {
  for (std::size_t i = 0; i < order.size(); ++i)
    EMBER_CHECK(order[i] < dataset_size, "DataLoader: the sampler returned index ", order[i], " for a dataset of ",
                dataset_size, " samples");
  const std::size_t bs = opt_.batch_size;
  // A sampler's size() and indices() are the user's: a size() larger than the order it returns would plan batches
  // past its end.
  EMBER_CHECK(num_batches == 0 || (first + num_batches - 1) * bs < order.size(), "DataLoader: the sampler's size() "
              "makes ", first + num_batches, " batches of up to ", bs, " samples, but its indices() returned ",
              order.size(), " indices");
  batches_.resize(num_batches);
  for (std::size_t b = 0; b < num_batches; ++b) {
    const std::size_t lo = (first + b) * bs, hi = std::min(order.size(), lo + bs);
    batches_[b].first = lo;
    batches_[b].indices.assign(order.begin() + std::ptrdiff_t(lo), order.begin() + std::ptrdiff_t(hi));
  }
}

EMBER_HEADER_INLINE void EpochCore::start(Produce produce, void* ctx) {
  produce_ = produce;
  ctx_ = ctx;
  const int w = opt_.num_workers;
  window_ = std::size_t(w) * std::size_t(opt_.prefetch_factor);
  try {
    for (int i = 0; i < w; ++i) workers_.emplace_back([this] { work(); });
  } catch (...) {  // could not start a thread: stop the ones that started before reporting it
    shutdown();
    throw;
  }
  stats_->wait_seconds += seconds_since(t0_);  // drawing the order and starting workers is waiting too
}

EMBER_HEADER_INLINE std::optional<std::size_t> EpochCore::next() {
  if (failed_) return std::nullopt;
  if (next_ >= batches_.size()) {
    stats_->total_seconds = seconds_since(t0_);
    if (const std::string h = input_bound_hint(*stats_, opt_.num_workers); !h.empty()) hint("dataloader-input", h);
    return std::nullopt;
  }
  const auto tw = Clock::now();
  const bool profiled = profile::is_recording();
  const std::int64_t tw_ns = profiled ? profile::now_ns() : 0;
  const std::size_t b = next_++;
  const std::string error = workers_.empty() ? produce_(ctx_, b) : take(b);
  stats_->wait_seconds += seconds_since(tw);
  if (profiled) profile::record("DataLoader.wait", "data", tw_ns, profile::now_ns());
  if (!error.empty()) {
    failed_ = true;
    stats_->total_seconds = seconds_since(t0_);
    throw Error(error);
  }
  stats_->batches++;
  stats_->samples += batches_[b].indices.size();
  stats_->stages += batches_[b].times;
  stats_->total_seconds = seconds_since(t0_);
  return b;
}

EMBER_HEADER_INLINE void EpochCore::work() {
  for (;;) {
    std::size_t b;
    {
      std::unique_lock<std::mutex> lk(mu_);
      space_.wait(lk, [&] { return stop_ || next_claim_ >= batches_.size() || next_claim_ < consumed_ + window_; });
      if (stop_ || next_claim_ >= batches_.size()) return;
      b = next_claim_++;
    }
    std::string error = produce_(ctx_, b);
    bool wake;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stop_) return;
      batches_[b].error = std::move(error);
      batches_[b].ready = true;
      wake = waiting_for_ == b;  // a consumer waiting for another batch would only wake to sleep again
    }
    if (wake) ready_.notify_one();
  }
}

EMBER_HEADER_INLINE std::string EpochCore::take(std::size_t b) {
  std::unique_lock<std::mutex> lk(mu_);
  waiting_for_ = b;
  ready_.wait(lk, [&] { return batches_[b].ready; });
  waiting_for_ = kNone;
  std::string error = std::move(batches_[b].error);
  consumed_ = b + 1;
  lk.unlock();
  space_.notify_all();
  return error;
}

EMBER_HEADER_INLINE void EpochCore::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  space_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  workers_.clear();
}
#endif
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
