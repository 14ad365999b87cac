// ember — Winograd F(4x4, 3x3) fp32 convolution (AVX-512) for 3x3 kernels with stride 1, no dilation and one group:
// the forward, and the gradient to the input (the same convolution of the output gradient with the kernels flipped
// and their channels swapped). Each 4x4 block of outputs comes from a 6x6 block of the input with 36 products per
// (output, input channel) pair instead of 144: the input block is transformed (Bᵀ d B), multiplied by the
// transformed kernels (G g Gᵀ, once per call) in 36 independent GEMMs over the channels, and transformed back
// (Aᵀ m A). The GEMMs are the direct kernel's tiles (cpu/conv_direct.hpp).
//
// Layout: each task takes one image and a band of tile rows. It copies the band's input rows channels-last into a
// zero-padded window, so every transform is a vector operation across 16 channels; the GEMMs run on the
// transformed band while it is in cache; the output is transformed channels-last, the bias and activation are
// applied there, and it is stored to the NCHW output once.
//
// Numerics: the transforms are exact in real arithmetic; in fp32 their rounding makes the result differ from a
// direct sum by a few units in the last place of the largest terms (the kernel transform is computed in double and
// rounded once). tests/test_conv.cpp bounds the error against a double reference; cpu::conv_winograd_enabled()
// switches the path off for bit-for-bit comparisons with the direct kernel.
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

/// Whether 3x3 stride-1 float convolutions may take the Winograd path (AVX-512 builds); on by default.
inline std::atomic<bool>& conv_winograd_enabled() {
  static std::atomic<bool> on{true};
  return on;
}

/// Whether the Winograd kernel computes conv2d with geometry g (float, AVX-512, 3x3, stride 1, no dilation, one
/// group, padding at most 2, and at least 16 input and 16 output channels: with fewer, the transforms cost more
/// than the products they save).
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
// v = Bᵀ d for one 6-vector of 16 lanes (in place may not alias): the interpolation points 0, ±1, ±2 and ∞.
inline void input_1d(const __m512 d[6], __m512 v[6]) {
  const __m512 four = _mm512_set1_ps(4.0f), five = _mm512_set1_ps(5.0f), two = _mm512_set1_ps(2.0f);
  const __m512 t0 = _mm512_fnmadd_ps(four, d[2], d[4]);  // d4 - 4 d2
  const __m512 t1 = _mm512_fnmadd_ps(four, d[1], d[3]);  // d3 - 4 d1
  const __m512 t2 = _mm512_sub_ps(d[4], d[2]);
  const __m512 t3 = _mm512_mul_ps(two, _mm512_sub_ps(d[3], d[1]));
  v[0] = _mm512_fmadd_ps(four, d[0], _mm512_fnmadd_ps(five, d[2], d[4]));
  v[1] = _mm512_add_ps(t1, t0);
  v[2] = _mm512_sub_ps(t0, t1);
  v[3] = _mm512_add_ps(t2, t3);
  v[4] = _mm512_sub_ps(t2, t3);
  v[5] = _mm512_fmadd_ps(four, d[1], _mm512_fnmadd_ps(five, d[3], d[5]));
}

// y = Aᵀ m for one 6-vector: 4 outputs.
inline void output_1d(const __m512 m[6], __m512 y[4]) {
  const __m512 two = _mm512_set1_ps(2.0f), four = _mm512_set1_ps(4.0f), eight = _mm512_set1_ps(8.0f);
  const __m512 s1 = _mm512_add_ps(m[1], m[2]), d1 = _mm512_sub_ps(m[1], m[2]);
  const __m512 s2 = _mm512_add_ps(m[3], m[4]), d2 = _mm512_sub_ps(m[3], m[4]);
  y[0] = _mm512_add_ps(_mm512_add_ps(m[0], s1), s2);
  y[1] = _mm512_fmadd_ps(two, d2, d1);
  y[2] = _mm512_fmadd_ps(four, s2, s1);
  y[3] = _mm512_add_ps(_mm512_fmadd_ps(eight, d2, d1), m[5]);
}

// r[0..16) as the rows of a 16x16 block -> its columns (r[j][i] = old r[i][j]), in registers.
// (The zero-masked forms with a full mask are the same instructions; the plain intrinsics start from an undefined
// vector, which g++ 12 at -O1 reports as uninitialised.)
inline void transpose16(__m512 r[16]) {
  constexpr __mmask16 all = 0xFFFF;
  __m512 t[16], u[16];
  for (int k = 0; k < 8; ++k) {  // lane L of t[2k]: r[2k][4L], r[2k+1][4L], r[2k][4L+1], r[2k+1][4L+1]
    t[2 * k] = _mm512_maskz_unpacklo_ps(all, r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * k], r[2 * k + 1]);
  }
  for (int q = 0; q < 4; ++q) {  // lane L of u[4q + e]: r[4q .. 4q+3][4L + e]
    u[4 * q + 0] = _mm512_maskz_shuffle_ps(all, t[4 * q], t[4 * q + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * q + 1] = _mm512_maskz_shuffle_ps(all, t[4 * q], t[4 * q + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * q + 2] = _mm512_maskz_shuffle_ps(all, t[4 * q + 1], t[4 * q + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * q + 3] = _mm512_maskz_shuffle_ps(all, t[4 * q + 1], t[4 * q + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int e = 0; e < 4; ++e) {  // row 4L + e gathers lane L of u[e], u[4 + e], u[8 + e], u[12 + e]
    const __m512 v0 = _mm512_maskz_shuffle_f32x4(all, u[e], u[4 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 v1 = _mm512_maskz_shuffle_f32x4(all, u[e], u[4 + e], _MM_SHUFFLE(3, 1, 3, 1));
    const __m512 w0 = _mm512_maskz_shuffle_f32x4(all, u[8 + e], u[12 + e], _MM_SHUFFLE(2, 0, 2, 0));
    const __m512 w1 = _mm512_maskz_shuffle_f32x4(all, u[8 + e], u[12 + e], _MM_SHUFFLE(3, 1, 3, 1));
    r[e] = _mm512_maskz_shuffle_f32x4(all, v0, w0, _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + e] = _mm512_maskz_shuffle_f32x4(all, v0, w0, _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + e] = _mm512_maskz_shuffle_f32x4(all, v1, w1, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + e] = _mm512_maskz_shuffle_f32x4(all, v1, w1, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// dst[col · ld + c] = src[c · cstride + col] for c < nc, col < ncol (both at most 16), and 0 for nc <= c < 16: a
// 16x16 block of planes to channels-last.
inline void to_channels_last(const float* src, std::int64_t cstride, int nc, int ncol, float* dst, std::int64_t ld) {
  const __mmask16 cm = __mmask16((1u << ncol) - 1);
  __m512 r[16];
  for (int c = 0; c < 16; ++c) r[c] = c < nc ? _mm512_maskz_loadu_ps(cm, src + c * cstride) : _mm512_setzero_ps();
  transpose16(r);
  for (int col = 0; col < ncol; ++col) _mm512_storeu_ps(dst + col * ld, r[col]);
}

// dst[o · ostride + col] = src[col · ld + o] for o < no, col < ncol (both at most 16): channels-last to planes.
inline void to_planes(const float* src, std::int64_t ld, int ncol, float* dst, std::int64_t ostride, int no) {
  const __mmask16 cm = __mmask16((1u << ncol) - 1);
  __m512 r[16];
  for (int col = 0; col < 16; ++col) r[col] = col < ncol ? _mm512_loadu_ps(src + col * ld) : _mm512_setzero_ps();
  transpose16(r);
  for (int o = 0; o < no; ++o) _mm512_mask_storeu_ps(dst + o * ostride, cm, r[o]);
}
#endif

// U = G k Gᵀ (6x6) of one 3x3 kernel k, in double, rounded once.
inline void kernel_6x6(const double k[3][3], float u[36]) {
  static constexpr double G[6][3] = {{1.0 / 4, 0, 0},
                                     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                     {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                     {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                     {0, 0, 1}};
  double gk[6][3];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) gk[i][j] = G[i][0] * k[0][j] + G[i][1] * k[1][j] + G[i][2] * k[2][j];
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) u[i * 6 + j] = float(gk[i][0] * G[j][0] + gk[i][1] * G[j][1] + gk[i][2] * G[j][2]);
}

/// The transformed kernels for out_ch outputs from in_ch inputs, laid out for the direct kernel's tiles: for each
/// of the 36 points, blocks of 16 outputs, each in_ch x 16 (zeros past out_ch). The kernel of (output o, input c)
/// is w[o][c] (w: (out_ch, in_ch, 3, 3)), or, with `flip`, w[c][o] rotated by 180 degrees (w: (in_ch, out_ch, 3,
/// 3)): the convolution that gives the gradient to the input.
inline std::unique_ptr<float[]> transform_kernels(const float* w, std::int64_t out_ch, std::int64_t in_ch, bool flip) {
  const std::int64_t blocks = (out_ch + 15) / 16, point = blocks * in_ch * 16;
  std::unique_ptr<float[]> u(new float[std::size_t(36 * point)]);
  parallel_for(0, blocks, 1, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t blk = b0; blk < b1; ++blk)
      for (std::int64_t c = 0; c < in_ch; ++c)
        for (std::int64_t l = 0; l < 16; ++l) {
          const std::int64_t o = blk * 16 + l;
          float t[36] = {};
          if (o < out_ch) {
            double k[3][3];
            for (int i = 0; i < 3; ++i)
              for (int j = 0; j < 3; ++j)
                k[i][j] = flip ? double(w[((c * out_ch + o) * 3 + (2 - i)) * 3 + (2 - j)])
                               : double(w[((o * in_ch + c) * 3 + i) * 3 + j]);
            kernel_6x6(k, t);
          }
          for (int p = 0; p < 36; ++p) u[std::size_t(p * point + (blk * in_ch + c) * 16 + l)] = t[p];
        }
  });
  return u;
}

}  // namespace detail::winograd

/// y = act(conv2d(x, u) + b) for a geometry where conv_winograd_applies<float>(g), from kernels transformed by
/// detail::winograd::transform_kernels (g.o outputs, g.c inputs). b may be null. pool2 and image_done as
/// conv2d_forward's: a 2x2 max pool of the output (stride 2, floor; y is then (N, O, oh/2, ow/2)), and a call
/// image_done(i, yi) with each image's output (O, oh, ow) (possible only without the pool), made by the task that
/// computed the image where one task covers a whole image, else after the convolution.
template <class Geometry, class ImageDone = std::nullptr_t>
void conv2d_winograd(const Geometry& g, const float* x, const float* u, const float* b, float* y, Act act,
                     bool pool2 = false, const ImageDone& image_done = nullptr) {
#if EMBER_CONV_DIRECT
  const std::int64_t C = g.c, O = g.o, Cp = (C + 15) / 16 * 16, blocks = (O + 15) / 16, Op = blocks * 16;
  const std::int64_t tx = (g.ow + 3) / 4, ty = (g.oh + 3) / 4, ww = tx * 4 + 2;  // a window row: tx tiles + halo
  // Bands of tile rows: about 24 tiles each (the transformed band, 36 x tiles x channels, stays in L2), fewer when
  // that leaves under 4 tasks per thread.
  std::int64_t band = std::max<std::int64_t>(1, (24 + tx / 2) / tx);
  while (band > 1 && g.n * ((ty + band - 1) / band) < 4 * get_num_threads()) --band;
  const std::int64_t bands = (ty + band - 1) / band, tmax = band * tx;
  constexpr bool has_done = !std::is_same_v<ImageDone, std::nullptr_t>;
  const std::int64_t point = blocks * C * 16;  // one point's transformed kernels
  std::vector<std::int64_t> koff(static_cast<std::size_t>(C));
  for (std::int64_t c = 0; c < C; ++c) koff[std::size_t(c)] = c;
  std::vector<float> bias(static_cast<std::size_t>(Op), 0.0f);
  if (b) std::copy(b, b + O, bias.data());
  const bool relu = act == Act::relu;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow, pw2 = g.ow / 2, pl = (g.oh / 2) * pw2;  // pooled plane

  parallel_for(0, g.n * bands, 1, [&](std::int64_t t0, std::int64_t t1) {
    const std::int64_t wrows = band * 4 + 2;
    // Scratch without a zero fill: every element read is written first.
    const std::unique_ptr<float[]> win(new float[std::size_t(wrows * ww * Cp)]),
        v(new float[std::size_t(36 * tmax * Cp)]), m(new float[std::size_t(36 * tmax * Op)]),
        yb(new float[std::size_t(band * 4 * tx * 4 * Op)]),
        pooled(new float[pool2 ? std::size_t(band * 2 * pw2 * Op) : 1]);
    const std::unique_ptr<std::int64_t[]> pos(new std::int64_t[std::size_t(tmax)]);
    for (std::int64_t i = 0; i < tmax; ++i) pos[i] = i * Cp;
    for (std::int64_t task = t0; task < t1; ++task) {
      const std::int64_t img = task / bands, by = task % bands;
      const std::int64_t ty0 = by * band, nty = std::min(band, ty - ty0), T = nty * tx;
      const std::int64_t iy0 = ty0 * 4 - g.ph, rows = nty * 4 + 2;
      // 1. The band's input rows, channels-last, zero-padded (channels past C too).
      const float* xi = x + img * C * HW;
      for (std::int64_t r = 0; r < rows; ++r) {
        float* dst = win.get() + r * ww * Cp;
        const std::int64_t iy = iy0 + r;
        if (iy < 0 || iy >= g.h) {
          std::fill(dst, dst + ww * Cp, 0.0f);
          continue;
        }
        const std::int64_t x0 = g.pw, x1 = g.pw + g.w;  // [x0, x1) reads the image (ww >= w + 2 pw)
        std::fill(dst, dst + x0 * Cp, 0.0f);
        std::fill(dst + x1 * Cp, dst + ww * Cp, 0.0f);
        for (std::int64_t c0 = 0; c0 < Cp; c0 += 16)  // 16 channels x 16 columns at a time (zeros past C)
          for (std::int64_t ix = 0; ix < g.w; ix += 16)
            detail::winograd::to_channels_last(xi + c0 * HW + iy * g.w + ix, HW,
                                               int(std::min<std::int64_t>(16, C - c0)),
                                               int(std::min<std::int64_t>(16, g.w - ix)), dst + (x0 + ix) * Cp + c0,
                                               Cp);
      }
      // 2. V[point][tile][channel] = Bᵀ d B for each tile's 6x6 block, 16 channels at a time.
      for (std::int64_t t = 0; t < T; ++t) {
        const float* base = win.get() + ((t / tx) * 4 * ww + (t % tx) * 4) * Cp;
        for (std::int64_t c0 = 0; c0 < Cp; c0 += 16) {
          __m512 tmp[6][6];
          for (int j = 0; j < 6; ++j) {  // columns: Bᵀ over the rows
            __m512 d[6], r[6];
            for (int i = 0; i < 6; ++i) d[i] = _mm512_loadu_ps(base + (i * ww + j) * Cp + c0);
            detail::winograd::input_1d(d, r);
            for (int i = 0; i < 6; ++i) tmp[i][j] = r[i];
          }
          for (int i = 0; i < 6; ++i) {  // rows: B on the right
            __m512 r[6];
            detail::winograd::input_1d(tmp[i], r);
            for (int j = 0; j < 6; ++j) _mm512_storeu_ps(v.get() + ((i * 6 + j) * tmax + t) * Cp + c0, r[j]);
          }
        }
      }
      // 3. M[point] = V[point] · U[point]: the direct kernel's tiles, tiles as rows, outputs as 16-lane blocks.
      for (int p = 0; p < 36; ++p)
        detail::direct::product(v.get() + p * tmax * Cp, pos.get(), T, koff.data(), C, u + p * point, blocks,
                                m.get() + p * tmax * Op, Op);
      // 4. Y = Aᵀ M A per tile, + bias, ReLU, channels-last into the band's output rows.
      const std::int64_t ybw = tx * 4;  // a row of yb
      for (std::int64_t t = 0; t < T; ++t) {
        float* yt = yb.get() + ((t / tx) * 4 * ybw + (t % tx) * 4) * Op;
        for (std::int64_t o0 = 0; o0 < Op; o0 += 16) {
          const __m512 vb = _mm512_loadu_ps(bias.data() + o0);
          __m512 tmp[4][6];
          for (int j = 0; j < 6; ++j) {
            __m512 mm[6], r[4];
            for (int i = 0; i < 6; ++i) mm[i] = _mm512_loadu_ps(m.get() + ((i * 6 + j) * tmax + t) * Op + o0);
            detail::winograd::output_1d(mm, r);
            for (int i = 0; i < 4; ++i) tmp[i][j] = r[i];
          }
          for (int i = 0; i < 4; ++i) {
            __m512 r[4];
            detail::winograd::output_1d(tmp[i], r);
            for (int j = 0; j < 4; ++j) {
              __m512 s = _mm512_add_ps(r[j], vb);
              if (relu) s = detail::direct::relu(s);
              _mm512_storeu_ps(yt + (i * ybw + j) * Op + o0, s);
            }
          }
        }
      }
      // 5. The band's rows (inside the output) to the NCHW planes, with any other activation on the way.
      const std::int64_t oy0 = ty0 * 4, oy1 = std::min(g.oh, oy0 + nty * 4);
      if (!relu && act != Act::none)
        for (std::int64_t r = 0; r < (oy1 - oy0) * ybw; ++r) act_(yb.get() + r * Op, O, act);
      if (pool2) {  // 2x2 windows of whole rows (bands start at even rows), max_pool2d's rule for ties and NaN
        const std::int64_t prows = (std::min(oy1, g.oh / 2 * 2) - oy0) / 2;
        for (std::int64_t py = 0; py < prows; ++py)
          for (std::int64_t px = 0; px < pw2; ++px)
            for (std::int64_t o0 = 0; o0 < Op; o0 += 16) {
              const float* r0 = yb.get() + (2 * py * ybw + 2 * px) * Op + o0;
              const float* r1 = r0 + ybw * Op;
              using detail::direct::pool_pick;
              const __m512 mx = pool_pick(
                  pool_pick(pool_pick(_mm512_loadu_ps(r0), _mm512_loadu_ps(r0 + Op)), _mm512_loadu_ps(r1)),
                  _mm512_loadu_ps(r1 + Op));
              _mm512_storeu_ps(pooled.get() + (py * pw2 + px) * Op + o0, mx);
            }
        for (std::int64_t py = 0; py < prows; ++py)
          for (std::int64_t o0 = 0; o0 < O; o0 += 16)
            for (std::int64_t px = 0; px < pw2; px += 16)
              detail::winograd::to_planes(pooled.get() + (py * pw2 + px) * Op + o0, Op,
                                          int(std::min<std::int64_t>(16, pw2 - px)),
                                          y + (img * O + o0) * pl + (oy0 / 2 + py) * pw2 + px, pl,
                                          int(std::min<std::int64_t>(16, O - o0)));
        continue;
      }
      for (std::int64_t oy = oy0; oy < oy1; ++oy)
        for (std::int64_t o0 = 0; o0 < O; o0 += 16)
          for (std::int64_t ox = 0; ox < g.ow; ox += 16)
            detail::winograd::to_planes(yb.get() + ((oy - oy0) * ybw + ox) * Op + o0, Op,
                                        int(std::min<std::int64_t>(16, g.ow - ox)),
                                        y + (img * O + o0) * L + oy * g.ow + ox, L,
                                        int(std::min<std::int64_t>(16, O - o0)));
      if constexpr (has_done) {
        if (bands == 1) image_done(img, static_cast<const float*>(y + img * O * L));
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
void conv2d_forward_winograd(const Geometry& g, const float* x, const float* w, const float* b, float* y, Act act,
                             bool pool2 = false, const ImageDone& image_done = nullptr) {
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
  conv2d_winograd(t, gy, u.get(), nullptr, gx, Act::none);
}

}  // namespace ember::cpu
