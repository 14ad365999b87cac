// ember — CPU softmax and log_softmax along one dim, and their backward passes, on contiguous buffers
// (ops/softmax.hpp checks and dispatches; cuda/cudnn.hpp holds the CUDA softmax). Numerically stable: each group
// subtracts its maximum before exp, so logits of any magnitude give finite results. The tensor is seen as (outer, n,
// inner) around the softmax dim; a group is the n elements of one (outer, inner) position. Groups run in parallel:
// along the last dim (inner = 1) each is a contiguous row; otherwise blocks of neighbouring inner positions are
// processed together so the loops run over contiguous memory.
// half/bfloat16 compute in float; float in float (sums in 8 lanes); double in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/detail/fastmath.hpp"

namespace ember::cpu {

/// (outer, n, inner) around dim d of a shape (a 0-d tensor is one group of one element).
struct SoftmaxGeom {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline SoftmaxGeom softmax_geom(const Shape& s, int d) {
  SoftmaxGeom g;
  if (s.n == 0) return g;
  for (int i = 0; i < d; ++i) g.outer *= s[i];
  g.n = s[d];
  for (int i = d + 1; i < s.n; ++i) g.inner *= s[i];
  return g;
}

namespace detail {

inline constexpr int kSoftmaxLanes = 8;        // independent accumulators per row (lets the compiler vectorise sums)
inline constexpr std::int64_t kSoftmaxCols = 64;  // inner positions processed together when the dim is not the last

template <class C>
EMBER_INLINE C max_(C a, C b) {
  return a < b ? b : a;
}

// ---- along the last dim: one contiguous row per group ---------------------------------------------------------

template <class T>
EMBER_VECTORIZE compute_t<T> row_max(const T* EMBER_RESTRICT x, std::int64_t n) {
  using C = compute_t<T>;
  C m[kSoftmaxLanes];
  for (auto& v : m) v = -std::numeric_limits<C>::infinity();
  std::int64_t j = 0;
  for (; j + kSoftmaxLanes <= n; j += kSoftmaxLanes)
    for (int l = 0; l < kSoftmaxLanes; ++l) m[l] = max_(m[l], static_cast<C>(x[j + l]));
  C r = m[0];
  for (int l = 1; l < kSoftmaxLanes; ++l) r = max_(r, m[l]);
  for (; j < n; ++j) r = max_(r, static_cast<C>(x[j]));
  return r;
}

// Σ exp(x - mx); when Store, y = exp(x - mx) as well.
template <bool Store, class T>
EMBER_VECTORIZE compute_t<T> row_expsum(const T* EMBER_RESTRICT x, T* EMBER_RESTRICT y, std::int64_t n,
                                        compute_t<T> mx) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  C s[kSoftmaxLanes] = {};
  std::int64_t j = 0;
  for (; j + kSoftmaxLanes <= n; j += kSoftmaxLanes)
    for (int l = 0; l < kSoftmaxLanes; ++l) {
      const C e = fm::exp(static_cast<C>(x[j + l]) - mx);
      if constexpr (Store) y[j + l] = static_cast<T>(e);
      s[l] += e;
    }
  C r = 0;
  for (int l = 0; l < kSoftmaxLanes; ++l) r += s[l];
  for (; j < n; ++j) {
    const C e = fm::exp(static_cast<C>(x[j]) - mx);
    if constexpr (Store) y[j] = static_cast<T>(e);
    r += e;
  }
  return r;
}

template <bool Log, class T>
EMBER_VECTORIZE void row_finish(const T* EMBER_RESTRICT x, T* EMBER_RESTRICT y, std::int64_t n, compute_t<T> mx,
                                compute_t<T> s) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  if constexpr (Log) {
    // (x - mx) - log s, not x - (mx + log s): the sum would round to the precision of mx (logits of 1e4 lose
    // three digits in float).
    const C ls = fm::log(s);
    for (std::int64_t j = 0; j < n; ++j) y[j] = convert<T>((static_cast<C>(x[j]) - mx) - ls);
  } else if constexpr (std::is_same_v<T, C>) {
    const C inv = C(1) / s;
    for (std::int64_t j = 0; j < n; ++j) y[j] = y[j] * inv;  // y holds exp(x - mx)
  } else {
    const C inv = C(1) / s;
    for (std::int64_t j = 0; j < n; ++j) y[j] = convert<T>(fm::exp(static_cast<C>(x[j]) - mx) * inv);
  }
}

template <bool Log, class T>
void softmax_row(const T* x, T* y, std::int64_t n) {
  using C = compute_t<T>;
  const C mx = row_max(x, n);
  constexpr bool store = !Log && std::is_same_v<T, C>;
  const C s = row_expsum<store>(x, y, n, mx);
  row_finish<Log>(x, y, n, mx, s);
}

// Backward along a row: softmax gx = y (g - Σ g y); log_softmax gx = g - exp(y) Σ g.
template <bool Log, class T>
EMBER_VECTORIZE void softmax_backward_row(const T* EMBER_RESTRICT y, const T* EMBER_RESTRICT g, T* EMBER_RESTRICT gx,
                                          std::int64_t n) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  C s[kSoftmaxLanes] = {};
  std::int64_t j = 0;
  for (; j + kSoftmaxLanes <= n; j += kSoftmaxLanes)
    for (int l = 0; l < kSoftmaxLanes; ++l) {
      if constexpr (Log) s[l] += static_cast<C>(g[j + l]);
      else s[l] += static_cast<C>(g[j + l]) * static_cast<C>(y[j + l]);
    }
  C r = 0;
  for (int l = 0; l < kSoftmaxLanes; ++l) r += s[l];
  for (; j < n; ++j) {
    if constexpr (Log) r += static_cast<C>(g[j]);
    else r += static_cast<C>(g[j]) * static_cast<C>(y[j]);
  }
  for (j = 0; j < n; ++j) {
    const C yv = static_cast<C>(y[j]), gv = static_cast<C>(g[j]);
    if constexpr (Log) gx[j] = convert<T>(gv - fm::exp(yv) * r);
    else gx[j] = convert<T>(yv * (gv - r));
  }
}

// ---- along another dim: w neighbouring columns (stride `inner` between the n elements of each) ---------------

template <bool Log, class T>
EMBER_VECTORIZE void softmax_cols(const T* EMBER_RESTRICT x, T* EMBER_RESTRICT y, std::int64_t n, std::int64_t inner,
                                  std::int64_t w) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  C m[kSoftmaxCols], s[kSoftmaxCols];
  for (std::int64_t k = 0; k < w; ++k) {
    m[k] = -std::numeric_limits<C>::infinity();
    s[k] = 0;
  }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t k = 0; k < w; ++k) m[k] = max_(m[k], static_cast<C>(x[j * inner + k]));
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t k = 0; k < w; ++k) s[k] += fm::exp(static_cast<C>(x[j * inner + k]) - m[k]);
  if constexpr (Log) {
    for (std::int64_t k = 0; k < w; ++k) s[k] = fm::log(s[k]);
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t k = 0; k < w; ++k)
        y[j * inner + k] = convert<T>((static_cast<C>(x[j * inner + k]) - m[k]) - s[k]);
  } else {
    for (std::int64_t k = 0; k < w; ++k) s[k] = C(1) / s[k];
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t k = 0; k < w; ++k)
        y[j * inner + k] = convert<T>(fm::exp(static_cast<C>(x[j * inner + k]) - m[k]) * s[k]);
  }
}

template <bool Log, class T>
EMBER_VECTORIZE void softmax_backward_cols(const T* EMBER_RESTRICT y, const T* EMBER_RESTRICT g, T* EMBER_RESTRICT gx,
                                           std::int64_t n, std::int64_t inner, std::int64_t w) {
  using C = compute_t<T>;
  namespace fm = ::ember::detail::fm;
  C s[kSoftmaxCols];
  for (std::int64_t k = 0; k < w; ++k) s[k] = 0;
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t k = 0; k < w; ++k) {
      const std::int64_t i = j * inner + k;
      if constexpr (Log) s[k] += static_cast<C>(g[i]);
      else s[k] += static_cast<C>(g[i]) * static_cast<C>(y[i]);
    }
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t k = 0; k < w; ++k) {
      const std::int64_t i = j * inner + k;
      const C yv = static_cast<C>(y[i]), gv = static_cast<C>(g[i]);
      if constexpr (Log) gx[i] = convert<T>(gv - fm::exp(yv) * s[k]);
      else gx[i] = convert<T>(yv * (gv - s[k]));
    }
}

/// Calls row(offset) for every group along the last dim, or cols(offset, width) for every block of columns, in
/// parallel; offsets are in elements of a contiguous (outer, n, inner) tensor.
template <class Row, class Cols>
void for_each_group(const SoftmaxGeom& g, const Row& row, const Cols& cols) {
  if (g.inner == 1) {
    const std::int64_t grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, g.n));
    parallel_for(0, g.outer, grain, [&](std::int64_t a, std::int64_t b) {
      for (std::int64_t r = a; r < b; ++r) row(r * g.n);
    });
    return;
  }
  const std::int64_t nblk = (g.inner + kSoftmaxCols - 1) / kSoftmaxCols;
  const std::int64_t grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, g.n * kSoftmaxCols));
  parallel_for(0, g.outer * nblk, grain, [&](std::int64_t a, std::int64_t b) {
    for (std::int64_t t = a; t < b; ++t) {
      const std::int64_t o = t / nblk, k0 = (t % nblk) * kSoftmaxCols;
      cols(o * g.n * g.inner + k0, std::min(kSoftmaxCols, g.inner - k0));
    }
  });
}

}  // namespace detail

/// softmax (Log: log_softmax) of every group of the contiguous (outer, n, inner) buffer x into y.
template <bool Log, class T>
void softmax_forward(const T* xp, T* yp, const SoftmaxGeom& g) {
  detail::for_each_group(
      g, [&](std::int64_t off) { detail::softmax_row<Log>(xp + off, yp + off, g.n); },
      [&](std::int64_t off, std::int64_t w) { detail::softmax_cols<Log>(xp + off, yp + off, g.n, g.inner, w); });
}

/// The gradient of softmax (Log: log_softmax) from its output y and the incoming gradient g into gx: softmax
/// gx = y (g - Σ g y); log_softmax gx = g - exp(y) Σ g.
template <bool Log, class T>
void softmax_backward(const T* yp, const T* gp, T* gxp, const SoftmaxGeom& g) {
  detail::for_each_group(
      g, [&](std::int64_t off) { detail::softmax_backward_row<Log>(yp + off, gp + off, gxp + off, g.n); },
      [&](std::int64_t off, std::int64_t w) {
        detail::softmax_backward_cols<Log>(yp + off, gp + off, gxp + off, g.n, g.inner, w);
      });
}

}  // namespace ember::cpu
