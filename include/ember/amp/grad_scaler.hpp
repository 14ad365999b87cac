// ember — amp::GradScaler: dynamic loss scaling for fp16 training, with torch.amp.GradScaler's semantics and
// defaults. The loss is multiplied by the scale before backward so that small fp16 gradients do not flush to zero;
// unscale_ divides the fp32 master gradients by it and detects inf/NaN in the same pass; step skips the update
// when anything was non-finite; update halves the scale after an overflow and doubles it after growth_interval
// clean steps. bf16 needs no scaler (it has fp32's range); using one with bf16 is allowed and harmless.
//
// One deliberate difference from PyTorch: the scale never falls below the smallest normal float (PyTorch's can
// underflow to 0 after ~150 consecutive overflows, after which every step is skipped for good).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"

namespace ember::amp {

/// The options of amp::GradScaler, in torch.amp.GradScaler's order and with its defaults (its device argument is
/// not needed: each gradient is unscaled on its own device):
///   amp::GradScaler scaler({.init_scale = 1024.0, .growth_interval = 1000});
struct GradScalerOptions {
  double init_scale = 65536.0;  ///< the starting scale, 2^16; in (0, the largest float]
  double growth_factor = 2.0;   ///< the scale's factor after growth_interval clean updates in a row; > 1
  double backoff_factor = 0.5;  ///< the scale's factor after an update that found inf/NaN; in (0, 1)
  std::int64_t growth_interval = 2000;  ///< the clean (no inf/NaN) updates in a row before the scale grows; > 0
  bool enabled = true;  ///< false: every method is a pass-through (scale 1, step = optimizer.step())
};

namespace detail {
/// The found-inf flags of one unscale_: one int64 per device, zero until a gradient's check sets it, read once at
/// the end (one device-to-host read per device, none per gradient).
struct FoundInf {
  std::vector<Tensor<std::int64_t>> flags;
  const Tensor<std::int64_t>& flag_for(Device d, [[maybe_unused]] const char* op) {
    for (const auto& f : flags)
      if (f.device() == d) return f;
#if !EMBER_CUDA_EXECUTOR
    if (d.is_cuda()) ops::detail::no_cuda_executor(op, d);  // before the flag's allocation fails without the op
#endif
    flags.push_back(zeros<std::int64_t>(Shape{1}, d));
    return flags.back();
  }
  bool any() const {
    for (const auto& f : flags)
      if (f.item() != 0) return true;
    return false;
  }
};

/// g *= inv_scale in place, on g's device, and `flag` set when any result is inf or NaN (a non-finite input stays
/// non-finite): one fused pass over the gradient, which it reads once (slot 0). CUDA gradients need an nvcc
/// translation unit, like every element-wise op on CUDA tensors.
template <class T>
void unscale(const Tensor<T>& g, double inv_scale, const Tensor<std::int64_t>& flag, const char* op) {
  const auto v = expr::slot<0>(g) * inv_scale;
  const auto bad = !(abs(v) <= std::numeric_limits<compute_t<T>>::max());
  ops::assign_multi_flag(std::make_tuple(g), std::make_tuple(v), g.shape(), std::make_tuple(g), bad, flag, op);
}
}  // namespace detail

/// Dynamic loss scaling (torch.amp.GradScaler). The usual step:
///
///   auto loss = loss_fn(model(x), y);
///   scaler.scale(loss).backward();
///   scaler.unscale_(opt);                       // optional: before clip_grad_norm_ on the true gradients
///   optim::clip_grad_norm_(params, 1.0);
///   scaler.step(opt);                           // skipped when a gradient overflowed
///   scaler.update();
///
/// With gradient accumulation, scale every micro-batch's loss and call unscale_/step/update once per update.
/// The optimizer is any with `param_groups()` (optim::SGD, Adam, AdamW).
class GradScaler {
  // The loss is scaled in float: a larger scale would be infinite there.
  static constexpr double kMaxScale = double(std::numeric_limits<float>::max());

 public:
  /// torch.amp.GradScaler(init_scale, growth_factor, backoff_factor, growth_interval, enabled).
  explicit GradScaler(const GradScalerOptions& o = {})
      : scale_(o.init_scale),
        growth_factor_(o.growth_factor),
        backoff_factor_(o.backoff_factor),
        growth_interval_(o.growth_interval),
        enabled_(o.enabled) {
    EMBER_CHECK(o.init_scale > 0 && o.init_scale <= kMaxScale, "amp::GradScaler: init_scale must be positive and at "
                "most the largest float, got ", o.init_scale);
    EMBER_CHECK(o.growth_factor > 1.0, "amp::GradScaler: growth_factor must be above 1, got ", o.growth_factor);
    EMBER_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "amp::GradScaler: backoff_factor must be in (0, 1), "
                "got ", o.backoff_factor);
    EMBER_CHECK(o.growth_interval > 0, "amp::GradScaler: growth_interval must be positive, got ", o.growth_interval);
  }

  /// loss * scale in float (the product of a half loss and 2^16 would overflow half), recorded by autograd; the
  /// loss itself when disabled (cast to float).
  template <class T>
  Tensor<float> scale(const Tensor<T>& loss) const {
    static_assert(is_floating_v<T>, "amp::GradScaler::scale: a floating-point loss");
    if constexpr (std::is_same_v<T, float>) {
      if (!enabled_) return loss;
      return Tensor<float>(loss * float(scale_));
    } else {
      if (!enabled_) return Tensor<float>(cast<float>(loss));
      return Tensor<float>(cast<float>(loss) * float(scale_));
    }
  }

  /// Divides every gradient of the optimizer's parameters by the scale in place and records whether any is inf or
  /// NaN, in one pass per gradient. At most once per optimizer between update()s, and before step().
  template <class Opt>
  void unscale_(Opt& opt) {
    if (!enabled_) return;
    OptState& st = state_of(&opt);
    EMBER_CHECK(st.stage != Stage::unscaled, "amp::GradScaler::unscale_: already called on this optimizer since the "
                "last update()");
    EMBER_CHECK(st.stage != Stage::stepped, "amp::GradScaler::unscale_: called after step(); call update() first");
    NoGradGuard ng;
    const double inv = 1.0 / scale_;
    constexpr const char* op = "amp::GradScaler::unscale_";
    detail::FoundInf found;
    for (auto& group : opt.param_groups())
      for (auto& p : group.params) {
        if (!p.has_meta() || !p.grad().defined()) continue;
        detail::unscale(p.grad(), inv, found.flag_for(p.grad().device(), op), op);
      }
    st.found_inf = found.any();
    st.stage = Stage::unscaled;
  }

  /// Unscales (if unscale_ was not called) and runs opt.step() unless a gradient was inf or NaN. Returns whether
  /// the optimizer stepped.
  template <class Opt>
  bool step(Opt& opt) {
    if (!enabled_) {
      opt.step();
      return true;
    }
    OptState& st = state_of(&opt);
    EMBER_CHECK(st.stage != Stage::stepped, "amp::GradScaler::step: already called on this optimizer since the last "
                "update()");
    if (st.stage == Stage::ready) unscale_(opt);
    st.stage = Stage::stepped;
    if (st.found_inf) return false;
    opt.step();
    return true;
  }

  /// Adjusts the scale from this iteration's inf checks: times backoff_factor if any optimizer found inf/NaN
  /// (and the growth count restarts), times growth_factor after growth_interval clean updates in a row.
  void update() {
    if (!enabled_) return;
    EMBER_CHECK(!opts_.empty(), "amp::GradScaler::update: no inf checks were recorded since the last update(); call "
                "unscale_() or step() first");
    bool found = false;
    for (const auto& o : opts_) found = found || o.second.found_inf;
    opts_.clear();
    if (found) {
      scale_ = std::max(scale_ * backoff_factor_, double(std::numeric_limits<float>::min()));
      growth_tracker_ = 0;
    } else if (++growth_tracker_ == growth_interval_) {
      const double grown = scale_ * growth_factor_;
      if (std::isfinite(float(grown))) scale_ = grown;
      growth_tracker_ = 0;
    }
  }
  /// Sets the scale directly (and restarts the growth count), like update(new_scale).
  void update(double new_scale) {
    if (!enabled_) return;
    EMBER_CHECK(std::isfinite(new_scale) && new_scale > 0, "amp::GradScaler::update: the new scale must be finite "
                "and positive, got ", new_scale);
    opts_.clear();
    scale_ = new_scale;
    growth_tracker_ = 0;
  }

  /// The current scale (1 when disabled).
  double get_scale() const { return enabled_ ? scale_ : 1.0; }
  /// The successive steps without an infinite gradient since the scale last changed (PyTorch's
  /// get_growth_tracker()); the scale grows when it reaches growth_interval.
  std::int64_t get_growth_tracker() const { return growth_tracker_; }
  /// Whether scaling is on (PyTorch's is_enabled()); disabled, every method is a pass-through.
  bool is_enabled() const { return enabled_; }
  /// Whether the last step() on this optimizer was skipped for a non-finite gradient (until update()).
  template <class Opt>
  bool found_inf(const Opt& opt) const {
    for (const auto& o : opts_)
      if (o.first == static_cast<const void*>(&opt)) return o.second.found_inf;
    return false;
  }

  /// PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker (0-d float64); empty
  /// when disabled.
  StateDict state_dict() const {
    StateDict sd;
    if (!enabled_) return sd;
    auto scalar = [](double v) { return full<double>(Shape{}, v); };
    sd["scale"] = scalar(scale_);
    sd["growth_factor"] = scalar(growth_factor_);
    sd["backoff_factor"] = scalar(backoff_factor_);
    sd["growth_interval"] = scalar(double(growth_interval_));
    sd["_growth_tracker"] = scalar(double(growth_tracker_));
    return sd;
  }
  /// Checks every entry before anything is written: a refused state leaves the scaler as it was.
  void load_state_dict(const StateDict& sd) {
    const Loaded l = read_state(sd);
    if (!enabled_) return;
    scale_ = l.scale;
    growth_factor_ = l.growth_factor;
    backoff_factor_ = l.backoff_factor;
    growth_interval_ = l.growth_interval;
    growth_tracker_ = l.growth_tracker;
    opts_.clear();
  }
  /// Throws what load_state_dict(sd) would throw, and changes nothing.
  void check_state_dict(const StateDict& sd) const { read_state(sd); }

 private:
  enum class Stage { ready, unscaled, stepped };
  struct OptState {
    Stage stage = Stage::ready;
    bool found_inf = false;
  };
  OptState& state_of(const void* opt) {
    for (auto& o : opts_)
      if (o.first == opt) return o.second;
    opts_.emplace_back(opt, OptState{});
    return opts_.back().second;
  }

  struct Loaded {
    double scale = 0, growth_factor = 0, backoff_factor = 0;
    std::int64_t growth_interval = 0, growth_tracker = 0;
  };
  // The checks of a state for load_state_dict and check_state_dict (nothing to read when disabled).
  Loaded read_state(const StateDict& sd) const {
    EMBER_CHECK(enabled_ || sd.empty(), "amp::GradScaler::load_state_dict: this scaler is disabled but the state is "
                "not empty");
    if (!enabled_) return {};
    EMBER_CHECK(!sd.empty(), "amp::GradScaler::load_state_dict: the state is empty (saved from a disabled scaler?)");
    constexpr const char* kName = "amp::GradScaler";
    const double s = read_scalar(sd, "scale", kName), gf = read_scalar(sd, "growth_factor", kName),
                 bf = read_scalar(sd, "backoff_factor", kName), gi = read_scalar(sd, "growth_interval", kName),
                 gt = read_scalar(sd, "_growth_tracker", kName);
    EMBER_CHECK(s > 0 && s <= kMaxScale && gf > 1 && bf > 0 && bf < 1 && gi >= 1 && gi < 9.0e15 && gt >= 0 &&
                    gt < gi && gi == std::floor(gi) && gt == std::floor(gt),
                "amp::GradScaler::load_state_dict: inconsistent state (scale ", s, ", growth_factor ", gf,
                ", backoff_factor ", bf, ", growth_interval ", gi, ", _growth_tracker ", gt, ")");
    return {s, gf, bf, std::int64_t(gi), std::int64_t(gt)};
  }

  double scale_;
  double growth_factor_, backoff_factor_;
  std::int64_t growth_interval_;
  std::int64_t growth_tracker_ = 0;
  bool enabled_;
  std::vector<std::pair<const void*, OptState>> opts_;  // per optimizer, since the last update()
};

}  // namespace ember::amp
