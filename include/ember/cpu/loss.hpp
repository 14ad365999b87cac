// ember — CPU kernels of the class-index losses (cross_entropy with class indices, nll_loss), forward and backward,
// on contiguous buffers; ops/loss.hpp checks the arguments, owns the tensors and dispatches (cuda/loss.cuh holds the
// CUDA twins). cross_entropy reads P rows of C class scores (the input with its class dim moved last); nll_loss reads
// the (N, C, D) input in place (class c of position (n, k) at (n * C + c) * D + k).
//
// Every input type computes in fp32 inside (double for double): per-position max and log Σ exp in compute_t<T>,
// per-position losses and their reduction in double, in position order, so results do not depend on the thread
// count; the result is rounded once into T.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/softmax.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/detail/fastmath.hpp"

namespace ember::cpu {

namespace detail {

using i64 = std::int64_t;

[[noreturn, gnu::cold, gnu::noinline]] inline void bad_class_target(const char* op, i64 t, i64 p, i64 C,
                                                                    i64 ignore_index, const Shape& in) {
  throw Error(::ember::detail::concat(op, ": target ", t, " at position ", p, " is out of range for ", C,
                                      " classes (expected a class index in [0, ", C, ") or ignore_index ",
                                      ignore_index, "; input shape ", in.str(), ")"));
}

template <class T>
std::vector<compute_t<T>> weight_values(const Tensor<T>& w) {
  std::vector<compute_t<T>> v;
  if (!w.defined()) return v;
  const T* d = w.data();
  for (i64 i = 0; i < w.numel(); ++i) v.push_back(static_cast<compute_t<T>>(d[i]));
  return v;
}

/// The class weights in the compute type (p null without weights) and their sum in double (C without weights).
template <class T>
struct ClassWeights {
  std::vector<compute_t<T>> w;
  const compute_t<T>* p = nullptr;
  double sum = 0;
  ClassWeights(const Tensor<T>& weight, i64 C) : w(weight_values(weight)) {
    p = w.empty() ? nullptr : w.data();
    sum = double(C);
    if (p) {
      sum = 0;
      for (compute_t<T> v : w) sum += double(v);
    }
  }
  ClassWeights(const ClassWeights&) = delete;  // p points into w
  ClassWeights& operator=(const ClassWeights&) = delete;
};

/// What cross_entropy's forward and backward both derive from their arguments: the class weights, the label
/// smoothing eps with its share per class (uni), and the rows per parallel task.
template <class T>
struct CrossEntropyRows : ClassWeights<T> {
  double eps, uni;
  i64 grain;
  CrossEntropyRows(const Tensor<T>& weight, i64 C, double label_smoothing)
      : ClassWeights<T>(weight, C), eps(label_smoothing), uni(label_smoothing / double(C)),
        grain(std::max<i64>(1, kGrain / std::max<i64>(1, C))) {}
};

// Row kernels of cross_entropy (compute type C): Σ_c w_c (x_c - mx) (or Σ (x_c - mx) without weights). The
// weighted and unweighted loops are separate functions: a `w ? w[j] : 1` inside the loop would not vectorise.
template <bool HasW, class T>
EMBER_VECTORIZE double row_shifted_sum_(const T* EMBER_RESTRICT x, const compute_t<T>* EMBER_RESTRICT w, i64 n,
                                        compute_t<T> mx) {
  using C = compute_t<T>;
  C s[8] = {};
  i64 j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) {
      if constexpr (HasW) s[l] += w[j + l] * (static_cast<C>(x[j + l]) - mx);
      else s[l] += static_cast<C>(x[j + l]) - mx;
    }
  double r = 0;
  for (int l = 0; l < 8; ++l) r += double(s[l]);
  for (; j < n; ++j) r += double((HasW ? w[j] : C(1)) * (static_cast<C>(x[j]) - mx));
  return r;
}
template <class T>
double row_shifted_sum(const T* x, const compute_t<T>* w, i64 n, compute_t<T> mx) {
  return w ? row_shifted_sum_<true>(x, w, n, mx) : row_shifted_sum_<false>(x, w, n, mx);
}

// dx_j = exp(x_j - mx - ls) * a - b * w_j (b alone without weights).
template <bool HasW, class T>
EMBER_VECTORIZE void ce_grad_row_(const T* EMBER_RESTRICT x, const compute_t<T>* EMBER_RESTRICT w, T* EMBER_RESTRICT dx,
                                  i64 n, compute_t<T> mx, compute_t<T> ls, compute_t<T> a, compute_t<T> b) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  for (i64 j = 0; j < n; ++j) {
    const C e = fm::exp((static_cast<C>(x[j]) - mx) - ls) * a;
    if constexpr (HasW) dx[j] = convert<T>(e - b * w[j]);
    else dx[j] = convert<T>(e - b);
  }
}
template <class T>
void ce_grad_row(const T* x, const compute_t<T>* w, T* dx, i64 n, compute_t<T> mx, compute_t<T> ls, compute_t<T> a,
                 compute_t<T> b) {
  if (w) ce_grad_row_<true>(x, w, dx, n, mx, ls, a, b);
  else ce_grad_row_<false>(x, w, dx, n, mx, ls, a, b);
}

}  // namespace detail

/// Checks the P class indices t: each in [0, C) or ignore_index; the error names the first bad position (`in`: the
/// input's shape, for the message).
inline void check_class_targets(const std::int64_t* t, std::int64_t P, std::int64_t C, std::int64_t ignore_index,
                                const Shape& in, const char* op) {
  for (std::int64_t p = 0; p < P; ++p)
    if (t[p] != ignore_index && (t[p] < 0 || t[p] >= C)) detail::bad_class_target(op, t[p], p, C, ignore_index, in);
}

/// The per-position scale of a class loss's backward: g[p] (unreduced), or one value for all.
template <class T>
struct GradScale {
  const T* g = nullptr;  // unreduced: one per position
  double s = 1;          // reduced: one for all
  double at(std::int64_t p) const { return g ? double(static_cast<compute_t<T>>(g[p])) : s; }
};

/// The scale from the loss's gradient g: per position when the loss was not reduced, else g[0], divided by the
/// total weight for a mean.
template <class T>
GradScale<T> grad_scale(const T* g, bool per_position, bool mean, double total_weight) {
  GradScale<T> gs;
  if (per_position) {
    gs.g = g;
  } else {
    const double g0 = double(static_cast<compute_t<T>>(g[0]));
    gs.s = mean ? g0 / total_weight : g0;
  }
  return gs;
}

/// Σ v in order (the reduction of per-position losses and weights).
inline double sum_in_order(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

/// The per-position losses rounded into a tensor of shape `out` (the unreduced loss).
template <class T>
Tensor<T> round_losses(const std::vector<double>& li, const Shape& out) {
  Tensor<T> t = empty<T>(out);
  for (std::size_t p = 0; p < li.size(); ++p) t.data()[p] = convert<T>(li[p]);
  return t;
}

/// cross_entropy's forward over P rows of C scores (xp) with class indices tp: li[p] the loss of position p, wt[p]
/// its target's weight (0 where ignored), and st (P x 2) each row's max and log Σ exp(x - max). weight (C) may be
/// undefined.
template <class T>
void cross_entropy_forward(const T* xp, const std::int64_t* tp, const Tensor<T>& weight, std::int64_t P,
                           std::int64_t Cn, std::int64_t ignore_index, double label_smoothing, compute_t<T>* st,
                           std::vector<double>& li, std::vector<double>& wt) {
  using C = compute_t<T>;
  using detail::i64;
  const detail::CrossEntropyRows<T> ce(weight, Cn, label_smoothing);
  parallel_for(0, P, ce.grain, [&](i64 p0, i64 p1) {
    for (i64 p = p0; p < p1; ++p) {
      const std::size_t ps = std::size_t(p);
      const T* x = xp + p * Cn;
      const i64 t = tp[p];
      if (t == ignore_index || Cn == 0) {
        li[ps] = wt[ps] = 0;
        st[2 * p] = st[2 * p + 1] = C(0);
        continue;
      }
      const C m = detail::row_max(x, Cn);
      const C l = ::ember::detail::fm::log(detail::row_expsum<false>(x, static_cast<T*>(nullptr), Cn, m));
      st[2 * p] = m;
      st[2 * p + 1] = l;
      const double w_t = ce.p ? double(ce.p[t]) : 1.0;
      const double logp_t = double((static_cast<C>(x[t]) - m) - l);
      double loss = -(1 - ce.eps) * w_t * logp_t;
      if (ce.eps > 0) loss -= ce.uni * (detail::row_shifted_sum(x, ce.p, Cn, m) - ce.sum * double(l));
      li[ps] = loss;
      wt[ps] = w_t;
    }
  });
}

/// cross_entropy's gradient (P rows of C values into dp) from the forward's scores xp, targets tp and row statistics
/// st, scaled per position by gs.
template <class T>
void cross_entropy_backward(const T* xp, const std::int64_t* tp, const compute_t<T>* st, const Tensor<T>& weight,
                            const GradScale<T>& gs, std::int64_t P, std::int64_t Cn, std::int64_t ignore_index,
                            double label_smoothing, T* dp) {
  using C = compute_t<T>;
  using detail::i64;
  const detail::CrossEntropyRows<T> ce(weight, Cn, label_smoothing);
  parallel_for(0, P, ce.grain, [&](i64 p0, i64 p1) {
    for (i64 p = p0; p < p1; ++p) {
      T* d = dp + p * Cn;
      const i64 t = tp[p];
      if (t == ignore_index) {
        for (i64 j = 0; j < Cn; ++j) d[j] = T(0);
        continue;
      }
      const double sc = gs.at(p), wt = ce.p ? double(ce.p[t]) : 1.0;
      const double a = sc * ((1 - ce.eps) * wt + ce.uni * ce.sum);
      detail::ce_grad_row(xp + p * Cn, ce.p, d, Cn, st[2 * p], st[2 * p + 1], C(a), C(sc * ce.uni));
      d[t] = convert<T>(double(static_cast<C>(d[t])) - sc * (1 - ce.eps) * wt);
    }
  });
}

/// nll_loss's forward on the contiguous (N, C, D) log-probabilities xp: li[p] = -w[t] x[t] of each position (0 where
/// ignored); returns Σ w[t] over the non-ignored positions.
template <class T>
double nll_loss_forward(const T* xp, const std::int64_t* tp, const Tensor<T>& weight, std::int64_t P, std::int64_t C,
                        std::int64_t D, std::int64_t ignore_index, std::vector<double>& li) {
  using detail::i64;
  const std::vector<compute_t<T>> w = detail::weight_values(weight);
  double total_weight = 0;
  for (i64 p = 0; p < P; ++p) {
    const i64 t = tp[p];
    if (t == ignore_index) {
      li[std::size_t(p)] = 0;
      continue;
    }
    const i64 n = p / D, k = p % D;
    const double wt = w.empty() ? 1.0 : double(w[std::size_t(t)]);
    li[std::size_t(p)] = -wt * double(static_cast<compute_t<T>>(xp[(n * C + t) * D + k]));
    total_weight += wt;
  }
  return total_weight;
}

/// nll_loss's gradient into dp, the zero-filled (N, C, D) gradient of the input.
template <class T>
void nll_loss_backward(const std::int64_t* tp, const Tensor<T>& weight, const GradScale<T>& gs, std::int64_t P,
                       std::int64_t C, std::int64_t D, std::int64_t ignore_index, T* dp) {
  using detail::i64;
  const std::vector<compute_t<T>> w = detail::weight_values(weight);
  for (i64 p = 0; p < P; ++p) {
    const i64 t = tp[p];
    if (t == ignore_index) continue;
    const i64 n = p / D, k = p % D;
    const double wt = w.empty() ? 1.0 : double(w[std::size_t(t)]);
    dp[(n * C + t) * D + k] = convert<T>(-gs.at(p) * wt);
  }
}

/// The debug check of nll_loss on the contiguous (N, C, D) input x: every non-ignored position's C entries are <= 0
/// and their exps sum to 1 (`in`: the input's shape, for the message).
template <class T>
void check_log_probs(const T* x, const std::int64_t* target, std::int64_t P, std::int64_t C, std::int64_t D,
                     std::int64_t ignore_index, const Shape& in) {
  using detail::i64;
  const double tol_sum = std::is_same_v<compute_t<T>, T> ? 1e-3 : 2e-2;
  const double tol_pos = std::is_same_v<compute_t<T>, T> ? 1e-5 : 1e-2;
  const char* hint = " (nll_loss expects log-probabilities, the output of log_softmax(x, 1); pass raw logits to "
                     "cross_entropy instead. This check runs in builds without NDEBUG or with EMBER_DEBUG_CHECKS=1)";
  for (i64 p = 0; p < P; ++p) {
    if (target[p] == ignore_index) continue;
    const i64 n = p / D, k = p % D;
    double s = 0;
    for (i64 c = 0; c < C; ++c) {
      const double v = double(static_cast<compute_t<T>>(x[(n * C + c) * D + k]));
      EMBER_CHECK(!(v > tol_pos), "nll_loss: the input (shape ", in.str(), ") has a positive entry ", v,
                  " at position ", p, ", class ", c, hint);
      s += std::exp(v);
    }
    EMBER_CHECK(std::fabs(s - 1.0) <= tol_sum, "nll_loss: the exps of the input (shape ", in.str(),
                ") at position ", p, " sum to ", s, ", not 1", hint);
  }
}

}  // namespace ember::cpu
