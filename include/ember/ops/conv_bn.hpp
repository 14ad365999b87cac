// ember — a convolution followed by a training-mode batch norm, an optional ReLU and an optional 2x2 max pool, as
// one operation on the CPU (forward and backward), without autograd.
//
// Unfused, this block makes about sixteen passes over the (N, O, oh, ow) activation: the convolution writes it, batch
// norm reads it for the statistics and again to normalise, ReLU and the pool each read and write a copy, the pool
// stores its indices, and the backward pass undoes each step with its own buffer. Fused:
// - forward: each image's convolution output z is reduced to its per-channel moments right after its GEMM, while
//   it is in cache; one pass then reads z and writes pool(relu(bn(z))) (the normalised map is never stored);
// - backward: one pass recomputes bn(z) and the ReLU and pool decisions per (image, channel) plane, writes the
//   gradient at the batch norm's output and sums what batch norm's gradient needs while the plane is in cache; a
//   second pass turns it into the gradient of z; then the convolution's own backward.
// Saved between them: x, z and the per-channel statistics. The arithmetic, its order and the merge order of the
// statistics are batch_norm's, relu's and max_pool2d's, so the fused results equal the unfused ones bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/normalization.hpp"

namespace ember::ops {

/// The options of the fused block after the convolution.
struct ConvBnOptions {
  double momentum = 0.1;  // running statistics: r = (1 - momentum) r + momentum * batch_stat
  double eps = 1e-5;
  bool relu = false;      // a ReLU after the batch norm
  bool pool2 = false;     // then a 2x2 max pool, stride 2, floor
};

/// What the fused forward returns and its backward needs.
template <class T>
struct ConvBnResult {
  Tensor<T> y;                       // (N, O, oh, ow), or (N, O, oh/2, ow/2) with pool2
  Tensor<T> z;                       // (N, O, oh, ow): the convolution's output (the batch norm's input)
  std::vector<double> mean, invstd;  // (O): the batch statistics
};

namespace detail {
template <class T>
void check_conv_bn(const char* op, const Tensor<T>& x, const cpu::ConvGeometry& g, const Tensor<T>& running_mean,
                   const Tensor<T>& running_var, const Tensor<T>& weight, const Tensor<T>& bias,
                   const ConvBnOptions& bo) {
  EMBER_CHECK(x.device().is_cpu(), op, ": runs on the CPU only; the input is on ", x.device().str(),
              " (use conv2d and batch_norm there)");
  const Shape zs{g.n, g.o, g.oh, g.ow};
  check_channel_vec(running_mean, g.o, "running_mean", zs, x.device());
  check_channel_vec(running_var, g.o, "running_var", zs, x.device());
  check_channel_vec(weight, g.o, "weight", zs, x.device());
  check_channel_vec(bias, g.o, "bias", zs, x.device());
  EMBER_CHECK(running_mean.defined() == running_var.defined(), op,
              ": running_mean and running_var must be both defined or both undefined");
  EMBER_CHECK(g.n * g.oh * g.ow > 1, op, ": batch norm needs more than 1 value per channel when training, the "
              "convolution's output has shape ", zs.str());
  EMBER_CHECK(bo.eps >= 0, op, ": eps must be non-negative, got ", bo.eps);
  EMBER_CHECK(!bo.pool2 || (g.oh >= 2 && g.ow >= 2), op, ": a 2x2 max pool needs an output of at least 2x2, got ",
              g.oh, "x", g.ow);
}

// One (image, channel) plane of the output pass: u = bn(z) (and relu), into y directly, or through `u` (L values)
// into the 2x2 max pool.
template <class T>
void conv_bn_plane(const T* z, T* y, T* u, std::int64_t oh, std::int64_t ow, SplitMean<compute_t<T>> m,
                   compute_t<T> scale, compute_t<T> shift, bool relu, bool pool2) {
  const std::int64_t L = oh * ow;
  T* dst = pool2 ? u : y;
  affine_(z, dst, L, m, scale, shift);
  if (relu) cpu::act_(dst, L, cpu::Act::relu);
  if (pool2) {
    cpu::PoolGeometry pg;
    pg.h = oh;
    pg.w = ow;
    pg.oh = oh / 2;
    pg.ow = ow / 2;
    cpu::detail::max_pool_plane_2x2<T, false>(pg, u, y, nullptr);
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
    if constexpr (std::is_same_v<T, float>) {
      // Up to 16 windows of the row at a time: the winner's lane mask per element, relu's derivative, the gradient interleaved back.
      const __m512 zero = _mm512_setzero_ps();
      for (; ox0 < pow; ox0 += 16) {
        const std::int64_t n = std::min<std::int64_t>(16, pow - ox0);
        const float* r0 = u + 2 * oy * ow + 2 * ox0;
        cpu::detail::Windows16 pre(r0, r0 + ow, n), in16 = pre;
        if (relu) in16.relu();
        __mmask16 wb, wd, we;
        (void)in16.max(wb, wd, we);
        const __mmask16 se = we, sd = __mmask16(wd & ~we), sb = __mmask16(wb & ~wd & ~we),
                        sa = __mmask16(~(wb | wd | we));
        auto live = [&](__m512 v) {  // relu's derivative: 0 where its input is <= 0
          return relu ? __mmask16(~_mm512_cmp_ps_mask(v, zero, _CMP_LE_OQ)) : __mmask16(0xffff);
        };
        const __m512 gv = _mm512_maskz_loadu_ps(cpu::detail::low_lanes(n), gy + oy * pow + ox0);
        float* g0 = gu + 2 * oy * ow + 2 * ox0;
        cpu::detail::store_interleaved(g0, _mm512_maskz_mov_ps(__mmask16(sa & live(pre.a)), gv),
                                       _mm512_maskz_mov_ps(__mmask16(sb & live(pre.b)), gv), n);
        cpu::detail::store_interleaved(g0 + ow, _mm512_maskz_mov_ps(__mmask16(sd & live(pre.d)), gv),
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

/// The training forward of conv2d(x, w, b, o) -> batch_norm (batch statistics; running statistics updated when
/// defined) -> [relu] -> [2x2 max pool], on the CPU. bn_weight / bn_bias (O) are optional, as batch_norm's.
template <class T>
ConvBnResult<T> conv2d_batch_norm_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b,
                                  const Tensor<T>& running_mean, const Tensor<T>& running_var,
                                  const Tensor<T>& bn_weight, const Tensor<T>& bn_bias, const Conv2dOptions& o,
                                  const ConvBnOptions& bo) {
  static_assert(is_floating_v<T>, "conv2d_batch_norm: floating-point tensors only");
  const char* op = "conv2d_batch_norm";
  const cpu::ConvGeometry g = conv2d_geometry(x, w, b, o);
  detail::check_conv_bn(op, x, g, running_mean, running_var, bn_weight, bn_bias, bo);
  const std::int64_t N = g.n, C = g.o, L = g.l();
  ConvBnResult<T> r;
  r.z = empty<T>(Shape{N, C, g.oh, g.ow});
  r.y = empty<T>(bo.pool2 ? Shape{N, C, g.oh / 2, g.ow / 2} : Shape{N, C, g.oh, g.ow});
  r.mean.assign(std::size_t(C), 0.0);
  r.invstd.assign(std::size_t(C), 0.0);
  const Tensor<T> xc = detail::dense(x), wc = detail::dense(w), bc = b.defined() ? detail::dense(b) : b;
  // The convolution, and each image's per-channel moments while its output is in cache.
  std::vector<double> cm(std::size_t(N * C)), cm2(std::size_t(N * C));
  cpu::conv2d_forward<T>(g, xc.data(), wc.data(), bc.defined() ? bc.data() : nullptr, r.z.data(), cpu::Act::none,
                         false, [&](std::int64_t i, const T* zi) {
                           for (std::int64_t c = 0; c < C; ++c)
                             detail::chunk_moments(zi + c * L, L, cm[std::size_t(i * C + c)],
                                                   cm2[std::size_t(i * C + c)]);
                         });
  // Merged as batch_norm merges them: in order within each fixed batch block, then block by block.
  const std::int64_t nblk = detail::batch_block_count(N);
  std::vector<detail::Moments> part(std::size_t(nblk * C));
  for (std::int64_t blk = 0; blk < nblk; ++blk)
    for (std::int64_t n = N * blk / nblk; n < N * (blk + 1) / nblk; ++n)
      for (std::int64_t c = 0; c < C; ++c)
        part[std::size_t(blk * C + c)].merge(double(L), cm[std::size_t(n * C + c)], cm2[std::size_t(n * C + c)]);
  detail::finish_batch_stats(C, nblk, part, N * L, running_mean, running_var, bo.momentum, bo.eps, r.mean, r.invstd);
  if (running_mean.defined()) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  // One pass: y = [pool]([relu](bn(z))).
  const detail::BnAffine<T> a(r.mean, r.invstd, bn_weight, bn_bias);
  const T* zp = r.z.data();
  T* yp = r.y.data();
  const std::int64_t yl = r.y.numel() / std::max<std::int64_t>(1, N * C);
  cpu::parallel_for(0, N * C, std::max<std::int64_t>(1, cpu::kGrain / std::max<std::int64_t>(1, L)),
                    [&](std::int64_t p0, std::int64_t p1) {
                      std::vector<T> u(bo.pool2 ? std::size_t(L) : 0);
                      for (std::int64_t p = p0; p < p1; ++p) {
                        const std::size_t c = std::size_t(p % C);
                        detail::conv_bn_plane(zp + p * L, yp + p * yl, u.data(), g.oh, g.ow, a.mean[c], a.scale[c],
                                              a.shift[c], bo.relu, bo.pool2);
                      }
                    });
  return r;
}

/// The gradients of the fused block; each is undefined when not asked for.
template <class T>
struct ConvBnGrads {
  Tensor<T> input, weight, bias;  // the convolution's
  Tensor<T> bn_weight, bn_bias;   // the batch norm's
};

/// Gradients of conv2d_batch_norm given gy (the shape of its y), from what its forward returned (z, mean, invstd) and
/// its inputs x, w, bn_weight and bn_bias (the last two may be undefined; the ReLU's and the pool's decisions are
/// recomputed from z through the batch norm). Each gradient is computed only when its flag is set.
template <class T>
ConvBnGrads<T> conv2d_batch_norm_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& w,
                                          const Tensor<T>& z, const Tensor<T>& bn_weight, const Tensor<T>& bn_bias,
                                          const std::vector<double>& mean, const std::vector<double>& invstd,
                                          const Conv2dOptions& o, const ConvBnOptions& bo, bool need_input,
                                          bool need_weight, bool need_bias, bool need_bn_weight, bool need_bn_bias) {
  const char* op = "conv2d_batch_norm_backward";
  const cpu::ConvGeometry g = conv2d_geometry(x, w, Tensor<T>(), o);
  const std::int64_t N = g.n, C = g.o, L = g.l();
  const Shape zs{N, C, g.oh, g.ow};
  const Shape ys = bo.pool2 ? Shape{N, C, g.oh / 2, g.ow / 2} : zs;
  EMBER_CHECK(gy.shape() == ys, op, ": gradient of shape ", gy.shape().str(), " does not match the output shape ",
              ys.str());
  EMBER_CHECK(z.shape() == zs && z.is_contiguous(), op, ": the saved convolution output has shape ", z.shape().str(),
              ", expected a contiguous ", zs.str());
  EMBER_CHECK(gy.device().is_cpu(), op, ": the gradient is on ", gy.device().str(), ", expected the CPU");
  EMBER_CHECK(mean.size() == std::size_t(C) && invstd.size() == std::size_t(C), op, ": ", mean.size(),
              " saved means for ", C, " channels");
  ConvBnGrads<T> r;
  const bool need_gz = need_input || need_weight || need_bias;
  if (!(need_gz || need_bn_weight || need_bn_bias)) return r;
  const Tensor<T> gyc = detail::dense(gy);
  const T *gp = gyc.data(), *zp = z.data();
  const std::int64_t yl = ys.numel() / std::max<std::int64_t>(1, N * C);
  // Pass 1, per plane in fixed batch blocks: gu, the gradient at the batch norm's output, and Σ gu, Σ gu (z - mean)
  // while the plane is in cache.
  const detail::BnAffine<T> a(mean, invstd, bn_weight, bn_bias);
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
                                   a.scale[cc], a.shift[cc], bo.relu, bo.pool2);
        gs.add(blk, c, gup + p * L, zp + p * L, L, mean);
      }
  });
  std::vector<double> sg(std::size_t(C), 0.0), sgx(std::size_t(C), 0.0);
  gs.total(sg, sgx);
  if (need_bn_weight) {
    r.bn_weight = empty<T>(Shape{C});
    for (std::int64_t c = 0; c < C; ++c) r.bn_weight.data()[c] = convert<T>(sgx[std::size_t(c)] * invstd[std::size_t(c)]);
  }
  if (need_bn_bias) {
    r.bn_bias = empty<T>(Shape{C});
    for (std::int64_t c = 0; c < C; ++c) r.bn_bias.data()[c] = convert<T>(sg[std::size_t(c)]);
  }
  if (!need_gz) return r;
  // Pass 2: gz = k1 gu + k2 (z - mean) + k3, batch_norm's input gradient; then the convolution's backward.
  const detail::BnDx<T> k(mean, invstd, bn_weight, true, N * L, sg, sgx);
  Tensor<T> gz = empty<T>(zs);
  T* gzp = gz.data();
  detail::for_chunks(N * C, L, [&](std::int64_t p) {
    const std::size_t c = std::size_t(p % C);
    detail::bn_dx_(gup + p * L, zp + p * L, gzp + p * L, L, k.k1[c], k.k2[c], k.k3[c], k.mean[c]);
  });
  gu = Tensor<T>();
  Conv2dGrads<T> cg = conv2d_backward(gz, x, w, o, need_input, need_weight, need_bias);
  r.input = std::move(cg.input);
  r.weight = std::move(cg.weight);
  r.bias = std::move(cg.bias);
  return r;
}

}  // namespace ember::ops
