// ember — loss functions (torch.nn.functional's) and loss modules (torch.nn's).
///
/// Which activation goes with which loss:
///
/// | the model ends in            | use                                | never                               |
/// |------------------------------|------------------------------------|-------------------------------------|
/// | raw logits, one class of C   | `cross_entropy(logits, target)`    | softmax or log_softmax before it    |
/// | `log_softmax(logits, 1)`     | `nll_loss(log_probs, target)`      | raw logits or probabilities         |
/// | raw logits, independent 0/1  | `binary_cross_entropy_with_logits` | sigmoid before it                   |
/// | a value (regression)         | `mse_loss`, `l1_loss`, `smooth_l1_loss`, `huber_loss`                    |
///
/// cross_entropy = nll_loss(log_softmax(logits, 1)), fused: one pass forward, one backward (softmax - smoothed
/// one-hot), stable for logits of any scale. Their kernels are ops/loss.hpp's, on the CPU and on CUDA (in a
/// translation unit compiled by nvcc), computing in fp32 inside for bf16/fp16 inputs. nll_loss checks, in builds without NDEBUG (or with
/// EMBER_DEBUG_CHECKS=1, or after nn::set_debug_checks(true)), that its input really holds log-probabilities: no
/// entry above 0 and exp of each row summing to 1; raw logits or probabilities passed by mistake then fail loudly
/// instead of training badly. Target classes outside [0, C) (other than ignore_index) are always an error.
///
/// Class-indexed losses take input (N, C), (N, C, d1, ...) or (C) and target (N), (N, d1, ...) or () with int64
/// class indices. Weighted means divide by the sum of the weights of the non-ignored targets, as PyTorch does; a
/// batch whose targets are all ignore_index therefore gives 0/0 = NaN under Reduction::Mean (and zero gradients),
/// exactly as PyTorch 1.13 does. Sum gives 0 and None gives zeros there. Class weights are constants (no gradient).
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/autograd/softmax.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/loss.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/detail/fastmath.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/loss.hpp"
#include "ember/ops/softmax.hpp"

/// EMBER_DEBUG_CHECKS: 1 turns on the debug checks of the losses (nll_loss's log-probability check); the default
/// is on unless NDEBUG is defined. The value is baked into the instantiation (a template argument), so translation
/// units built with different settings do not clash.
#ifndef EMBER_DEBUG_CHECKS
#ifdef NDEBUG
#define EMBER_DEBUG_CHECKS 0
#else
#define EMBER_DEBUG_CHECKS 1
#endif
#endif

namespace ember::nn {

/// How a loss reduces its per-element values: keep them (None), average (Mean) or add (Sum).
using Reduction = ops::Reduction;

/// The options of cross_entropy and nn::CrossEntropyLoss after (input, target), F.cross_entropy's with its defaults
/// (in its order but for label_smoothing, which comes before reduction here; the deprecated size_average and reduce
/// are not supported):
///   auto l = nn::cross_entropy(logits, target, {.ignore_index = 0, .label_smoothing = 0.1});
template <class T>
struct CrossEntropyOptions {
  /// (C) class weights, on the input's device, constants (no gradient); undefined: every class weighs 1.
  Tensor<T> weight;
  /// Targets equal to it contribute nothing (nor to Mean's divisor); any value, usually negative. With
  /// class-probability targets it must stay negative (unused), as PyTorch.
  std::int64_t ignore_index = -100;
  double label_smoothing = 0.0;  ///< in [0, 1]: the target is (1 - ε) one_hot + ε / C; 0: none
  /// None: the per-position losses, the target's shape; Mean: their sum over the sum of the non-ignored targets'
  /// weights (PyTorch's reduction="mean"); Sum: their sum.
  Reduction reduction = Reduction::Mean;
};

/// The options of nll_loss and nn::NLLLoss after (input, target), F.nll_loss's, in its order and with its defaults
/// (the deprecated size_average and reduce are not supported):
///   auto l = nn::nll_loss(log_softmax(logits, 1), target, {.reduction = nn::Reduction::Sum});
template <class T>
struct NllLossOptions {
  Tensor<T> weight;  ///< (C) class weights, on the input's device, constants; undefined: every class weighs 1
  std::int64_t ignore_index = -100;  ///< targets equal to it contribute nothing (nor to Mean's divisor)
  /// None: the per-position losses; Mean: their sum over the sum of the non-ignored targets' weights; Sum: their sum.
  Reduction reduction = Reduction::Mean;
};

/// The options of binary_cross_entropy_with_logits and nn::BCEWithLogitsLoss after (input, target), F's with its
/// defaults (not in its order: pos_weight comes before reduction here; size_average and reduce are not supported):
///   auto l = nn::binary_cross_entropy_with_logits(logits, target, {.pos_weight = pw});
template <class T>
struct BceWithLogitsOptions {
  Tensor<T> weight;  ///< broadcast to the input: each element's loss is multiplied by it; undefined: 1
  /// Broadcast to the input (usually (C), one per class): the weight of the positive (y = 1) term, > 1 to favour
  /// recall; undefined: 1.
  Tensor<T> pos_weight;
  Reduction reduction = Reduction::Mean;  ///< None: the per-element losses; Mean: their average; Sum: their sum
};

/// Turns the debug checks on or off at run time for every translation unit (they are also on wherever
/// EMBER_DEBUG_CHECKS is 1).
inline std::atomic<bool>& debug_checks_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline void set_debug_checks(bool on) { debug_checks_flag().store(on); }

namespace detail {

using i64 = std::int64_t;

using ops::reduction_name;

template <class T, class E>
Tensor<T> reduce_loss(const E& e, Reduction r) {
  switch (r) {
    case Reduction::None: return Tensor<T>(e);
    case Reduction::Sum: return sum(e);
    default: return mean(e);
  }
}

template <class T>
void check_same_shape(const Tensor<T>& input, const Tensor<T>& target, const char* op) {
  EMBER_CHECK(input.defined() && target.defined(), op, ": input and target must be defined");
  EMBER_CHECK(input.shape() == target.shape(), op, ": target of shape ", target.shape().str(),
              " does not match the input of shape ", input.shape().str(),
              " (broadcasting a loss silently is a common bug: reshape one of them)");
}

// ---- class-indexed losses: the kernels are ops/loss.hpp's; these nodes put them on the graph ----------------

template <class T>
struct ClassLossNode final : autograd::TypedNode<T> {
  bool ce = true;                // cross_entropy, else nll_loss
  autograd::Saved<T> input;      // cross_entropy: the scores as its kernel read them (version-checked)
  ops::ClassLossSaved<T> saved;  // the rest (saved.input is moved into `input`)
  ops::ClassLossOptions options;
  const char* name() const override { return ce ? "CrossEntropyBackward" : "NllLossBackward"; }
  void release() override {
    input = autograd::Saved<T>();
    saved = ops::ClassLossSaved<T>();
  }
  void backward() override {
    if (!ce) {
      this->template deliver<T>(0, ops::nll_loss_backward(this->grad, saved, options));
      return;
    }
    ops::ClassLossSaved<T> s = saved;
    s.input = input.get(name());
    this->template deliver<T>(0, ops::cross_entropy_backward(this->grad, s, options));
  }
};

template <class T>
Tensor<T> class_loss_graph(ops::ClassLossResult<T> r, const Tensor<T>& input, bool ce,
                           const ops::ClassLossOptions& o) {
  if (!(is_grad_enabled() && input.requires_grad())) return std::move(r.loss);
  auto node = std::make_shared<ClassLossNode<T>>();
  node->next = {autograd::gradient_edge(input)};
  node->ce = ce;
  if (ce) node->input = autograd::Saved<T>(r.saved.input);
  r.saved.input = Tensor<T>();
  node->saved = std::move(r.saved);
  node->options = o;
  node->output = r.loss.impl_ptr();
  autograd::set_history<T>(r.loss, node);
  return std::move(r.loss);
}

}  // namespace detail

// ---- class-indexed losses ---------------------------------------------------------------------------------------

/// F.cross_entropy with class-index targets: log_softmax over dim 1 (dim 0 for a (C) input) and the negative
/// log-likelihood, fused and stable for any logit scale. With label_smoothing ε the target distribution is
/// (1 - ε) one_hot + ε / C; with class weights w the loss of position i is
/// (1 - ε) w[t_i] (-log p[t_i]) + (ε / C) Σ_c w_c (-log p_c), and Mean divides the sum by Σ_i w[t_i] over
/// non-ignored positions (PyTorch 1.13's definition). logits: (N, C), (N, C, d1, ...) or (C); target: (N),
/// (N, d1, ...) or () int64 class indices.
template <class T>
Tensor<T> cross_entropy(const Tensor<T>& logits, const Tensor<std::int64_t>& target,
                        const CrossEntropyOptions<std::type_identity_t<T>>& o = {}) {
  const ops::ClassLossOptions so{o.ignore_index, o.label_smoothing, o.reduction};
  return detail::class_loss_graph(ops::cross_entropy_forward(logits, target, o.weight, so), logits, true, so);
}

/// F.cross_entropy with class-probability targets ("soft labels"): target has the input's shape and holds, along
/// the class dim (1, or 0 for a (C) input), a distribution over the C classes. With label_smoothing ε the target
/// becomes q = (1 - ε) target + ε / C; with class weights w the loss of position i is -Σ_c w_c q_ic log p_ic, and
/// Mean divides the sum by the number of positions (N * d1 * ..., not by a sum of weights), as PyTorch.
/// Differentiable in the logits and in the target; ignore_index is not supported here (as PyTorch: it must stay
/// negative). An empty batch gives NaN under Mean.
template <class T>
Tensor<T> cross_entropy(const Tensor<T>& logits, const Tensor<T>& target,
                        const CrossEntropyOptions<std::type_identity_t<T>>& o = {}) {
  static_assert(is_floating_v<T>, "cross_entropy: logits and class-probability targets must be floating-point");
  using detail::i64;
  EMBER_CHECK(logits.defined() && target.defined(), "cross_entropy: input and target must be defined");
  EMBER_CHECK(logits.dim() >= 1, "cross_entropy: expected an input of shape (N, C), (N, C, d1, ...) or (C), got a "
              "0-d tensor");
  EMBER_CHECK(target.shape() == logits.shape(), "cross_entropy: class-probability target of shape ",
              target.shape().str(), " does not match the input of shape ", logits.shape().str(),
              " (a floating-point target holds one probability per class, so it has the input's shape; class "
              "indices are an int64 tensor of the input's shape without the class dim)");
  EMBER_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], "
              "got ", o.label_smoothing);
  EMBER_CHECK(o.ignore_index < 0, "cross_entropy: ignore_index ", o.ignore_index, " is not supported with "
              "class-probability targets (target of shape ", target.shape().str(), "), as in PyTorch; leave it "
              "negative (the default is -100)");
  const int cdim = logits.dim() == 1 ? 0 : 1;
  const i64 C = logits.size(cdim);
  EMBER_CHECK(!o.weight.defined() || (o.weight.dim() == 1 && o.weight.numel() == C), "cross_entropy: weight of "
              "shape ", o.weight.shape().str(), " does not match ", C, " classes (input of shape ",
              logits.shape().str(), "; expected weight of shape [", C, "])");
  i64 positions = 1;  // N * d1 * ...: the divisor of Mean
  for (int d = 0; d < logits.dim(); ++d)
    if (d != cdim) positions *= logits.size(d);
  const Tensor<T> logp = log_softmax(logits, cdim);
  Tensor<T> wb;  // the weights as (C, 1, ..., 1), broadcasting over the trailing dims; constants
  if (o.weight.defined()) {
    Shape ws{C};
    for (int d = cdim + 1; d < logits.dim(); ++d) ws.push_back(1);
    wb = o.weight.detach().contiguous().view(ws);
  }
  // prod = log p * q (* w): the loss is minus its sum over the class dim (None) or over everything.
  auto finish = [&](const auto& prod) -> Tensor<T> {
    switch (o.reduction) {
      case Reduction::None: return Tensor<T>(-sum(prod, cdim));
      case Reduction::Sum: return Tensor<T>(-sum(prod));
      default: return Tensor<T>(sum(prod) / T(-double(positions)));  // 0 / -0 = NaN for an empty batch
    }
  };
  auto with_q = [&](const auto& q) -> Tensor<T> {
    if (wb.defined()) return finish(logp * q * wb);
    return finish(logp * q);
  };
  const double eps = o.label_smoothing;
  if (eps > 0) return with_q(target * T(1 - eps) + T(eps / double(C)));
  return with_q(target);
}

/// F.nll_loss: the negative log-likelihood of the target classes, given LOG-PROBABILITIES (log_softmax(x, 1)).
/// loss_i = -w[t_i] log_probs[i, t_i]; Mean divides by Σ_i w[t_i] over non-ignored positions. Shapes as
/// cross_entropy. Debug builds check the input is log-probabilities (see the top of this header).
template <class T, bool DebugChecks = (EMBER_DEBUG_CHECKS != 0)>
Tensor<T> nll_loss(const Tensor<T>& log_probs, const Tensor<std::int64_t>& target,
                   const NllLossOptions<std::type_identity_t<T>>& o = {}) {
  const ops::ClassLossOptions so{o.ignore_index, 0.0, o.reduction};
  ops::ClassLossResult<T> r = ops::nll_loss_forward(log_probs, target, o.weight, so);
  if (DebugChecks || debug_checks_flag().load(std::memory_order_relaxed)) {
    // On the host: a debug build pays a copy of a CUDA input here.
    const Tensor<T> x = log_probs.detach().contiguous().cpu();
    const Tensor<std::int64_t> t = r.saved.target.cpu();
    const ops::ClassGeom& g = r.saved.geom;
    cpu::check_log_probs(x.data(), t.data(), g.positions(), g.C, g.D, o.ignore_index, g.in);
  }
  return detail::class_loss_graph(std::move(r), log_probs, false, so);
}

// ---- element-wise losses: fused expressions (one pass forward, one fused backward) -----------------------------

/// Mean squared error: reduce((input - target)²). Shapes must match.
template <class T>
Tensor<T> mse_loss(const Tensor<T>& input, const Tensor<T>& target, Reduction r = Reduction::Mean) {
  detail::check_same_shape(input, target, "mse_loss");
  return detail::reduce_loss<T>(square(input - target), r);
}

/// Mean absolute error: reduce(|input - target|) (gradient 0 where they are equal, as PyTorch).
template <class T>
Tensor<T> l1_loss(const Tensor<T>& input, const Tensor<T>& target, Reduction r = Reduction::Mean) {
  detail::check_same_shape(input, target, "l1_loss");
  return detail::reduce_loss<T>(abs(input - target), r);
}

/// Smooth L1: 0.5 d² / beta where |d| < beta, else |d| - 0.5 beta (d = input - target; beta = 0 is l1_loss).
template <class T>
Tensor<T> smooth_l1_loss(const Tensor<T>& input, const Tensor<T>& target, Reduction r = Reduction::Mean,
                         double beta = 1.0) {
  detail::check_same_shape(input, target, "smooth_l1_loss");
  EMBER_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  return detail::reduce_loss<T>(expr::make_unary(ops_table::SmoothL1{beta}, input - target), r);
}

/// Huber: 0.5 d² where |d| < delta, else delta (|d| - 0.5 delta). Equals delta * smooth_l1_loss(beta = delta).
template <class T>
Tensor<T> huber_loss(const Tensor<T>& input, const Tensor<T>& target, Reduction r = Reduction::Mean,
                     double delta = 1.0) {
  detail::check_same_shape(input, target, "huber_loss");
  EMBER_CHECK(delta > 0, "huber_loss: delta must be positive, got ", delta);
  return detail::reduce_loss<T>(expr::make_unary(ops_table::Huber{delta}, input - target), r);
}

/// Binary cross-entropy on logits (sigmoid fused in), stable for any logit: softplus(x) - x y, with the functor
/// table's softplus (log1p(exp(x)), x itself above 20 as PyTorch's softplus; PyTorch's loss uses the form
/// max(x, 0) + log1p(exp(-|x|)), which rounds differently: by at most an ulp in float, and above 20 it adds exp(-x),
/// 2e-9 at most). With pos_weight p: (1 - y) x + (1 + (p - 1) y) softplus(-x), as PyTorch. weight rescales each
/// element.
/// target has the input's shape (values in [0, 1]); weight and pos_weight broadcast to it.
template <class T>
Tensor<T> binary_cross_entropy_with_logits(const Tensor<T>& logits, const Tensor<T>& target,
                                           const BceWithLogitsOptions<std::type_identity_t<T>>& o = {}) {
  static_assert(is_floating_v<T>, "binary_cross_entropy_with_logits: needs floating-point tensors");
  detail::check_same_shape(logits, target, "binary_cross_entropy_with_logits");
  auto bcast_ok = [&](const Tensor<T>& t, const char* what) {
    if (!t.defined()) return;
    bool ok = t.dim() <= logits.dim();
    if (ok) ok = broadcast_shapes(t.shape(), logits.shape(), "binary_cross_entropy_with_logits") == logits.shape();
    EMBER_CHECK(ok, "binary_cross_entropy_with_logits: ", what, " of shape ", t.shape().str(),
                " does not broadcast to the input of shape ", logits.shape().str());
  };
  bcast_ok(o.weight, "weight");
  bcast_ok(o.pos_weight, "pos_weight");
  const Tensor<T>& x = logits;
  const Tensor<T>& y = target;
  auto sp = [](auto&& e) { return expr::make_unary(ops_table::Softplus{}, std::forward<decltype(e)>(e)); };
  if (o.pos_weight.defined()) {
    const Tensor<T>& pw = o.pos_weight;
    auto l = (1 - y) * x + (1 + (pw - 1) * y) * sp(-x);
    if (o.weight.defined()) return detail::reduce_loss<T>(o.weight * l, o.reduction);
    return detail::reduce_loss<T>(l, o.reduction);
  }
  auto l = sp(x) - x * y;
  if (o.weight.defined()) return detail::reduce_loss<T>(o.weight * l, o.reduction);
  return detail::reduce_loss<T>(l, o.reduction);
}

// ---- loss modules (no parameters: plain callables holding their options) ------------------------------------------

/// nn::CrossEntropyLoss: `nn::CrossEntropyLoss loss({.label_smoothing = 0.1}); auto l = loss(logits, target);`
template <class T = float>
struct CrossEntropyLoss {
  CrossEntropyOptions<T> options;  ///< The weight, ignore_index, reduction and label_smoothing of every call.
  CrossEntropyLoss() = default;
  /// nn.CrossEntropyLoss(weight=..., ignore_index=..., reduction=..., label_smoothing=...).
  explicit CrossEntropyLoss(CrossEntropyOptions<T> o) : options(std::move(o)) {}
  /// cross_entropy(logits, target, options): logits (N, C) or (N, C, d1, ...), class indices (N) or (N, d1, ...).
  Tensor<T> operator()(const Tensor<T>& logits, const Tensor<std::int64_t>& target) const {
    return cross_entropy(logits, target, options);
  }
  /// Class-probability targets (the input's shape).
  Tensor<T> operator()(const Tensor<T>& logits, const Tensor<T>& target) const {
    return cross_entropy(logits, target, options);
  }
};

/// nn::NLLLoss: use after log_softmax(x, 1).
template <class T = float>
struct NLLLoss {
  NllLossOptions<T> options;  ///< The weight, ignore_index and reduction of every call.
  NLLLoss() = default;
  /// nn.NLLLoss(weight=..., ignore_index=..., reduction=...).
  explicit NLLLoss(NllLossOptions<T> o) : options(std::move(o)) {}
  /// nll_loss(log_probs, target, options): log-probabilities (N, C) or (N, C, d1, ...), class indices (N) or
  /// (N, d1, ...). DebugChecks also checks that the input is log-probabilities (on by default in debug builds).
  template <bool DebugChecks = (EMBER_DEBUG_CHECKS != 0)>
  Tensor<T> operator()(const Tensor<T>& log_probs, const Tensor<std::int64_t>& target) const {
    return nll_loss<T, DebugChecks>(log_probs, target, options);
  }
};

/// nn::BCEWithLogitsLoss: takes raw logits (no sigmoid before it).
template <class T = float>
struct BCEWithLogitsLoss {
  BceWithLogitsOptions<T> options;  ///< The weight, reduction and pos_weight of every call.
  BCEWithLogitsLoss() = default;
  /// nn.BCEWithLogitsLoss(weight=..., reduction=..., pos_weight=...).
  explicit BCEWithLogitsLoss(BceWithLogitsOptions<T> o) : options(std::move(o)) {}
  /// binary_cross_entropy_with_logits(logits, target, options): target has the logits' shape, values in [0, 1].
  Tensor<T> operator()(const Tensor<T>& logits, const Tensor<T>& target) const {
    return binary_cross_entropy_with_logits(logits, target, options);
  }
};

/// nn::MSELoss.
struct MSELoss {
  Reduction reduction = Reduction::Mean;  ///< Mean (the default), Sum or None, as PyTorch's reduction.
  MSELoss() = default;
  /// nn.MSELoss(reduction=r).
  explicit MSELoss(Reduction r) : reduction(r) {}
  /// mse_loss(input, target, reduction): the squared error, target of the input's shape.
  template <class T>
  Tensor<T> operator()(const Tensor<T>& input, const Tensor<T>& target) const {
    return mse_loss(input, target, reduction);
  }
};

/// nn::L1Loss.
struct L1Loss {
  Reduction reduction = Reduction::Mean;  ///< Mean (the default), Sum or None, as PyTorch's reduction.
  L1Loss() = default;
  /// nn.L1Loss(reduction=r).
  explicit L1Loss(Reduction r) : reduction(r) {}
  /// l1_loss(input, target, reduction): the absolute error, target of the input's shape.
  template <class T>
  Tensor<T> operator()(const Tensor<T>& input, const Tensor<T>& target) const {
    return l1_loss(input, target, reduction);
  }
};

/// nn::SmoothL1Loss.
struct SmoothL1Loss {
  Reduction reduction = Reduction::Mean;  ///< Mean (the default), Sum or None, as PyTorch's reduction.
  double beta = 1.0;  ///< Where the loss turns from quadratic (0.5 x^2 / beta) to linear (|x| - 0.5 beta), >= 0.
  SmoothL1Loss() = default;
  /// nn.SmoothL1Loss(reduction=r, beta=b).
  explicit SmoothL1Loss(Reduction r, double b = 1.0) : reduction(r), beta(b) {}
  /// smooth_l1_loss(input, target, reduction, beta).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& input, const Tensor<T>& target) const {
    return smooth_l1_loss(input, target, reduction, beta);
  }
};

/// nn::HuberLoss.
struct HuberLoss {
  Reduction reduction = Reduction::Mean;  ///< Mean (the default), Sum or None, as PyTorch's reduction.
  double delta = 1.0;  ///< Where the loss turns from quadratic (0.5 x^2) to linear (delta (|x| - 0.5 delta)), > 0.
  HuberLoss() = default;
  /// nn.HuberLoss(reduction=r, delta=d).
  explicit HuberLoss(Reduction r, double d = 1.0) : reduction(r), delta(d) {}
  /// huber_loss(input, target, reduction, delta).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& input, const Tensor<T>& target) const {
    return huber_loss(input, target, reduction, delta);
  }
};

}  // namespace ember::nn
