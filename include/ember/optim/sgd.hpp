// ember — stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD).
// Each parameter is updated in one fused pass (a multi-output expression, the same on the CPU and on CUDA) that reads
// p, grad and the momentum buffer once and allocates nothing after the first step.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/range.hpp"

namespace ember::optim {

/// The options of optim::SGD (one per parameter group), in torch.optim.SGD's order and with its defaults (its
/// foreach, differentiable and fused are not needed: every update is one fused pass):
///   optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
struct SGDOptions {
  double lr = 1e-3;           ///< the learning rate, in [0, 1e4]
  double momentum = 0.0;      ///< the momentum factor, in [0, 1]; 0: no momentum buffer
  double dampening = 0.0;     ///< scales the gradient added to the momentum buffer by 1 - dampening; in [0, 1]
  double weight_decay = 0.0;  ///< L2 penalty, weight_decay * p added to the gradient; in [0, 1e4]
  bool nesterov = false;      ///< Nesterov momentum; needs momentum > 0 and dampening 0
  bool maximize = false;      ///< ascend: the update uses -grad (maximises the objective)
};

/// Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD),
/// one fused pass per parameter.
template <class T = float>
class SGD final : public Optimizer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "optim::SGD: parameters are float or double (mixed precision keeps fp32 master weights)");

 public:
  using Group = ParamGroup<T, SGDOptions>;  ///< One param group: its parameters and their SGDOptions.

  /// One group of `params` (leaf tensors) with options `o`, as `torch.optim.SGD(params, lr=..., ...)`.
  SGD(std::vector<Tensor<T>> params, const SGDOptions& o) : SGD(std::vector<Group>{{std::move(params), o}}) {}
  /// Several param groups, each with its own options (PyTorch's list of dicts).
  explicit SGD(std::vector<Group> groups);

  void step() override;

  void zero_grad(bool set_to_none = true) override {
    for (auto& g : groups_) detail::zero_grads(g.params, set_to_none);
  }
  /// The number of param groups.
  std::size_t num_groups() const override { return groups_.size(); }
  double& lr(std::size_t g) override { return groups_.at(g).options.lr; }
  double* momentum(std::size_t g) override { return &groups_.at(g).options.momentum; }
  /// The groups and their options, to read or change between steps (PyTorch's `optimizer.param_groups`).
  std::vector<Group>& param_groups() { return groups_; }

  nn::StateDict state_dict() const override;
  void load_state_dict(const nn::StateDict& sd) override;
  void check_state_dict(const nn::StateDict& sd) const override { read_state(sd, nullptr); }

 private:
  // The hyper-parameters' checks (the ranges of optimizer.hpp), for the constructor and for a loaded state (`where`
  // begins the message).
  static void check_options(const SGDOptions& o, const char* where);
  // Checks every entry of `sd` and returns the groups' options; fills `bufs` (one per parameter) when not null.
  std::vector<SGDOptions> read_state(const nn::StateDict& sd, std::vector<Tensor<T>>* bufs) const;

  std::vector<Group> groups_;
  std::vector<Tensor<T>> buf_;  // momentum buffer per parameter, undefined until its first step
};

template <class T>
EMBER_COLD void SGD<T>::check_options(const SGDOptions& o, const char* where) {
  detail::check_lr(where, o.lr);
  detail::check_hyper(where, "momentum", o.momentum, 0, 1, "[0, 1]");
  detail::check_hyper(where, "dampening", o.dampening, 0, 1, "[0, 1]");
  detail::check_hyper(where, "weight_decay", o.weight_decay, 0, kMaxWeightDecay, "[0, 1e4]");
  EMBER_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), where,
              ": Nesterov momentum requires a momentum and zero dampening");
}

template <class T>
EMBER_COLD SGD<T>::SGD(std::vector<Group> groups) : groups_(std::move(groups)) {
  for (auto& g : groups_) {
    check_options(g.options, "optim::SGD");
    for (auto& p : g.params) {
      EMBER_CHECK(p.defined() && p.is_leaf(), "optim::SGD: can only optimize leaf tensors");
      buf_.emplace_back();
    }
  }
}

template <class T>
void SGD<T>::step() {
  EMBER_PROFILE_RANGE_CAT("SGD.step", "optimizer");
  NoGradGuard ng;
  std::size_t k = 0;
  for (auto& grp : groups_) {
    const SGDOptions& o = grp.options;
    for (auto& p : grp.params) {
      Tensor<T>& buf = buf_[k++];
      if (!p.has_meta() || !p.grad().defined()) continue;
      const Tensor<T> g = detail::checked_grad(p, "optim::SGD");
#if !EMBER_CUDA_EXECUTOR
      if (p.device().is_cuda()) detail::no_cuda_update("optim::SGD", p.device());
#endif
      const bool first = !buf.defined();
      if (o.momentum != 0 && first) buf = empty<T>(p.shape(), p.device());
      detail::check_state_device(p, buf, "optim::SGD", "momentum_buffer");
      // One fused pass on the parameter's device, each operand read once per element through its slot and each
      // hyper-parameter from the pass's table: d = ±g + wd p; with momentum buf = d on the first step, else
      // mom buf + (1 - dampening) d, and d = d + mom buf (Nesterov) or buf; then p -= lr d. In T, as PyTorch's
      // for-loop SGD.
      const T lr = T(o.lr), wd = T(o.weight_decay), mom = T(o.momentum), damp = T(1 - o.dampening);
      const T sign = o.maximize ? T(-1) : T(1);
      const expr::Params hp{double(sign), double(wd), double(mom), double(damp), double(lr)};
      using expr::param;
      const auto P = expr::slot<0>(p);
      const auto d = expr::slot<1>(p) * param<0, T>() + P * param<1, T>();
      const auto mom_ = param<2, T>();
      const auto lr_ = param<4, T>();
      const char* op = "optim::SGD";
      if (o.momentum == 0) {
        ops::assign_multi(std::make_tuple(p), std::make_tuple(P - d * lr_), p.shape(),
                          expr::Slots(std::make_tuple(p, g), hp), op);
      } else if (first) {  // buf = d
        const auto slots = expr::Slots(std::make_tuple(p, g), hp);
        if (o.nesterov)
          ops::assign_multi(std::make_tuple(p, buf), std::make_tuple(P - (d + d * mom_) * lr_, d), p.shape(), slots, op);
        else
          ops::assign_multi(std::make_tuple(p, buf), std::make_tuple(P - d * lr_, d), p.shape(), slots, op);
      } else {
        const auto b = expr::slot<2>(p) * mom_ + d * param<3, T>();
        const auto slots = expr::Slots(std::make_tuple(p, g, buf), hp);
        if (o.nesterov)
          ops::assign_multi(std::make_tuple(p, buf), std::make_tuple(P - (d + b * mom_) * lr_, b), p.shape(), slots, op);
        else
          ops::assign_multi(std::make_tuple(p, buf), std::make_tuple(P - b * lr_, b), p.shape(), slots, op);
      }
    }
  }
}

template <class T>
EMBER_COLD nn::StateDict SGD<T>::state_dict() const {
  nn::StateDict sd;
  for (std::size_t i = 0; i < buf_.size(); ++i)
    if (buf_[i].defined()) sd.emplace("state." + std::to_string(i) + ".momentum_buffer", buf_[i].clone());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SGDOptions& o = groups_[g].options;
    detail::put_group(sd, g, {{"lr", o.lr}, {"momentum", o.momentum}, {"dampening", o.dampening},
                              {"weight_decay", o.weight_decay}});
  }
  return sd;
}

template <class T>
EMBER_COLD std::vector<SGDOptions> SGD<T>::read_state(const nn::StateDict& sd, std::vector<Tensor<T>>* bufs) const {
  std::vector<SGDOptions> opts;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::vector<double> v =
        detail::get_group(sd, g, {"lr", "momentum", "dampening", "weight_decay"}, "optim::SGD");
    SGDOptions o = groups_[g].options;
    o.lr = v[0];
    o.momentum = v[1];
    o.dampening = v[2];
    o.weight_decay = v[3];
    check_options(o, ("optim::SGD::load_state_dict: param_groups." + std::to_string(g)).c_str());
    opts.push_back(o);
  }
  if (bufs) bufs->assign(buf_.size(), Tensor<T>());
  std::size_t k = 0;
  for (const auto& grp : groups_)
    for (const auto& p : grp.params) {
      detail::load_buffer(sd, "state." + std::to_string(k) + ".momentum_buffer", p, bufs ? &(*bufs)[k] : nullptr,
                          "optim::SGD");
      ++k;
    }
  return opts;
}

template <class T>
EMBER_COLD void SGD<T>::load_state_dict(const nn::StateDict& sd) {
  std::vector<Tensor<T>> bufs;
  const std::vector<SGDOptions> opts = read_state(sd, &bufs);
  for (std::size_t g = 0; g < groups_.size(); ++g) groups_[g].options = opts[g];
  buf_ = std::move(bufs);
}

}  // namespace ember::optim
