// ember — Adam and AdamW (torch.optim.Adam / AdamW, with the amsgrad option). Each parameter is updated in one
// fused pass over p, grad and the moment buffers (a multi-output expression, the same on the CPU and on CUDA), with no
// allocation after the first step.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/range.hpp"

namespace ember::optim {

/// The options of optim::Adam and optim::AdamW (one per parameter group), in torch.optim.Adam's order and with
/// torch.optim's defaults (its foreach, capturable, differentiable and fused are not needed: every update is one
/// fused pass):
///   optim::AdamW opt(model.parameters(), {.lr = 3e-4, .beta2 = 0.95, .weight_decay = 0.1});
struct AdamOptions {
  double lr = 1e-3;      ///< the learning rate, in [0, 1e4]
  double beta1 = 0.9;    ///< the first moment's decay, in [0, 1 - 2^-24] (PyTorch: betas[0])
  double beta2 = 0.999;  ///< the second moment's decay, in [0, 1 - 2^-24] (PyTorch: betas[1])
  /// Added to the denominator's sqrt(v_hat), in [1e-20, 1e4]; PyTorch allows 0, which makes a parameter whose
  /// gradients are all 0 NaN.
  double eps = 1e-8;
  /// Adam: added to the gradient (L2); AdamW: decoupled, p *= 1 - lr * weight_decay. Unset means the optimizer's
  /// PyTorch default: 0 for Adam, 0.01 for AdamW (the optimizer's param_groups() show the value it resolved to).
  std::optional<double> weight_decay = std::nullopt;
  bool amsgrad = false;   ///< divide by the running maximum of the second moment (AMSGrad, Reddi et al., 2018)
  bool maximize = false;  ///< ascend: the update uses -grad (maximises the objective)
};

/// Adam when Decoupled is false, AdamW when true.
template <class T, bool Decoupled>
class BasicAdam : public Optimizer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "optim::Adam: parameters are float or double (mixed precision keeps fp32 master weights)");
  static constexpr const char* kName = Decoupled ? "optim::AdamW" : "optim::Adam";
  /// torch.optim's default weight decay: Adam 0, AdamW 0.01.
  static constexpr double kDefaultWeightDecay = Decoupled ? 0.01 : 0.0;
  static double weight_decay(const AdamOptions& o) { return o.weight_decay.value_or(kDefaultWeightDecay); }

 public:
  using Group = ParamGroup<T, AdamOptions>;  ///< One param group: its parameters and their AdamOptions.

  /// One group of `params` (leaf tensors) with options `o`, as `torch.optim.Adam(params, lr=..., ...)`.
  BasicAdam(std::vector<Tensor<T>> params, const AdamOptions& o)
      : BasicAdam(std::vector<Group>{{std::move(params), o}}) {}
  /// Several param groups, each with its own options (PyTorch's list of dicts): `{{decay, {.lr = 1e-3}},
  /// {no_decay, {.lr = 1e-3, .weight_decay = 0.0}}}`. An unset weight_decay takes the optimizer's default.
  explicit BasicAdam(std::vector<Group> groups);

  /// One Adam (AdamW) update of every parameter that has a gradient, in one fused pass each.
  void step() override;

  /// Clears (set_to_none, the default) or zeroes the gradients of every group's parameters.
  void zero_grad(bool set_to_none = true) override {
    for (auto& g : groups_) detail::zero_grads(g.params, set_to_none);
  }
  /// The number of param groups.
  std::size_t num_groups() const override { return groups_.size(); }
  /// Group g's learning rate (what schedulers write).
  double& lr(std::size_t g) override { return groups_.at(g).options.lr; }
  /// Group g's beta1, which one-cycle schedules cycle.
  double* momentum(std::size_t g) override { return &groups_.at(g).options.beta1; }
  /// The groups and their options, to read or change between steps (PyTorch's `optimizer.param_groups`).
  std::vector<Group>& param_groups() { return groups_; }

  /// Every parameter's step count and moments (copies) under PyTorch's names, `state.0.step`, `state.0.exp_avg`,
  /// `state.0.exp_avg_sq` (and with amsgrad `state.0.max_exp_avg_sq`), `state.1.step`, ..., and the groups'
  /// hyper-parameters.
  nn::StateDict state_dict() const override;
  /// Loads a state_dict() (ember's or PyTorch's); everything is checked first, so a refused state changes nothing.
  void load_state_dict(const nn::StateDict& sd) override;
  /// Throws what load_state_dict(sd) would throw, and changes nothing.
  void check_state_dict(const nn::StateDict& sd) const override { read_state(sd, nullptr); }

 private:
  struct State {
    std::int64_t step = 0;
    Tensor<T> m, v, vmax;  // first and second moments, running max of the second (amsgrad)
  };
  // The hyper-parameters' checks (weight_decay resolved; the ranges of optimizer.hpp), for the constructor and for
  // a loaded state (`where` begins the message).
  static void check_options(const AdamOptions& o, const char* where);
  // Checks every entry of `sd` and returns the groups' options; fills `st` (one per parameter) when not null.
  std::vector<AdamOptions> read_state(const nn::StateDict& sd, std::vector<State>* st) const;

  std::vector<Group> groups_;
  std::vector<State> state_;
};

template <class T, bool Decoupled>
EMBER_COLD void BasicAdam<T, Decoupled>::check_options(const AdamOptions& o, const char* where) {
  detail::check_lr(where, o.lr);
  // eps > 0, unlike PyTorch's >= 0: with eps = 0 a parameter whose gradients are all 0 becomes 0 / 0 = NaN.
  detail::check_hyper(where, "epsilon", o.eps, kMinEps, kMaxEps, "[1e-20, 1e4]");
  EMBER_CHECK(o.beta1 >= 0 && o.beta1 <= kMaxBeta && o.beta2 >= 0 && o.beta2 <= kMaxBeta, where, ": invalid betas (",
              o.beta1, ", ", o.beta2, "), expected each in [0, 1 - 2^-24] (below 1 in float)");
  detail::check_hyper(where, "weight_decay", *o.weight_decay, 0, kMaxWeightDecay, "[0, 1e4]");
}

template <class T, bool Decoupled>
EMBER_COLD BasicAdam<T, Decoupled>::BasicAdam(std::vector<Group> groups) : groups_(std::move(groups)) {
  for (auto& g : groups_) {
    if (!g.options.weight_decay) g.options.weight_decay = kDefaultWeightDecay;
    check_options(g.options, kName);
    for (auto& p : g.params) {
      EMBER_CHECK(p.defined() && p.is_leaf(), kName, ": can only optimize leaf tensors");
      state_.emplace_back();
    }
  }
}

template <class T, bool Decoupled>
void BasicAdam<T, Decoupled>::step() {
  EMBER_PROFILE_RANGE_CAT("Adam.step", "optimizer");
  NoGradGuard ng;
  std::size_t k = 0;
  for (auto& grp : groups_) {
    const AdamOptions& o = grp.options;
    for (auto& p : grp.params) {
      State& s = state_[k++];
      if (!p.has_meta() || !p.grad().defined()) continue;
      const Tensor<T> g = detail::checked_grad(p, kName);
#if !EMBER_CUDA_EXECUTOR
      if (p.device().is_cuda()) detail::no_cuda_update(kName, p.device());
#endif
      if (!s.m.defined()) {
        s.m = zeros<T>(p.shape(), p.device());
        s.v = zeros<T>(p.shape(), p.device());
        if (o.amsgrad) s.vmax = zeros<T>(p.shape(), p.device());
      }
      detail::check_state_device(p, s.m, kName, "exp_avg");
      detail::check_state_device(p, s.v, kName, "exp_avg_sq");
      detail::check_state_device(p, s.vmax, kName, "max_exp_avg_sq");
      ++s.step;
      // The update in T, as PyTorch's for-loop Adam: bias corrections in double, folded into the step size and
      // the second moment's divisor.
      const double bc1 = 1 - std::pow(o.beta1, double(s.step)), bc2 = 1 - std::pow(o.beta2, double(s.step));
      const T step_size = T(o.lr / bc1), inv_sqrt_bc2 = T(1 / std::sqrt(bc2)), eps = T(o.eps);
      const double wd = weight_decay(o);
      const T b1 = T(o.beta1), b2 = T(o.beta2), l2 = Decoupled ? T(0) : T(wd);
      const T decay = Decoupled ? T(1 - o.lr * wd) : T(1);
      const T sign = o.maximize ? T(-1) : T(1);
      // One fused pass on the parameter's device writes p, m, v (and vmax), reading each operand once per element
      // through its slot and each hyper-parameter from the pass's table (so g', m and v are computed once):
      // m = b1 m + (1 - b1) g', v = b2 v + (1 - b2) g' g' with g' = ±g + l2 p, then
      // p = decay p - step_size m / (sqrt(v, or vmax = max(vmax, v)) / sqrt(bc2) + eps).
      using expr::param;
      const auto P = expr::slot<0>(p);
      const auto gi = expr::slot<1>(p) * param<0, T>() + P * param<1, T>();
      const auto m1 = expr::slot<2>(p) * param<2, T>() + gi * param<3, T>();
      const auto v1 = expr::slot<3>(p) * param<4, T>() + gi * param<5, T>() * gi;
      const auto update = [&](const auto& vv) {
        return P * param<6, T>() - m1 * param<7, T>() / (sqrt(vv) * param<8, T>() + param<9, T>());
      };
      const expr::Params hp{double(sign), double(l2),        double(b1),    double(T(1 - b1)),     double(b2),
                            double(T(1 - b2)), double(decay), double(step_size), double(inv_sqrt_bc2), double(eps)};
      if (o.amsgrad && s.vmax.defined()) {
        const auto X = expr::slot<4>(p);
        const auto vmax1 = where(X > v1, X, v1);
        ops::assign_multi(std::make_tuple(p, s.m, s.v, s.vmax), std::make_tuple(update(vmax1), m1, v1, vmax1),
                          p.shape(), expr::Slots(std::make_tuple(p, g, s.m, s.v, s.vmax), hp), kName);
      } else {
        ops::assign_multi(std::make_tuple(p, s.m, s.v), std::make_tuple(update(v1), m1, v1), p.shape(),
                          expr::Slots(std::make_tuple(p, g, s.m, s.v), hp), kName);
      }
    }
  }
}

template <class T, bool Decoupled>
EMBER_COLD nn::StateDict BasicAdam<T, Decoupled>::state_dict() const {
  nn::StateDict sd;
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const State& s = state_[i];
    if (!s.m.defined()) continue;
    const std::string pre = "state." + std::to_string(i) + ".";
    sd.emplace(pre + "step", detail::scalar(double(s.step)));
    sd.emplace(pre + "exp_avg", s.m.clone());
    sd.emplace(pre + "exp_avg_sq", s.v.clone());
    if (s.vmax.defined()) sd.emplace(pre + "max_exp_avg_sq", s.vmax.clone());
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const AdamOptions& o = groups_[g].options;
    detail::put_group(sd, g, {{"lr", o.lr}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
                              {"weight_decay", weight_decay(o)}});
  }
  return sd;
}

template <class T, bool Decoupled>
EMBER_COLD std::vector<AdamOptions> BasicAdam<T, Decoupled>::read_state(const nn::StateDict& sd,
                                                                       std::vector<State>* st) const {
  std::vector<AdamOptions> opts;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<double> v = detail::get_group(sd, g, {"lr", "beta1", "beta2", "eps", "weight_decay"}, kName);
    AdamOptions o = groups_[g].options;
    o.lr = v[0];
    o.beta1 = v[1];
    o.beta2 = v[2];
    o.eps = v[3];
    o.weight_decay = v[4];
    check_options(o, (std::string(kName) + "::load_state_dict: param_groups." + std::to_string(g)).c_str());
    opts.push_back(o);
  }
  if (st) st->assign(state_.size(), State{});
  std::size_t k = 0;
  for (const auto& grp : groups_)
    for (const auto& p : grp.params) {
      const std::string pre = "state." + std::to_string(k) + ".";
      State* s = st ? &(*st)[k] : nullptr;
      ++k;
      if (!sd.count(pre + "step")) continue;
      const std::int64_t step = read_count(sd, pre + "step", kName);
      const bool m = detail::load_buffer(sd, pre + "exp_avg", p, s ? &s->m : nullptr, kName);
      const bool v = detail::load_buffer(sd, pre + "exp_avg_sq", p, s ? &s->v : nullptr, kName, /*non_negative=*/true);
      const bool vmax = detail::load_buffer(sd, pre + "max_exp_avg_sq", p, s ? &s->vmax : nullptr, kName,
                                            /*non_negative=*/true);
      EMBER_CHECK(m && v, kName, "::load_state_dict: '", pre, "step' is present but exp_avg / exp_avg_sq are missing");
      EMBER_CHECK(!grp.options.amsgrad || vmax, kName, "::load_state_dict: '", pre,
                  "max_exp_avg_sq' is missing and amsgrad is on");
      if (s) s->step = step;
    }
  return opts;
}

template <class T, bool Decoupled>
EMBER_COLD void BasicAdam<T, Decoupled>::load_state_dict(const nn::StateDict& sd) {
  std::vector<State> st;
  const std::vector<AdamOptions> opts = read_state(sd, &st);
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].options = opts[g];
  state_ = std::move(st);
}

template <class T = float>
class Adam : public BasicAdam<T, false> {
 public:
  using BasicAdam<T, false>::BasicAdam;
};
template <class T = float>
class AdamW : public BasicAdam<T, true> {
 public:
  using BasicAdam<T, true>::BasicAdam;
};
template <class T>
Adam(std::vector<Tensor<T>>, const AdamOptions&) -> Adam<T>;
template <class T>
AdamW(std::vector<Tensor<T>>, const AdamOptions&) -> AdamW<T>;

}  // namespace ember::optim
