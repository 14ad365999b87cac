// ember — learning-rate schedules, stepped once per optimizer step (OneCycleLR, cosine with warmup) or per epoch
// (StepLR, ReduceLROnPlateau), with PyTorch's formulas.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/optim/optimizer.hpp"

namespace ember::optim {

/// Base of the schedules that compute each group's lr from a step counter.
class LRScheduler {
 public:
  /// Schedules `opt`, whose current per-group rates become the base rates (PyTorch's base_lrs); the step count
  /// starts at 0. The optimizer must outlive the scheduler.
  EMBER_HEADER_INLINE explicit LRScheduler(Optimizer& opt);
  virtual ~LRScheduler() = default;
  /// Advances the schedule by one step and writes the new rates into the optimizer.
  virtual void step() {
    ++step_;
    apply();
  }
  /// The number of step() calls so far (PyTorch's last_epoch).
  std::int64_t last_step() const { return step_; }
  /// The schedule's state under PyTorch's keys: `last_epoch` (the step count) and one `base_lrs.0`, `base_lrs.1`,
  /// ... per param group (0-d float64 tensors).
  StateDict state_dict() const {
    StateDict sd;
    sd["last_epoch"] = full<double>(Shape{}, double(step_));
    for (std::size_t g = 0; g < base_lrs_.size(); ++g)
      sd["base_lrs." + std::to_string(g)] = full<double>(Shape{}, base_lrs_[g]);
    return sd;
  }
  /// Restores a state_dict(): the step count and base rates, and writes that step's rates into the optimizer, so
  /// a resumed schedule continues where it stopped. A state is refused (and nothing changes) unless its base rates
  /// and the rates it gives the optimizer are in the optimizers' range ([0, kMaxLr]) and its step is one the
  /// schedule can reach.
  void load_state_dict(const StateDict& sd) {
    std::vector<double> base;
    const std::int64_t last = read_state(sd, base);
    base_lrs_ = std::move(base);
    step_ = last;
    apply();
  }
  /// Throws what load_state_dict(sd) would throw, and changes nothing.
  void check_state_dict(const StateDict& sd) const {
    std::vector<double> base;
    read_state(sd, base);
  }
  /// The rate of every param group now (PyTorch's get_last_lr()).
  std::vector<double> last_lr() const {
    std::vector<double> r;
    for (std::size_t g = 0; g < opt_.num_groups(); ++g) r.push_back(opt_.lr(g));
    return r;
  }

 protected:
  /// Group `group`'s rate at `step` when its base rate is `base_lr`; no side effects (check_state_dict calls it).
  virtual double lr_at(std::size_t group, std::int64_t step, double base_lr) const = 0;
  /// The momentum (or beta1) the schedule sets for the group at `step`; none by default.
  virtual std::optional<double> momentum_at(std::size_t, std::int64_t) const { return std::nullopt; }
  /// The largest step count a loaded state may have.
  virtual std::int64_t step_limit() const { return std::int64_t(9.0e15); }
  /// Writes the rates (and momenta) of the current step into the optimizer.
  void apply() {
    for (std::size_t g = 0; g < opt_.num_groups(); ++g) {
      opt_.lr(g) = lr_at(g, step_, base_lrs_[g]);
      if (const std::optional<double> m = momentum_at(g, step_)) *opt_.momentum(g) = *m;
    }
  }
  Optimizer& opt_;                ///< The optimizer whose rates the schedule sets.
  std::vector<double> base_lrs_;  ///< Each group's base rate (PyTorch's base_lrs).
  std::int64_t step_ = 0;         ///< The step count (PyTorch's last_epoch).

 private:
  // Checks every entry of `sd` and the rates it would set; returns last_epoch and fills `base`.
  std::int64_t read_state(const StateDict& sd, std::vector<double>& base) const {
    constexpr const char* op = "optim::LRScheduler";
    const std::int64_t last = read_count(sd, "last_epoch", op);
    EMBER_CHECK(last <= step_limit(), op, "::load_state_dict: last_epoch is ", last, ", beyond the schedule's ",
                step_limit(), " steps");
    for (std::size_t g = 0; g < base_lrs_.size(); ++g) {
      const std::string key = "base_lrs." + std::to_string(g);
      base.push_back(read_scalar(sd, key, op));
      EMBER_CHECK(base.back() >= 0 && base.back() <= kMaxLr, op, "::load_state_dict: ", key, " is ", base.back(),
                  ", expected a learning rate in [0, 1e4] (the optimizers' range)");
    }
    EMBER_CHECK(sd.size() == base.size() + 1, op, "::load_state_dict: expected last_epoch and ", base.size(),
                " base_lrs entries (one per parameter group), got ", sd.size(), " entries");
    for (std::size_t g = 0; g < base.size() && g < opt_.num_groups(); ++g) {
      const double lr = lr_at(g, last, base[g]);
      EMBER_CHECK(lr >= 0 && lr <= kMaxLr, op, "::load_state_dict: at last_epoch ", last, " the schedule gives "
                  "parameter group ", g, " the learning rate ", lr, ", outside the optimizers' range [0, 1e4]");
    }
    return last;
  }
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE LRScheduler::LRScheduler(Optimizer& opt)
    : opt_(opt) {
  for (std::size_t g = 0; g < opt.num_groups(); ++g) base_lrs_.push_back(opt.lr(g));
}
#endif

/// lr = base_lr * gamma^floor(step / step_size).
class StepLR final : public LRScheduler {
 public:
  /// Multiplies the rates by gamma every step_size (> 0) steps, as torch.optim.lr_scheduler.StepLR; usually
  /// stepped once per epoch.
  StepLR(Optimizer& opt, std::int64_t step_size, double gamma = 0.1) : LRScheduler(opt), size_(step_size), gamma_(gamma) {
    EMBER_CHECK(step_size > 0, "optim::StepLR: step_size must be positive, got ", step_size);
  }

 protected:
  double lr_at(std::size_t, std::int64_t s, double base) const override {
    return base * std::pow(gamma_, double(s / size_));
  }

 private:
  std::int64_t size_;
  double gamma_;
};

/// Linear warmup from 0 to base_lr over warmup_steps, then cosine annealing to min_lr at total_steps.
class CosineWarmupLR final : public LRScheduler {
 public:
  /// Warms up over `warmup_steps` steps, then anneals to `min_lr` at `total_steps` (PyTorch has no single class
  /// for it: LinearLR then CosineAnnealingLR, or transformers' get_cosine_schedule_with_warmup). Stepped once per
  /// optimizer step.
  EMBER_HEADER_INLINE CosineWarmupLR(Optimizer& opt, std::int64_t warmup_steps, std::int64_t total_steps,
                                     double min_lr = 0.0);

 protected:
  EMBER_HEADER_INLINE double lr_at(std::size_t g, std::int64_t s, double base) const override;

 private:
  std::int64_t warmup_, total_;
  double min_lr_;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE CosineWarmupLR::CosineWarmupLR(Optimizer& opt, std::int64_t warmup_steps,
                                                   std::int64_t total_steps, double min_lr)
    : LRScheduler(opt), warmup_(warmup_steps), total_(total_steps), min_lr_(min_lr) {
  EMBER_CHECK(warmup_steps >= 0 && total_steps > warmup_steps, "optim::CosineWarmupLR: expected 0 <= warmup_steps < ",
              "total_steps, got warmup_steps=", warmup_steps, ", total_steps=", total_steps);
  detail::check_lr("optim::CosineWarmupLR: min_lr", min_lr);  // (the rates it sets stay in the optimizers' range)
  apply();
}

EMBER_HEADER_INLINE double CosineWarmupLR::lr_at(std::size_t, std::int64_t s, double base) const {
  if (s < warmup_) return base * double(s) / double(warmup_);
  const double progress = std::min(1.0, double(s - warmup_) / double(total_ - warmup_));
  return min_lr_ + (base - min_lr_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}
#endif

/// The options of optim::OneCycleLR after (optimizer, max_lr), in torch.optim.lr_scheduler.OneCycleLR's order and
/// with its defaults (total_steps is required: its epochs and steps_per_epoch are not supported):
///   optim::OneCycleLR sched(opt, 0.1, {.total_steps = epochs * steps_per_epoch, .pct_start = 0.25});
struct OneCycleOptions {
  std::int64_t total_steps = 0;  ///< required, > 0: the optimizer steps in the whole run (step() calls at most)
  double pct_start = 0.3;        ///< the fraction of the steps spent increasing the lr, in [0, 1]
  bool cos_anneal = true;  ///< cosine annealing; false: linear (PyTorch: anneal_strategy="cos" / "linear")
  /// Momentum (SGD) or beta1 (Adam, AdamW) moves inversely to the lr, between max_momentum and base_momentum; needs
  /// an optimizer with one.
  bool cycle_momentum = true;
  double base_momentum = 0.85;  ///< the momentum at the lr's peak, in [0, 1 - 2^-24] (with cycle_momentum)
  double max_momentum = 0.95;   ///< the momentum at the start and end of the cycle, in [0, 1 - 2^-24]
  double div_factor = 25.0;     ///< initial_lr = max_lr / div_factor (which must be a valid lr, in [0, 1e4])
  double final_div_factor = 1e4;  ///< the final lr = initial_lr / final_div_factor (a valid lr too)
  /// Three phases: up to max_lr, back down to initial_lr, then annealing to the final lr (fast.ai's schedule);
  /// false: two, up to max_lr and then down to the final lr.
  bool three_phase = false;
};

/// Leslie Smith's 1cycle policy as torch.optim.lr_scheduler.OneCycleLR: the lr rises from max_lr/div_factor to
/// max_lr over pct_start of the steps, then anneals to a tiny value; momentum moves the opposite way between
/// max_momentum and base_momentum. Construction sets the initial lr (and momentum); call step() after every
/// optimizer step, total_steps times at most.
class OneCycleLR final : public LRScheduler {
 public:
  /// The schedule with one peak rate `max_lr` for every param group.
  OneCycleLR(Optimizer& opt, double max_lr, const OneCycleOptions& o) : OneCycleLR(opt, std::vector<double>{max_lr}, o) {}
  /// The schedule with a peak rate per param group (max_lrs has one value, or one per group), as PyTorch's
  /// max_lr list. Sets the initial rates (and momenta) at once.
  EMBER_HEADER_INLINE OneCycleLR(Optimizer& opt, std::vector<double> max_lrs, const OneCycleOptions& o);
  /// Advances the schedule by one step; an error beyond total_steps steps.
  void step() override {
    EMBER_CHECK(step_ + 1 <= o_.total_steps, "optim::OneCycleLR: tried to step ", step_ + 1,
                " times; the schedule has total_steps=", o_.total_steps);
    LRScheduler::step();
  }

 protected:
  // lr and momentum of step s: within the phase containing s, annealed from the phase's start to its end value.
  EMBER_HEADER_INLINE double lr_at(std::size_t g, std::int64_t s, double base) const override;
  EMBER_HEADER_INLINE std::optional<double> momentum_at(std::size_t g, std::int64_t s) const override;
  std::int64_t step_limit() const override { return o_.total_steps; }

 private:
  struct Phase {
    double end_step;
    int lr_from, lr_to;    // 0 initial, 1 max, 2 min
    int mom_from, mom_to;  // 0 max_momentum, 1 base_momentum
  };
  // The phase that holds step s and how far into it s is (0 at its start, 1 at its end).
  EMBER_HEADER_INLINE std::pair<const Phase*, double> phase_at(std::int64_t s) const;
  double anneal(double a, double b, double pct) const {
    if (o_.cos_anneal) return b + (a - b) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
    return (b - a) * pct + a;
  }
  OneCycleOptions o_;
  std::vector<Phase> phases_;
  std::vector<std::array<double, 3>> lrs_;
};

#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE OneCycleLR::OneCycleLR(Optimizer& opt, std::vector<double> max_lrs, const OneCycleOptions& o)
    : LRScheduler(opt), o_(o) {
  EMBER_CHECK(o.total_steps > 0, "optim::OneCycleLR: total_steps must be positive, got ", o.total_steps);
  EMBER_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "optim::OneCycleLR: pct_start must be in [0, 1], got ",
              o.pct_start);
  EMBER_CHECK(max_lrs.size() == 1 || max_lrs.size() == opt.num_groups(), "optim::OneCycleLR: got ", max_lrs.size(),
              " max_lr values for ", opt.num_groups(), " parameter groups");
  EMBER_CHECK(!o.cycle_momentum || opt.momentum(0) != nullptr,
              "optim::OneCycleLR: cycle_momentum needs an optimizer with momentum or beta1");
  // The rates and momenta it sets stay in the optimizers' ranges (optimizer.hpp), so its checkpoints load back.
  if (o.cycle_momentum)
    EMBER_CHECK(o.base_momentum >= 0 && o.base_momentum <= kMaxBeta && o.max_momentum >= 0 &&
                    o.max_momentum <= kMaxBeta,
                "optim::OneCycleLR: base_momentum and max_momentum must be in [0, 1 - 2^-24], got ", o.base_momentum,
                " and ", o.max_momentum);
  const double n = double(o.total_steps);
  if (o.three_phase) {
    phases_ = {{o.pct_start * n - 1, 0, 1, 0, 1}, {2 * o.pct_start * n - 2, 1, 0, 1, 0}, {n - 1, 0, 2, 0, 0}};
  } else {
    phases_ = {{o.pct_start * n - 1, 0, 1, 0, 1}, {n - 1, 1, 2, 1, 0}};
  }
  for (std::size_t g = 0; g < opt.num_groups(); ++g) {
    const double mx = max_lrs.size() == 1 ? max_lrs[0] : max_lrs[g];
    const double init = mx / o.div_factor;
    lrs_.push_back({init, mx, init / o.final_div_factor});
    detail::check_lr("optim::OneCycleLR: max_lr", mx);
    detail::check_lr("optim::OneCycleLR: max_lr / div_factor", lrs_.back()[0]);
    detail::check_lr("optim::OneCycleLR: max_lr / div_factor / final_div_factor", lrs_.back()[2]);
  }
  apply();
}

EMBER_HEADER_INLINE std::pair<const OneCycleLR::Phase*, double> OneCycleLR::phase_at(std::int64_t s) const {
  double start_step = 0;
  for (std::size_t i = 0; i < phases_.size(); ++i) {
    const Phase& p = phases_[i];
    if (double(s) <= p.end_step || i + 1 == phases_.size())
      return {&p, (double(s) - start_step) / (p.end_step - start_step)};
    start_step = p.end_step;
  }
  return {nullptr, 0.0};  // (not reached: there are two or three phases)
}

EMBER_HEADER_INLINE double OneCycleLR::lr_at(std::size_t g, std::int64_t s, double) const {
  const auto [p, pct] = phase_at(s);
  return p ? anneal(lrs_[g][p->lr_from], lrs_[g][p->lr_to], pct) : lrs_[g][2];
}

EMBER_HEADER_INLINE std::optional<double> OneCycleLR::momentum_at(std::size_t, std::int64_t s) const {
  if (!o_.cycle_momentum) return std::nullopt;
  const auto [p, pct] = phase_at(s);
  const double m[2] = {o_.max_momentum, o_.base_momentum};
  return p ? anneal(m[p->mom_from], m[p->mom_to], pct) : m[1];
}
#endif

/// The options of optim::ReduceLROnPlateau after the optimizer, in torch.optim.lr_scheduler.ReduceLROnPlateau's
/// order and with its defaults (mode and threshold_mode are booleans; min_lr is one value for every group):
///   optim::ReduceLROnPlateau sched(opt, {.mode_max = true, .patience = 5});
struct PlateauOptions {
  /// false: the metric should decrease (a loss); true: increase (an accuracy). PyTorch: mode="min" / mode="max".
  bool mode_max = false;
  double factor = 0.1;  ///< new_lr = lr * factor, in [0, 1)
  /// The epochs without improvement that are tolerated, >= 0: the lr is reduced on the (patience + 1)-th bad epoch.
  std::int64_t patience = 10;
  double threshold = 1e-4;  ///< what counts as an improvement: by more than this (relative or absolute)
  /// Relative: better than best * (1 -/+ threshold); false: absolute, best -/+ threshold. PyTorch:
  /// threshold_mode="rel" / "abs".
  bool threshold_rel = true;
  std::int64_t cooldown = 0;  ///< the epochs after a reduction during which bad epochs are not counted, >= 0
  double min_lr = 0.0;        ///< the lr's lower bound, for every parameter group (PyTorch also takes one per group)
  double eps = 1e-8;          ///< a reduction of the lr by eps or less is skipped
};

/// Reduces the lr by `factor` when a metric has stopped improving for `patience` epochs
/// (torch.optim.lr_scheduler.ReduceLROnPlateau). Call step(metric) once per epoch.
class ReduceLROnPlateau {
 public:
  /// Watches a metric for `opt` (which must outlive the scheduler); `best` starts at +inf (-inf with mode_max).
  ReduceLROnPlateau(Optimizer& opt, const PlateauOptions& o = {}) : opt_(opt), o_(o) {
    EMBER_CHECK(o.factor < 1.0 && o.factor >= 0, "optim::ReduceLROnPlateau: factor must be in [0, 1), got ", o.factor);
    EMBER_CHECK(o.patience >= 0 && o.cooldown >= 0, "optim::ReduceLROnPlateau: patience and cooldown must be >= 0");
    best_ = o.mode_max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  /// Records one epoch's metric and reduces every group's rate to max(lr * factor, min_lr) once more than
  /// `patience` epochs passed without improvement (outside cooldown). A NaN metric is never an improvement (every
  /// comparison with it is false), so it counts as a bad epoch, as in PyTorch; `best` stays a number.
  void step(double metric) {
    if (better(metric)) {
      best_ = metric;
      bad_ = 0;
    } else {
      ++bad_;
    }
    if (cooldown_left_ > 0) {
      --cooldown_left_;
      bad_ = 0;
    }
    if (bad_ > o_.patience) {
      for (std::size_t g = 0; g < opt_.num_groups(); ++g) {
        const double old = opt_.lr(g), nw = std::max(old * o_.factor, o_.min_lr);
        if (old - nw > o_.eps) opt_.lr(g) = nw;
      }
      cooldown_left_ = o_.cooldown;
      bad_ = 0;
    }
  }
  /// The best metric seen so far (PyTorch's `best`).
  double best() const { return best_; }
  /// The epochs since the last improvement, reset by a reduction and during cooldown (PyTorch's num_bad_epochs).
  std::int64_t num_bad_epochs() const { return bad_; }
  /// PyTorch's keys best, num_bad_epochs and cooldown_counter (0-d float64); the rates themselves are in the
  /// optimizer's state.
  StateDict state_dict() const {
    StateDict sd;
    sd["best"] = full<double>(Shape{}, best_);
    sd["num_bad_epochs"] = full<double>(Shape{}, double(bad_));
    sd["cooldown_counter"] = full<double>(Shape{}, double(cooldown_left_));
    return sd;
  }
  /// Restores a state_dict() (best, num_bad_epochs and cooldown_counter); a malformed state is refused and nothing
  /// changes.
  void load_state_dict(const StateDict& sd) {
    std::int64_t b = 0, c = 0;
    best_ = read_state(sd, b, c);
    bad_ = b;
    cooldown_left_ = c;
  }
  /// Throws what load_state_dict(sd) would throw, and changes nothing.
  void check_state_dict(const StateDict& sd) const {
    std::int64_t b = 0, c = 0;
    read_state(sd, b, c);
  }

 private:
  static double read_state(const StateDict& sd, std::int64_t& bad, std::int64_t& cooldown) {
    constexpr const char* op = "optim::ReduceLROnPlateau";
    const double best = read_scalar(sd, "best", op);
    bad = read_count(sd, "num_bad_epochs", op);
    cooldown = read_count(sd, "cooldown_counter", op);
    EMBER_CHECK(!std::isnan(best), op, "::load_state_dict: best is NaN");
    EMBER_CHECK(sd.size() == 3, op, "::load_state_dict: expected best, num_bad_epochs and cooldown_counter, got ",
                sd.size(), " entries");
    return best;
  }
  bool better(double a) const {
    if (!o_.mode_max) return o_.threshold_rel ? a < best_ * (1 - o_.threshold) : a < best_ - o_.threshold;
    return o_.threshold_rel ? a > best_ * (1 + o_.threshold) : a > best_ + o_.threshold;
  }
  Optimizer& opt_;
  PlateauOptions o_;
  double best_;
  std::int64_t bad_ = 0, cooldown_left_ = 0;
};

}  // namespace ember::optim
