// ember — the CPU kernel of a convolution followed by a training-mode batch norm, an optional ReLU and an optional
// 2x2 max pool, as one operation, forward and backward (ops/conv_bn.hpp checks the arguments).
//
// Unfused, this block makes about sixteen passes over the (N, O, oh, ow) activation: the convolution writes it, batch
// norm reads it for the statistics and again to normalise, ReLU and the pool each read and write a copy, the pool
// stores its indices, and the backward pass undoes each step with its own buffer. Fused:
// - forward: each image's convolution output z is reduced to its per-channel moments right after its GEMM, while
//   it is in cache; one pass then reads z and writes pool(relu(bn(z))) (the normalised map is never stored);
// - backward: one pass recomputes bn(z) and the ReLU and pool decisions per (image, channel) plane, writes the
//   gradient at the batch norm's output and sums what batch norm's gradient needs while the plane is in cache; a
//   second pass turns it into the gradient of z; then the convolution's own backward (ops/conv.hpp).
// Saved between them: x, z and the per-channel statistics. The arithmetic, its order and the merge order of the
// statistics are batch_norm's (cpu/norm.hpp), relu's and max_pool2d's (cpu/pool.hpp), so the fused results equal the
// unfused ones bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/norm.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

namespace detail {
// One (image, channel) plane of the output pass: u = bn(z) (and relu), into y directly, or through `u` (L values)
// into the 2x2 max pool.
template <class T>
void conv_bn_plane(const T* z, T* y, T* u, std::int64_t oh, std::int64_t ow, SplitMean<compute_t<T>> m,
                   compute_t<T> scale, compute_t<T> shift, bool relu, bool pool2) {
  const std::int64_t L = oh * ow;
  T* dst = pool2 ? u : y;
  affine_(z, dst, L, m, scale, shift);
  if (relu) act_(dst, L, Activation::relu);
  if (pool2) {
    PoolGeometry pg;
    pg.h = oh;
    pg.w = ow;
    pg.oh = oh / 2;
    pg.ow = ow / 2;
    detail::max_pool_plane_2x2<T, false>(pg, u, y, nullptr);
  }
}

// The gradient at the batch norm's output for one plane: gy sent back through the pool (to the first maximum of
// each window, as max_pool2d) and the ReLU (where its input is > 0 or NaN, as relu's derivative). u: L values of
// scratch.
template <class T>
EMBER_VECTORIZE void conv_bn_plane_grad(const T* EMBER_RESTRICT z, const T* EMBER_RESTRICT gy, T* EMBER_RESTRICT gu,
                                        T* EMBER_RESTRICT u, std::int64_t oh, std::int64_t ow,
                                        SplitMean<compute_t<T>> m, compute_t<T> scale, compute_t<T> shift, bool relu,
                                        bool pool2) {
  using C = compute_t<T>;
  const std::int64_t L = oh * ow;
  affine_(z, u, L, m, scale, shift);
  if (!pool2) {
    for (std::int64_t j = 0; j < L; ++j) gu[j] = relu && static_cast<C>(u[j]) <= C(0) ? T(0) : gy[j];
    return;
  }
  for (std::int64_t j = 0; j < L; ++j) gu[j] = T(0);
  const std::int64_t poh = oh / 2, pow = ow / 2;
  // The pool's input, relu(u) as relu computes it (x < 0 ? 0 : x).
  auto in = [&](std::int64_t q) {
    const C v = static_cast<C>(u[q]);
    return relu && v < C(0) ? C(0) : v;
  };
  for (std::int64_t oy = 0; oy < poh; ++oy) {
    std::int64_t ox0 = 0;
#if EMBER_POOL_AVX512
    constexpr bool vec = std::is_same_v<T, float> || (EMBER_POOL_AVX512_BF16 && std::is_same_v<T, bfloat16>);
    if constexpr (vec) {
      // Up to 16 windows of the row at a time: the winner's lane mask per element, relu's derivative, the gradient
      // interleaved back (bfloat16 values travel as exact floats).
      const __m512 zero = _mm512_setzero_ps();
      for (; ox0 < pow; ox0 += 16) {
        const std::int64_t n = std::min<std::int64_t>(16, pow - ox0);
        const T* r0 = u + 2 * oy * ow + 2 * ox0;
        detail::Windows16 pre(r0, r0 + ow, n), in16 = pre;
        if (relu) in16.relu();
        __mmask16 wb, wd, we;
        (void)in16.max(wb, wd, we);
        const __mmask16 se = we, sd = __mmask16(wd & ~we), sb = __mmask16(wb & ~wd & ~we),
                        sa = __mmask16(~(wb | wd | we));
        auto live = [&](__m512 v) {  // relu's derivative: 0 where its input is <= 0
          return relu ? __mmask16(~_mm512_cmp_ps_mask(v, zero, _CMP_LE_OQ)) : __mmask16(0xffff);
        };
        const __m512 gv = detail::load16(gy + oy * pow + ox0, n);
        T* g0 = gu + 2 * oy * ow + 2 * ox0;
        detail::store_interleaved(g0, _mm512_maskz_mov_ps(__mmask16(sa & live(pre.a)), gv),
                                       _mm512_maskz_mov_ps(__mmask16(sb & live(pre.b)), gv), n);
        detail::store_interleaved(g0 + ow, _mm512_maskz_mov_ps(__mmask16(sd & live(pre.d)), gv),
                                       _mm512_maskz_mov_ps(__mmask16(se & live(pre.e)), gv), n);
      }
    }
#endif
    for (std::int64_t ox = ox0; ox < pow; ++ox) {
      // max_pool_plane_2x2's choice: a later element wins when greater or NaN.
      const std::int64_t c0 = 2 * oy * ow + 2 * ox;
      const std::int64_t cand[3] = {c0 + 1, c0 + ow, c0 + ow + 1};
      C best = in(c0);
      std::int64_t k = c0;
      for (std::int64_t q : cand) {
        const C v = in(q);
        if (v > best || v != v) {
          best = v;
          k = q;
        }
      }
      // relu's derivative at its input u: 0 where u <= 0.
      if (!relu || !(static_cast<C>(u[k]) <= C(0))) gu[k] = gy[oy * pow + ox];
    }
  }
}
}  // namespace detail

/// The fused forward on dense buffers: z (N, O, oh, ow) = conv2d(x, w, b) (b may be null), the batch statistics of z
/// into mean and invstd (O values each; the running statistics updated in place when defined), and y =
/// [pool]([relu](batch_norm(z))) ((N, O, oh, ow), or (N, O, oh/2, ow/2) with pool2). bn_weight / bn_bias (O) may be
/// undefined; they and the running statistics are of dtype P (T, or float for 16-bit data, as batch_norm's).
template <class T, class P = T>
void conv2d_batch_norm_forward(const ConvGeometry& g, const T* xp, const T* wp, const T* bp, T* zp, T* yp,
                               const Tensor<P>& running_mean, const Tensor<P>& running_var, const Tensor<P>& bn_weight,
                               const Tensor<P>& bn_bias, double momentum, double eps, bool relu, bool pool2,
                               std::vector<double>& mean, std::vector<double>& invstd) {
  const std::int64_t N = g.n, C = g.o, L = g.l();
  // The convolution, and each image's per-channel moments while its output is in cache.
  std::vector<double> cm(std::size_t(N * C)), cm2(std::size_t(N * C));
  conv2d_forward<T>(g, xp, wp, bp, zp, Activation::none, false, [&](std::int64_t i, const T* zi) {
    for (std::int64_t c = 0; c < C; ++c)
      detail::chunk_moments(zi + c * L, L, cm[std::size_t(i * C + c)], cm2[std::size_t(i * C + c)]);
  });
  // Merged as batch_norm merges them: in order within each fixed batch block, then block by block.
  const std::int64_t nblk = detail::batch_block_count(N);
  std::vector<detail::Moments> part(std::size_t(nblk * C));
  for (std::int64_t blk = 0; blk < nblk; ++blk)
    for (std::int64_t n = N * blk / nblk; n < N * (blk + 1) / nblk; ++n)
      for (std::int64_t c = 0; c < C; ++c)
        part[std::size_t(blk * C + c)].merge(double(L), cm[std::size_t(n * C + c)], cm2[std::size_t(n * C + c)]);
  detail::finish_batch_stats(C, nblk, part, N * L, running_mean, running_var, momentum, eps, mean, invstd);
  // One pass: y = [pool]([relu](bn(z))).
  const detail::BnAffine<T, P> a(mean, invstd, bn_weight, bn_bias);
  const std::int64_t yl = pool2 ? (g.oh / 2) * (g.ow / 2) : L;
  parallel_for(0, N * C, std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, L)),
               [&](std::int64_t p0, std::int64_t p1) {
                 std::vector<T> u(pool2 ? std::size_t(L) : 0);
                 for (std::int64_t p = p0; p < p1; ++p) {
                   const std::size_t c = std::size_t(p % C);
                   detail::conv_bn_plane(zp + p * L, yp + p * yl, u.data(), g.oh, g.ow, a.mean[c], a.scale[c],
                                         a.shift[c], relu, pool2);
                 }
               });
}

/// The gradients of the fused block's batch norm, ReLU and pool: gz (the gradient at the convolution's output, when
/// need_gz), and the batch norm's weight and bias gradients (when asked for, in the parameters' dtype P); undefined
/// where not asked for.
template <class T, class P = T>
struct ConvBnNormGrads {
  Tensor<T> gz;
  Tensor<P> dbn_weight, dbn_bias;
};

/// The backward of the fused block down to the convolution's output, from gp (the dense gradient of y), zp (the saved
/// convolution output) and the forward's statistics (the ReLU's and the pool's decisions are recomputed from z).
template <class T, class P = T>
ConvBnNormGrads<T, P> conv2d_batch_norm_backward(const ConvGeometry& g, const T* gp, const T* zp,
                                                 const std::vector<double>& mean, const std::vector<double>& invstd,
                                                 const Tensor<P>& bn_weight, const Tensor<P>& bn_bias, bool relu,
                                                 bool pool2, bool need_gz, bool need_bn_weight, bool need_bn_bias) {
  const std::int64_t N = g.n, C = g.o, L = g.l();
  const Shape zs{N, C, g.oh, g.ow};
  const std::int64_t yl = pool2 ? (g.oh / 2) * (g.ow / 2) : L;
  ConvBnNormGrads<T, P> r;
  // Pass 1, per plane in fixed batch blocks: gu, the gradient at the batch norm's output, and Σ gu, Σ gu (z - mean)
  // while the plane is in cache.
  const detail::BnAffine<T, P> a(mean, invstd, bn_weight, bn_bias);
  Tensor<T> gu = empty<T>(zs);
  T* gup = gu.data();
  detail::BnGradSums gs(N, C);
  detail::for_batch_blocks(N, gs.nblk, [&](std::int64_t blk, std::int64_t n0, std::int64_t n1) {
    std::vector<T> u(static_cast<std::size_t>(L));
    for (std::int64_t n = n0; n < n1; ++n)
      for (std::int64_t c = 0; c < C; ++c) {
        const std::int64_t p = n * C + c;
        const std::size_t cc = std::size_t(c);
        detail::conv_bn_plane_grad(zp + p * L, gp + p * yl, gup + p * L, u.data(), g.oh, g.ow, a.mean[cc],
                                   a.scale[cc], a.shift[cc], relu, pool2);
        gs.add(blk, c, gup + p * L, zp + p * L, L, mean);
      }
  });
  std::vector<double> sg(std::size_t(C), 0.0), sgx(std::size_t(C), 0.0);
  gs.total(sg, sgx);
  if (need_bn_weight) {
    r.dbn_weight = empty<P>(Shape{C});
    for (std::int64_t c = 0; c < C; ++c)
      r.dbn_weight.data()[c] = convert<P>(sgx[std::size_t(c)] * invstd[std::size_t(c)]);
  }
  if (need_bn_bias) {
    r.dbn_bias = empty<P>(Shape{C});
    for (std::int64_t c = 0; c < C; ++c) r.dbn_bias.data()[c] = convert<P>(sg[std::size_t(c)]);
  }
  if (!need_gz) return r;
  // Pass 2: gz = k1 gu + k2 (z - mean) + k3, batch_norm's input gradient.
  const detail::BnDx<T, P> k(mean, invstd, bn_weight, true, N * L, sg, sgx);
  r.gz = empty<T>(zs);
  T* gzp = r.gz.data();
  detail::for_chunks(N * C, L, [&](std::int64_t p) {
    const std::size_t c = std::size_t(p % C);
    detail::bn_dx_(gup + p * L, zp + p * L, gzp + p * L, L, k.k1[c], k.k2[c], k.k3[c], k.mean[c]);
  });
  return r;
}

}  // namespace ember::cpu
