// ember — the Trainer's stock callbacks: EarlyStopping and LearningRateMonitor (ModelCheckpoint, which writes
// files through ember::io, is in <ember/train/checkpoint.hpp>). Semantics and names are PyTorch Lightning's.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "ember/config.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

/// Whether a monitored metric improves by going down or up (Lightning's mode="min" / "max").
enum class Mode { min, max };

namespace detail {
inline std::string format_score(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
/// A double saved as text and read back bit for bit.
inline std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
inline double parse_double(const std::map<std::string, std::string>& kv, const std::string& key, const char* who) {
  const auto it = kv.find(key);
  EMBER_CHECK(it != kv.end(), who, ": the checkpoint has no '", key, "' entry for this callback");
  double v = 0;
  EMBER_CHECK(parse_double(it->second, v), who, ": the checkpoint's '", key, "' is ",
              ember::detail::quote_untrusted(it->second), ", not a number");
  return v;
}
}  // namespace detail

/// The options of train::EarlyStopping, with the names of Lightning's EarlyStopping(...) arguments:
/// ```
/// trainer.add_callback(std::make_shared<train::EarlyStopping>(
///     train::EarlyStoppingOptions{.monitor = "val_acc", .mode = train::Mode::max, .patience = 5}));
/// ```
struct EarlyStoppingOptions {
  std::string monitor = "val_loss";  ///< the metric watched (Lightning requires it; ember defaults to val_loss)
  Mode mode = Mode::min;             ///< min: lower is better; max: higher is better
  double min_delta = 0.0;        ///< an improvement must beat the best by more than this (its absolute value)
  int patience = 3;              ///< checks without improvement before stopping
  bool strict = true;            ///< a monitor missing from the metrics is an error (else the check is skipped)
  bool check_finite = true;      ///< stop when the monitored value is NaN or infinite
  std::optional<double> stopping_threshold{};    ///< stop as soon as the value is better than this; unset: never
  std::optional<double> divergence_threshold{};  ///< stop as soon as the value is worse than this; unset: never
  bool verbose = true;           ///< print why it stopped (Lightning's default is false)
};

/// Stops training when a monitored metric stops improving (Lightning's EarlyStopping). It checks after every
/// validation, or, when fit has no validation loader, at the end of each epoch (a training metric such as
/// train_loss_epoch).
class EarlyStopping : public Callback {
 public:
  /// Watches `o.monitor` (checked: a name, patience >= 0, a finite min_delta).
  explicit EarlyStopping(EarlyStoppingOptions o = {}) : o_(std::move(o)) {
    EMBER_CHECK(!o_.monitor.empty(), "train::EarlyStopping: monitor is empty");
    EMBER_CHECK(o_.patience >= 0, "train::EarlyStopping: patience must be non-negative, got ", o_.patience);
    EMBER_CHECK(std::isfinite(o_.min_delta), "train::EarlyStopping: min_delta must be finite, got ", o_.min_delta);
    o_.min_delta = std::fabs(o_.min_delta);
    best_ = o_.mode == Mode::min ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
  }

  /// One check on the value `current`: updates the best value and the wait count, and returns why to stop (empty:
  /// go on). What the callback does after each validation; tests drive it directly.
  std::string check(double current) {
    const std::string& m = o_.monitor;
    if (o_.check_finite && !std::isfinite(current))
      return "Monitored metric " + m + " = " + detail::format_score(current) +
             " is not finite. Previous best value was " + detail::format_score(best_) + ". Signaling Trainer to stop.";
    if (o_.stopping_threshold && better(current, *o_.stopping_threshold, 0.0))
      return "Stopping threshold reached: " + m + " = " + detail::format_score(current) + " " +
             (o_.mode == Mode::min ? "<" : ">") + " " + detail::format_score(*o_.stopping_threshold) +
             ". Signaling Trainer to stop.";
    if (o_.divergence_threshold && better(*o_.divergence_threshold, current, 0.0))
      return "Divergence threshold reached: " + m + " = " + detail::format_score(current) + " " +
             (o_.mode == Mode::min ? ">" : "<") + " " + detail::format_score(*o_.divergence_threshold) +
             ". Signaling Trainer to stop.";
    if (better(current, best_, o_.min_delta)) {
      best_ = current;
      wait_ = 0;
      return {};
    }
    if (++wait_ >= o_.patience)
      return "Monitored metric " + m + " did not improve in the last " + std::to_string(wait_) +
             " records. Best score: " + detail::format_score(best_) + ". Signaling Trainer to stop.";
    return {};
  }

  /// The best monitored value so far (Lightning's best_score).
  double best_score() const { return best_; }
  /// The checks since the last improvement (Lightning's wait_count).
  int wait_count() const { return wait_; }
  /// The epoch in which it stopped training (-1 when it did not).
  std::int64_t stopped_epoch() const { return stopped_epoch_; }
  /// Why it stopped training (empty when it did not).
  const std::string& reason() const { return reason_; }

  void on_validation_end(Trainer& t) override { run(t); }
  void on_train_epoch_end(Trainer& t) override {
    if (!t.has_validation()) run(t);
  }

  std::string state_key() const override { return "EarlyStopping{" + o_.monitor + "}"; }
  void save_state(std::map<std::string, std::string>& kv) const override {
    kv["best_score"] = detail::exact(best_);
    kv["wait_count"] = std::to_string(wait_);
  }
  void load_state(const std::map<std::string, std::string>& kv) override {
    if (kv.empty()) return;  // a checkpoint from a run without this callback
    const auto [best, wait] = read_state(kv);
    best_ = best;
    wait_ = wait;
  }
  void check_state(const std::map<std::string, std::string>& kv) const override {
    if (!kv.empty()) read_state(kv);
  }

 private:
  // The checks of a saved state, for load_state and check_state: the best score and the wait count.
  static std::pair<double, int> read_state(const std::map<std::string, std::string>& kv) {
    const double best = detail::parse_double(kv, "best_score", "train::EarlyStopping");
    // +-inf is the start of a run; NaN would make every later score a non-improvement.
    EMBER_CHECK(!std::isnan(best), "train::EarlyStopping: the checkpoint's best_score is NaN");
    const double w = detail::parse_double(kv, "wait_count", "train::EarlyStopping");
    EMBER_CHECK(w >= 0 && w <= 1e9 && w == std::floor(w), "train::EarlyStopping: the checkpoint's wait_count is ", w);
    return {best, int(w)};
  }

  /// Whether a beats b by more than delta.
  bool better(double a, double b, double delta) const { return o_.mode == Mode::min ? a < b - delta : a > b + delta; }
  void run(Trainer& t) {
    const auto v = t.callback_metrics().get(o_.monitor);
    if (!v) {
      EMBER_CHECK(!o_.strict, "train::EarlyStopping: the monitored metric '", o_.monitor, "' is not among the "
                  "metrics (", t.callback_metrics().names(),
                  "); return it from validation_step, or set strict = false");
      return;
    }
    std::string why = check(*v);
    if (why.empty()) return;
    stopped_epoch_ = t.current_epoch();
    reason_ = why;
    if (o_.verbose) t.print(why);
    t.request_stop(std::move(why));
  }

  EarlyStoppingOptions o_;
  double best_;
  int wait_ = 0;
  std::int64_t stopped_epoch_ = -1;
  std::string reason_;
};

/// The options of train::LearningRateMonitor, with the names of Lightning's LearningRateMonitor(...) arguments.
struct LearningRateMonitorOptions {
  /// Every optimizer step (at log_every_n_steps), or every epoch; Lightning's default, None, follows the scheduler's
  /// interval.
  Interval logging_interval = Interval::step;
  bool log_momentum = false;  ///< also log each group's momentum (SGD) or beta1 (Adam, AdamW) as "momentum"
};

/// Logs each parameter group's learning rate: "lr" (one group) or "lr/pg<i>", and "momentum" likewise.
class LearningRateMonitor : public Callback {
 public:
  /// Logs the rates (and with log_momentum the momenta) after every optimizer step.
  explicit LearningRateMonitor(LearningRateMonitorOptions o = {}) : o_(o) {}
  void on_fit_start(Trainer& t) override {
    EMBER_CHECK(t.optimizer() != nullptr, "train::LearningRateMonitor: the optimizer is not an optim::Optimizer");
  }
  void on_train_batch_end(Trainer& t) override {
    if (o_.logging_interval == Interval::step && t.stepped() &&
        (t.global_step() - 1) % t.options().log_every_n_steps == 0)
      t.log(rates(t));
  }
  void on_train_epoch_start(Trainer& t) override {
    if (o_.logging_interval == Interval::epoch) t.log(rates(t));
  }

 private:
  Metrics rates(const Trainer& t) const {
    Metrics m;
    optim::Optimizer& opt = *t.optimizer();
    const std::size_t n = opt.num_groups();
    for (std::size_t g = 0; g < n; ++g) {
      const std::string suffix = n == 1 ? "" : "/pg" + std::to_string(g);
      m.set("lr" + suffix, opt.lr(g));
      if (o_.log_momentum)
        if (const double* mom = opt.momentum(g)) m.set("momentum" + suffix, *mom);
    }
    return m;
  }
  LearningRateMonitorOptions o_;
};

}  // namespace ember::train
