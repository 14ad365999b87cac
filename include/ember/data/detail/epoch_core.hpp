// ember — detail::EpochCore: what one epoch of a data::DataLoader does whatever its dataset, transform and sampler
// (compiled once, not per loader type): the batches' plans, the worker threads, the hand-over in order, the
// statistics and the errors. The typed loader (<ember/data/dataloader.hpp>) owns the batches and loads them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/hint.hpp"
#include "ember/data/loader_options.hpp"
#include "ember/data/loader_stages.hpp"
#include "ember/data/loader_stats.hpp"
#include "ember/profile/range.hpp"

namespace ember::data::detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

}  // namespace ember::data::detail
