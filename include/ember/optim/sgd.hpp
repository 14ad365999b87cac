// ember — stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD).
// Each parameter is updated in one fused, threaded pass that reads p, grad and the momentum buffer once and
// allocates nothing after the first step.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/range.hpp"

namespace ember::optim {

namespace detail {
/// One run of SGD's update, p[i] -= lr * d with d the (momentum, Nesterov) step of grad g: the options are
/// template parameters and the pointers restrict, so the loop vectorises.
template <class T, bool Momentum, bool First, bool Nesterov>
EMBER_VECTORIZE void sgd_run(T* EMBER_RESTRICT p, const T* EMBER_RESTRICT g, T* EMBER_RESTRICT buf, std::int64_t n,
                             T lr, T wd, T mom, T damp, T sign) {
  for (std::int64_t i = 0; i < n; ++i) {
    T d = sign * g[i] + wd * p[i];
    if constexpr (Momentum) {
      const T b = First ? d : mom * buf[i] + damp * d;
      buf[i] = b;
      d = Nesterov ? d + mom * b : b;
    }
    p[i] -= lr * d;
  }
}
}  // namespace detail

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

template <class T = float>
class SGD final : public Optimizer {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "optim::SGD: parameters are float or double (mixed precision keeps fp32 master weights)");

 public:
  using Group = ParamGroup<T, SGDOptions>;

  SGD(std::vector<Tensor<T>> params, const SGDOptions& o) : SGD(std::vector<Group>{{std::move(params), o}}) {}
  explicit SGD(std::vector<Group> groups);

  void step() override;

  void zero_grad(bool set_to_none = true) override {
    for (auto& g : groups_) detail::zero_grads(g.params, set_to_none);
  }
  std::size_t num_groups() const override { return groups_.size(); }
  double& lr(std::size_t g) override { return groups_.at(g).options.lr; }
  double* momentum(std::size_t g) override { return &groups_.at(g).options.momentum; }
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
      if (p.device().is_cuda()) {
        // The same update as fused expressions (one pass per written tensor) through the CUDA executor.
#if EMBER_CUDA_EXECUTOR
        const double sg = o.maximize ? -1.0 : 1.0;
        const auto d = g * sg + p * o.weight_decay;
        if (o.momentum != 0) {
          if (first) buf = d;
          else buf = buf * o.momentum + d * (1 - o.dampening);
          if (o.nesterov) p -= (d + buf * o.momentum) * o.lr;
          else p -= buf * o.lr;
        } else {
          p -= d * o.lr;
        }
        continue;
#endif
      }
      const T lr = T(o.lr), wd = T(o.weight_decay), mom = T(o.momentum), damp = T(1 - o.dampening);
      const T sign = o.maximize ? T(-1) : T(1);
      T* pp = p.data();
      const T* gp = g.data();
      T* bp = buf.defined() ? buf.data() : nullptr;
      // The branches resolved once per parameter, so the loop vectorises (detail::sgd_run).
      auto run = [&](auto mom_c, auto first_c, auto nesterov_c) {
        cpu::parallel_for(0, p.numel(), 1 << 15, [=](std::int64_t i0, std::int64_t i1) {
          detail::sgd_run<T, decltype(mom_c)::value, decltype(first_c)::value, decltype(nesterov_c)::value>(
              pp + i0, gp + i0, bp ? bp + i0 : nullptr, i1 - i0, lr, wd, mom, damp, sign);
        });
      };
      using Y = std::true_type;
      using N = std::false_type;
      if (o.momentum == 0) run(N{}, N{}, N{});
      else if (first) o.nesterov ? run(Y{}, Y{}, Y{}) : run(Y{}, Y{}, N{});
      else o.nesterov ? run(Y{}, N{}, Y{}) : run(Y{}, N{}, N{});
      p.bump_version();
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
