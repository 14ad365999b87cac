// ember — the packed CPU GEMM: register-blocked micro-kernels chosen at compile time from the compiler's target
// macros (AVX-512, AVX2+FMA, or 128-bit GCC/Clang vector extensions, i.e. SSE2 on any x86-64 and NEON on ARM),
// operand packing that reads any strides in place, and cache blocking. cpu/gemm.hpp calls it when
// EMBER_GEMM_PACKED is 1 and falls back to Eigen otherwise (compilers without vector extensions).
//
// Layout (BLIS-style): C (m, n) row-major is computed in panels of kc along k. B's (kc, nc) block is packed into
// micro-panels of NR columns (kc rows of NR values, L1/L2-resident while the kernel sweeps A); A's (mc, kc)
// block is packed into micro-panels of MR rows (kc columns of MR values). The kernel keeps an MR x NR tile of C
// in registers: per k it loads NR/W vectors of B, broadcasts MR values of A and issues MR * NR/W FMAs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ember/config.hpp"

// EMBER_GEMM_EIGEN selects the Eigen fallback, EMBER_GEMM_NO_AVX512 the AVX2 kernel on an AVX-512 target.
#if defined(EMBER_GEMM_EIGEN)
#define EMBER_GEMM_PACKED 0
#elif defined(__AVX512F__) && !defined(EMBER_GEMM_NO_AVX512)
#include <immintrin.h>
#define EMBER_GEMM_PACKED 1
#define EMBER_GEMM_AVX512 1
#define EMBER_GEMM_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define EMBER_GEMM_PACKED 1
#define EMBER_GEMM_AVX512 0
#define EMBER_GEMM_AVX2 1
#elif (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define EMBER_GEMM_PACKED 1
#define EMBER_GEMM_AVX512 0
#define EMBER_GEMM_AVX2 0
#else
#define EMBER_GEMM_PACKED 0
#endif

#if EMBER_GEMM_PACKED

// nvcc's front end does not know `#pragma GCC unroll` (warning 1675); the host compiler still gets the pragmas.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#endif

namespace ember::cpu::detail::gemm {

// One SIMD register of T and the four operations the kernel needs.
template <class T>
struct Vec;

#if EMBER_GEMM_AVX512
template <>
struct Vec<float> {
  using type = __m512;
  static constexpr int width = 16;
  static type zero() { return _mm512_setzero_ps(); }
  static type load(const float* p) { return _mm512_load_ps(p); }
  static type loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, type v) { _mm512_storeu_ps(p, v); }
  static type bcast(const float* p) { return _mm512_set1_ps(*p); }
  static type fma(type a, type b, type c) { return _mm512_fmadd_ps(a, b, c); }
  static type add(type a, type b) { return _mm512_add_ps(a, b); }
};
template <>
struct Vec<double> {
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
// 12 x 2 vectors: 24 accumulators, 2 B loads and 12 broadcasts per k (32 registers).
inline constexpr int kMR = 12;
inline constexpr int kNV = 2;
#elif EMBER_GEMM_AVX2
template <>
struct Vec<float> {
  using type = __m256;
  static constexpr int width = 8;
  static type zero() { return _mm256_setzero_ps(); }
  static type load(const float* p) { return _mm256_load_ps(p); }
  static type loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, type v) { _mm256_storeu_ps(p, v); }
  static type bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static type fma(type a, type b, type c) { return _mm256_fmadd_ps(a, b, c); }
  static type add(type a, type b) { return _mm256_add_ps(a, b); }
};
template <>
struct Vec<double> {
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
// 6 x 2 vectors: 12 accumulators, 2 B loads and 6 broadcasts per k (16 registers).
inline constexpr int kMR = 6;
inline constexpr int kNV = 2;
#else
// Portable: 16-byte vectors through the compiler's vector extensions (SSE2, NEON, ...); multiply then add, which
// the compiler contracts into an FMA where the target has one and contraction is allowed.
template <class T>
struct GenericVec {
  typedef T type __attribute__((vector_size(16)));
  static constexpr int width = int(16 / sizeof(T));
  static type zero() { return type{}; }
  static type load(const T* p) { return *reinterpret_cast<const type*>(p); }
  static type loadu(const T* p) {
    type v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void storeu(T* p, type v) { std::memcpy(p, &v, sizeof v); }
  static type bcast(const T* p) { return type{} + *p; }
  static type fma(type a, type b, type c) { return a * b + c; }
  static type add(type a, type b) { return a + b; }
};
template <>
struct Vec<float> : GenericVec<float> {};
template <>
struct Vec<double> : GenericVec<double> {};
// 3 x 3 vectors: 9 accumulators, 3 B loads and 3 broadcasts per k (fits 16 registers with temporaries; on SSE2
// a broadcast costs a shuffle, so the kernel is kept square).
inline constexpr int kMR = 3;
inline constexpr int kNV = 3;
#endif

template <class T>
inline constexpr int kNR = kNV * Vec<T>::width;

/// Cache blocking: kc values of k per packed panel, mc rows of A per packed block, nc columns of B per block.
template <class T>
struct Blocking {
  static constexpr std::int64_t kc = 1024 / sizeof(T);  // B micro-panel kc * NR * sizeof(T) stays in L1/L2
  static constexpr std::int64_t mc = kMR * (96 / kMR);   // A block mc * kc * sizeof(T) in L2
  static constexpr std::int64_t nc = kNR<T> * (4096 / kNR<T>);  // B block kc * nc * sizeof(T) in L3
};

/// c (MR, NR; leading dim ldc) = [c +] a_packed (MR, kc) @ b_packed (kc, NR).
template <class T>
[[gnu::hot]] inline void micro_kernel(std::int64_t kc, const T* EMBER_RESTRICT a, const T* EMBER_RESTRICT b,
                                      T* c, std::int64_t ldc, bool add) {
  using V = Vec<T>;
  using R = typename V::type;
  constexpr int W = V::width;
  R acc[kMR][kNV];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[r][v] = V::zero();
  for (std::int64_t p = 0; p < kc; ++p) {
    R bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) bv[v] = V::load(b + v * W);
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const R av = V::bcast(a + r);
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[r][v] = V::fma(av, bv[v], acc[r][v]);
    }
    a += kMR;
    b += kNV * W;
  }
  if (add) {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) V::storeu(c + r * ldc + v * W, V::add(V::loadu(c + r * ldc + v * W), acc[r][v]));
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) V::storeu(c + r * ldc + v * W, acc[r][v]);
  }
}

/// Packs rows [0, mc) x cols [0, kc) of A (element (i, p) at a[i * rs + p * cs]) into MR-row micro-panels,
/// zero-padding the last one: panel q holds kc groups of MR values.
template <class T>
void pack_a(std::int64_t mc, std::int64_t kc, const T* a, std::int64_t rs, std::int64_t cs, T* dst) {
  for (std::int64_t i0 = 0; i0 < mc; i0 += kMR, dst += kMR * kc) {
    const int rows = int(std::min<std::int64_t>(kMR, mc - i0));
    const T* ap = a + i0 * rs;
    if (cs == 1) {  // rows are contiguous along k: read each row, write with stride MR
      for (int r = 0; r < rows; ++r)
        for (std::int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = ap[r * rs + p];
    } else if (rs == 1 && rows == kMR) {  // columns contiguous: one contiguous run of MR per k
      for (std::int64_t p = 0; p < kc; ++p)
#pragma GCC unroll 16
        for (int r = 0; r < kMR; ++r) dst[p * kMR + r] = ap[p * cs + r];
    } else {
      for (std::int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < rows; ++r) dst[p * kMR + r] = ap[r * rs + p * cs];
    }
    if (rows < kMR)
      for (std::int64_t p = 0; p < kc; ++p)
        for (int r = rows; r < kMR; ++r) dst[p * kMR + r] = T(0);
  }
}

/// Packs rows [0, kc) x cols [0, nc) of B (element (p, j) at b[p * rs + j * cs]) into NR-column micro-panels,
/// zero-padding the last one: panel q holds kc groups of NR values.
template <class T>
void pack_b(std::int64_t kc, std::int64_t nc, const T* b, std::int64_t rs, std::int64_t cs, T* dst) {
  constexpr int NR = kNR<T>;
  for (std::int64_t j0 = 0; j0 < nc; j0 += NR, dst += NR * kc) {
    const int cols = int(std::min<std::int64_t>(NR, nc - j0));
    const T* bp = b + j0 * cs;
    if (cs == 1 && cols == NR) {  // row-major: NR contiguous values per k
      for (std::int64_t p = 0; p < kc; ++p) std::memcpy(dst + p * NR, bp + p * rs, NR * sizeof(T));
    } else if (rs == 1) {  // column-major (a transposed view): read each column along k
      for (int j = 0; j < cols; ++j)
        for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + j] = bp[j * cs + p];
    } else {
      for (std::int64_t p = 0; p < kc; ++p)
        for (int j = 0; j < cols; ++j) dst[p * NR + j] = bp[p * rs + j * cs];
    }
    if (cols < NR)
      for (std::int64_t p = 0; p < kc; ++p)
        for (int j = cols; j < NR; ++j) dst[p * NR + j] = T(0);
  }
}

/// A per-thread, 64-byte aligned scratch buffer that only grows.
struct Scratch {
  void* p = nullptr;
  std::size_t bytes = 0;
  ~Scratch() { std::free(p); }
  template <class T>
  T* get(std::size_t n) {
    const std::size_t need = (n * sizeof(T) + 63) / 64 * 64;
    if (need > bytes) {
      std::free(p);
      p = std::aligned_alloc(64, need);
      if (!p) throw std::bad_alloc();
      bytes = need;
    }
    return static_cast<T*>(p);
  }
};
inline Scratch& scratch_a() {
  thread_local Scratch s;
  return s;
}
inline Scratch& scratch_b() {
  thread_local Scratch s;
  return s;
}

/// C (m, n; row-major, leading dim ldc) = [C +] A (m, k) @ B (k, n) on the calling thread. A's element (i, p)
/// is a[i * ars + p * acs], B's (p, j) is b[p * brs + j * bcs]: any strides, read in place while packing.
template <class T>
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t ars, std::int64_t acs,
                 const T* b, std::int64_t brs, std::int64_t bcs, T* c, std::int64_t ldc, bool accumulate) {
  using Blk = Blocking<T>;
  constexpr int NR = kNR<T>;
  const std::int64_t kc_max = std::min(Blk::kc, k);
  const std::int64_t nc_max = std::min(Blk::nc, (n + NR - 1) / NR * NR);
  const std::int64_t mc_max = std::min(Blk::mc, (m + kMR - 1) / kMR * kMR);
  T* bpack = scratch_b().get<T>(std::size_t(kc_max * nc_max));
  T* apack = scratch_a().get<T>(std::size_t(kc_max * mc_max));
  alignas(64) T edge[kMR * NR];
  for (std::int64_t jc = 0; jc < n; jc += Blk::nc) {
    const std::int64_t nc = std::min(Blk::nc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += Blk::kc) {
      const std::int64_t kc = std::min(Blk::kc, k - pc);
      const bool add = accumulate || pc > 0;
      pack_b(kc, nc, b + pc * brs + jc * bcs, brs, bcs, bpack);
      for (std::int64_t ic = 0; ic < m; ic += Blk::mc) {
        const std::int64_t mc = std::min(Blk::mc, m - ic);
        pack_a(mc, kc, a + ic * ars + pc * acs, ars, acs, apack);
        for (std::int64_t jr = 0; jr < nc; jr += NR) {
          const int cols = int(std::min<std::int64_t>(NR, nc - jr));
          const T* bp = bpack + jr * kc;
          for (std::int64_t ir = 0; ir < mc; ir += kMR) {
            const int rows = int(std::min<std::int64_t>(kMR, mc - ir));
            const T* ap = apack + ir * kc;
            T* cp = c + (ic + ir) * ldc + jc + jr;
            if (rows == kMR && cols == NR) {
              micro_kernel<T>(kc, ap, bp, cp, ldc, add);
            } else {  // edge tile: compute the full tile aside, then add/store the valid part
              micro_kernel<T>(kc, ap, bp, edge, NR, false);
              for (int r = 0; r < rows; ++r)
                for (int j = 0; j < cols; ++j) cp[r * ldc + j] = add ? cp[r * ldc + j] + edge[r * NR + j] : edge[r * NR + j];
            }
          }
        }
      }
    }
  }
}

}  // namespace ember::cpu::detail::gemm

#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

#endif  // EMBER_GEMM_PACKED
