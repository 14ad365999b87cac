// ember — direct fp32 convolution forward (AVX-512 or AVX2 + FMA: one source over simd::Vec<float>'s W lanes, 16 or
// 8): no column matrix. Each task copies the input rows of its few output rows into a zero-padded window and reads it
// one broadcast per (output position, channel, tap), against the weights packed in blocks of W output channels; each
// tile holds MR positions x NV blocks of W channels in registers over the whole depth C/groups · kh · kw. The product
// comes out channels-last for a few output rows at a time, so the bias, the activation and a fused 2x2 max pool are
// vector operations across channels while the block is in cache, and the result is stored to the NCHW output once.
//
// Compared with im2col + GEMM it skips building and packing the columns (kh · kw copies of the input) and writing
// the full-size output before a pool. The sums run over the depth in the same order (channel, tap row, tap
// column) with one rounding per fused multiply-add, as the GEMM's do; the GEMM may split the depth into blocks, so
// the two paths agree to rounding, not bit for bit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/cpu/detail/simd.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/thread_pool.hpp"

// The direct and Winograd kernels need simd::Vec<float>'s float extras (AVX-512 or AVX2 + FMA).
#define EMBER_CONV_DIRECT EMBER_SIMD_FLOAT_EXTRAS

// nvcc's front end does not know `#pragma GCC unroll` (warning 1675); the host compiler still gets the pragmas.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#endif

namespace ember::cpu {

/// Whether float convolutions may take the direct forward path (AVX-512 and AVX2 builds); on by default. Tests and
/// benchmarks switch it off to compare with im2col + GEMM.
inline std::atomic<bool>& conv_direct_enabled() {
  static std::atomic<bool> on{true};
  return on;
}

namespace detail::direct {

#if EMBER_CONV_DIRECT
using V = simd::Vec<float>;
using R = V::type;
inline constexpr int W = V::width;  // lanes: output channels per block
#else
inline constexpr int W = 16;  // (no kernel here: the layouts' block size only)
#endif

#if EMBER_CONV_DIRECT

// MR positions (rows of A: in + pos[i] + koff[k]; rows past mr repeat the last) x NV blocks of W output channels
// (block v's depth k at w + v · wstride + W k). C's rows are ldc apart and take NV · W values.
template <int MR, int NV>
void tile(const float* in, const std::int64_t* pos, int mr, const std::int64_t* koff, std::int64_t depth,
          const float* w, std::int64_t wstride, float* c, std::int64_t ldc) {
  R acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
  const float* ar[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ar[i] = in + pos[std::min(i, mr - 1)];
  for (std::int64_t k = 0; k < depth; ++k) {
    const std::int64_t o = koff[k];
    R bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = V::loadu(w + v * wstride + k * W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const R av = V::bcast(ar[i] + o);  // AVX-512: an embedded broadcast of the FMA
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = V::fma(av, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    if (i < mr)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) V::storeu(c + i * ldc + v * W, acc[i][v]);
}

template <int MR, int NV>
void rows(const float* in, const std::int64_t* pos, std::int64_t m, const std::int64_t* koff, std::int64_t depth,
          const float* w, std::int64_t wstride, float* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; i += MR)
    tile<MR, NV>(in, pos + i, int(std::min<std::int64_t>(MR, m - i)), koff, depth, w, wstride, c + i * ldc, ldc);
}

// C[p][o] = Σ_k in[pos[p] + koff[k]] · w[o][k] for p < m, o < W · nblocks (w packed as above, nblocks blocks of W).
inline void product(const float* in, const std::int64_t* pos, std::int64_t m, const std::int64_t* koff,
                    std::int64_t depth, const float* w, std::int64_t nblocks, float* c, std::int64_t ldc) {
  const std::int64_t wstride = depth * W;
#if EMBER_SIMD_AVX512
  // 4 blocks against 6 positions: 24 accumulators and 4 weight vectors of the 32 registers (the broadcasts are
  // memory operands); fewer blocks take more positions.
  constexpr std::int64_t pass = 4;
#else
  // AVX2, 16 registers and no embedded broadcast: 2 blocks against 6 positions, 12 accumulators, 2 weight vectors
  // and the broadcast; one block takes 12 positions.
  constexpr std::int64_t pass = 2;
#endif
  for (std::int64_t b = 0; b < nblocks; b += pass) {
    const std::int64_t nb = std::min<std::int64_t>(pass, nblocks - b);
    const float* wb = w + b * wstride;
    float* cb = c + b * W;
#if EMBER_SIMD_AVX512
    switch (nb) {
      case 4: rows<6, 4>(in, pos, m, koff, depth, wb, wstride, cb, ldc); break;
      case 3: rows<8, 3>(in, pos, m, koff, depth, wb, wstride, cb, ldc); break;
      case 2: rows<12, 2>(in, pos, m, koff, depth, wb, wstride, cb, ldc); break;
      default: rows<16, 1>(in, pos, m, koff, depth, wb, wstride, cb, ldc); break;
    }
#else
    if (nb == 2) rows<6, 2>(in, pos, m, koff, depth, wb, wstride, cb, ldc);
    else rows<12, 1>(in, pos, m, koff, depth, wb, wstride, cb, ldc);
#endif
  }
}
#endif

}  // namespace detail::direct

/// Whether conv2d_forward takes the direct path for this call (float, AVX-512 or AVX2, not a 1x1 convolution that reads
/// its input as the column matrix already, and a depth C/groups · kh · kw of at least 32: with less, the
/// channels-last store dominates; measured at depth 9, the CNN's first layer, the direct forward took 1.6x the time
/// of im2col + GEMM, BM_Conv2dForwardAlgo/0).
template <class T, class Geometry>
bool conv_direct_applies(const Geometry& g) {
  if constexpr (!std::is_same_v<T, float> || !EMBER_CONV_DIRECT) {
    (void)g;
    return false;
  } else {
    return conv_direct_enabled().load(std::memory_order_relaxed) && !g.pointwise() && g.cg() * g.kh * g.kw >= 32;
  }
}

/// y = act(conv2d(x, w) + b), pooled 2x2 when pool2 (the same contract as conv2d_forward), through the direct
/// kernel. Call only where conv_direct_applies<float>(g).
template <class Geometry>
void conv2d_forward_direct(const Geometry& g, const float* x, const float* w, const float* b, float* y, Activation act,
                           bool pool2) {
#if EMBER_CONV_DIRECT
  using detail::direct::R, detail::direct::V, detail::direct::W;
  if (g.n <= 0 || g.oh <= 0 || g.ow <= 0 || g.o <= 0) return;  // nothing to write
  const std::int64_t G = g.groups, og = g.og(), cg = g.cg(), blocks = (og + W - 1) / W, ogp = blocks * W;
  const std::int64_t taps = g.kh * g.kw, depth = cg * taps;
  const std::int64_t wp = g.w + 2 * g.pw;  // a padded input row
  // Weights per group: blocks of W output channels, W values per depth index (zeros past the group's outputs),
  // each written once (no zero fill first: at a batch of one the packing is a visible part of the call).
  const std::unique_ptr<float[]> wk(new float[std::size_t(G * blocks * depth * W)]);
  for (std::int64_t grp = 0; grp < G; ++grp)
    for (std::int64_t blk = 0; blk < blocks; ++blk)
      for (std::int64_t k = 0; k < depth; ++k) {
        float* dst = wk.get() + ((grp * blocks + blk) * depth + k) * W;
        for (std::int64_t l = 0; l < W; ++l) {
          const std::int64_t o = blk * W + l;
          dst[l] = o < og ? w[(grp * og + o) * depth + k] : 0.0f;
        }
      }
  // Tasks: (image, group, block of output rows), about 48 positions each; with a pool, an even number of rows.
  // Fewer rows per task when that leaves under 4 tasks per thread (a batch of one image).
  const std::int64_t want = std::max<std::int64_t>(1, (48 + g.ow - 1) / g.ow), step = pool2 ? 2 : 1;
  const std::int64_t oh_used = pool2 ? g.oh / 2 * 2 : g.oh;  // a pool drops an odd last row
  std::int64_t rows = pool2 ? 2 * ((want + 1) / 2) : want;
  while (rows > step && g.n * G * ((oh_used + rows - 1) / rows) < 4 * get_num_threads()) rows -= step;
  const std::int64_t rblocks = (oh_used + rows - 1) / rows;
  // Each task copies the input rows its output rows read (hl of them per channel, halo included) into a window of
  // its own, zero-padded: no pass over the whole input before the convolution, and the window stays in cache.
  const std::int64_t hl = (rows - 1) * g.sh + (g.kh - 1) * g.dh + 1, lplane = hl * wp;
  std::vector<std::int64_t> koff(static_cast<std::size_t>(depth));
  for (std::int64_t ch = 0; ch < cg; ++ch)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j)
        koff[std::size_t((ch * g.kh + i) * g.kw + j)] = ch * lplane + i * g.dh * wp + j * g.dw;
  std::vector<float> bias(static_cast<std::size_t>(G * ogp), 0.0f);
  if (b)
    for (std::int64_t grp = 0; grp < G; ++grp) std::copy(b + grp * og, b + (grp + 1) * og, bias.data() + grp * ogp);

  const std::int64_t yh = pool2 ? g.oh / 2 : g.oh, yw = pool2 ? g.ow / 2 : g.ow, yl = yh * yw;
  const bool relu = act == Activation::relu;
  parallel_for(0, g.n * G * rblocks, 1, [&](std::int64_t t0, std::int64_t t1) {
    // Scratch without a zero fill: every element read is written first.
    const std::int64_t pmax = rows * g.ow;
    const std::unique_ptr<std::int64_t[]> pos(new std::int64_t[std::size_t(pmax)]);
    const std::unique_ptr<float[]> c(new float[std::size_t(pmax * ogp)]),
        pooled(new float[pool2 ? std::size_t(rows / 2 * yw * ogp) : 1]), win(new float[std::size_t(cg * lplane)]);
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t img = t / (G * rblocks), grp = (t / rblocks) % G, rb = t % rblocks;
      const std::int64_t oy0 = rb * rows, oy1 = std::min(oh_used, oy0 + rows), P = (oy1 - oy0) * g.ow;
      const std::int64_t iy0 = oy0 * g.sh - g.ph, rows_read = (oy1 - oy0 - 1) * g.sh + (g.kh - 1) * g.dh + 1;
      for (std::int64_t ch = 0; ch < cg; ++ch) {
        const float* src = x + (img * g.c + grp * cg + ch) * g.h * g.w;
        for (std::int64_t r = 0; r < rows_read; ++r) {
          float* dst = win.get() + ch * lplane + r * wp;
          const std::int64_t iy = iy0 + r;
          if (iy < 0 || iy >= g.h) {
            std::fill(dst, dst + wp, 0.0f);
            continue;
          }
          std::fill(dst, dst + g.pw, 0.0f);
          std::memcpy(dst + g.pw, src + iy * g.w, std::size_t(g.w) * sizeof(float));
          std::fill(dst + g.pw + g.w, dst + wp, 0.0f);
        }
      }
      for (std::int64_t oy = oy0, p = 0; oy < oy1; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox, ++p) pos[p] = (oy - oy0) * g.sh * wp + ox * g.sw;
      detail::direct::product(win.get(), pos.get(), P, koff.data(), depth,
                              wk.get() + grp * blocks * depth * W, blocks, c.get(), ogp);
      // + bias, then the activation (ReLU in registers)
      for (std::int64_t o0 = 0; o0 < ogp; o0 += W) {
        const R vb = V::loadu(bias.data() + grp * ogp + o0);
        for (std::int64_t p = 0; p < P; ++p) {
          R r = V::add(V::loadu(c.get() + p * ogp + o0), vb);
          if (relu) r = V::relu(r);
          V::storeu(c.get() + p * ogp + o0, r);
        }
      }
      if (!relu && act != Activation::none)
        for (std::int64_t p = 0; p < P; ++p) act_(c.get() + p * ogp, og, act);
      const float* src = c.get();
      std::int64_t n_out = P, y0 = oy0 * g.ow;
      if (pool2) {
        const std::int64_t prow = (oy1 - oy0) / 2;
        for (std::int64_t py = 0; py < prow; ++py)
          for (std::int64_t px = 0; px < yw; ++px)
            for (std::int64_t o0 = 0; o0 < ogp; o0 += W) {
              const float* r0 = c.get() + (2 * py * g.ow + 2 * px) * ogp + o0;
              const float* r1 = r0 + g.ow * ogp;
              const R mx = V::pool_pick(
                  V::pool_pick(V::pool_pick(V::loadu(r0), V::loadu(r0 + ogp)), V::loadu(r1)), V::loadu(r1 + ogp));
              V::storeu(pooled.get() + (py * yw + px) * ogp + o0, mx);
            }
        src = pooled.get();
        n_out = prow * yw;
        y0 = oy0 / 2 * yw;
      }
      // channels-last -> the output's planes
      for (std::int64_t o = 0; o < og; ++o) {
        float* yr = y + (img * g.o + grp * og + o) * yl + y0;
        for (std::int64_t p = 0; p < n_out; ++p) yr[p] = src[p * ogp + o];
      }
    }
  });
#else
  (void)g, (void)x, (void)w, (void)b, (void)y, (void)act, (void)pool2;
#endif
}

}  // namespace ember::cpu

#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif
