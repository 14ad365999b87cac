// ember — the AVX2 + FMA registers of cpu/detail/simd.hpp: 8 float or 4 double lanes, the operations the GEMM's and
// the convolutions' kernels use, and an 8x8 transpose in registers. Defined where the compiler targets AVX2 and FMA.
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include <cstdint>

namespace ember::cpu::simd::avx2 {

/// 8 floats.
struct F32 {
  using type = __m256;
  static constexpr int width = 8;
  static type zero() { return _mm256_setzero_ps(); }
  static type set1(float x) { return _mm256_set1_ps(x); }
  static type load(const float* p) { return _mm256_load_ps(p); }
  static type loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, type v) { _mm256_storeu_ps(p, v); }
  /// All ones in the first n lanes (0 <= n <= 8).
  static __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  /// The first n lanes (0 <= n <= 8) from p, zeros after them; nothing past them is read.
  static type loadu_n(const float* p, int n) { return _mm256_maskload_ps(p, lanes(n)); }
  /// The first n lanes (0 <= n <= 8) of v to p; nothing past them is written.
  static void storeu_n(float* p, type v, int n) { _mm256_maskstore_ps(p, lanes(n), v); }
  static type bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static type add(type a, type b) { return _mm256_add_ps(a, b); }
  static type sub(type a, type b) { return _mm256_sub_ps(a, b); }
  static type mul(type a, type b) { return _mm256_mul_ps(a, b); }
  /// a b + c, one rounding.
  static type fma(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
  /// c - a b, one rounding.
  static type fnma(type a, type b, type c) { return _mm256_fnmadd_ps(a, b, c); }
  /// relu as relu computes it: x < 0 ? 0 : x (NaN and -0 stay).
  static type relu(type x) {
    const type z = _mm256_setzero_ps();
    return _mm256_blendv_ps(x, z, _mm256_cmp_ps(x, z, _CMP_LT_OQ));
  }
  /// The next element v of a max-pool window against the maximum so far, with max_pool's rule: v wins when greater
  /// or NaN (so the first of equal maxima stays, and a NaN wins).
  static type pool_pick(type m, type v) {
    return _mm256_blendv_ps(m, v, _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  /// r[0..8) as the rows of an 8x8 block -> its columns (afterwards r[j] holds old column j), 24 shuffles.
  static void transpose(type (&r)[8]) {
    type t[8], u[8];
    for (int i = 0; i < 4; ++i) {  // 128-bit lane L of t[2i]: r[2i][4L], r[2i+1][4L], r[2i][4L+1], r[2i+1][4L+1]
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + c]: 128-bit lane L holds column 4L + c of rows 4g .. 4g + 3.
    for (int g = 0; g < 2; ++g) {
      u[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {  // column c: low lanes of u[c] and u[4 + c]; column 4 + c: their high lanes
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
};

/// 4 doubles.
struct F64 {
  using type = __m256d;
  static constexpr int width = 4;
  static type zero() { return _mm256_setzero_pd(); }
  static type load(const double* p) { return _mm256_load_pd(p); }
  static type loadu(const double* p) { return _mm256_loadu_pd(p); }
  static void storeu(double* p, type v) { _mm256_storeu_pd(p, v); }
  static type bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static type fma(type a, type b, type c) { return _mm256_fmadd_pd(a, b, c); }
  static type add(type a, type b) { return _mm256_add_pd(a, b); }
};

}  // namespace ember::cpu::simd::avx2

#endif
