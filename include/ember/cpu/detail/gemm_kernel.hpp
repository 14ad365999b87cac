// ember — the packed CPU GEMM: register-blocked micro-kernels chosen at compile time from the compiler's target
// macros (AVX-512, AVX2+FMA, or 128-bit GCC/Clang vector extensions, i.e. SSE2 on any x86-64 and NEON on ARM),
// operand packing that reads any strides in place, and cache blocking. cpu/gemm.hpp calls it when
// EMBER_GEMM_PACKED is 1 and falls back to Eigen otherwise (compilers without vector extensions).
//
// Layout (BLIS-style): C (m, n) row-major is computed in panels of kc along k. B's (kc, nc) block is packed into
// micro-panels of NR columns (kc rows of NR values, L1/L2-resident while the kernel sweeps A); A's (mc, kc)
// block is packed into micro-panels of MR rows (kc columns of MR values). The kernel keeps an MR x NR tile of C
// in registers: per k it loads NR/W vectors of B, broadcasts MR values of A and issues MR * NR/W FMAs.
//
// Mixed precision: bfloat16 and half operands are converted to fp32 while they are packed (packing touches each
// element once per block, so the conversion costs O(mk + kn) against the kernel's O(mnk), and no fp32 copy of a
// whole operand is ever made); the fp32 kernel accumulates, and the tile is rounded once into the output type
// (bfloat16, half or float) as it is stored. With k longer than one panel a 16-bit output is accumulated in an
// fp32 scratch block and rounded once at the end, so the result is the fp32 product rounded once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/float16.hpp"
#include "ember/cpu/detail/cast16.hpp"
#include "ember/cpu/detail/simd.hpp"

// EMBER_GEMM_EIGEN selects the Eigen fallback; the kernel's tier is simd::Vec's (EMBER_SIMD_NO_AVX512: the AVX2
// kernel on an AVX-512 target).
#if defined(EMBER_GEMM_EIGEN) || !EMBER_SIMD_VEC
#define EMBER_GEMM_PACKED 0
#else
#define EMBER_GEMM_PACKED 1
#define EMBER_GEMM_AVX512 EMBER_SIMD_AVX512
#define EMBER_GEMM_AVX2 EMBER_SIMD_AVX2
#endif

#if EMBER_GEMM_PACKED

// nvcc's front end does not know `#pragma GCC unroll` (warning 1675); the host compiler still gets the pragmas.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#endif

namespace ember::cpu::detail::gemm {

// One SIMD register of T and the operations the kernel needs (cpu/detail/simd.hpp).
template <class T>
using Vec = simd::Vec<T>;

#if EMBER_GEMM_AVX512
// 12 x 2 vectors: 24 accumulators, 2 B loads and 12 broadcasts per k (32 registers).
inline constexpr int kMR = 12;
inline constexpr int kNV = 2;
#elif EMBER_GEMM_AVX2
// 6 x 2 vectors: 12 accumulators, 2 B loads and 6 broadcasts per k (16 registers).
inline constexpr int kMR = 6;
inline constexpr int kNV = 2;
#else
// 3 x 3 vectors: 9 accumulators, 3 B loads and 3 broadcasts per k (fits 16 registers with temporaries; on SSE2
// a broadcast costs a shuffle, so the kernel is kept square).
inline constexpr int kMR = 3;
inline constexpr int kNV = 3;
#endif

template <class T>
inline constexpr int kNR = kNV * Vec<T>::width;

/// The type the kernel computes in for operands stored as T (cpu/detail/cast16.hpp), and the conversion runs
/// that packing and the tile stores use.
using cast16::compute_t;
using cast16::store_run;
using cast16::to_compute_run;

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

#if EMBER_GEMM_AVX512
/// n (at most 16) values of S at src as 16 fp32 lanes, zeros past n: float as it is, bfloat16 and half widened
/// (exactly: every 16-bit value is a float).
template <class S>
inline __m512 load_f32x16(const S* src, int n) {
  const __mmask16 m = __mmask16((1u << n) - 1u);
  if constexpr (std::is_same_v<S, float>) {
    return _mm512_maskz_loadu_ps(m, src);
  } else {
    static_assert(std::is_same_v<S, bfloat16> || std::is_same_v<S, half>, "load_f32x16: float, bfloat16 or half");
    return cast16::cvt16_ps(_mm256_maskz_loadu_epi16(m, src), std::is_same_v<S, half>);
  }
}

/// Transposing packs into fp32 panels, 16 values of k at a time through Vec<float>::transpose: `lines` runs of src
/// (run i at src + i * ld, contiguous along k; missing runs read as zeros; float, or bfloat16 / half widened as they
/// are read) become kc groups of `width` values at dst (group p at dst + p * ld_dst + off). A row-major A's
/// micro-panel is 12 runs packed 12 wide; a column-major B's is 32 runs packed as two halves of 16.
template <class S>
inline void pack_transposed_f32(int lines, std::int64_t kc, const S* src, std::int64_t ld, float* dst,
                                std::int64_t ld_dst, __mmask16 keep) {
  __m512 r[16];
  for (std::int64_t p = 0; p < kc; p += 16) {
    const int n = int(std::min<std::int64_t>(16, kc - p));
    for (int i = 0; i < 16; ++i) r[i] = i < lines ? load_f32x16(src + i * ld + p, n) : _mm512_setzero_ps();
    Vec<float>::transpose(r);
    for (int j = 0; j < n; ++j) _mm512_mask_storeu_ps(dst + (p + j) * ld_dst, keep, r[j]);
  }
}

/// Whether pack_transposed_f32 reads S (and the kernel computes S in fp32).
template <class S>
inline constexpr bool kTransposedPack =
    std::is_same_v<S, float> || std::is_same_v<S, bfloat16> || std::is_same_v<S, half>;
#endif

/// Packs rows [0, mc) x cols [0, kc) of A (element (i, p) at a[i * rs + p * cs]) into MR-row micro-panels of the
/// compute type, zero-padding the last one: panel q holds kc groups of MR values.
template <class S>
void pack_a(std::int64_t mc, std::int64_t kc, const S* a, std::int64_t rs, std::int64_t cs, compute_t<S>* dst) {
  using T = compute_t<S>;
  for (std::int64_t i0 = 0; i0 < mc; i0 += kMR, dst += kMR * kc) {
    const int rows = int(std::min<std::int64_t>(kMR, mc - i0));
    const S* ap = a + i0 * rs;
#if EMBER_GEMM_AVX512
    if constexpr (kTransposedPack<S>) {
      if (cs == 1) {  // rows contiguous along k: transposed 16 x 16 in registers, zero rows below the last
        pack_transposed_f32(rows, kc, ap, rs, dst, kMR, __mmask16((1u << kMR) - 1u));
        continue;
      }
    }
#endif
    if (cs == 1) {  // rows are contiguous along k: read each row, write with stride MR
      for (int r = 0; r < rows; ++r) {
        if constexpr (std::is_same_v<S, T>) {
          for (std::int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = ap[r * rs + p];
        } else {  // convert the row with vector instructions first (kc is at most one panel)
          alignas(64) T row[Blocking<T>::kc];
          to_compute_run(ap + r * rs, row, kc);
          for (std::int64_t p = 0; p < kc; ++p) dst[p * kMR + r] = row[p];
        }
      }
    } else if (rs == 1) {  // columns contiguous: one contiguous run of MR (the last panel: rows) per k
      for (std::int64_t p = 0; p < kc; ++p) to_compute_run(ap + p * cs, dst + p * kMR, rows);
    } else {
      for (std::int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < rows; ++r) dst[p * kMR + r] = T(ap[r * rs + p * cs]);
    }
    if (rows < kMR)
      for (std::int64_t p = 0; p < kc; ++p)
        for (int r = rows; r < kMR; ++r) dst[p * kMR + r] = T(0);
  }
}

/// Packs rows [0, kc) x cols [0, nc) of B (element (p, j) at b[p * rs + j * cs]) into NR-column micro-panels of
/// the compute type, zero-padding the last one: panel q holds kc groups of NR values.
template <class S>
void pack_b(std::int64_t kc, std::int64_t nc, const S* b, std::int64_t rs, std::int64_t cs, compute_t<S>* dst) {
  using T = compute_t<S>;
  constexpr int NR = kNR<T>;
  for (std::int64_t j0 = 0; j0 < nc; j0 += NR, dst += NR * kc) {
    const int cols = int(std::min<std::int64_t>(NR, nc - j0));
    const S* bp = b + j0 * cs;
#if EMBER_GEMM_AVX512
    if constexpr (kTransposedPack<S>) {
      if (rs == 1 && cs != 1) {  // columns contiguous along k: two 16-column halves transposed in registers
        pack_transposed_f32(std::min(cols, 16), kc, bp, cs, dst, NR, 0xffff);
        pack_transposed_f32(std::max(cols - 16, 0), kc, bp + 16 * cs, cs, dst + 16, NR, 0xffff);
        continue;
      }
    }
#endif
    if (cs == 1) {  // row-major: NR (the last panel: cols) contiguous values per k
      for (std::int64_t p = 0; p < kc; ++p) to_compute_run(bp + p * rs, dst + p * NR, cols);
    } else if (rs == 1) {  // column-major (a transposed view): read each column along k
      for (int j = 0; j < cols; ++j) {
        if constexpr (std::is_same_v<S, T>) {
          for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + j] = bp[j * cs + p];
        } else {
          alignas(64) T col[Blocking<T>::kc];
          to_compute_run(bp + j * cs, col, kc);
          for (std::int64_t p = 0; p < kc; ++p) dst[p * NR + j] = col[p];
        }
      }
    } else {
      for (std::int64_t p = 0; p < kc; ++p)
        for (int j = 0; j < cols; ++j) dst[p * NR + j] = T(bp[p * rs + j * cs]);
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
inline Scratch& scratch_c() {
  thread_local Scratch s;
  return s;
}

/// Rows of A rounded up to whole micro-panels: the row count of a packed A.
inline std::int64_t packed_rows(std::int64_t m) { return (m + kMR - 1) / kMR * kMR; }
/// Columns of B rounded up to whole micro-panels: the column count of a packed B.
template <class T>
std::int64_t packed_cols(std::int64_t n) {
  return (n + kNR<T> - 1) / kNR<T> * kNR<T>;
}

/// Packs all of A (m, k) once, in the order gemm_panels reads it: for each k panel pc (Blocking::kc wide), the
/// micro-panels of every row, so row r (a multiple of kMR) of panel pc starts at pc * packed_rows(m) + r * kc.
/// dst holds packed_rows(m) * k values of the compute type.
template <class S>
void pack_a_all(std::int64_t m, std::int64_t k, const S* a, std::int64_t ars, std::int64_t acs, compute_t<S>* dst) {
  using Blk = Blocking<compute_t<S>>;
  const std::int64_t mp = packed_rows(m);
  for (std::int64_t pc = 0; pc < k; pc += Blk::kc) {
    const std::int64_t kc = std::min(Blk::kc, k - pc);
    pack_a(m, kc, a + pc * acs, ars, acs, dst + pc * mp);
  }
}

/// Packs columns [j0, j1) of B (k, n; j1 = -1: to n) into the layout of all of B packed once: for each k panel pc,
/// the micro-panels of every column, so column j (a multiple of NR) of panel pc starts at pc * packed_cols(n) +
/// j * kc. dst holds packed_cols(n) * k values; j0 is a multiple of NR (threads pack disjoint column ranges).
template <class S>
void pack_b_all(std::int64_t k, std::int64_t n, const S* b, std::int64_t brs, std::int64_t bcs, compute_t<S>* dst,
                std::int64_t j0 = 0, std::int64_t j1 = -1) {
  using T = compute_t<S>;
  using Blk = Blocking<T>;
  const std::int64_t np = packed_cols<T>(n), e = j1 < 0 ? n : j1;
  for (std::int64_t pc = 0; pc < k; pc += Blk::kc) {
    const std::int64_t kc = std::min(Blk::kc, k - pc);
    pack_b(kc, e - j0, b + pc * brs + j0 * bcs, brs, bcs, dst + pc * np + j0 * kc);
  }
}

/// Operands packed beforehand (either may be absent): a by pack_a_all (a_rows = packed_rows of the whole A, of
/// which a GEMM's rows start at a_row0, a multiple of kMR), b by pack_b_all (b_cols = packed_cols of the whole B,
/// a GEMM's columns from b_col0, a multiple of NR). A GEMM then reads them in place and packs only the other.
template <class T>
struct Prepacked {
  const T* a = nullptr;
  std::int64_t a_rows = 0, a_row0 = 0;
  const T* b = nullptr;
  std::int64_t b_cols = 0, b_col0 = 0;
};

/// C (m, n; row-major, leading dim ldc) = [C +] A (m, k) @ B (k, n) on the calling thread, for k within one
/// panel or C of the compute type. See gemm_packed.
template <class S, class TC>
void gemm_panels(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t ars, std::int64_t acs,
                 const S* b, std::int64_t brs, std::int64_t bcs, TC* c, std::int64_t ldc, bool accumulate,
                 const Prepacked<compute_t<S>>& pre) {
  using T = compute_t<S>;
  using Blk = Blocking<T>;
  constexpr int NR = kNR<T>;
  constexpr bool direct = std::is_same_v<TC, T>;  // the kernel stores straight into C
  const std::int64_t kc_max = std::min(Blk::kc, k);
  const std::int64_t nc_max = std::min(Blk::nc, (n + NR - 1) / NR * NR);
  const std::int64_t mc_max = std::min(Blk::mc, (m + kMR - 1) / kMR * kMR);
  T* bpack = pre.b ? nullptr : scratch_b().get<T>(std::size_t(kc_max * nc_max));
  T* apack = pre.a ? nullptr : scratch_a().get<T>(std::size_t(kc_max * mc_max));
  alignas(64) T edge[kMR * NR];
  for (std::int64_t jc = 0; jc < n; jc += Blk::nc) {
    const std::int64_t nc = std::min(Blk::nc, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += Blk::kc) {
      const std::int64_t kc = std::min(Blk::kc, k - pc);
      const bool add = accumulate || pc > 0;
      // An operand packed beforehand (pre) is read in place; otherwise this block of it is packed now.
      const T* bblk = pre.b ? pre.b + pc * pre.b_cols + (pre.b_col0 + jc) * kc : bpack;
      if (!pre.b) pack_b(kc, nc, b + pc * brs + jc * bcs, brs, bcs, bpack);
      for (std::int64_t ic = 0; ic < m; ic += Blk::mc) {
        const std::int64_t mc = std::min(Blk::mc, m - ic);
        const T* ablk = pre.a ? pre.a + pc * pre.a_rows + (pre.a_row0 + ic) * kc : apack;
        if (!pre.a) pack_a(mc, kc, a + ic * ars + pc * acs, ars, acs, apack);
        for (std::int64_t jr = 0; jr < nc; jr += NR) {
          const int cols = int(std::min<std::int64_t>(NR, nc - jr));
          const T* bp = bblk + jr * kc;
          for (std::int64_t ir = 0; ir < mc; ir += kMR) {
            const int rows = int(std::min<std::int64_t>(kMR, mc - ir));
            const T* ap = ablk + ir * kc;
            TC* cp = c + (ic + ir) * ldc + jc + jr;
            if (direct && rows == kMR && cols == NR) {
              micro_kernel<T>(kc, ap, bp, reinterpret_cast<T*>(cp), ldc, add);
            } else {  // edge tile or a narrower output: compute the tile aside, then add/store the valid part
              micro_kernel<T>(kc, ap, bp, edge, NR, false);
              for (int r = 0; r < rows; ++r) store_run(cp + r * ldc, edge + r * NR, cols, add);
            }
          }
        }
      }
    }
  }
}

/// C (m, n) = [C +] a product computed in blocks of at most nb columns by panels(j0, w, acc), which writes (or, when
/// accumulating, adds to) columns [j0, j0 + w) into acc (m x w, leading dim w, of the compute type T): C's values
/// are read into acc first when accumulating, and each block is rounded once into C. A 16-bit output over several k
/// panels is the fp32 sum rounded once so (gemm_packed, and the bfloat16 dot-product and AMX kernels).
template <class T, class TC, class Panels>
void rounded_once(std::int64_t m, std::int64_t n, std::int64_t nb, TC* c, std::int64_t ldc, bool accumulate,
                  const Panels& panels) {
  T* acc = scratch_c().get<T>(std::size_t(m * nb));
  for (std::int64_t j0 = 0; j0 < n; j0 += nb) {
    const std::int64_t w = std::min(nb, n - j0);
    if (accumulate)
      for (std::int64_t i = 0; i < m; ++i) to_compute_run(c + i * ldc + j0, acc + i * w, w);
    panels(j0, w, acc);
    for (std::int64_t i = 0; i < m; ++i) store_run(c + i * ldc + j0, acc + i * w, w, false);
  }
}

/// C (m, n; row-major, leading dim ldc) = [C +] A (m, k) @ B (k, n) on the calling thread. A's element (i, p)
/// is a[i * ars + p * acs], B's (p, j) is b[p * brs + j * bcs]: any strides, read in place while packing. S is
/// float, double, half or bfloat16 (computed in compute_t<S>); C is S or compute_t<S>.
/// pre: operands packed beforehand (Prepacked); a packed operand's pointer and strides are then unused.
template <class S, class TC = S>
void gemm_packed(std::int64_t m, std::int64_t n, std::int64_t k, const S* a, std::int64_t ars, std::int64_t acs,
                 const S* b, std::int64_t brs, std::int64_t bcs, TC* c, std::int64_t ldc, bool accumulate,
                 const Prepacked<compute_t<S>>& pre = {}) {
  using T = compute_t<S>;
  if (std::is_same_v<TC, T> || k <= Blocking<T>::kc) {
    gemm_panels<S, TC>(m, n, k, a, ars, acs, b, brs, bcs, c, ldc, accumulate, pre);
    return;
  }
  // A 16-bit C and several k panels: accumulate each block of nc columns in fp32, round it once.
  const auto panels = [&](std::int64_t j0, std::int64_t w, T* acc) {
    Prepacked<T> p = pre;
    p.b_col0 += j0;  // (j0 is a multiple of nc, so of NR)
    gemm_panels<S, T>(m, w, k, a, ars, acs, b + j0 * bcs, brs, bcs, acc, w, accumulate, p);
  };
  rounded_once<T>(m, n, std::min(Blocking<T>::nc, n), c, ldc, accumulate, panels);
}

}  // namespace ember::cpu::detail::gemm

#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

#endif  // EMBER_GEMM_PACKED
