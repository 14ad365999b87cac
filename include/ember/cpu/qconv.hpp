// ember — CPU int8 kernels of quantized Conv2d layers (quant/layers.hpp converts and checks the layer). Convolutions
// with 4 or more input channels per group run, on every path but the scalar one (AVX512-VNNI, AVX-VNNI, AVX2), a
// direct kernel (conv_direct) on the input quantized into channel quads: no columns are built. The others build
// uint8 columns (stride 1: in place from the padded planes) for the GEMM of cpu/qgemm.hpp. The dequantization, the
// fused activation and the fused 2x2 max pool follow cpu/qlinear.hpp's epilogue.
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/cpu/qgemm.hpp"
#include "ember/cpu/qlinear.hpp"
#include "ember/cpu/thread_pool.hpp"

#if defined(__SSE2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ember::cpu::q {

/// conv2d_direct's blocked weight and the padded weight rows of q (out, depth and kp set) from the contiguous int8
/// weight w (out, cg, kh, kw) with `groups` groups.
inline void prepare_conv_weight(Int8Operands& q, const std::int8_t* w, std::int64_t cg, std::int64_t taps,
                                std::int64_t groups) {
  const std::int64_t out = q.out, depth = q.depth, kp = q.kp;
  q.rows.assign(std::size_t(out * kp), 0);
  for (std::int64_t o = 0; o < out; ++o) std::copy(w + o * depth, w + (o + 1) * depth, q.rows.data() + o * kp);
  q.blocked.clear();
  q.quads = q.blocks = 0;
  if (conv_direct_compiled && cg >= 4) {
    const std::int64_t G = groups, og = out / G;
    q.quads = (cg + 3) / 4;
    q.blocks = (og + 15) / 16;
    const std::int64_t nkg = q.quads * taps, blocks = q.blocks;
    q.blocked.assign(std::size_t(G * blocks * nkg * 64), 0);
    for (std::int64_t grp = 0; grp < G; ++grp)
      for (std::int64_t o = 0; o < og; ++o)
        for (std::int64_t ch = 0; ch < cg; ++ch)
          for (std::int64_t tap = 0; tap < taps; ++tap) {
            const std::int64_t kg = (ch / 4) * taps + tap;
            q.blocked[std::size_t(((grp * blocks + o / 16) * nkg + kg) * 64 + (o % 16) * 4 + ch % 4)] =
                w[((grp * og + o) * cg + ch) * taps + tap];
          }
  }
}

namespace detail {


/// out[oy][ox] = the max of c's 2x2 window at (2 oy, 2 ox), for oy < oh, ox < ow; c's rows are `stride` apart.
inline void max_pool_2x2_s32(const std::int32_t* EMBER_RESTRICT c, std::int64_t stride, std::int64_t oh,
                             std::int64_t ow, std::int32_t* EMBER_RESTRICT out) {
#if defined(__AVX512F__)
  // 16 outputs at a time: 32 inputs of each row, split into even and odd columns.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __mmask16 all = 0xFFFF;
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    const std::int32_t* r0 = c + 2 * oy * stride;
    const std::int32_t* r1 = r0 + stride;
    for (std::int64_t ox = 0; ox < ow; ox += 16) {
      const std::int64_t n = std::min<std::int64_t>(16, ow - ox), in = 2 * n;  // outputs, inputs per row
      const __mmask16 m_out = __mmask16((1u << n) - 1);
      const __mmask16 m_lo = in >= 16 ? all : __mmask16((1u << in) - 1);
      const __mmask16 m_hi = in > 16 ? __mmask16((1u << (in - 16)) - 1) : __mmask16(0);
      __m512i best = _mm512_set1_epi32(INT32_MIN);
      for (const std::int32_t* r : {r0, r1}) {
        const __m512i lo = _mm512_maskz_loadu_epi32(m_lo, r + 2 * ox), hi = _mm512_maskz_loadu_epi32(m_hi, r + 2 * ox + 16);
        const __m512i e = _mm512_maskz_permutex2var_epi32(all, lo, even, hi);
        const __m512i o = _mm512_maskz_permutex2var_epi32(all, lo, odd, hi);
        best = _mm512_maskz_max_epi32(all, best, _mm512_maskz_max_epi32(all, e, o));
      }
      _mm512_mask_storeu_epi32(out + oy * ow + ox, m_out, best);
    }
  }
#else
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    const std::int32_t* r0 = c + 2 * oy * stride;
    const std::int32_t* r1 = r0 + stride;
    for (std::int64_t ox = 0; ox < ow; ++ox)
      out[oy * ow + ox] = std::max(std::max(r0[2 * ox], r0[2 * ox + 1]), std::max(r1[2 * ox], r1[2 * ox + 1]));
  }
#endif
}

// The GEMM's packed columns (cpu/qgemm.hpp) from kp rows of bytes: rows[k] points at row k's first position, rows
// past the depth at zeros, and each is readable for lp (a multiple of 16) positions. For each block of 16 positions
// and group of 4 rows, the 16 positions' 4 bytes go side by side: a 4 x 16 byte transpose.
inline void pack_columns(const std::uint8_t* const* rows, std::int64_t kp, std::int64_t lp,
                         std::uint8_t* EMBER_RESTRICT out) {
  using cpu::q::kBlock;
  for (std::int64_t p0 = 0; p0 < lp; p0 += kBlock)
    for (std::int64_t k = 0; k < kp; k += 4) {
      std::uint8_t* o = out + (p0 / kBlock) * kp * kBlock + k * kBlock;
#if defined(__SSE2__)
      const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k] + p0));
      const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k + 1] + p0));
      const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k + 2] + p0));
      const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[k + 3] + p0));
      const __m128i a = _mm_unpacklo_epi8(r0, r1), b = _mm_unpackhi_epi8(r0, r1);
      const __m128i c = _mm_unpacklo_epi8(r2, r3), d = _mm_unpackhi_epi8(r2, r3);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_unpacklo_epi16(a, c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16), _mm_unpackhi_epi16(a, c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32), _mm_unpacklo_epi16(b, d));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 48), _mm_unpackhi_epi16(b, d));
#else
      for (std::int64_t l = 0; l < kBlock; ++l)
        for (std::int64_t t = 0; t < 4; ++t) o[l * 4 + t] = rows[k + t][p0 + l];
#endif
    }
}
#if EMBER_QCONV_DIRECT
// The direct path (cpu::q::conv_direct): the input quantized once into planes of 4-byte positions, the 4 channels of
// a quad side by side, so the kernel reads each (position, tap, quad) as one broadcast in place: no columns are
// built, and only real output positions are computed. The product comes out channels-last, which makes the
// dequantization, the activation and the 2x2 pool vector operations across channels; the result is stored to the
// (N, O, H, W) output at the end.

/// Planes [r0, r1) of the quad layout, r = (image · G + group) · quads + quad; returns whether x held a NaN there.
/// With `mag`, the planes are stored split for Path::avx2's kernel (cpu::q::split_signed): a at out, |a| at mag.
inline bool quantize_quads(const float* x, const ConvGeometry& g, std::int64_t quads, float inv, float zp,
                           std::int64_t r0, std::int64_t r1, std::uint8_t* out, std::uint8_t* mag) {
  const std::int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw, cg = g.cg();
#if defined(__AVX2__) && !defined(__AVX512F__)
  // As the AVX-512 form below at 8 lanes: the arithmetic of quantize_u8 (bit for bit), lanes outside the input row
  // and channels past cg loading 0.0, which quantizes to the zero point.
  const __m256 vinv = _mm256_set1_ps(inv), vzp = _mm256_set1_ps(zp), lo = _mm256_setzero_ps(),
               hi = _mm256_set1_ps(255.0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), flip = _mm256_set1_epi8(char(0x80));
  __m256 nan = _mm256_setzero_ps();
#elif !defined(__AVX512F__)
  // Each channel's row quantized by quantize_u8 into a row of bytes that starts as the zero point (the value of a
  // padded 0.0, and of the channels past cg in the last quad), then the quad's 4 rows interleaved.
  std::vector<std::uint8_t> rowq(std::size_t(4 * wp));
  const auto zb = std::uint8_t(zp);
  bool nan = false;
#else
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp), lo = _mm512_setzero_ps(),
               hi = _mm512_set1_ps(255.0f);
  const __mmask16 all = 0xFFFF;
  __mmask16 nan = 0;
#endif
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t img = r / (g.groups * quads), grp = (r / quads) % g.groups, quad = r % quads;
    const std::int64_t nch = std::min<std::int64_t>(4, cg - 4 * quad);
    const float* src = x + (img * g.c + grp * cg + 4 * quad) * g.h * g.w;  // channel t's plane at src + t·h·w
    auto* dst = reinterpret_cast<std::uint32_t*>(out + r * hp * wp * 4);
#if defined(__AVX2__) && !defined(__AVX512F__)
    auto* mdst = mag ? reinterpret_cast<std::uint32_t*>(mag + r * hp * wp * 4) : nullptr;
#endif
    for (std::int64_t yy = 0; yy < hp; ++yy) {
      const bool in_row = yy >= g.ph && yy < g.ph + g.h;
#if defined(__AVX2__) && !defined(__AVX512F__)
      for (std::int64_t x0 = 0; x0 < wp; x0 += 8) {
        const std::int64_t n = std::min<std::int64_t>(8, wp - x0);
        const std::int64_t a = std::clamp<std::int64_t>(g.pw - x0, 0, 8), b = std::clamp<std::int64_t>(g.pw + g.w - x0, 0, 8);
        const bool any = in_row && b > a;
        const __m256i valid = _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(int(a) - 1)),
                                               _mm256_cmpgt_epi32(_mm256_set1_epi32(int(b)), lane));
        __m256i packed = _mm256_setzero_si256();
        for (std::int64_t t = 0; t < 4; ++t) {
          __m256 v = lo;
          if (any && t < nch) {
            // x0 - pw may be negative: lanes outside `valid` are never read (masked loads do not fault)
            const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(src + t * g.h * g.w + (yy - g.ph) * g.w) +
                                      std::uintptr_t(x0 - g.pw) * sizeof(float);
            v = _mm256_maskload_ps(reinterpret_cast<const float*>(at), valid);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
          }
          __m256 q = _mm256_round_ps(_mm256_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, vzp), lo), hi);
          packed = _mm256_or_si256(packed, _mm256_slli_epi32(_mm256_cvtps_epi32(q), int(8 * t)));
        }
        const auto store = [&](std::uint32_t* to, __m256i v) {
          if (n == 8)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + yy * wp + x0), v);
          else
            _mm256_maskstore_epi32(reinterpret_cast<int*>(to + yy * wp + x0),
                                   _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), lane), v);
        };
        if (mdst) {  // split_signed's bytes
          packed = _mm256_xor_si256(packed, flip);
          store(mdst, _mm256_abs_epi8(packed));
        }
        store(dst, packed);
      }
#elif !defined(__AVX512F__)
      std::fill(rowq.begin(), rowq.end(), zb);
      if (in_row)
        for (std::int64_t t = 0; t < nch; ++t)
          nan |= quantize_u8(src + t * g.h * g.w + (yy - g.ph) * g.w, g.w, inv, zp, rowq.data() + t * wp + g.pw);
      const std::uint8_t *q0 = rowq.data(), *q1 = q0 + wp, *q2 = q1 + wp, *q3 = q2 + wp;
      std::uint32_t* d = dst + yy * wp;
      for (std::int64_t i = 0; i < wp; ++i)
        d[i] = std::uint32_t(q0[i]) | std::uint32_t(q1[i]) << 8 | std::uint32_t(q2[i]) << 16 |
               std::uint32_t(q3[i]) << 24;
#else
      for (std::int64_t x0 = 0; x0 < wp; x0 += 16) {
        // lanes x0 + l < wp are stored; those inside [pw, pw + w) of an input row read x, the others are padding:
        // they load 0.0, which quantizes to the zero point.
        const std::int64_t n = std::min<std::int64_t>(16, wp - x0);
        const __mmask16 store = __mmask16((1u << n) - 1);
        const std::int64_t a = std::clamp<std::int64_t>(g.pw - x0, 0, 16), b = std::clamp<std::int64_t>(g.pw + g.w - x0, 0, 16);
        const __mmask16 valid = in_row && b > a ? __mmask16(((1u << b) - 1) & ~((1u << a) - 1)) : __mmask16(0);
        __m512i packed = _mm512_setzero_si512();
        for (std::int64_t t = 0; t < 4; ++t) {
          __m512 v = lo;
          if (valid && t < nch) {
            // x0 - pw may be negative: lanes outside `valid` are never read (masked loads do not fault)
            const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(src + t * g.h * g.w + (yy - g.ph) * g.w) +
                                      std::uintptr_t(x0 - g.pw) * sizeof(float);
            v = _mm512_maskz_loadu_ps(valid, reinterpret_cast<const float*>(at));
            nan |= _mm512_mask_cmp_ps_mask(valid, v, v, _CMP_UNORD_Q);
          }
          __m512 q = _mm512_maskz_roundscale_ps(all, _mm512_maskz_mul_ps(all, v, vinv),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          q = _mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, _mm512_maskz_add_ps(all, q, vzp), lo), hi);
          packed = _mm512_or_si512(packed, _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtps_epu32(all, q), unsigned(8 * t)));
        }
        _mm512_mask_storeu_epi32(dst + yy * wp + x0, store, packed);
      }
#endif
    }
#if !defined(__AVX2__) || defined(__AVX512F__)
    if (mag) cpu::q::split_signed(out + r * hp * wp * 4, hp * wp * 4, mag + r * hp * wp * 4);
#endif
  }
#if defined(__AVX2__) && !defined(__AVX512F__)
  return _mm256_movemask_ps(nan) != 0;
#else
  return nan != 0;
#endif
}

/// The convolution of x through the direct kernel into y (N, O, ph, pw): ph, pw are the output's size, halved by a
/// fused pool. Returns whether x held a NaN.
inline bool conv2d_direct(const Int8Operands& q, const Int8Epilogue& e, const float* x, const ConvGeometry& g,
                          float* y, Path path) {
  const std::int64_t G = g.groups, og = g.og(), quads = q.quads, blocks = q.blocks, ogp = blocks * 16;
  const std::int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw, qplane = hp * wp * 4, taps = g.kh * g.kw;
  const std::int64_t nkg = quads * taps;
  std::vector<std::int64_t> koff(static_cast<std::size_t>(nkg));
  for (std::int64_t quad = 0; quad < quads; ++quad)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j)
        koff[std::size_t((quad * g.kh + i) * g.kw + j)] = quad * qplane + (i * g.dh * wp + j * g.dw) * 4;
  // The quantized input; split (a, then |a| `mag` bytes on) where the path's kernel reads it so.
  const bool split = cpu::q::conv_direct_split(path);
  const std::int64_t mag = split ? g.n * G * quads * qplane : 0;
  const Tensor<std::uint8_t> xq_buf = empty<std::uint8_t>(Shape{(split ? 2 : 1) * g.n * G * quads * qplane});
  std::uint8_t* xq = xq_buf.data();  // (from the caching allocator)
  const float inv = 1.0f / e.input_scale, zp = float(q.zp_u8);
  std::atomic<bool> saw_nan{false};
  cpu::parallel_for(0, g.n * G * quads, 4, [&](std::int64_t r0, std::int64_t r1) {
    if (quantize_quads(x, g, quads, inv, zp, r0, r1, xq, split ? xq + mag : nullptr)) saw_nan = true;
  });
  if (saw_nan) return true;

  // Tasks: (image, group, block of output rows): two rows (one pooled row) with a pool, else about 48 positions.
  const bool pool = e.pool;
  const std::int64_t rows = pool ? 2 : std::max<std::int64_t>(1, 48 / g.ow);
  const std::int64_t rblocks = pool ? g.oh / 2 : (g.oh + rows - 1) / rows;
  const std::int64_t yh = pool ? g.oh / 2 : g.oh, yw = pool ? g.ow / 2 : g.ow, yl = yh * yw;
  const bool relu = e.act == Activation::relu, pool_first = pool && (relu || e.act == Activation::none);
  cpu::parallel_for(0, g.n * G * rblocks, 1, [&](std::int64_t t0, std::int64_t t1) {
    const std::int64_t pmax = rows * g.ow;
    std::vector<std::int64_t> pos(static_cast<std::size_t>(pmax));
    std::vector<std::int32_t> c(std::size_t(pmax * ogp));
    std::vector<float> f(std::size_t(pmax * ogp)), pooled(pool && !pool_first ? std::size_t(yw * ogp) : 0);
    [[maybe_unused]] std::vector<std::int32_t> pos_max(static_cast<std::size_t>(ogp));  // (the portable epilogue's)
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t img = t / (G * rblocks), grp = (t / rblocks) % G, rb = t % rblocks;
      const std::int64_t oy0 = rb * rows, oy1 = std::min(g.oh, oy0 + rows), P = (oy1 - oy0) * g.ow;
      for (std::int64_t oy = oy0, p = 0; oy < oy1; ++oy)
        for (std::int64_t ox = 0; ox < g.ow; ++ox, ++p) pos[std::size_t(p)] = (oy * g.sh * wp + ox * g.sw) * 4;
      cpu::q::conv_direct(xq + (img * G + grp) * quads * qplane, mag, pos.data(), P, koff.data(), nkg,
                          q.blocked.data() + grp * blocks * nkg * 64, blocks, c.data(), ogp, path);
      // f[p][o] = (c + zp offset) · scale + bias, as dequantize_row computes it, then the activation. With a pool
      // and no activation or ReLU (monotone, like the dequantization: scales are positive), the int32 sums are
      // pooled first and only the pooled ones dequantized; other activations are pooled after.
      const std::int64_t n_out = pool ? yw : P, y0 = pool ? (oy0 / 2) * yw : oy0 * g.ow;
#if !defined(__AVX512F__)
      // The same arithmetic as dequantize_row's (so every path of one build agrees bit for bit), across channels.
      const std::int64_t oc0 = grp * og;
      const std::int32_t* off = q.zp_offset.data() + oc0;
      const float *sc = q.out_scale.data() + oc0, *bo = e.bias + oc0;
      const auto dequantize = [&](const std::int32_t* v, float* out) {
        for (std::int64_t o = 0; o < og; ++o) {
          const float r = float(v[o] + off[o]) * sc[o] + bo[o];
          out[o] = relu ? std::max(r, 0.0f) : r;
        }
      };
      if (pool_first) {
        std::vector<std::int32_t>& mx = pos_max;
        for (std::int64_t px = 0; px < yw; ++px) {
          const std::int32_t* r0 = c.data() + 2 * px * ogp;
          const std::int32_t* r1 = r0 + g.ow * ogp;
          for (std::int64_t o = 0; o < og; ++o)
            mx[std::size_t(o)] = std::max(std::max(r0[o], r0[o + ogp]), std::max(r1[o], r1[o + ogp]));
          dequantize(mx.data(), f.data() + px * ogp);
        }
      } else {
        for (std::int64_t p = 0; p < P; ++p) dequantize(c.data() + p * ogp, f.data() + p * ogp);
      }
      const float* src = f.data();
      if (!pool_first && e.act != Activation::none && !relu)
        for (std::int64_t p = 0; p < P; ++p) cpu::act_(f.data() + p * ogp, og, e.act);
      if (pool && !pool_first) {
        for (std::int64_t px = 0; px < yw; ++px) {
          const float* r0 = f.data() + 2 * px * ogp;
          const float* r1 = r0 + g.ow * ogp;
          for (std::int64_t o = 0; o < og; ++o)
            pooled[std::size_t(px * ogp + o)] = std::max(std::max(r0[o], r0[o + ogp]), std::max(r1[o], r1[o + ogp]));
        }
        src = pooled.data();
      }
#else
      for (std::int64_t o0 = 0; o0 < og; o0 += 16) {
        const __mmask16 m = og - o0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (og - o0)) - 1);
        const std::int64_t oc = grp * og + o0;
        const __m512i voff = _mm512_maskz_loadu_epi32(m, q.zp_offset.data() + oc);
        const __m512 vs = _mm512_maskz_loadu_ps(m, q.out_scale.data() + oc),
                     vb = _mm512_maskz_loadu_ps(m, e.bias + oc);
        const auto dequantize = [&](__m512i v) {
          __m512 r = _mm512_maskz_fmadd_ps(m, _mm512_maskz_cvtepi32_ps(m, _mm512_maskz_add_epi32(m, v, voff)), vs, vb);
          return relu ? _mm512_maskz_max_ps(m, r, _mm512_setzero_ps()) : r;
        };
        if (pool_first) {
          for (std::int64_t px = 0; px < yw; ++px) {
            const std::int32_t* r0 = c.data() + 2 * px * ogp + o0;
            const std::int32_t* r1 = r0 + g.ow * ogp;
            const __m512i mx = _mm512_maskz_max_epi32(
                m, _mm512_maskz_max_epi32(m, _mm512_maskz_loadu_epi32(m, r0), _mm512_maskz_loadu_epi32(m, r0 + ogp)),
                _mm512_maskz_max_epi32(m, _mm512_maskz_loadu_epi32(m, r1), _mm512_maskz_loadu_epi32(m, r1 + ogp)));
            _mm512_storeu_ps(f.data() + px * ogp + o0, dequantize(mx));
          }
        } else {
          for (std::int64_t p = 0; p < P; ++p)
            _mm512_storeu_ps(f.data() + p * ogp + o0, dequantize(_mm512_maskz_loadu_epi32(m, c.data() + p * ogp + o0)));
        }
      }
      const float* src = f.data();
      if (!pool_first && e.act != Activation::none && !relu)
        for (std::int64_t p = 0; p < P; ++p) cpu::act_(f.data() + p * ogp, og, e.act);
      if (pool && !pool_first) {
        for (std::int64_t px = 0; px < yw; ++px)
          for (std::int64_t o0 = 0; o0 < ogp; o0 += 16) {
            const float* r0 = f.data() + 2 * px * ogp + o0;
            const float* r1 = r0 + g.ow * ogp;
            const __mmask16 all = 0xFFFF;
            const __m512 mx = _mm512_maskz_max_ps(
                all, _mm512_maskz_max_ps(all, _mm512_loadu_ps(r0), _mm512_loadu_ps(r0 + ogp)),
                _mm512_maskz_max_ps(all, _mm512_loadu_ps(r1), _mm512_loadu_ps(r1 + ogp)));
            _mm512_storeu_ps(pooled.data() + px * ogp + o0, mx);
          }
        src = pooled.data();
      }
#endif
      // channels-last rows -> the output's planes
      for (std::int64_t o = 0; o < og; ++o) {
        float* yr = y + (img * g.o + grp * og + o) * yl + y0;
        for (std::int64_t p = 0; p < n_out; ++p) yr[p] = src[p * ogp + o];
      }
    }
  });
  return false;
}
#endif

}  // namespace detail

/// The convolution of the contiguous float input x (g) through columns and the GEMM, with e's epilogue: y (N, O, oh,
/// ow), or (N, O, oh/2, ow/2) with e.pool; undefined when x held a NaN.
inline Tensor<float> conv2d_forward(const Int8Operands& q, const Int8Epilogue& e, const ConvGeometry& g,
                                    const float* x, Path path) {
  const std::int64_t G = g.groups, L = g.l(), og = g.og();
  // The whole input quantized once, into planes padded with the zero point (the value of a padded 0.0), so the
  // columns need no bounds checks. Each plane is (H + 2ph) x (W + 2pw); `slack` bytes follow the last one.
  const std::int64_t hp = g.h + 2 * g.ph, wp = g.w + 2 * g.pw, plane = hp * wp;
  const std::int64_t slack = (g.kw - 1) * g.dw + 2 * cpu::q::kBlock;
  // From ember's caching allocator: a fresh malloc of this size would be a new mmap (and page faults) every call.
  const Tensor<std::uint8_t> xq_buf = empty<std::uint8_t>(Shape{g.n * g.c * plane + slack});
  std::uint8_t* xq = xq_buf.data();
  std::memset(xq, q.zp_u8, std::size_t(xq_buf.numel()));
  const float inv = 1.0f / e.input_scale, zp = float(q.zp_u8);
  std::atomic<bool> saw_nan{false};
  cpu::parallel_for(0, g.n * g.c, 8, [&](std::int64_t r0, std::int64_t r1) {
    bool bad = false;
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t i = 0; i < g.h; ++i)
        bad |= detail::quantize_u8(x + (r * g.h + i) * g.w, g.w, inv, zp,
                                   xq + r * plane + (i + g.ph) * wp + g.pw);
    if (bad) saw_nan = true;
  });
  if (saw_nan) return Tensor<float>();

  // With stride 1 the columns are the padded planes themselves: tap (c, i, j) for output position (oy, ox) is byte
  // (oy + i·dh)·wp + ox + j·dw of plane c, so over "virtual" positions oy·wp + ox (ox < wp; the wp - ow extra ones
  // are computed and dropped) each tap's row is one contiguous run. Other strides copy the taps first.
  const bool direct = g.sh == 1 && g.sw == 1;
  const std::int64_t lv = direct ? g.oh * wp : L;  // positions the GEMM computes
  const std::int64_t row_stride = direct ? wp : g.ow;
  const std::int64_t lp = cpu::q::round_up(lv, cpu::q::kBlock);
  // With a pool, y's planes are (oh/2, ow/2). ReLU and the dequantization are monotone (scales are positive), so
  // the int32 sums are pooled first and a quarter of them dequantized; other activations are pooled after.
  const std::int64_t ph = e.pool ? g.oh / 2 : g.oh, pw = e.pool ? g.ow / 2 : g.ow, yl = ph * pw;
  const bool pool_first = e.pool && (e.act == Activation::none || e.act == Activation::relu);
  Tensor<float> y = empty<float>(Shape{g.n, g.o, ph, pw});
  // Tasks: (image, group, block of output channels). With fewer images and groups than threads, the output
  // channels are split too (each part builds the same columns).
  const std::int64_t threads = cpu::get_num_threads();
  const std::int64_t splits = g.n * G >= threads ? 1 : std::min<std::int64_t>(threads, (og + 7) / 8);
  const std::int64_t per = (og + splits - 1) / splits;
  const std::int64_t K = q.depth;
  cpu::parallel_for(0, g.n * G * splits, 1, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<std::uint8_t> zeros(std::size_t(lp), 0), plain(direct ? 0 : std::size_t(K * lp), 0),
        cols(std::size_t(q.kp * lp));
    std::vector<const std::uint8_t*> rows(std::size_t(q.kp), zeros.data());
    std::vector<std::int32_t> c(std::size_t(per * lv)), pooled(e.pool ? std::size_t(yl) : 0);
    std::vector<float> pre(e.pool && !pool_first ? std::size_t(L) : 0);
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t img = t / (G * splits), grp = (t / splits) % G, part = t % splits;
      const std::int64_t o0 = part * per, o1 = std::min(og, o0 + per);
      if (o0 >= o1) continue;
      const std::uint8_t* planes = xq + (img * g.c + grp * g.cg()) * plane;
      for (std::int64_t ch = 0; ch < g.cg(); ++ch)
        for (std::int64_t i = 0; i < g.kh; ++i)
          for (std::int64_t j = 0; j < g.kw; ++j) {
            const std::int64_t k = (ch * g.kh + i) * g.kw + j;
            const std::uint8_t* tap = planes + ch * plane + i * g.dh * wp + j * g.dw;
            if (direct) {
              rows[std::size_t(k)] = tap;
              continue;
            }
            std::uint8_t* dst = plain.data() + k * lp;
            for (std::int64_t oy = 0; oy < g.oh; ++oy)
              for (std::int64_t ox = 0; ox < g.ow; ++ox) dst[oy * g.ow + ox] = tap[oy * g.sh * wp + ox * g.sw];
            rows[std::size_t(k)] = dst;
          }
      detail::pack_columns(rows.data(), q.kp, lp, cols.data());
      const std::int64_t oc0 = grp * og + o0;
      cpu::q::gemm_raw(q.rows.data() + oc0 * q.kp, q.kp, o1 - o0, cols.data(), lv, q.kp, c.data(), lv, path);
      for (std::int64_t oc = oc0; oc < grp * og + o1; ++oc) {
        float* yr = y.data() + (img * g.o + oc) * yl;
        const std::int32_t* cr = c.data() + (oc - oc0) * lv;
        const std::int32_t off = q.zp_offset[std::size_t(oc)];
        const float sc = q.out_scale[std::size_t(oc)], bo = e.bias[oc];
        const bool relu = e.act == Activation::relu;  // applied in the dequantize pass; the others after it
        if (pool_first) {
          detail::max_pool_2x2_s32(cr, row_stride, ph, pw, pooled.data());
          detail::dequantize_row(pooled.data(), yl, off, sc, bo, relu, yr);
          continue;
        }
        float* full = e.pool ? pre.data() : yr;
        for (std::int64_t oy = 0; oy < g.oh; ++oy)
          detail::dequantize_row(cr + oy * row_stride, g.ow, off, sc, bo, relu, full + oy * g.ow);
        if (!relu) cpu::act_(full, L, e.act);
        if (e.pool) {
          cpu::PoolGeometry pg;
          pg.h = g.oh;
          pg.w = g.ow;
          pg.oh = ph;
          pg.ow = pw;
          cpu::detail::max_pool_plane_2x2<float, false>(pg, full, yr, nullptr);
        }
      }
    }
  });
  return y;
}

}  // namespace ember::cpu::q
