// ember — the class-index losses, forward and backward, without autograd (nn/loss.hpp adds the graph):
// cross_entropy (log_softmax and the negative log-likelihood fused, with class weights, ignore_index and label
// smoothing) and nll_loss. One dispatch per call: CPU tensors run the threaded row kernels of cpu/loss.hpp; CUDA
// tensors run cuda/loss.cuh when the translation unit is compiled by nvcc (like the element-wise executor).
//
// Every input type computes in fp32 inside (double for double): per-position max and log Σ exp in compute_t<T>,
// per-position losses and their reduction in double on the CPU, in compute_t<T> with a double block sum on CUDA;
// the result is rounded once into T. A target outside [0, C) that is not ignore_index is an ember::Error naming
// the position on both devices (on CUDA it costs one 8-byte copy to the host per forward).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/loss.hpp"
#include "ember/ops/softmax.hpp"
#include "ember/profile/range.hpp"

#if EMBER_WITH_CUDA && defined(__CUDACC__)
#include "ember/cuda/loss.cuh"
#define EMBER_CUDA_LOSS 1
#else
#define EMBER_CUDA_LOSS 0
#endif

namespace ember::ops {

/// How a loss reduces its per-element values: keep them (None), average (Mean) or add (Sum).
enum class Reduction { None, Mean, Sum };

inline const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean";
}

/// The scalar options of a class-index loss kernel (the class weights are a tensor argument), the fields of
/// nn::CrossEntropyOptions and nn::NllLossOptions that the kernels read, with PyTorch's defaults:
///   auto r = ops::cross_entropy_forward(logits, target, weight, {.ignore_index = -1, .label_smoothing = 0.1});
struct ClassLossOptions {
  std::int64_t ignore_index = -100;  ///< targets equal to it contribute nothing (nor to Mean's divisor)
  double label_smoothing = 0.0;      ///< cross_entropy only: in [0, 1]; 0: none (nll_loss takes 0)
  /// None: the per-position losses; Mean: their sum over Σ w[t] of the non-ignored positions; Sum: their sum.
  Reduction reduction = Reduction::Mean;
};

/// input (N, C, d1, ...) or (C), target (N, d1, ...) or (): P = N * D positions, D = d1 * ...; the score of class
/// c at position (n, k) is element (n * C + c) * D + k of the contiguous input.
struct ClassGeom {
  ///@{
  /// The batch, the classes and the positions per sample (d1 * ...).
  std::int64_t N = 1, C = 1, D = 1;
  ///@}
  ///@{
  /// The input's shape and the unreduced loss's (= the target's).
  Shape in, out;  // the input's shape; the unreduced loss's (= the target's)
  ///@}
  /// The positions P = N * D.
  std::int64_t positions() const { return N * D; }
};

/// What a forward keeps for its backward.
template <class T>
struct ClassLossSaved {
  using C = compute_t<T>;  ///< The statistics' type (float for half and bfloat16).
  ClassGeom geom;          ///< The geometry.
  Tensor<T> input;           ///< cross_entropy: the scores as the kernel read them ((P, C) rows on the CPU,
                             ///< the contiguous input on CUDA); undefined for nll_loss
  Tensor<std::int64_t> target;  ///< contiguous
  Tensor<T> weight;          ///< contiguous (C), or undefined
  Tensor<C> stats;           ///< cross_entropy: (P, 2) per position max and log Σ exp(x - max)
  Tensor<C> total_weight;    ///< 0-d: Σ w[t] over the non-ignored positions (the divisor of Mean)
  /// Where the saved tensors are.
  Device device() const { return target.device(); }
};

/// What a class-indexed loss's forward returns: the loss and what its backward needs.
template <class T>
struct ClassLossResult {
  Tensor<T> loss;  ///< reduced (0-d) or per position (the target's shape)
  ClassLossSaved<T> saved;  ///< for the backward
};

namespace detail {

using i64 = std::int64_t;

[[noreturn, gnu::cold, gnu::noinline]] inline void no_cuda_loss(const char* op, Device d) {
  throw Error(::ember::detail::concat(
      op, ": got tensors on ", d.str(), ", but this translation unit was not compiled by nvcc; the loss kernels "
      "for CUDA tensors are instantiated in the user's own translation unit, so compile it with nvcc (a .cu file) "
      "and link ember::cuda"));
}

template <class T>
ClassGeom class_geom(const Tensor<T>& input, const Tensor<i64>& target, const Tensor<T>& weight, const char* op) {
  EMBER_CHECK(input.defined() && target.defined(), op, ": input and target must be defined");
  EMBER_CHECK(target.device() == input.device(), op, ": the target is on ", target.device().str(),
              " but the input is on ", input.device().str(), " (move both to one device)");
  EMBER_CHECK(!weight.defined() || weight.device() == input.device(), op, ": the class weights are on ",
              weight.device().str(), " but the input is on ", input.device().str());
  const Shape& is = input.shape();
  ClassGeom g;
  g.in = is;
  EMBER_CHECK(is.n >= 1, op, ": expected an input of shape (N, C), (N, C, d1, ...) or (C), got a 0-d tensor");
  Shape expect;
  if (is.n == 1) {
    g.C = is[0];
  } else {
    g.N = is[0];
    g.C = is[1];
    expect.push_back(is[0]);
    for (int i = 2; i < is.n; ++i) {
      expect.push_back(is[i]);
      g.D *= is[i];
    }
  }
  EMBER_CHECK(target.shape() == expect, op, ": target of shape ", target.shape().str(),
              " does not match the input of shape ", is.str(), " (expected a target of shape ", expect.str(),
              is.n >= 2 ? ": the input without its class dim 1)" : ": a 0-d class index for a (C) input)");
  EMBER_CHECK(!weight.defined() || (weight.dim() == 1 && weight.numel() == g.C), op, ": weight of shape ",
              weight.shape().str(), " does not match ", g.C, " classes (input of shape ", is.str(),
              "; expected weight of shape [", g.C, "])");
  g.out = expect;
  return g;
}

/// Reduces per-position losses (double, position order) into the result tensor.
template <class T>
Tensor<T> finish_class_loss(const std::vector<double>& li, double total_weight, Reduction r, const Shape& out) {
  if (r == Reduction::None) return cpu::round_losses<T>(li, out);
  double s = cpu::sum_in_order(li);
  if (r == Reduction::Mean) s /= total_weight;  // 0 / 0 = NaN when every target is ignored, as in PyTorch
  return full<T>(Shape{}, convert<T>(s));
}

template <class T>
cpu::GradScale<T> grad_scale(const Tensor<T>& gc, const ClassLossOptions& o, const ClassLossSaved<T>& s) {
  return cpu::grad_scale(gc.data(), o.reduction == Reduction::None, o.reduction == Reduction::Mean,
                         double(s.total_weight.item()));
}

template <class T>
ClassLossResult<T> cross_entropy_cpu(ClassLossSaved<T> s, const ClassLossOptions& o) {
  using C = compute_t<T>;
  const ClassGeom& g = s.geom;
  const i64 P = g.positions();
  s.stats = empty<C>(Shape{P, 2});
  std::vector<double> li(static_cast<std::size_t>(P)), wt(static_cast<std::size_t>(P));
  cpu::cross_entropy_forward(s.input.data(), s.target.data(), s.weight, P, g.C, o.ignore_index, o.label_smoothing,
                             s.stats.data(), li, wt);
  const double total_weight = cpu::sum_in_order(wt);
  s.total_weight = full<C>(Shape{}, C(total_weight));
  Tensor<T> out = finish_class_loss<T>(li, total_weight, o.reduction, g.out);
  return {std::move(out), std::move(s)};
}

template <class T>
Tensor<T> cross_entropy_backward_cpu(const Tensor<T>& grad, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  const ClassGeom& g = s.geom;
  const Tensor<T> gc = grad.contiguous();
  const i64 P = g.positions(), Cn = g.C;
  Tensor<T> dx = empty<T>(Shape{P, Cn});
  cpu::cross_entropy_backward(s.input.data(), s.target.data(), s.stats.data(), s.weight, grad_scale(gc, o, s), P, Cn,
                              o.ignore_index, o.label_smoothing, dx.data());
  return g.D == 1 ? dx.view(g.in) : dx.view({g.N, g.D, Cn}).transpose(1, 2).reshape(g.in);
}

template <class T>
ClassLossResult<T> nll_loss_cpu(const Tensor<T>& xc, ClassLossSaved<T> s, const ClassLossOptions& o) {
  const ClassGeom& g = s.geom;
  const i64 P = g.positions();
  std::vector<double> li(static_cast<std::size_t>(P));
  const double total_weight = cpu::nll_loss_forward(xc.data(), s.target.data(), s.weight, P, g.C, g.D,
                                                    o.ignore_index, li);
  s.total_weight = full<compute_t<T>>(Shape{}, compute_t<T>(total_weight));
  Tensor<T> out = finish_class_loss<T>(li, total_weight, o.reduction, g.out);
  return {std::move(out), std::move(s)};
}

template <class T>
Tensor<T> nll_loss_backward_cpu(const Tensor<T>& grad, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  const ClassGeom& g = s.geom;
  const Tensor<T> gc = grad.contiguous();
  Tensor<T> dx = zeros<T>(g.in);
  cpu::nll_loss_backward(s.target.data(), s.weight, grad_scale(gc, o, s), g.positions(), g.C, g.D, o.ignore_index,
                         dx.data());
  return dx;
}

template <class T>
ClassLossSaved<T> class_loss_saved(const Tensor<T>& input, const Tensor<i64>& target, const Tensor<T>& weight,
                                   const char* op) {
  ClassLossSaved<T> s;
  s.geom = class_geom(input, target, weight, op);
  s.target = target;
  if (weight.defined()) s.weight = weight.detach();
  return s;
}

/// A dense copy that nothing else holds: what the backward reads does not change if the caller later writes into
/// the target or the weights (P int64s and C values; the copy runs on the tensor's device).
template <class U>
Tensor<U> snapshot(const Tensor<U>& t) {
  if (!t.defined()) return t;
  return t.is_contiguous() ? t.clone() : t.contiguous();
}

/// The CPU path's copies and target check.
template <class T>
void prepare_cpu(ClassLossSaved<T>& s, const ClassLossOptions& o, const char* op) {
  s.target = snapshot(s.target);
  s.weight = snapshot(s.weight);
  cpu::check_class_targets(s.target.data(), s.geom.positions(), s.geom.C, o.ignore_index, s.geom.in, op);
}

#if EMBER_CUDA_LOSS
inline cuda::ClassLossDims cuda_dims(const ClassGeom& g, const ClassLossOptions& o) {
  cuda::ClassLossDims d;
  d.P = g.positions();
  d.C = g.C;
  d.D = g.D;
  d.ignore_index = o.ignore_index;
  d.smoothing = o.label_smoothing;
  d.reduction = o.reduction == Reduction::None ? 0 : o.reduction == Reduction::Sum ? 2 : 1;
  return d;
}

/// Reads the smallest bad target position back (one 8-byte copy) and raises the error it names.
template <class T>
void check_targets_cuda(const Tensor<i64>& bad, const ClassLossSaved<T>& s, i64 ignore_index, const char* op) {
  const i64 p = bad.item();
  if (p < 0 || p >= s.geom.positions()) return;  // all ones: none
  cpu::detail::bad_class_target(op, s.target.view({s.geom.positions()}).slice(0, p, p + 1).item(), p, s.geom.C,
                                 ignore_index, s.geom.in);
}

template <class T, bool Ce>
ClassLossResult<T> class_loss_cuda(const Tensor<T>& xc, ClassLossSaved<T> s, const ClassLossOptions& o,
                                   const char* op) {
  using C = compute_t<T>;
  const Device dev = xc.device();
  cuda::DeviceGuard guard(dev);
  s.target = snapshot(s.target);
  s.weight = snapshot(s.weight);
  const ClassGeom& g = s.geom;
  const i64 P = g.positions();
  const cuda::ClassLossDims d = cuda_dims(g, o);
  Tensor<T> out = o.reduction == Reduction::None ? empty<T>(g.out, dev) : empty<T>(Shape{}, dev);
  Tensor<C> li = empty<C>(Shape{P}, dev), wt = empty<C>(Shape{P}, dev);
  s.total_weight = empty<C>(Shape{}, dev);
  Tensor<i64> bad = empty<i64>(Shape{1}, dev);
  auto* badp = reinterpret_cast<unsigned long long*>(bad.data());
  const T* wp = s.weight.defined() ? s.weight.data() : nullptr;
  if constexpr (Ce) {
    s.stats = empty<C>(Shape{P, 2}, dev);
    cuda::cross_entropy_forward<T, C>(xc.data(), wp, s.target.data(), d, s.stats.data(), li.data(), wt.data(),
                                      out.data(), s.total_weight.data(), badp, dev.index);
  } else {
    cuda::nll_loss_forward<T, C>(xc.data(), wp, s.target.data(), d, li.data(), wt.data(), out.data(),
                                 s.total_weight.data(), badp, dev.index);
  }
  check_targets_cuda(bad, s, o.ignore_index, op);
  return {std::move(out), std::move(s)};
}

template <class T>
Tensor<T> cross_entropy_backward_cuda(const Tensor<T>& gc, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  const Device dev = s.device();
  cuda::DeviceGuard guard(dev);
  Tensor<T> dx = empty<T>(s.geom.in, dev);
  if (dx.numel() == 0) return dx;
  cuda::cross_entropy_backward<T, compute_t<T>>(s.input.data(), s.weight.defined() ? s.weight.data() : nullptr,
                                                s.target.data(), s.stats.data(), gc.data(), s.total_weight.data(),
                                                cuda_dims(s.geom, o), dx.data(), dev.index);
  return dx;
}

template <class T>
Tensor<T> nll_loss_backward_cuda(const Tensor<T>& gc, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  const Device dev = s.device();
  cuda::DeviceGuard guard(dev);
  Tensor<T> dx = zeros<T>(s.geom.in, dev);
  if (s.geom.positions() == 0) return dx;
  cuda::nll_loss_backward<T, compute_t<T>>(s.weight.defined() ? s.weight.data() : nullptr, s.target.data(),
                                           gc.data(), s.total_weight.data(), cuda_dims(s.geom, o), dx.data(),
                                           dev.index);
  return dx;
}
#endif  // EMBER_CUDA_LOSS

/// Both backward passes: the device check, then the CUDA or the CPU kernel (Ce: cross_entropy, else nll_loss).
template <bool Ce, class T>
Tensor<T> class_loss_backward(const Tensor<T>& grad, const ClassLossSaved<T>& s, const ClassLossOptions& o,
                              const char* op) {
  EMBER_CHECK(grad.device() == s.device(), op, ": the gradient is on ", grad.device().str(),
              " but the loss was computed on ", s.device().str());
  if (s.device().is_cuda()) {
#if EMBER_CUDA_LOSS
    if constexpr (Ce) return cross_entropy_backward_cuda(grad.contiguous(), s, o);
    else return nll_loss_backward_cuda(grad.contiguous(), s, o);
#else
    no_cuda_loss(op, s.device());
#endif
  }
  if constexpr (Ce) return cross_entropy_backward_cpu(grad, s, o);
  else return nll_loss_backward_cpu(grad, s, o);
}

}  // namespace detail

/// cross_entropy with class-index targets (F.cross_entropy's semantics; see nn/loss.hpp): the loss, reduced by
/// o.reduction, and what the backward needs. logits (N, C), (N, C, d1, ...) or (C); target (N), (N, d1, ...) or
/// () int64 class indices on the same device; weight (C) or undefined.
template <class T>
ClassLossResult<T> cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int64_t>& target,
                                         const Tensor<T>& weight, const ClassLossOptions& o) {
  EMBER_PROFILE_RANGE("cross_entropy");
  static_assert(is_floating_v<T>, "cross_entropy: logits must be floating-point");
  constexpr const char* op = "cross_entropy";
  EMBER_CHECK(o.label_smoothing >= 0 && o.label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
              o.label_smoothing);
  ClassLossSaved<T> s = detail::class_loss_saved(logits, target, weight, op);
  const ClassGeom& g = s.geom;
  if (logits.device().is_cuda()) {
#if EMBER_CUDA_LOSS
    const Tensor<T> xc = logits.detach().contiguous();
    s.input = xc;
    return detail::class_loss_cuda<T, true>(xc, std::move(s), o, op);
#else
    detail::no_cuda_loss(op, logits.device());
#endif
  }
  detail::prepare_cpu(s, o, op);
  // Rows of C class scores, one per position.
  const std::int64_t P = g.positions();
  s.input = g.D == 1 ? logits.detach().reshape({P, g.C}).contiguous()
                     : logits.detach().reshape({g.N, g.C, g.D}).transpose(1, 2).contiguous().view({P, g.C});
  return detail::cross_entropy_cpu(std::move(s), o);
}

/// The gradient of cross_entropy_forward's loss with respect to the logits (the logits' shape), from the loss's
/// gradient `grad` (0-d when reduced, else the target's shape).
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& grad, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  EMBER_PROFILE_RANGE("cross_entropy_backward");
  return detail::class_loss_backward<true>(grad, s, o, "cross_entropy_backward");
}

/// nll_loss (F.nll_loss's semantics): -w[t] log_probs[t] per position, reduced by o.reduction.
template <class T>
ClassLossResult<T> nll_loss_forward(const Tensor<T>& log_probs, const Tensor<std::int64_t>& target,
                                    const Tensor<T>& weight, const ClassLossOptions& o) {
  EMBER_PROFILE_RANGE("nll_loss");
  static_assert(is_floating_v<T>, "nll_loss: log_probs must be floating-point");
  ClassLossSaved<T> s = detail::class_loss_saved(log_probs, target, weight, "nll_loss");
  const Tensor<T> xc = log_probs.detach().contiguous();
  if (log_probs.device().is_cuda()) {
#if EMBER_CUDA_LOSS
    return detail::class_loss_cuda<T, false>(xc, std::move(s), o, "nll_loss");
#else
    detail::no_cuda_loss("nll_loss", log_probs.device());
#endif
  }
  detail::prepare_cpu(s, o, "nll_loss");
  return detail::nll_loss_cpu(xc, std::move(s), o);
}

/// The gradient of nll_loss_forward's loss with respect to log_probs.
template <class T>
Tensor<T> nll_loss_backward(const Tensor<T>& grad, const ClassLossSaved<T>& s, const ClassLossOptions& o) {
  EMBER_PROFILE_RANGE("nll_loss_backward");
  return detail::class_loss_backward<false>(grad, s, o, "nll_loss_backward");
}

}  // namespace ember::ops
