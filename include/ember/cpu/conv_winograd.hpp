// ember — Winograd F(4x4, 3x3) fp32 convolution (AVX-512 or AVX2 + FMA) for 3x3 kernels with stride 1, no dilation
// and one group: the forward, the gradient to the input (the same convolution of the output gradient with the kernels
// flipped and their channels swapped) and the gradient to the weight (the transformed kernels' gradient, summed over
// the tiles, transformed back). Each 4x4 block of outputs comes from a 6x6 block of the input with 36 products per
// (output, input channel) pair instead of 144: the input block is transformed (Bᵀ d B), multiplied by the
// transformed kernels (G g Gᵀ, once per call) in 36 independent GEMMs over the channels, and transformed back
// (Aᵀ m A). The GEMMs are the direct kernel's tiles (cpu/conv_direct.hpp).
//
// Layout: each task takes one image and a band of tile rows (or, for small images, a few whole images). It copies
// the band's input rows channels-last into a zero-padded window, so every transform is a vector operation across W
// channels (simd::Vec<float>'s lanes: 16 with AVX-512, 8 with AVX2; one source for both); the GEMMs run on the
// transformed band while it is in cache; the output is transformed channels-last, the bias and activation are applied
// there, and it is stored to the NCHW output once.
//
// Numerics: the transforms are exact in real arithmetic; in fp32 their rounding makes the result differ from a
// direct sum by a few units in the last place of the largest terms (the kernel transform is computed in double and
// rounded once). tests/test_conv.cpp bounds the error against a double reference; cpu::conv_winograd_enabled()
// switches the path off for bit-for-bit comparisons with the direct kernel. Non-finite inputs spread further than
// in a direct sum, as the transforms mix each 6x6 input block: a NaN or an infinity makes NaN of every output in the
// 4x4 blocks whose input block holds it, where a direct sum gives NaN (or ±inf) in the outputs whose 3x3 window
// holds it only.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/cpu/conv_direct.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

/// Whether 3x3 stride-1 float convolutions may take the Winograd path (AVX-512 and AVX2 builds); on by default.
inline std::atomic<bool>& conv_winograd_enabled() {
  static std::atomic<bool> on{true};
  return on;
}

/// Whether the Winograd kernel computes conv2d with geometry g (float, AVX-512 or AVX2, 3x3, stride 1, no dilation, one
/// group, padding at most 2, and at least 16 input and 16 output channels: the fewest measured, where the forward
/// still takes about half the direct kernel's time; bench_conv's BM_Conv2dForwardAlgo).
template <class T, class Geometry>
bool conv_winograd_applies(const Geometry& g) {
  if constexpr (!std::is_same_v<T, float> || !EMBER_CONV_DIRECT) {
    (void)g;
    return false;
  } else {
    return conv_winograd_enabled().load(std::memory_order_relaxed) && g.kh == 3 && g.kw == 3 && g.sh == 1 &&
           g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1 && g.ph <= 2 && g.pw <= 2 && g.c >= 16 &&
           g.o >= 16 && g.oh > 0 && g.ow > 0;
  }
}

namespace detail::winograd {

#if EMBER_CONV_DIRECT
using detail::direct::R, detail::direct::V, detail::direct::W;

// v = Bᵀ d for one 6-vector of W lanes (in place may not alias): the interpolation points 0, ±1, ±2 and ∞.
inline void input_1d(const R d[6], R v[6]) {
  const R four = V::set1(4.0f), five = V::set1(5.0f), two = V::set1(2.0f);
  const R t0 = V::fnma(four, d[2], d[4]);  // d4 - 4 d2
  const R t1 = V::fnma(four, d[1], d[3]);  // d3 - 4 d1
  const R t2 = V::sub(d[4], d[2]);
  const R t3 = V::mul(two, V::sub(d[3], d[1]));
  v[0] = V::fma(four, d[0], V::fnma(five, d[2], d[4]));
  v[1] = V::add(t1, t0);
  v[2] = V::sub(t0, t1);
  v[3] = V::add(t2, t3);
  v[4] = V::sub(t2, t3);
  v[5] = V::fma(four, d[1], V::fnma(five, d[3], d[5]));
}

// y = Aᵀ m for one 6-vector: 4 outputs.
inline void output_1d(const R m[6], R y[4]) {
  const R two = V::set1(2.0f), four = V::set1(4.0f), eight = V::set1(8.0f);
  const R s1 = V::add(m[1], m[2]), d1 = V::sub(m[1], m[2]);
  const R s2 = V::add(m[3], m[4]), d2 = V::sub(m[3], m[4]);
  y[0] = V::add(V::add(m[0], s1), s2);
  y[1] = V::fma(two, d2, d1);
  y[2] = V::fma(four, s2, s1);
  y[3] = V::add(V::fma(eight, d2, d1), m[5]);
}

// dst[col · ld + c] = src[c · cstride + col] for c < nc, col < ncol (both at most W), and 0 for nc <= c < W: a
// W x W block of planes to channels-last.
inline void to_channels_last(const float* src, std::int64_t cstride, int nc, int ncol, float* dst, std::int64_t ld) {
  R r[W];
  for (int c = 0; c < W; ++c) r[c] = c < nc ? V::loadu_n(src + c * cstride, ncol) : V::zero();
  V::transpose(r);
  for (int col = 0; col < ncol; ++col) V::storeu(dst + col * ld, r[col]);
}

// dst[o · ostride + col] = src[col · ld + o] for o < no, col < ncol (both at most W): channels-last to planes.
inline void to_planes(const float* src, std::int64_t ld, int ncol, float* dst, std::int64_t ostride, int no) {
  R r[W];
  for (int col = 0; col < W; ++col) r[col] = col < ncol ? V::loadu(src + col * ld) : V::zero();
  V::transpose(r);
  for (int o = 0; o < no; ++o) V::storeu_n(dst + o * ostride, r[o], ncol);
}
#endif

// The kernel transform's matrix (6x3), for the interpolation points 0, ±1, ±2 and ∞.
inline constexpr double G[6][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};

// U = G k Gᵀ (6x6) of one 3x3 kernel k, in double, rounded once.
inline void kernel_6x6(const double k[3][3], float u[36]) {
  double gk[6][3];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) gk[i][j] = G[i][0] * k[0][j] + G[i][1] * k[1][j] + G[i][2] * k[2][j];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) u[i * 6 + j] = float(gk[i][0] * G[j][0] + gk[i][1] * G[j][1] + gk[i][2] * G[j][2]);
}

/// The transformed kernels for out_ch outputs from in_ch inputs, laid out for the direct kernel's tiles: for each
/// of the 36 points, blocks of W outputs, each in_ch x W (zeros past out_ch). The kernel of (output o, input c)
/// is w[o][c] (w: (out_ch, in_ch, 3, 3)), or, with `flip`, w[c][o] rotated by 180 degrees (w: (in_ch, out_ch, 3,
/// 3)): the convolution that gives the gradient to the input.
inline std::unique_ptr<float[]> transform_kernels(const float* w, std::int64_t out_ch, std::int64_t in_ch, bool flip) {
  constexpr int W = detail::direct::W;
  const std::int64_t blocks = (out_ch + W - 1) / W, point = blocks * in_ch * W;
  std::unique_ptr<float[]> u(new float[std::size_t(36 * point)]);
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk)
      for (std::int64_t c = 0; c < in_ch; ++c)
        for (std::int64_t l = 0; l < W; ++l) {
          const std::int64_t o = blk * W + l;
          float t[36] = {};
          if (o < out_ch) {
            double k[3][3];
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j)
                k[i][j] = flip ? double(w[((c * out_ch + o) * 3 + (2 - i)) * 3 + (2 - j)])
                               : double(w[((o * in_ch + c) * 3 + i) * 3 + j]);
            kernel_6x6(k, t);
          }
          for (int p = 0; p < 36; ++p) u[std::size_t(p * point + (blk * in_ch + c) * W + l)] = t[p];
        }
  });
  return u;
}

// How a call is cut into tasks: bands of tile rows of one image, or, for small images, groups of whole images, of
// about 24-48 tiles each (the transformed tiles, 36 x tiles x channels, stay in L2); fewer tiles when that leaves
// under 4 tasks per thread. Task i covers images [img0, img0 + nimg) and tile rows [ty0, ty0 + nty).
struct Plan {
  std::int64_t tx = 0, ty = 0, ww = 0, band = 1, bands = 1, group = 1, groups = 1, tmax = 0;
  template <class Geometry>
  explicit Plan(const Geometry& g) : tx((g.ow + 3) / 4), ty((g.oh + 3) / 4), ww(tx * 4 + 2) {
    const std::int64_t min_tasks = 4 * get_num_threads();
    band = std::max<std::int64_t>(1, (24 + tx / 2) / tx);
    while (band > 1 && g.n * ((ty + band - 1) / band) < min_tasks) --band;
    band = std::min(band, ty);
    bands = (ty + band - 1) / band;
    if (bands == 1)
      while ((group + 1) * ty * tx <= 48 && (g.n + group) / (group + 1) >= min_tasks) ++group;
    groups = (g.n + group - 1) / group;
    tmax = group * band * tx;
  }
  std::int64_t tasks() const { return groups * bands; }
};

#if EMBER_CONV_DIRECT
// The input rows [iy0, iy0 + rows) of one image x (C, h, w), channels-last with Cp channels (zeros past C), each
// row ww wide with pw zero columns on the left (and zeros past the image): win[(r · ww + col) · Cp + c].
inline void window(const float* x, std::int64_t C, std::int64_t Cp, std::int64_t h, std::int64_t w, std::int64_t pw,
                   std::int64_t ww, std::int64_t iy0, std::int64_t rows, float* win) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* dst = win + r * ww * Cp;
    const std::int64_t iy = iy0 + r;
    if (iy < 0 || iy >= h) {
      std::fill(dst, dst + ww * Cp, 0.0f);
      continue;
    }
    std::fill(dst, dst + pw * Cp, 0.0f);
    std::fill(dst + (pw + w) * Cp, dst + ww * Cp, 0.0f);  // (ww >= w + pw)
    for (std::int64_t c0 = 0; c0 < Cp; c0 += W)  // W channels x W columns at a time
      for (std::int64_t ix = 0; ix < w; ix += W)
        to_channels_last(x + c0 * h * w + iy * w + ix, h * w, int(std::min<std::int64_t>(W, C - c0)),
                         int(std::min<std::int64_t>(W, w - ix)), dst + (pw + ix) * Cp + c0, Cp);
  }
}

// Bᵀ d B of the 6x6 block at `base` of a window (rows ww · Cp apart), W channels from c0: point p = 6 i + j goes to
// out + p · pstride.
inline void input_tile(const float* base, std::int64_t ww, std::int64_t Cp, float* out, std::int64_t pstride) {
  R tmp[6][6];
  for (int j = 0; j < 6; ++j) {  // columns: Bᵀ over the rows
    R d[6], r[6];
    for (int i = 0; i < 6; ++i) d[i] = V::loadu(base + (i * ww + j) * Cp);
    input_1d(d, r);
    for (int i = 0; i < 6; ++i) tmp[i][j] = r[i];
  }
  for (int i = 0; i < 6; ++i) {  // rows: B on the right
    R r[6];
    input_1d(tmp[i], r);
    for (int j = 0; j < 6; ++j) V::storeu(out + (i * 6 + j) * pstride, r[j]);
  }
}

// m = A y for one 4-vector of W lanes: 6 values (the transpose of output_1d, for the weight gradient).
inline void grad_1d(const R y[4], R m[6]) {
  const R two = V::set1(2.0f), four = V::set1(4.0f), eight = V::set1(8.0f);
  const R e = V::add(y[0], y[2]), o = V::add(y[1], y[3]);
  const R e2 = V::fma(four, y[2], y[0]), o2 = V::fma(eight, y[3], V::mul(two, y[1]));
  m[0] = y[0];
  m[1] = V::add(e, o);
  m[2] = V::sub(e, o);
  m[3] = V::add(e2, o2);
  m[4] = V::sub(e2, o2);
  m[5] = y[3];
}
#endif

}  // namespace detail::winograd

/// y = act(conv2d(x, u) + b) for a geometry where conv_winograd_applies<float>(g), from kernels transformed by
/// detail::winograd::transform_kernels (g.o outputs, g.c inputs). b may be null. pool2 and image_done as
/// conv2d_forward's: a 2x2 max pool of the output (stride 2, floor; y is then (N, O, oh/2, ow/2)), and a call
/// image_done(i, yi) with each image's output (O, oh, ow) (possible only without the pool), made by the task that
/// computed the image where tasks cover whole images, else after the convolution.
template <class Geometry, class ImageDone = std::nullptr_t>
void conv2d_winograd(const Geometry& g, const float* x, const float* u, const float* b, float* y, Activation act,
                     bool pool2 = false, const ImageDone& image_done = nullptr) {
#if EMBER_CONV_DIRECT
  using detail::direct::R, detail::direct::V, detail::direct::W;
  const std::int64_t C = g.c, O = g.o, Cp = (C + W - 1) / W * W, blocks = (O + W - 1) / W, Op = blocks * W;
  const detail::winograd::Plan plan(g);
  const std::int64_t tx = plan.tx, ty = plan.ty, ww = plan.ww, band = plan.band, bands = plan.bands;
  const std::int64_t group = plan.group, tmax = plan.tmax;
  constexpr bool has_done = !std::is_same_v<ImageDone, std::nullptr_t>;
  const std::int64_t point = blocks * C * W;  // one point's transformed kernels
  std::vector<std::int64_t> koff(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) koff[std::size_t(c)] = c;
  std::vector<float> bias(static_cast<std::size_t>(Op), 0.0f);
  if (b) std::copy(b, b + O, bias.data());
  const bool relu = act == Activation::relu;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow, pw2 = g.ow / 2, pl = (g.oh / 2) * pw2;  // pooled plane
  const std::int64_t ybw = tx * 4, ybimg = band * 4 * ybw * Op;  // a row of yb; one image's band in yb

  parallel_for(0, plan.tasks(), 1, [&](std::int64_t t0, std::int64_t t1) {
    // Scratch without a zero fill: every element read is written first.
    const std::unique_ptr<float[]> win(new float[std::size_t((band * 4 + 2) * ww * Cp)]),
        v(new float[std::size_t(36 * tmax * Cp)]), m(new float[std::size_t(36 * tmax * Op)]),
        yb(new float[std::size_t(group * ybimg)]), pooled(new float[pool2 ? std::size_t(band * 2 * pw2 * Op) : 1]);
    const std::unique_ptr<std::int64_t[]> pos(new std::int64_t[std::size_t(tmax)]);
    for (std::int64_t i = 0; i < tmax; ++i) pos[i] = i * Cp;
    for (std::int64_t task = t0; task < t1; ++task) {
      const std::int64_t img0 = task / bands * group, nimg = std::min(group, g.n - img0), by = task % bands;
      const std::int64_t ty0 = by * band, nty = std::min(band, ty - ty0), Ti = nty * tx, T = nimg * Ti;
      const std::int64_t iy0 = ty0 * 4 - g.ph, rows = nty * 4 + 2;
      for (std::int64_t k = 0; k < nimg; ++k) {
        // 1. The band's input rows, channels-last, zero-padded (channels past C too).
        detail::winograd::window(x + (img0 + k) * C * HW, C, Cp, g.h, g.w, g.pw, ww, iy0, rows, win.get());
        // 2. V[point][tile][channel] = Bᵀ d B for each tile's 6x6 block, W channels at a time.
        for (std::int64_t t = 0; t < Ti; ++t)
          for (std::int64_t c0 = 0; c0 < Cp; c0 += W)
            detail::winograd::input_tile(win.get() + ((t / tx) * 4 * ww + (t % tx) * 4) * Cp + c0, ww, Cp,
                                         v.get() + (k * Ti + t) * Cp + c0, tmax * Cp);
      }
      // 3. M[point] = V[point] · U[point]: the direct kernel's tiles, tiles as rows, outputs as W-lane blocks.
      for (int p = 0; p < 36; ++p)
        detail::direct::product(v.get() + p * tmax * Cp, pos.get(), T, koff.data(), C, u + p * point, blocks,
                                m.get() + p * tmax * Op, Op);
      // 4. Y = Aᵀ M A per tile, + bias, ReLU, channels-last into each image's band of output rows.
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t k = t / Ti, tl = t % Ti;
        float* yt = yb.get() + k * ybimg + ((tl / tx) * 4 * ybw + (tl % tx) * 4) * Op;
        for (std::int64_t o0 = 0; o0 < Op; o0 += W) {
          const R vb = V::loadu(bias.data() + o0);
          R tmp[4][6];
          for (int j = 0; j < 6; ++j) {
            R mm[6], r[4];
            for (int i = 0; i < 6; ++i) mm[i] = V::loadu(m.get() + ((i * 6 + j) * tmax + t) * Op + o0);
            detail::winograd::output_1d(mm, r);
            for (int i = 0; i < 4; ++i) tmp[i][j] = r[i];
          }
          for (int i = 0; i < 4; ++i) {
            R r[4];
            detail::winograd::output_1d(tmp[i], r);
            for (int j = 0; j < 4; ++j) {
              R s = V::add(r[j], vb);
              if (relu) s = V::relu(s);
              V::storeu(yt + (i * ybw + j) * Op + o0, s);
            }
          }
        }
      }
      // 5. Each image's rows (inside the output) to the NCHW planes, with any other activation on the way.
      const std::int64_t oy0 = ty0 * 4, oy1 = std::min(g.oh, oy0 + nty * 4);
      for (std::int64_t k = 0; k < nimg; ++k) {
        const std::int64_t img = img0 + k;
        float* ybk = yb.get() + k * ybimg;
        if (!relu && act != Activation::none)
          for (std::int64_t r = 0; r < (oy1 - oy0) * ybw; ++r) act_(ybk + r * Op, O, act);
        if (pool2) {  // 2x2 windows of whole rows (bands start at even rows), max_pool2d's rule for ties and NaN
          const std::int64_t prows = (std::min(oy1, g.oh / 2 * 2) - oy0) / 2;
          for (std::int64_t py = 0; py < prows; ++py)
            for (std::int64_t px = 0; px < pw2; ++px)
              for (std::int64_t o0 = 0; o0 < Op; o0 += W) {
                const float* r0 = ybk + (2 * py * ybw + 2 * px) * Op + o0;
                const float* r1 = r0 + ybw * Op;
                const R mx = V::pool_pick(V::pool_pick(V::pool_pick(V::loadu(r0), V::loadu(r0 + Op)), V::loadu(r1)),
                                          V::loadu(r1 + Op));
                V::storeu(pooled.get() + (py * pw2 + px) * Op + o0, mx);
              }
          for (std::int64_t py = 0; py < prows; ++py)
            for (std::int64_t o0 = 0; o0 < O; o0 += W)
              for (std::int64_t px = 0; px < pw2; px += W)
                detail::winograd::to_planes(pooled.get() + (py * pw2 + px) * Op + o0, Op,
                                            int(std::min<std::int64_t>(W, pw2 - px)),
                                            y + (img * O + o0) * pl + (oy0 / 2 + py) * pw2 + px, pl,
                                            int(std::min<std::int64_t>(W, O - o0)));
          continue;
        }
        for (std::int64_t oy = oy0; oy < oy1; ++oy)
          for (std::int64_t o0 = 0; o0 < O; o0 += W)
            for (std::int64_t ox = 0; ox < g.ow; ox += W)
              detail::winograd::to_planes(ybk + ((oy - oy0) * ybw + ox) * Op + o0, Op,
                                          int(std::min<std::int64_t>(W, g.ow - ox)),
                                          y + (img * O + o0) * L + oy * g.ow + ox, L,
                                          int(std::min<std::int64_t>(W, O - o0)));
        if constexpr (has_done) {
          if (bands == 1) image_done(img, static_cast<const float*>(y + img * O * L));
        }
      }
    }
  });
  if constexpr (has_done) {
    if (bands > 1)
      parallel_for(0, g.n, 1, [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) image_done(i, static_cast<const float*>(y + i * O * L));
      });
  }
#else
  (void)g, (void)x, (void)u, (void)b, (void)y, (void)act, (void)pool2, (void)image_done;
#endif
}

/// y = act(conv2d(x, w) + b), pooled 2x2 when pool2, through the Winograd kernel (conv2d_forward's contract); call
/// only where conv_winograd_applies<float>(g).
template <class Geometry, class ImageDone = std::nullptr_t>
void conv2d_forward_winograd(const Geometry& g, const float* x, const float* w, const float* b, float* y,
                             Activation act, bool pool2 = false, const ImageDone& image_done = nullptr) {
  if (g.n <= 0) return;
  const auto u = detail::winograd::transform_kernels(w, g.o, g.c, false);
  conv2d_winograd(g, x, u.get(), b, y, act, pool2, image_done);
}

/// gx (N, C, H, W) = the gradient of conv2d(x, w) to x from gy (N, O, oh, ow), for a geometry where
/// conv_winograd_applies<float>(g): the convolution of gy with w's kernels rotated by 180 degrees, input and output
/// channels swapped, padded by 2 - padding.
template <class Geometry>
void conv2d_backward_data_winograd(const Geometry& g, const float* w, const float* gy, float* gx) {
  if (g.n <= 0) return;
  Geometry t = g;
  t.c = g.o;
  t.h = g.oh;
  t.w = g.ow;
  t.o = g.c;
  t.oh = g.h;
  t.ow = g.w;
  t.ph = 2 - g.ph;
  t.pw = 2 - g.pw;
  const auto u = detail::winograd::transform_kernels(w, g.c, g.o, true);
  conv2d_winograd(t, gy, u.get(), nullptr, gx, Activation::none);
}

/// gw (O, C, 3, 3) = the gradient of conv2d(x, w) to w from gy (N, O, oh, ow), for a geometry where
/// conv_winograd_applies<float>(g). With V = Bᵀ d B the input tiles' transforms and Mg = A gy_tile Aᵀ the output
/// gradient's, the transformed kernels' gradient is dU = Σ_tiles Mg ⊙ V (36 GEMMs over the tiles: outputs x channels),
/// and gw = Gᵀ dU G. The tasks are cut into fixed runs (as conv2d_backward's batch runs, a number that depends on the
/// thread count only); each run sums its tiles in order into its own dU, and the runs are added in order.
template <class Geometry>
void conv2d_backward_weight_winograd(const Geometry& g, const float* x, const float* gy, float* gw) {
  if (g.n <= 0) {  // no positions: a zero gradient (and no runs to sum)
    std::fill(gw, gw + g.o * g.c * 9, 0.0f);
    return;
  }
#if EMBER_CONV_DIRECT
  using detail::direct::R, detail::direct::V, detail::direct::W;
  const std::int64_t C = g.c, O = g.o, Cp = (C + W - 1) / W * W, cblocks = Cp / W, Op = (O + W - 1) / W * W;
  const detail::winograd::Plan plan(g);
  const std::int64_t tx = plan.tx, ww = plan.ww, band = plan.band, bands = plan.bands, group = plan.group;
  const std::int64_t tmax = plan.tmax, HW = g.h * g.w, L = g.oh * g.ow, ybw = tx * 4, du_n = 36 * O * Cp;
  // One run per thread: each run's dU is 36 O C floats, four times the weight's size.
  const std::int64_t runs = std::min<std::int64_t>(plan.tasks(), get_num_threads());
  std::vector<float> du(static_cast<std::size_t>(runs * du_n));
  std::vector<std::int64_t> koff(static_cast<std::size_t>(tmax)), rows_o(static_cast<std::size_t>(O));
  for (std::int64_t t = 0; t < tmax; ++t) koff[std::size_t(t)] = t * Op;
  for (std::int64_t o = 0; o < O; ++o) rows_o[std::size_t(o)] = o;
  parallel_for(0, runs, 1, [&](std::int64_t r0, std::int64_t r1) {
    const std::unique_ptr<float[]> win(new float[std::size_t((band * 4 + 2) * ww * Cp)]),
        gwin(new float[std::size_t(band * 4 * ybw * Op)]), v(new float[std::size_t(36 * tmax * Cp)]),
        mg(new float[std::size_t(36 * tmax * Op)]), prod(new float[std::size_t(O * Cp)]);
    for (std::int64_t run = r0; run < r1; ++run) {
      float* dur = du.data() + run * du_n;
      std::fill(dur, dur + du_n, 0.0f);
      for (std::int64_t task = plan.tasks() * run / runs; task < plan.tasks() * (run + 1) / runs; ++task) {
        const std::int64_t img0 = task / bands * group, nimg = std::min(group, g.n - img0), by = task % bands;
        const std::int64_t ty0 = by * band, nty = std::min(band, plan.ty - ty0), Ti = nty * tx, T = nimg * Ti;
        const std::int64_t oy0 = ty0 * 4, oy1 = std::min(g.oh, oy0 + nty * 4);
        for (std::int64_t k = 0; k < nimg; ++k) {
          const std::int64_t img = img0 + k;
          // V in blocks of W channels, each T x W (the layout of the direct kernel's weights).
          detail::winograd::window(x + img * C * HW, C, Cp, g.h, g.w, g.pw, ww, oy0 - g.ph, nty * 4 + 2, win.get());
          for (std::int64_t t = 0; t < Ti; ++t)
            for (std::int64_t c0 = 0; c0 < Cp; c0 += W)
              detail::winograd::input_tile(win.get() + ((t / tx) * 4 * ww + (t % tx) * 4) * Cp + c0, ww, Cp,
                                           v.get() + ((c0 / W) * T + k * Ti + t) * W, cblocks * T * W);
          // gy's rows of the band, channels-last (zeros past the output), and Mg = A gy_tile Aᵀ per tile.
          for (std::int64_t r = 0; r < nty * 4; ++r) {
            float* dst = gwin.get() + r * ybw * Op;
            const std::int64_t oy = oy0 + r;
            if (oy >= oy1) {
              std::fill(dst, dst + ybw * Op, 0.0f);
              continue;
            }
            std::fill(dst + g.ow * Op, dst + ybw * Op, 0.0f);
            for (std::int64_t o0 = 0; o0 < Op; o0 += W)
              for (std::int64_t ox = 0; ox < g.ow; ox += W)
                detail::winograd::to_channels_last(gy + (img * O + o0) * L + oy * g.ow + ox, L,
                                                   int(std::min<std::int64_t>(W, O - o0)),
                                                   int(std::min<std::int64_t>(W, g.ow - ox)), dst + ox * Op + o0, Op);
          }
          for (std::int64_t t = 0; t < Ti; ++t) {
            const float* base = gwin.get() + ((t / tx) * 4 * ybw + (t % tx) * 4) * Op;
            for (std::int64_t o0 = 0; o0 < Op; o0 += W) {
              R tmp[6][4];
              for (int j = 0; j < 4; ++j) {
                R d[4], r[6];
                for (int i = 0; i < 4; ++i) d[i] = V::loadu(base + (i * ybw + j) * Op + o0);
                detail::winograd::grad_1d(d, r);
                for (int i = 0; i < 6; ++i) tmp[i][j] = r[i];
              }
              for (int i = 0; i < 6; ++i) {
                R r[6];
                detail::winograd::grad_1d(tmp[i], r);
                for (int j = 0; j < 6; ++j) V::storeu(mg.get() + ((i * 6 + j) * tmax + k * Ti + t) * Op + o0, r[j]);
              }
            }
          }
        }
        // dU[point][o][c] += Σ_t Mg[point][t][o] V[point][t][c]: rows o, depth t, W-channel blocks.
        for (int p = 0; p < 36; ++p) {
          detail::direct::product(mg.get() + p * tmax * Op, rows_o.data(), O, koff.data(), T,
                                  v.get() + p * cblocks * T * W, cblocks, prod.get(), Cp);
          float* dp = dur + p * O * Cp;
          for (std::int64_t i = 0; i < O * Cp; i += W)
            V::storeu(dp + i, V::add(V::loadu(dp + i), V::loadu(prod.get() + i)));
        }
      }
    }
  });
  for (std::int64_t run = 1; run < runs; ++run)
    for (std::int64_t i = 0; i < du_n; ++i) du[std::size_t(i)] += du[std::size_t(run * du_n + i)];
  // gw[o][c] = Gᵀ dU[o][c] G, in double, rounded once.
  using detail::winograd::G;
  parallel_for(0, O, 1, [&](std::int64_t o0, std::int64_t o1) {
    for (std::int64_t o = o0; o < o1; ++o)
      for (std::int64_t c = 0; c < C; ++c) {
        double t[6][3] = {};
        for (int a = 0; a < 6; ++a)
          for (int b = 0; b < 6; ++b) {
            const double d = du[std::size_t((a * 6 + b) * O * Cp + o * Cp + c)];
            for (int j = 0; j < 3; ++j) t[a][j] += d * G[b][j];
          }
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            double sum = 0;
            for (int a = 0; a < 6; ++a) sum += G[a][i] * t[a][j];
            gw[((o * C + c) * 3 + i) * 3 + j] = float(sum);
          }
      }
  });
#else
  (void)g, (void)x, (void)gy, (void)gw;
#endif
}

}  // namespace ember::cpu
