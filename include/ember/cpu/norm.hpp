// ember — CPU batch norm and layer norm kernels, forward and backward, on contiguous buffers (ops/normalization.hpp
// checks the shapes and dispatches; cuda/cudnn.hpp holds the CUDA batch norm).
//
// batch_norm sees its input as (N, C, S) (S = product of the spatial dims) and sweeps it twice in memory order
// (streaming beats hopping between the N chunks of one channel by 1.5-2.5x here): the first sweep computes the
// moments of each (n, c) chunk by two passes over the chunk while it sits in L1 (mean of x - pivot, then
// Σ (x - mean)²; partial sums in the compute type over short blocks, 8 lanes, vectorised) and merges them per
// channel in double with Chan's pairwise formula; the second normalises. The mean is carried as hi + lo in the
// compute type, so x - mean keeps its digits when the data sit far from zero. The backward pass is the closed form
// (one sweep for Σ g and Σ g (x - mean), one for dx). Partial results live in fixed batch blocks merged in order,
// so results do not depend on the thread count.
//
// layer_norm normalises each row of the last D elements, with the same scheme per row; the weight and bias
// gradients sum over rows in fixed blocks, so results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

namespace detail {

inline constexpr int kNormLanes = 8;
inline constexpr std::int64_t kNormBlock = 1024;  // elements summed in the compute type before going to double

// Σ term(x) over n contiguous elements: blocks of kNormBlock summed in the compute type over kNormLanes partial sums
// (so the loop vectorises; term is inlined into it), the blocks added in double.
template <class T, class Term>
EMBER_VECTORIZE double block_total(const T* EMBER_RESTRICT x, std::int64_t n, Term term) {
  using C = compute_t<T>;
  double total = 0;
  for (std::int64_t b = 0; b < n; b += kNormBlock) {
    const std::int64_t e = std::min(n, b + kNormBlock);
    C s[kNormLanes] = {};
    std::int64_t j = b;
    for (; j + kNormLanes <= e; j += kNormLanes)
      for (int l = 0; l < kNormLanes; ++l) s[l] += term(static_cast<C>(x[j + l]));
    C r = 0;
    for (int l = 0; l < kNormLanes; ++l) r += s[l];
    for (; j < e; ++j) r += term(static_cast<C>(x[j]));
    total += double(r);
  }
  return total;
}

// The mean as hi + lo in the compute type: (x - hi) - lo keeps the digits a float mean would round away (x near
// 1000 would otherwise carry 3e-5 absolute error into every normalised value).
template <class C>
struct SplitMean {
  C hi, lo;
  explicit SplitMean(double m) : hi(C(m)), lo(C(m - double(C(m)))) {}
};

// Σ (x - pivot) over n contiguous elements. The pivot (an element of the data) keeps the partial sums near the
// spread of the data rather than its mean, so float lanes lose nothing to a large offset.
template <class T>
double block_sum(const T* x, std::int64_t n, compute_t<T> pivot) {
  return block_total(x, n, [pivot](compute_t<T> v) { return v - pivot; });
}

// Σ (x - m)² over n contiguous elements.
template <class T>
double block_sqdev(const T* x, std::int64_t n, SplitMean<compute_t<T>> m) {
  return block_total(x, n, [m](compute_t<T> v) {
    const compute_t<T> d = (v - m.hi) - m.lo;
    return d * d;
  });
}

// Σ g and Σ g (x - m) over n contiguous elements.
template <class T>
EMBER_VECTORIZE void block_grad_sums(const T* EMBER_RESTRICT g, const T* EMBER_RESTRICT x, std::int64_t n,
                                     SplitMean<compute_t<T>> m, double& sg, double& sgx) {
  using C = compute_t<T>;
  for (std::int64_t b = 0; b < n; b += kNormBlock) {
    const std::int64_t e = std::min(n, b + kNormBlock);
    C s[kNormLanes] = {}, q[kNormLanes] = {};
    std::int64_t j = b;
    for (; j + kNormLanes <= e; j += kNormLanes)
      for (int l = 0; l < kNormLanes; ++l) {
        const C gv = static_cast<C>(g[j + l]);
        s[l] += gv;
        q[l] += gv * ((static_cast<C>(x[j + l]) - m.hi) - m.lo);
      }
    C rs = 0, rq = 0;
    for (int l = 0; l < kNormLanes; ++l) {
      rs += s[l];
      rq += q[l];
    }
    for (; j < e; ++j) {
      const C gv = static_cast<C>(g[j]);
      rs += gv;
      rq += gv * ((static_cast<C>(x[j]) - m.hi) - m.lo);
    }
    sg += double(rs);
    sgx += double(rq);
  }
}

// y = (x - m) * scale + shift.
template <class T>
EMBER_VECTORIZE void affine_(const T* EMBER_RESTRICT x, T* EMBER_RESTRICT y, std::int64_t n, SplitMean<compute_t<T>> m,
                             compute_t<T> scale, compute_t<T> shift) {
  using C = compute_t<T>;
  for (std::int64_t j = 0; j < n; ++j) y[j] = convert<T>(((static_cast<C>(x[j]) - m.hi) - m.lo) * scale + shift);
}

// dx = k1 g + k2 (x - m) + k3.
template <class T>
EMBER_VECTORIZE void bn_dx_(const T* EMBER_RESTRICT g, const T* EMBER_RESTRICT x, T* EMBER_RESTRICT dx, std::int64_t n,
                            compute_t<T> k1, compute_t<T> k2, compute_t<T> k3, SplitMean<compute_t<T>> m) {
  using C = compute_t<T>;
  for (std::int64_t j = 0; j < n; ++j)
    dx[j] = convert<T>(k1 * static_cast<C>(g[j]) + (k2 * ((static_cast<C>(x[j]) - m.hi) - m.lo) + k3));
}

template <class T>
double elem(const Tensor<T>& t, std::int64_t i) {
  return double(static_cast<compute_t<T>>(t.data()[i * t.strides()[0]]));
}

/// Count, mean and Σ (x - mean)² of a set of values; merges exactly (Chan et al.'s pairwise update), in double.
struct Moments {
  double count = 0, mean = 0, m2 = 0;
  void merge(double n, double mean_b, double m2_b) {
    if (n == 0) return;
    const double tot = count + n, d = mean_b - mean;
    mean += d * n / tot;
    m2 += m2_b + d * d * count * n / tot;
    count = tot;
  }
};

/// Mean and M2 of n contiguous values: two passes over the chunk (the second from L1), pivot-shifted.
template <class T>
void chunk_moments(const T* x, std::int64_t n, double& mean, double& m2) {
  using C = compute_t<T>;
  const C pivot = static_cast<C>(x[0]);
  mean = double(pivot) + block_sum(x, n, pivot) / double(n);
  m2 = block_sqdev(x, n, SplitMean<C>(mean));
}

/// The batch dim in fixed blocks (at most 16): per-block partial results merged in block order make batch_norm
/// independent of the thread count. fn(block, n0, n1).
template <class F>
void for_batch_blocks(std::int64_t N, std::int64_t nblk, const F& fn) {
  cpu::parallel_for(0, nblk, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t b = b0; b < b1; ++b) fn(b, N * b / nblk, N * (b + 1) / nblk);
  });
}
inline std::int64_t batch_block_count(std::int64_t N) { return std::max<std::int64_t>(1, std::min<std::int64_t>(N, 16)); }

/// fn(chunk) over the N * C chunks of S elements in memory order, in parallel.
template <class F>
void for_chunks(std::int64_t NC, std::int64_t S, const F& fn) {
  const std::int64_t grain = std::max<std::int64_t>(1, cpu::kGrain / std::max<std::int64_t>(1, S));
  cpu::parallel_for(0, NC, grain, [&](std::int64_t a, std::int64_t b) {
    for (std::int64_t i = a; i < b; ++i) fn(i);
  });
}

/// Per channel, the batch mean and 1/sqrt(biased var + eps) from the moments of fixed batch blocks (`part`, nblk x C,
/// merged in block order) over M values per channel; updates the running statistics when they are defined:
/// r = (1 - momentum) r + momentum * batch_stat, with the unbiased variance for running_var.
template <class P>
void finish_batch_stats(std::int64_t C, std::int64_t nblk, const std::vector<Moments>& part, std::int64_t M,
                        const Tensor<P>& running_mean, const Tensor<P>& running_var, double momentum, double eps,
                        std::vector<double>& mean, std::vector<double>& invstd) {
  for (std::int64_t c = 0; c < C; ++c) {
    Moments tot;
    for (std::int64_t blk = 0; blk < nblk; ++blk) {
      const Moments& p = part[std::size_t(blk * C + c)];
      tot.merge(p.count, p.mean, p.m2);
    }
    mean[std::size_t(c)] = tot.mean;
    invstd[std::size_t(c)] = 1.0 / std::sqrt(tot.m2 / double(M) + eps);
    if (running_mean.defined()) {
      P& rm = running_mean.data()[c * running_mean.strides()[0]];
      P& rv = running_var.data()[c * running_var.strides()[0]];
      rm = convert<P>((1 - momentum) * elem(running_mean, c) + momentum * tot.mean);
      rv = convert<P>((1 - momentum) * elem(running_var, c) + momentum * (tot.m2 / double(M - 1)));
    }
  }
}

/// Per channel, what y = (x - mean) * invstd * weight + bias computes with (affine_), in the data's compute type
/// (weight and bias may be of another dtype P: float parameters for 16-bit data).
template <class T, class P = T>
struct BnAffine {
  using Cm = compute_t<T>;
  std::vector<Cm> scale, shift;
  std::vector<SplitMean<Cm>> mean;
  BnAffine(const std::vector<double>& m, const std::vector<double>& invstd, const Tensor<P>& weight,
           const Tensor<P>& bias) {
    const std::size_t C = m.size();
    scale.resize(C);
    shift.resize(C);
    mean.reserve(C);
    for (std::size_t c = 0; c < C; ++c) {
      const double is = invstd[c];
      scale[c] = Cm(weight.defined() ? elem(weight, std::int64_t(c)) * is : is);
      shift[c] = Cm(bias.defined() ? elem(bias, std::int64_t(c)) : 0.0);
      mean.emplace_back(m[c]);
    }
  }
};

/// Σ g and Σ g (x - mean) per channel, in fixed batch blocks (as batch_norm_forward's moments) summed in order.
struct BnGradSums {
  std::int64_t nblk, C;
  std::vector<double> ps, pq;
  BnGradSums(std::int64_t N, std::int64_t C_)
      : nblk(batch_block_count(N)), C(C_), ps(std::size_t(nblk * C_), 0.0), pq(std::size_t(nblk * C_), 0.0) {}
  /// Adds chunk (n, c) of batch block blk: g and x hold S values.
  template <class T>
  void add(std::int64_t blk, std::int64_t c, const T* g, const T* x, std::int64_t S, const std::vector<double>& mean) {
    block_grad_sums(g, x, S, SplitMean<compute_t<T>>(mean[std::size_t(c)]), ps[std::size_t(blk * C + c)],
                    pq[std::size_t(blk * C + c)]);
  }
  void total(std::vector<double>& sg, std::vector<double>& sgx) const {
    for (std::int64_t blk = 0; blk < nblk; ++blk)
      for (std::int64_t c = 0; c < C; ++c) {
        sg[std::size_t(c)] += ps[std::size_t(blk * C + c)];
        sgx[std::size_t(c)] += pq[std::size_t(blk * C + c)];
      }
  }
};

/// Per channel, the factors of dx = k1 g + k2 (x - mean) + k3 (bn_dx_), from Σ g and Σ g (x - mean) over the M values
/// of each channel; in evaluation mode (training = false) only k1. The weight may be of another dtype P.
template <class T, class P = T>
struct BnDx {
  using Cm = compute_t<T>;
  std::vector<Cm> k1, k2, k3;
  std::vector<SplitMean<Cm>> mean;
  BnDx(const std::vector<double>& m, const std::vector<double>& invstd, const Tensor<P>& weight, bool training,
       std::int64_t M, const std::vector<double>& sg, const std::vector<double>& sgx) {
    const std::size_t C = m.size();
    k1.resize(C);
    k2.assign(C, Cm(0));
    k3.assign(C, Cm(0));
    mean.reserve(C);
    for (std::size_t c = 0; c < C; ++c) {
      const double w = weight.defined() ? elem(weight, std::int64_t(c)) : 1.0, is = invstd[c];
      const double a = w * is;
      k1[c] = Cm(a);
      if (training && M > 0) {
        k2[c] = Cm(-a * is * is * sgx[c] / double(M));
        k3[c] = Cm(-a * sg[c] / double(M));
      }
      mean.emplace_back(m[c]);
    }
  }
};


// y = (x - m) * rs [* w] [+ b]; one instantiation per combination, so each loop vectorises.
template <bool HasW, bool HasB, class T>
EMBER_VECTORIZE void ln_apply_(const T* EMBER_RESTRICT x, T* EMBER_RESTRICT y, const T* EMBER_RESTRICT w,
                               const T* EMBER_RESTRICT b, std::int64_t n, SplitMean<compute_t<T>> m, compute_t<T> rs) {
  using C = compute_t<T>;
  for (std::int64_t j = 0; j < n; ++j) {
    C v = ((static_cast<C>(x[j]) - m.hi) - m.lo) * rs;
    if constexpr (HasW) v *= static_cast<C>(w[j]);
    if constexpr (HasB) v += static_cast<C>(b[j]);
    y[j] = convert<T>(v);
  }
}
template <class T>
void ln_apply(const T* x, T* y, const T* w, const T* b, std::int64_t n, SplitMean<compute_t<T>> m, compute_t<T> rs) {
  if (w && b) ln_apply_<true, true>(x, y, w, b, n, m, rs);
  else if (w) ln_apply_<true, false>(x, y, w, b, n, m, rs);
  else if (b) ln_apply_<false, true>(x, y, w, b, n, m, rs);
  else ln_apply_<false, false>(x, y, w, b, n, m, rs);
}

// One row of layer_norm's backward: dx = rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g * w; and the row's
// contributions g * xhat, g to the weight and bias gradients (HasW: a weight; the loops stay branch-free).
template <bool HasW, class T>
EMBER_VECTORIZE void ln_backward_row_(const T* EMBER_RESTRICT g, const T* EMBER_RESTRICT x, const T* EMBER_RESTRICT w,
                                      T* EMBER_RESTRICT dx, double* EMBER_RESTRICT dw, double* EMBER_RESTRICT db,
                                      std::int64_t n, SplitMean<compute_t<T>> m, compute_t<T> rs) {
  using C = compute_t<T>;
  auto gw_at = [&](std::int64_t j) {
    if constexpr (HasW) return static_cast<C>(g[j]) * static_cast<C>(w[j]);
    else return static_cast<C>(g[j]);
  };
  if (dx) {
    double a = 0, b = 0;
    for (std::int64_t bl = 0; bl < n; bl += kNormBlock) {
      const std::int64_t e = std::min(n, bl + kNormBlock);
      C s[kNormLanes] = {}, q[kNormLanes] = {};
      std::int64_t j = bl;
      for (; j + kNormLanes <= e; j += kNormLanes)
        for (int l = 0; l < kNormLanes; ++l) {
          const C gw = gw_at(j + l);
          s[l] += gw;
          q[l] += gw * (((static_cast<C>(x[j + l]) - m.hi) - m.lo) * rs);
        }
      C rsum = 0, rq = 0;
      for (int l = 0; l < kNormLanes; ++l) {
        rsum += s[l];
        rq += q[l];
      }
      for (; j < e; ++j) {
        const C gw = gw_at(j);
        rsum += gw;
        rq += gw * (((static_cast<C>(x[j]) - m.hi) - m.lo) * rs);
      }
      a += double(rsum);
      b += double(rq);
    }
    const C ma = C(a / double(n)), mb = C(b / double(n));
    for (std::int64_t j = 0; j < n; ++j) {
      const C xh = ((static_cast<C>(x[j]) - m.hi) - m.lo) * rs;
      dx[j] = convert<T>(rs * (gw_at(j) - ma - xh * mb));
    }
  }
  if (dw)
    for (std::int64_t j = 0; j < n; ++j)
      dw[j] += double(static_cast<C>(g[j]) * (((static_cast<C>(x[j]) - m.hi) - m.lo) * rs));
  if (db)
    for (std::int64_t j = 0; j < n; ++j) db[j] += double(static_cast<C>(g[j]));
}
}  // namespace detail

/// batch_norm's forward on a contiguous (N, C, S) buffer into y: in training, the batch statistics (and the running
/// statistics updated in place when defined: r = (1 - momentum) r + momentum * batch_stat, the unbiased variance for
/// running_var); in eval, the running statistics. mean and invstd (C values each) receive the per-channel mean and
/// 1/sqrt(var + eps) the output was normalised with. weight and bias (C) may be undefined. The statistics and
/// parameters are of dtype P: T itself, or float for 16-bit data (PyTorch's mixed-type batch norm: the data's
/// values are widened as they are read and the output rounded once, no float copy of the data is made).
template <class T, class P>
void batch_norm_forward(const T* xp, T* yp, std::int64_t N, std::int64_t C, std::int64_t S,
                        const Tensor<P>& running_mean, const Tensor<P>& running_var, const Tensor<P>& weight,
                        const Tensor<P>& bias, bool training, double momentum, double eps, std::vector<double>& mean,
                        std::vector<double>& invstd) {
  const std::int64_t M = N * S;
  if (training) {
    // Sweep 1, in memory order: moments of each (n, c) chunk, merged per channel within fixed batch blocks.
    const std::int64_t nblk = detail::batch_block_count(N);
    std::vector<detail::Moments> part(std::size_t(nblk * C));
    detail::for_batch_blocks(N, nblk, [&](std::int64_t blk, std::int64_t n0, std::int64_t n1) {
      detail::Moments* mo = part.data() + blk * C;
      for (std::int64_t n = n0; n < n1; ++n)
        for (std::int64_t c = 0; c < C; ++c) {
          double m, m2;
          detail::chunk_moments(xp + (n * C + c) * S, S, m, m2);
          mo[c].merge(double(S), m, m2);
        }
    });
    detail::finish_batch_stats(C, nblk, part, M, running_mean, running_var, momentum, eps, mean, invstd);
  } else {
    for (std::int64_t c = 0; c < C; ++c) {
      const double var = detail::elem(running_var, c);
      // A variance is never negative; one that is (or NaN) came from a corrupt state dict and would make the
      // channel NaN without a word.
      EMBER_CHECK(var + eps > 0, "batch_norm: running_var[", c, "] is ", var, " (eps ", eps,
                  "); in eval the running variance plus eps must be positive (a corrupt state dict?)");
      mean[std::size_t(c)] = detail::elem(running_mean, c);
      invstd[std::size_t(c)] = 1.0 / std::sqrt(var + eps);
    }
  }
  // Sweep 2, in memory order: y = (x - mean) * invstd * weight + bias.
  const detail::BnAffine<T, P> a(mean, invstd, weight, bias);
  detail::for_chunks(N * C, S, [&](std::int64_t i) {
    const std::size_t c = std::size_t(i % C);
    detail::affine_(xp + i * S, yp + i * S, S, a.mean[c], a.scale[c], a.shift[c]);
  });
}

/// batch_norm's gradients on contiguous (N, C, S) buffers g and x, from the forward's mean and invstd: dx (when dxp is
/// not null), dweight and dbias (C values, when not null). `training`: the batch-statistics gradient (the statistics
/// depend on x), else the eval one (they are constants). The weight and its gradients are of dtype P (see
/// batch_norm_forward).
template <class T, class P>
void batch_norm_backward(const T* gp, const T* xp, T* dxp, P* dweight, P* dbias, std::int64_t N, std::int64_t C,
                         std::int64_t S, const Tensor<P>& weight, const std::vector<double>& mean,
                         const std::vector<double>& invstd, bool training) {
  const std::int64_t M = N * S;
  const bool sums = dweight || dbias || (dxp && training);
  std::vector<double> sg(std::size_t(C), 0.0), sgx(std::size_t(C), 0.0);
  if (sums) {
    // Sweep 1: Σ g and Σ g (x - mean) per channel, in fixed batch blocks merged in order.
    detail::BnGradSums gs(N, C);
    detail::for_batch_blocks(N, gs.nblk, [&](std::int64_t blk, std::int64_t n0, std::int64_t n1) {
      for (std::int64_t n = n0; n < n1; ++n)
        for (std::int64_t c = 0; c < C; ++c)
          gs.add(blk, c, gp + (n * C + c) * S, xp + (n * C + c) * S, S, mean);
    });
    gs.total(sg, sgx);
  }
  for (std::int64_t c = 0; c < C; ++c) {
    if (dweight) dweight[c] = convert<P>(sgx[std::size_t(c)] * invstd[std::size_t(c)]);
    if (dbias) dbias[c] = convert<P>(sg[std::size_t(c)]);
  }
  if (!dxp) return;
  // Sweep 2: dx = k1 g + k2 (x - mean) + k3 per channel.
  const detail::BnDx<T, P> k(mean, invstd, weight, training, M, sg, sgx);
  detail::for_chunks(N * C, S, [&](std::int64_t i) {
    const std::size_t c = std::size_t(i % C);
    detail::bn_dx_(gp + i * S, xp + i * S, dxp + i * S, S, k.k1[c], k.k2[c], k.k3[c], k.mean[c]);
  });
}

/// layer_norm's forward over R contiguous rows of D values into y: mean and rstd (R values each) receive each row's
/// mean and 1/sqrt(biased var + eps). wp and bp (D values) may be null.
template <class T>
void layer_norm_forward(const T* xp, const T* wp, const T* bp, T* yp, std::int64_t R, std::int64_t D, double eps,
                        std::vector<double>& mean, std::vector<double>& rstd) {
  using Cm = compute_t<T>;
  const std::int64_t grain = std::max<std::int64_t>(1, kGrain / D);
  parallel_for(0, R, grain, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t i = r0; i < r1; ++i) {
      const T* xr = xp + i * D;
      const double m = double(static_cast<Cm>(xr[0])) + detail::block_sum(xr, D, static_cast<Cm>(xr[0])) / double(D);
      const detail::SplitMean<Cm> ms(m);
      const double var = detail::block_sqdev(xr, D, ms) / double(D);
      const double rs = 1.0 / std::sqrt(var + eps);
      mean[std::size_t(i)] = m;
      rstd[std::size_t(i)] = rs;
      detail::ln_apply(xr, yp + i * D, wp, bp, D, ms, Cm(rs));
    }
  });
}

/// layer_norm's gradients over R contiguous rows of D values, from the forward's per-row mean and rstd: dx (when dxp
/// is not null), and the weight and bias gradients (D values each, when dweight / dbias are not null). wp (D values)
/// may be null. Rows run in fixed blocks, each with its own weight/bias partial sums, added in block order: the
/// result does not depend on the thread count.
template <class T>
void layer_norm_backward(const T* gp, const T* xp, const T* wp, T* dxp, T* dweight, T* dbias, std::int64_t R,
                         std::int64_t D, const std::vector<double>& mean, const std::vector<double>& rstd) {
  const bool need_dweight = dweight != nullptr, need_dbias = dbias != nullptr;
  const std::int64_t nblk = std::max<std::int64_t>(1, std::min<std::int64_t>(R, 8));
  const bool params = need_dweight || need_dbias;
  std::vector<double> pw(params && need_dweight ? std::size_t(nblk * D) : 0, 0.0),
      pb(params && need_dbias ? std::size_t(nblk * D) : 0, 0.0);
  using Cm = compute_t<T>;
  parallel_for(0, nblk, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk) {
      const std::int64_t ra = R * blk / nblk, rb = R * (blk + 1) / nblk;
      double* dw = need_dweight ? pw.data() + blk * D : nullptr;
      double* db = need_dbias ? pb.data() + blk * D : nullptr;
      for (std::int64_t i = ra; i < rb; ++i)
        if (wp)
          detail::ln_backward_row_<true>(gp + i * D, xp + i * D, wp, dxp ? dxp + i * D : nullptr, dw, db, D,
                                         detail::SplitMean<Cm>(mean[std::size_t(i)]), Cm(rstd[std::size_t(i)]));
        else
          detail::ln_backward_row_<false>(gp + i * D, xp + i * D, wp, dxp ? dxp + i * D : nullptr, dw, db, D,
                                          detail::SplitMean<Cm>(mean[std::size_t(i)]), Cm(rstd[std::size_t(i)]));
    }
  });
  auto finish = [&](const std::vector<double>& part, T* out) {
    for (std::int64_t j = 0; j < D; ++j) {
      double s = 0;
      for (std::int64_t blk = 0; blk < nblk; ++blk) s += part[std::size_t(blk * D + j)];
      out[j] = convert<T>(s);
    }
  };
  if (need_dweight) finish(pw, dweight);
  if (need_dbias) finish(pb, dbias);
}

}  // namespace ember::cpu
