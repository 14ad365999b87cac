// ember — the AVX-512 registers of cpu/detail/simd.hpp: 16 float or 8 double lanes, the operations the GEMM's and
// the convolutions' kernels use, and a 16x16 transpose in registers. Defined where the compiler targets AVX-512F.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace ember::cpu::simd::avx512 {

/// 16 floats.
struct F32 {
  using type = __m512;
  static constexpr int width = 16;
  static type zero() { return _mm512_setzero_ps(); }
  static type set1(float x) { return _mm512_set1_ps(x); }
  static type load(const float* p) { return _mm512_load_ps(p); }
  static type loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, type v) { _mm512_storeu_ps(p, v); }
  /// The first n lanes (0 <= n <= 16) from p, zeros after them; nothing past them is read.
  static type loadu_n(const float* p, int n) { return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p); }
  /// The first n lanes (0 <= n <= 16) of v to p; nothing past them is written.
  static void storeu_n(float* p, type v, int n) { _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1u), v); }
  static type bcast(const float* p) { return _mm512_set1_ps(*p); }
  static type add(type a, type b) { return _mm512_add_ps(a, b); }
  static type sub(type a, type b) { return _mm512_sub_ps(a, b); }
  static type mul(type a, type b) { return _mm512_mul_ps(a, b); }
  /// a b + c, one rounding.
  static type fma(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
  /// c - a b, one rounding.
  static type fnma(type a, type b, type c) { return _mm512_fnmadd_ps(a, b, c); }
  /// relu as relu computes it: x < 0 ? 0 : x (NaN and -0 stay).
  static type relu(type x) {
    const type z = _mm512_setzero_ps();
    return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, z, _CMP_LT_OQ), z);
  }
  /// The next element v of a max-pool window against the maximum so far, with max_pool's rule: v wins when greater
  /// or NaN (so the first of equal maxima stays, and a NaN wins).
  static type pool_pick(type m, type v) {
    return _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
  }
  /// r[0..16) as the rows of a 16x16 block -> its columns (afterwards r[j] holds old column j), 64 shuffles. (The
  /// zero-masked forms with a full mask are the same instructions; GCC 12 reports the plain ones, which start from
  /// an undefined vector, as maybe-uninitialized once inlined.)
  static void transpose(type (&r)[16]) {
    constexpr __mmask16 all = 0xffff;
    type t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_maskz_unpacklo_ps(all, r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_maskz_unpackhi_ps(all, r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c]: 128-bit lane L holds column 4L + c of rows 4g .. 4g + 3.
    for (int g = 0; g < 4; ++g) {
      u[4 * g] = _mm512_maskz_shuffle_ps(all, t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm512_maskz_shuffle_ps(all, t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm512_maskz_shuffle_ps(all, t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm512_maskz_shuffle_ps(all, t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      const type v1 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0x88);
      const type v2 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0xDD);
      const type w1 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0x88);
      const type w2 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_maskz_shuffle_f32x4(all, v1, w1, 0x88);
      r[8 + c] = _mm512_maskz_shuffle_f32x4(all, v1, w1, 0xDD);
      r[4 + c] = _mm512_maskz_shuffle_f32x4(all, v2, w2, 0x88);
      r[12 + c] = _mm512_maskz_shuffle_f32x4(all, v2, w2, 0xDD);
    }
  }
};

/// 8 doubles.
struct F64 {
  using type = __m512d;
  static constexpr int width = 8;
  static type zero() { return _mm512_setzero_pd(); }
  static type load(const double* p) { return _mm512_load_pd(p); }
  static type loadu(const double* p) { return _mm512_loadu_pd(p); }
  static void storeu(double* p, type v) { _mm512_storeu_pd(p, v); }
  static type bcast(const double* p) { return _mm512_set1_pd(*p); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_pd(a, b, c); }
  static type add(type a, type b) { return _mm512_add_pd(a, b); }
};

}  // namespace ember::cpu::simd::avx512

#endif
