// ember — CPU 2-D pooling kernels (max, average, adaptive average), forward and backward, on contiguous planes
// (N*C planes of H x W), one plane per parallel chunk. The window rules follow PyTorch's CPU kernels exactly:
// max pool skips padding, keeps the first maximum (a NaN wins) and records its flat index in the plane (a dilated
// window that only covers padding gives -inf and index -1, which backward skips; PyTorch records an index outside
// the plane there); average pool divides by divisor_override when set, else by the window clipped to the padded
// input (count_include_pad) or to the input; adaptive pool bin i spans [floor(i*H/oh), ceil((i+1)*H/oh)).
// bf16/fp16 planes are read and written in place and computed in fp32 (compute_t<T>): sums, and the gradients that
// overlapping windows add onto one input element, accumulate in an fp32 plane and are rounded once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/window.hpp"
#include "ember/cpu/thread_pool.hpp"

#if defined(__AVX512F__)
#include <immintrin.h>
#define EMBER_POOL_AVX512 1
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#define EMBER_POOL_AVX512_BF16 1  // bfloat16 rows through the same windows (16-bit masked loads and stores)
#else
#define EMBER_POOL_AVX512_BF16 0
#endif
#else
#define EMBER_POOL_AVX512 0
#endif

namespace ember::cpu {

/// The geometry of one pooling call (checked by ops/): the window and the extents around it.
struct PoolGeometry : Window2d {
  std::int64_t planes = 0, h = 0, w = 0;  // input (planes = N*C, H, W)
  std::int64_t oh = 0, ow = 0;             // output
  bool count_include_pad = true;
  std::int64_t divisor_override = 0;  // avg pool: the divisor of every window when non-zero
};

namespace detail {
// Planes per parallel chunk: enough work per chunk to amortise the hand-off.
inline std::int64_t plane_grain(std::int64_t plane_work) {
  return std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(plane_work, 1));
}

template <class T>
inline bool greater_or_nan(T v, T m) {
  return v > m || v != v;  // v != v: NaN
}

/// The plane a backward pass adds into: gx itself for float/double, else an fp32 plane that finish() rounds into
/// gx once. One per parallel chunk.
template <class T>
struct GradPlane {
  using C = compute_t<T>;
  static constexpr bool wide = std::is_same_v<C, T>;
  std::vector<C> buf;
  explicit GradPlane(std::int64_t hw) {
    if constexpr (!wide) buf.resize(static_cast<std::size_t>(hw));
  }
  C* start(T* gp, std::int64_t hw) {
    C* a = wide ? reinterpret_cast<C*>(gp) : buf.data();
    std::fill(a, a + hw, C(0));
    return a;
  }
  void finish(T* gp, std::int64_t hw) const {
    if constexpr (!wide)
      for (std::int64_t k = 0; k < hw; ++k) gp[k] = convert<T>(buf[static_cast<std::size_t>(k)]);
  }
};
}  // namespace detail

namespace detail {
// The general max-pool window loop over one plane (PyTorch's CPU rule: the window is clipped to the input and
// stepped by the dilation; the first maximum wins, a NaN beats everything).
template <class T, bool Idx>
void max_pool_plane(const PoolGeometry& g, const T* EMBER_RESTRICT xp, T* EMBER_RESTRICT yp,
                    std::int64_t* EMBER_RESTRICT ip) {
  using C = compute_t<T>;
  for (std::int64_t oy = 0; oy < g.oh; ++oy) {
    std::int64_t y0 = oy * g.sh - g.ph;
    const std::int64_t y1 = std::min(y0 + (g.kh - 1) * g.dh + 1, g.h);
    while (y0 < 0) y0 += g.dh;
    for (std::int64_t ox = 0; ox < g.ow; ++ox) {
      std::int64_t x0 = ox * g.sw - g.pw;
      const std::int64_t x1 = std::min(x0 + (g.kw - 1) * g.dw + 1, g.w);
      while (x0 < 0) x0 += g.dw;
      // A window with no element (dilation steps over the input) keeps -inf and index -1.
      std::int64_t best = y0 < y1 && x0 < x1 ? y0 * g.w + x0 : -1;
      C m = -std::numeric_limits<C>::infinity();
      for (std::int64_t iy = y0; iy < y1; iy += g.dh)
        for (std::int64_t ix = x0; ix < x1; ix += g.dw) {
          const C v = static_cast<C>(xp[iy * g.w + ix]);
          if (greater_or_nan(v, m)) {
            m = v;
            best = iy * g.w + ix;
          }
        }
      yp[oy * g.ow + ox] = convert<T>(m);  // one of the inputs (or -inf): exact
      if constexpr (Idx) ip[oy * g.ow + ox] = best;
    }
  }
}

#if EMBER_POOL_AVX512
/// The low n bits (n <= 16).
inline __mmask16 low_lanes(std::int64_t n) { return __mmask16((1u << unsigned(n)) - 1u); }
#if EMBER_POOL_AVX512_BF16
/// The 2n low lanes of 32 16-bit lanes (n <= 16 windows' pairs of bfloat16 elements).
inline __mmask32 low_pairs(std::int64_t n) { return __mmask32((std::uint64_t(1) << unsigned(2 * n)) - 1u); }
#endif

/// Up to sixteen 2x2 windows (n of them) of fp32 rows r0 and r1 (columns [0, 2n) of each, read with masks, so
/// narrow planes such as 14x14 take one step per row pair), split into their four elements: a = r0[2j],
/// b = r0[2j + 1], d = r1[2j], e = r1[2j + 1].
struct Windows16 {
  __m512 a, b, d, e;
  Windows16(const float* r0, const float* r1, std::int64_t n) {
    const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __mmask16 lo = low_lanes(std::min<std::int64_t>(16, 2 * n)),
                    hi = low_lanes(std::max<std::int64_t>(0, 2 * n - 16));
    const __m512 r0a = _mm512_maskz_loadu_ps(lo, r0), r0b = _mm512_maskz_loadu_ps(hi, r0 + 16);
    const __m512 r1a = _mm512_maskz_loadu_ps(lo, r1), r1b = _mm512_maskz_loadu_ps(hi, r1 + 16);
    a = _mm512_permutex2var_ps(r0a, ev, r0b);
    b = _mm512_permutex2var_ps(r0a, od, r0b);
    d = _mm512_permutex2var_ps(r1a, ev, r1b);
    e = _mm512_permutex2var_ps(r1a, od, r1b);
  }
#if EMBER_POOL_AVX512_BF16
  /// The same windows of bfloat16 rows: each 32-bit lane of a row's load holds one window's pair (r[2j] in its low
  /// half, r[2j + 1] in its high half), and a bfloat16 is the high half of its float, so a shift and a mask give
  /// the four elements as exact floats.
  Windows16(const bfloat16* r0, const bfloat16* r1, std::int64_t n) {
    const __mmask32 m = low_pairs(n);
    const __m512i v0 = _mm512_maskz_loadu_epi16(m, r0), v1 = _mm512_maskz_loadu_epi16(m, r1);
    const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
    a = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, v0, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(v0, high));
    d = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, v1, 16));
    e = _mm512_castsi512_ps(_mm512_and_si512(v1, high));
  }
#endif
  /// relu of each element, as relu computes it (x < 0 ? 0 : x; NaN stays).
  void relu() {
    const __m512 z = _mm512_setzero_ps();
    a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, z, _CMP_LT_OQ), a, z);
    b = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(b, z, _CMP_LT_OQ), b, z);
    d = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(d, z, _CMP_LT_OQ), d, z);
    e = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(e, z, _CMP_LT_OQ), e, z);
  }
  /// The maximum of each window with max_pool's rule (a later element wins when greater or NaN); wb, wd, we: the
  /// lanes where b, d, e took over (the winner is the last of them set, else a).
  __m512 max(__mmask16& wb, __mmask16& wd, __mmask16& we) const {
    wb = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    __m512 m = _mm512_mask_blend_ps(wb, a, b);
    wd = _mm512_cmp_ps_mask(d, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q);
    m = _mm512_mask_blend_ps(wd, m, d);
    we = _mm512_cmp_ps_mask(e, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(e, e, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(we, m, e);
  }
};

/// Stores the first n of sixteen maxima (each one of the inputs, exactly): as float, or as bfloat16 (the high
/// halves; a NaN is quieted as the scalar conversion quiets it).
inline void store_max16(float* p, __m512 m, std::int64_t n) { _mm512_mask_storeu_ps(p, low_lanes(n), m); }
#if EMBER_POOL_AVX512_BF16
inline void store_max16(bfloat16* p, __m512 m, std::int64_t n) {
  // (The zero-masked forms with a full mask: GCC 12 reports the plain ones, which start from an undefined vector,
  // as maybe-uninitialized once inlined.)
  constexpr __mmask16 all = 0xffff;
  __m512i bits = _mm512_maskz_srli_epi32(all, _mm512_castps_si512(m), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
  bits = _mm512_mask_or_epi32(bits, nan, bits, _mm512_set1_epi32(0x40));
  _mm256_mask_storeu_epi16(p, low_lanes(n), _mm512_maskz_cvtepi32_epi16(all, bits));
}
#endif

/// The flat input indices of the first n of sixteen windows whose top-left elements are at first, first + 2, ...
/// in rows of width W: + 1, + W or + W + 1 where b, d or e won (the last of wb, wd, we set); eight per register.
inline void store_indices16(std::int64_t* p, std::int64_t first, std::int64_t W, __mmask16 wb, __mmask16 wd,
                            __mmask16 we, std::int64_t n) {
  const __m512i one = _mm512_set1_epi64(1), w0 = _mm512_set1_epi64(W), w1 = _mm512_set1_epi64(W + 1);
  for (int h = 0; h < 2 && 8 * h < n; ++h) {
    const auto lanes = [h](__mmask16 m) { return __mmask8(m >> (8 * h)); };
    __m512i off = _mm512_maskz_mov_epi64(lanes(wb), one);
    off = _mm512_mask_mov_epi64(off, lanes(wd), w0);
    off = _mm512_mask_mov_epi64(off, lanes(we), w1);
    const __m512i top_left = _mm512_add_epi64(_mm512_set1_epi64(first + 16 * h),
                                              _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14));
    _mm512_mask_storeu_epi64(p + 8 * h, __mmask8(low_lanes(std::min<std::int64_t>(8, n - 8 * h))),
                             _mm512_add_epi64(top_left, off));
  }
}

/// Stores the first n values of x and y interleaved (x0 y0 x1 y1 ...) at p[0, 2n).
inline void store_interleaved(float* p, __m512 x, __m512 y, std::int64_t n) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  _mm512_mask_storeu_ps(p, low_lanes(std::min<std::int64_t>(16, 2 * n)), _mm512_permutex2var_ps(x, lo, y));
  _mm512_mask_storeu_ps(p + 16, low_lanes(std::max<std::int64_t>(0, 2 * n - 16)), _mm512_permutex2var_ps(x, hi, y));
}
/// The first n of 16 contiguous values as floats (the rest 0).
inline __m512 load16(const float* p, std::int64_t n) { return _mm512_maskz_loadu_ps(low_lanes(n), p); }
#if EMBER_POOL_AVX512_BF16
/// The first n of 16 contiguous bfloat16 values as exact floats (the rest 0).
inline __m512 load16(const bfloat16* p, std::int64_t n) {
  constexpr __mmask16 all = 0xffff;  // (zero-masked forms: see store_max16)
  const __m256i v = _mm256_maskz_loadu_epi16(low_lanes(n), p);
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, v), 16));
}
/// store_interleaved for values that are bfloat16 numbers held exactly as floats (each one's high half is its bits,
/// NaN payloads included): x's in the low and y's in the high half of each 32-bit lane, 2n elements stored.
inline void store_interleaved(bfloat16* p, __m512 x, __m512 y, std::int64_t n) {
  constexpr __mmask16 all = 0xffff;
  const __m512i lo = _mm512_maskz_srli_epi32(all, _mm512_castps_si512(x), 16);
  const __m512i hi = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32(int(0xffff0000u)));
  _mm512_mask_storeu_epi16(p, low_pairs(n), _mm512_or_si512(lo, hi));
}
#endif
#endif

// 2x2 windows with stride 2 and no padding, all inside the input: the layer after most conv blocks. Extents are
// copied to locals (stores through ip could otherwise alias them) and the maxima are chosen with selects, not
// branches (random data would mispredict about every other comparison). fp32 and bfloat16, with or without
// indices, take up to 16 windows of a row at a time with AVX-512 (the same rule, in masks).
template <class T, bool Idx>
EMBER_VECTORIZE void max_pool_plane_2x2(const PoolGeometry& g, const T* EMBER_RESTRICT xp, T* EMBER_RESTRICT yp,
                        std::int64_t* EMBER_RESTRICT ip) {
  using C = compute_t<T>;
  const std::int64_t W = g.w, oh = g.oh, ow = g.ow;
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    const T* EMBER_RESTRICT r0 = xp + 2 * oy * W;
    const T* EMBER_RESTRICT r1 = r0 + W;
    T* EMBER_RESTRICT yr = yp + oy * ow;
    std::int64_t* EMBER_RESTRICT ir = Idx ? ip + oy * ow : nullptr;
    const std::int64_t base = 2 * oy * W;
    std::int64_t ox0 = 0;
#if EMBER_POOL_AVX512
    constexpr bool vec = std::is_same_v<T, float> || (EMBER_POOL_AVX512_BF16 && std::is_same_v<T, bfloat16>);
    if constexpr (vec) {
      for (; ox0 < ow; ox0 += 16) {
        const std::int64_t n = std::min<std::int64_t>(16, ow - ox0);
        __mmask16 wb, wd, we;
        store_max16(yr + ox0, Windows16(r0 + 2 * ox0, r1 + 2 * ox0, n).max(wb, wd, we), n);
        if constexpr (Idx) store_indices16(ir + ox0, base + 2 * ox0, W, wb, wd, we, n);
      }
    }
#endif
    for (std::int64_t ox = ox0; ox < ow; ++ox) {
      const std::int64_t c = 2 * ox;
      const C a = static_cast<C>(r0[c]), b = static_cast<C>(r0[c + 1]), d = static_cast<C>(r1[c]),
              e = static_cast<C>(r1[c + 1]);
      const bool tb = b > a || b != b;
      C m = tb ? b : a;
      std::int64_t k = tb ? c + 1 : c;
      const bool td = d > m || d != d;
      m = td ? d : m;
      k = td ? W + c : k;
      const bool te = e > m || e != e;
      m = te ? e : m;
      k = te ? W + c + 1 : k;
      yr[ox] = convert<T>(m);
      if constexpr (Idx) ir[ox] = base + k;
    }
  }
}

template <class T, bool Idx>
void max_pool_planes(const PoolGeometry& g, const T* x, T* y, std::int64_t* idx) {
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  const bool is2x2 = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0 && g.dh == 1 &&
                     g.dw == 1 && 2 * g.oh <= g.h && 2 * g.ow <= g.w;
  parallel_for(0, g.planes, plane_grain(L * g.kh * g.kw), [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      std::int64_t* ip = Idx ? idx + p * L : nullptr;
      if (is2x2) max_pool_plane_2x2<T, Idx>(g, x + p * HW, y + p * L, ip);
      else max_pool_plane<T, Idx>(g, x + p * HW, y + p * L, ip);
    }
  });
}
}  // namespace detail

/// y (planes, oh, ow) = max over each window of x (planes, h, w); idx (may be null when no gradient is needed)
/// = flat index h*W + w of the maximum.
template <class T>
void max_pool2d_forward(const PoolGeometry& g, const T* x, T* y, std::int64_t* idx) {
  if (idx) detail::max_pool_planes<T, true>(g, x, y, idx);
  else detail::max_pool_planes<T, false>(g, x, y, nullptr);
}

/// gx (planes, h, w) = gy (planes, oh, ow) sent to the recorded maxima (overwrites gx); index -1 (an empty
/// window) sends nothing. Indices must lie in [-1, h*w) (ops/ checks them).
template <class T>
void max_pool2d_backward(const PoolGeometry& g, const T* gy, const std::int64_t* idx, T* gx) {
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  using C = compute_t<T>;
  parallel_for(0, g.planes, detail::plane_grain(HW + L), [&](std::int64_t p0, std::int64_t p1) {
    detail::GradPlane<T> plane(HW);
    for (std::int64_t p = p0; p < p1; ++p) {
      C* ap = plane.start(gx + p * HW, HW);
      const T* gyp = gy + p * L;
      const std::int64_t* ip = idx + p * L;
      for (std::int64_t k = 0; k < L; ++k)
        if (ip[k] >= 0) ap[ip[k]] += static_cast<C>(gyp[k]);
      plane.finish(gx + p * HW, HW);
    }
  });
}

namespace detail {
// The window of average-pool output (oy, ox) clipped to the input, and its divisor.
struct AvgWindow {
  std::int64_t y0, y1, x0, x1, divisor;
};
inline AvgWindow avg_window(const PoolGeometry& g, std::int64_t oy, std::int64_t ox) {
  std::int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  std::int64_t y1 = std::min(y0 + g.kh, g.h + g.ph), x1 = std::min(x0 + g.kw, g.w + g.pw);
  const std::int64_t padded = (y1 - y0) * (x1 - x0);
  y0 = std::max<std::int64_t>(y0, 0);
  x0 = std::max<std::int64_t>(x0, 0);
  y1 = std::min(y1, g.h);
  x1 = std::min(x1, g.w);
  const std::int64_t inside = std::max<std::int64_t>(y1 - y0, 0) * std::max<std::int64_t>(x1 - x0, 0);
  return {y0, y1, x0, x1, g.divisor_override != 0 ? g.divisor_override : g.count_include_pad ? padded : inside};
}
}  // namespace detail

/// y (planes, oh, ow) = mean over each window of x (planes, h, w); a window entirely in the padding gives 0.
template <class T>
void avg_pool2d_forward(const PoolGeometry& g, const T* x, T* y) {
  using C = compute_t<T>;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  parallel_for(0, g.planes, detail::plane_grain(L * g.kh * g.kw), [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * HW;
      T* yp = y + p * L;
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = detail::avg_window(g, oy, ox);
          if (win.y0 >= win.y1 || win.x0 >= win.x1) {
            yp[oy * g.ow + ox] = T(0);
            continue;
          }
          C s = 0;
          for (std::int64_t iy = win.y0; iy < win.y1; ++iy)
            for (std::int64_t ix = win.x0; ix < win.x1; ++ix) s += static_cast<C>(xp[iy * g.w + ix]);
          yp[oy * g.ow + ox] = convert<T>(s / C(win.divisor));
        }
    }
  });
}

/// gx (planes, h, w) = the adjoint of avg_pool2d_forward applied to gy (overwrites gx).
template <class T>
void avg_pool2d_backward(const PoolGeometry& g, const T* gy, T* gx) {
  using C = compute_t<T>;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  parallel_for(0, g.planes, detail::plane_grain(HW + L * g.kh * g.kw), [&](std::int64_t p0, std::int64_t p1) {
    detail::GradPlane<T> plane(HW);
    for (std::int64_t p = p0; p < p1; ++p) {
      C* gp = plane.start(gx + p * HW, HW);
      const T* gyp = gy + p * L;
      for (std::int64_t oy = 0; oy < g.oh; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = detail::avg_window(g, oy, ox);
          if (win.y0 >= win.y1 || win.x0 >= win.x1) continue;
          const C v = static_cast<C>(gyp[oy * g.ow + ox]) / C(win.divisor);
          for (std::int64_t iy = win.y0; iy < win.y1; ++iy)
            for (std::int64_t ix = win.x0; ix < win.x1; ++ix) gp[iy * g.w + ix] += v;
        }
      plane.finish(gx + p * HW, HW);
    }
  });
}

namespace detail {
inline std::int64_t adaptive_start(std::int64_t i, std::int64_t in, std::int64_t out) { return i * in / out; }
inline std::int64_t adaptive_end(std::int64_t i, std::int64_t in, std::int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}
}  // namespace detail

/// y (planes, oh, ow): the mean of x (planes, h, w) over each adaptive bin.
template <class T>
void adaptive_avg_pool2d_forward(const PoolGeometry& g, const T* x, T* y) {
  using C = compute_t<T>;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  parallel_for(0, g.planes, detail::plane_grain(HW + L), [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const T* xp = x + p * HW;
      T* yp = y + p * L;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const std::int64_t y0 = detail::adaptive_start(oy, g.h, g.oh), y1 = detail::adaptive_end(oy, g.h, g.oh);
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const std::int64_t x0 = detail::adaptive_start(ox, g.w, g.ow), x1 = detail::adaptive_end(ox, g.w, g.ow);
          C s = 0;
          for (std::int64_t iy = y0; iy < y1; ++iy)
            for (std::int64_t ix = x0; ix < x1; ++ix) s += static_cast<C>(xp[iy * g.w + ix]);
          yp[oy * g.ow + ox] = convert<T>(s / C((y1 - y0) * (x1 - x0)));
        }
      }
    }
  });
}

/// gx (planes, h, w) = the adjoint of adaptive_avg_pool2d_forward applied to gy (overwrites gx).
template <class T>
void adaptive_avg_pool2d_backward(const PoolGeometry& g, const T* gy, T* gx) {
  using C = compute_t<T>;
  const std::int64_t HW = g.h * g.w, L = g.oh * g.ow;
  parallel_for(0, g.planes, detail::plane_grain(HW + L), [&](std::int64_t p0, std::int64_t p1) {
    detail::GradPlane<T> plane(HW);
    for (std::int64_t p = p0; p < p1; ++p) {
      C* gp = plane.start(gx + p * HW, HW);
      const T* gyp = gy + p * L;
      for (std::int64_t oy = 0; oy < g.oh; ++oy) {
        const std::int64_t y0 = detail::adaptive_start(oy, g.h, g.oh), y1 = detail::adaptive_end(oy, g.h, g.oh);
        for (std::int64_t ox = 0; ox < g.ow; ++ox) {
          const std::int64_t x0 = detail::adaptive_start(ox, g.w, g.ow), x1 = detail::adaptive_end(ox, g.w, g.ow);
          const C v = static_cast<C>(gyp[oy * g.ow + ox]) / C((y1 - y0) * (x1 - x0));
          for (std::int64_t iy = y0; iy < y1; ++iy)
            for (std::int64_t ix = x0; ix < x1; ++ix) gp[iy * g.w + ix] += v;
        }
      }
      plane.finish(gx + p * HW, HW);
    }
  });
}

}  // namespace ember::cpu
