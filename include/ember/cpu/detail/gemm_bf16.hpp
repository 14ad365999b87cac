// ember — bfloat16 GEMM on AVX512-BF16 dot products (`vdpbf16ps`): C = [C +] A @ B with bfloat16 operands, fp32
// accumulation and one rounding into the output (bfloat16 or float), at twice the fp32 kernel's multiply-adds per
// instruction: one instruction adds, in each of 16 fp32 lanes, the two products of a pair of values along k.
//
// Chosen at run time from CPUID wherever the CPU has AVX512_BF16 and the OS enables the AVX-512 state, so any
// AVX-512 build can use it; on by default where it pays (cpu::bf16_dot_pays: AMD's Zen 4 and later, where one
// instruction does twice an fp32 FMA's work at the same rate), off on Intel's cores, which run it no faster than
// their fp32 FMAs (half their rate on the Sapphire and Emerald Rapids-class Xeons measured), so that the fp32
// kernel on operands converted while packed is as fast or faster. cpu::set_bf16_dot(true/false), or
// EMBER_BF16_DOT=1/0 in the environment, overrides the default, and EMBER_CPU_ISA=avx2 or below turns it off. AMX,
// where the CPU has it and it is switched on (the default, cpu::set_amx), comes first. Results differ from the fp32
// kernel's within the GEMM's rounding bound: each instruction adds the pair's two products in turn (odd index first),
// and bfloat16 subnormal inputs and fp32 subnormal sums are flushed to zero (the instruction's DAZ/FTZ, whatever
// MXCSR says).
// cpu::PackedA and cpu::PackedB of bfloat16 then keep the view and multiply through this kernel as cpu::gemm does,
// so their results stay gemm's bit for bit.
//
// Layout: B's block is packed along k into 16-column strips of pairs (row q of a strip holds (b[2q][j],
// b[2q+1][j]) for its 16 columns: one 64-byte vector), as AMX's tiles read it too (pack_b_pairs, shared with
// cpu/detail/gemm_amx.hpp); A's block into micro-panels of kMR rows holding, per pair q, the kMR pairs (a[i][2q],
// a[i][2q+1]) as 32-bit words, each broadcast to a whole vector. The kernel keeps kMR x 32 outputs (24 of the 32
// vector registers) through all of a panel's k. k is zero-padded to whole pairs, m and n to whole micro-tiles.
#pragma once

#include "ember/cpu/detail/gemm_kernel.hpp"
#include "ember/cpu/isa.hpp"

#if EMBER_GEMM_PACKED && EMBER_GEMM_AVX512 && EMBER_CPU_X86 && !defined(__CUDACC__)
#define EMBER_GEMM_BF16_PAIRS 1
#else
#define EMBER_GEMM_BF16_PAIRS 0
#endif

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if EMBER_GEMM_BF16_PAIRS
#include <immintrin.h>
#endif

namespace ember::cpu {
namespace detail::gemm {
/// A run-time kernel's switch (the AVX512-BF16 and AMX GEMMs): unset until first asked, then the environment
/// variable's value ("1" on, "0" off; anything else, or unset, the default); set() decides from then on.
struct KernelSwitch {
  const char* env;
  bool by_default;
  std::atomic<int> state{-1};  // -1: not asked yet; 0: off; 1: on
  void set(bool on) { state.store(on ? 1 : 0); }
  bool on() {
    int f = state.load(std::memory_order_relaxed);
    if (f < 0) {
      const char* e = std::getenv(env);
      f = e && (e[0] == '0' || e[0] == '1') && e[1] == '\0' ? e[0] == '1' : by_default;
      int expected = -1;
      if (!state.compare_exchange_strong(expected, f)) f = expected;
    }
    return f == 1;
  }
};
}  // namespace detail::gemm

namespace detail::gemm::bf16 {

/// The switch: on by default where the dot products pay (cpu::bf16_dot_pays); EMBER_BF16_DOT=0/1 in the
/// environment decides instead at the first ask.
inline KernelSwitch& kernel_switch() {
  static KernelSwitch s{"EMBER_BF16_DOT", bf16_dot_pays(read_cpuid())};
  return s;
}

#if EMBER_GEMM_BF16_PAIRS
#define EMBER_BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/// Whether this process runs vdpbf16ps: the CPU has it, and the tier (capped by EMBER_CPU_ISA) is avx512 or above.
inline bool available() {
  static const bool ok = has_avx512_bf16(read_cpuid()) && int(machine_isa()) >= int(Isa::avx512);
  return ok;
}

inline std::int64_t round_up(std::int64_t x, std::int64_t q) { return (x + q - 1) / q * q; }

/// Columns [0, nc) x k [0, kc) of B (element (p, j) at b[p * rs + j * cs]) as 16-column strips of kp / 2 rows of
/// pairs: strip t, pair q, column j at dst + t * 16 * kp + (q * 16 + j) * 2 holds (b[2q][16 t + j], b[2q+1][...]),
/// zeros past kc and past nc (to whole 32-column groups). kp is even and at least kc.
inline void pack_b_pairs(std::int64_t kc, std::int64_t nc, const std::uint16_t* b, std::int64_t rs, std::int64_t cs,
                         std::int64_t kp, std::uint16_t* dst) {
  const std::int64_t np = round_up(nc, 32), pairs = kp / 2;
  // Interleaves the first 16 values of two registers: (x0, y0, x1, y1, ...) (y's lanes are 32 and up).
  const __m512i inter = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                         6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (std::int64_t t = 0; t < np / 16; ++t) {
    std::uint16_t* strip = dst + t * 16 * kp;
    const std::int64_t j0 = t * 16, cols = std::max<std::int64_t>(0, std::min<std::int64_t>(16, nc - j0));
    if (cols == 0) {
      std::memset(strip, 0, std::size_t(16 * kp) * 2);
      continue;
    }
    const std::uint16_t* bs = b + j0 * cs;
    if (cs == 1) {  // rows of B contiguous: two rows of 16 values interleaved per pair
      // (16 values into a 512-bit register by a masked load: GCC 12 reports the 256-to-512-bit casts and
      // extensions as maybe-uninitialized)
      const __mmask32 lm = __mmask32((1u << cols) - 1u);
      for (std::int64_t q = 0; q < pairs; ++q) {
        const std::int64_t p0 = 2 * q, p1 = 2 * q + 1;
        const __m512i x = p0 < kc ? _mm512_maskz_loadu_epi16(lm, bs + p0 * rs) : _mm512_setzero_si512();
        const __m512i y = p1 < kc ? _mm512_maskz_loadu_epi16(lm, bs + p1 * rs) : _mm512_setzero_si512();
        _mm512_storeu_si512(strip + q * 32, _mm512_permutex2var_epi16(x, inter, y));
      }
    } else if (rs == 1 && kc % 2 == 0) {  // columns contiguous along k: each pair is one 32-bit value
      // 16 columns x 16 pairs at a time, transposed as 32-bit values (bit patterns only: shuffles, no arithmetic).
      for (std::int64_t q0 = 0; q0 < pairs; q0 += 16) {
        const std::int64_t left = std::max<std::int64_t>(0, std::min<std::int64_t>(16, kc / 2 - q0));
        const __mmask16 lm = __mmask16(left >= 16 ? 0xffffu : (1u << left) - 1u);
        __m512 r[16];
        for (int j = 0; j < 16; ++j)
          r[j] = j < cols ? _mm512_maskz_loadu_ps(lm, reinterpret_cast<const float*>(bs + j * cs + 2 * q0))
                          : _mm512_setzero_ps();
        simd::avx512::F32::transpose(r);
        for (int q = 0; q < 16 && q0 + q < pairs; ++q)
          _mm512_storeu_ps(reinterpret_cast<float*>(strip + (q0 + q) * 32), r[q]);
      }
    } else {
      for (std::int64_t q = 0; q < pairs; ++q)
        for (int j = 0; j < 16; ++j) {
          const std::int64_t p0 = 2 * q, p1 = 2 * q + 1;
          strip[q * 32 + 2 * j] = j < cols && p0 < kc ? bs[p0 * rs + j * cs] : std::uint16_t(0);
          strip[q * 32 + 2 * j + 1] = j < cols && p1 < kc ? bs[p1 * rs + j * cs] : std::uint16_t(0);
        }
    }
  }
}

inline constexpr std::int64_t kKC = 512;  // k per panel: a 32-column micro-panel of B is 32 KiB, as the fp32 kernel's
inline constexpr std::int64_t kMC = kMR * (96 / kMR);  // rows of A per packed block (96 KiB at kKC)
inline constexpr std::int64_t kNC = 4096;              // columns of B per packed block (4 MiB at kKC)

/// Rows [0, mc) x k [0, kc) of A (element (i, p) at a[i * rs + p * cs]) as micro-panels of kMR rows: panel s, pair
/// q, row r at dst + (s * pairs + q) * kMR + r holds (a[i][2q], a[i][2q+1]) of row i = s kMR + r as one 32-bit word
/// (low half first), zeros past kc and below the last row.
inline void pack_a_pairs(std::int64_t mc, std::int64_t kc, const std::uint16_t* a, std::int64_t rs, std::int64_t cs,
                         std::int64_t pairs, std::uint32_t* dst) {
  for (std::int64_t i0 = 0; i0 < mc; i0 += kMR, dst += pairs * kMR) {
    const int rows = int(std::min<std::int64_t>(kMR, mc - i0));
    const std::uint16_t* ap = a + i0 * rs;
    if (cs == 1 && rs % 2 == 0 && kc % 2 == 0) {
      // Rows contiguous along k, whole pairs: the pairs are 32-bit words, transposed 16 x 16 in registers.
      gemm::pack_transposed_f32(rows, pairs, reinterpret_cast<const float*>(ap), rs / 2,
                                reinterpret_cast<float*>(dst), kMR, __mmask16((1u << kMR) - 1u));
      continue;
    }
    for (std::int64_t q = 0; q < pairs; ++q) {
      const std::int64_t p0 = 2 * q, p1 = 2 * q + 1;
      for (int r = 0; r < kMR; ++r) {
        const std::uint32_t lo = r < rows && p0 < kc ? ap[r * rs + p0 * cs] : 0u;
        const std::uint32_t hi = r < rows && p1 < kc ? ap[r * rs + p1 * cs] : 0u;
        dst[q * kMR + r] = lo | (hi << 16);
      }
    }
  }
}

/// c (kMR, 32; leading dim ldc) = [c +] A's micro-panel (pairs x kMR words) @ B's two strips b0, b1 (pairs x 16
/// pairs each), in fp32.
[[gnu::hot]] EMBER_BF16_TARGET inline void micro_kernel(std::int64_t pairs, const std::uint32_t* EMBER_RESTRICT a,
                                                        const std::uint16_t* EMBER_RESTRICT b0,
                                                        const std::uint16_t* EMBER_RESTRICT b1, float* c,
                                                        std::int64_t ldc, bool add) {
  __m512 acc[kMR][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (std::int64_t q = 0; q < pairs; ++q) {
    const __m512bh x0 = (__m512bh)_mm512_loadu_si512(b0 + q * 32);
    const __m512bh x1 = (__m512bh)_mm512_loadu_si512(b1 + q * 32);
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, x0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, x1);
    }
    a += kMR;
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      float* d = c + r * ldc + v * 16;
      _mm512_storeu_ps(d, add ? _mm512_add_ps(_mm512_loadu_ps(d), acc[r][v]) : acc[r][v]);
    }
}

/// C (m, n; leading dim ldc) = [C +] A @ B on the calling thread, for k within one panel (kKC) or a float C.
template <class TC>
EMBER_BF16_TARGET void gemm_panels(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a,
                                   std::int64_t ars, std::int64_t acs, const std::uint16_t* b, std::int64_t brs,
                                   std::int64_t bcs, TC* c, std::int64_t ldc, bool accumulate) {
  constexpr bool direct = std::is_same_v<TC, float>;  // the kernel stores straight into C
  const std::int64_t kp_max = round_up(std::min(kKC, k), 2);
  const std::int64_t nc_max = round_up(std::min(kNC, n), 32), mc_max = round_up(std::min(kMC, m), kMR);
  auto* bpack = scratch_b().get<std::uint16_t>(std::size_t(kp_max * nc_max));
  auto* apack = scratch_a().get<std::uint32_t>(std::size_t(kp_max / 2 * mc_max));
  alignas(64) float edge[kMR * 32];
  for (std::int64_t jc = 0; jc < n; jc += kNC) {
    const std::int64_t nc = std::min(kNC, n - jc);
    for (std::int64_t pc = 0; pc < k; pc += kKC) {
      const std::int64_t kc = std::min(kKC, k - pc), kp = round_up(kc, 2), pairs = kp / 2;
      const bool add = accumulate || pc > 0;
      pack_b_pairs(kc, nc, b + pc * brs + jc * bcs, brs, bcs, kp, bpack);
      for (std::int64_t ic = 0; ic < m; ic += kMC) {
        const std::int64_t mc = std::min(kMC, m - ic);
        pack_a_pairs(mc, kc, a + ic * ars + pc * acs, ars, acs, pairs, apack);
        for (std::int64_t jr = 0; jr < nc; jr += 32) {
          const int cols = int(std::min<std::int64_t>(32, nc - jr));
          const std::uint16_t* b0 = bpack + jr * kp;
          for (std::int64_t ir = 0; ir < mc; ir += kMR) {
            const int rows = int(std::min<std::int64_t>(kMR, mc - ir));
            const std::uint32_t* ap = apack + ir * pairs;
            TC* cp = c + (ic + ir) * ldc + jc + jr;
            if (direct && rows == kMR && cols == 32) {
              micro_kernel(pairs, ap, b0, b0 + 16 * kp, reinterpret_cast<float*>(cp), ldc, add);
            } else {  // edge tile or a bfloat16 output: the tile aside, then the valid part added or stored
              micro_kernel(pairs, ap, b0, b0 + 16 * kp, edge, 32, false);
              for (int r = 0; r < rows; ++r) store_run(cp + r * ldc, edge + r * 32, cols, add);
            }
          }
        }
      }
    }
  }
}

/// C (m, n) = [C +] A @ B, any k: one call of the panels, or, for a bfloat16 C with k past one panel, fp32
/// accumulation in a scratch block rounded once at the end (rounded_once).
template <class TC>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, std::int64_t ars, std::int64_t acs,
          const bfloat16* b, std::int64_t brs, std::int64_t bcs, TC* c, std::int64_t ldc, bool accumulate) {
  const auto* a16 = reinterpret_cast<const std::uint16_t*>(a);
  const auto* b16 = reinterpret_cast<const std::uint16_t*>(b);
  if (std::is_same_v<TC, float> || k <= kKC) {
    gemm_panels<TC>(m, n, k, a16, ars, acs, b16, brs, bcs, c, ldc, accumulate);
    return;
  }
  const auto panels = [&](std::int64_t j0, std::int64_t w, float* acc) {
    gemm_panels<float>(m, w, k, a16, ars, acs, b16 + j0 * bcs, brs, bcs, acc, w, accumulate);
  };
  rounded_once<float>(m, n, std::min(kNC, n), c, ldc, accumulate, panels);
}
#else
inline bool available() { return false; }
#endif

/// Whether bfloat16 GEMMs take the dot-product kernel now: switched on (the default) and available.
inline bool active() { return kernel_switch().on() && available(); }

}  // namespace detail::gemm::bf16

/// bfloat16 GEMMs (matmul, linear, the im2col convolution's GEMMs) on AVX512-BF16 dot products (vdpbf16ps) when
/// `on` and the CPU has them (cpu::bf16_dot_available()); off, they run the fp32 kernel on operands converted while
/// packed. The default is on where the dot products pay (cpu::bf16_dot_pays: AMD's cores, not Intel's); the
/// environment's EMBER_BF16_DOT=1 or 0 sets it at start instead. See cpu/detail/gemm_bf16.hpp
/// for how its results differ from the fp32 kernel's (within the rounding bound).
inline void set_bf16_dot(bool on) { detail::gemm::bf16::kernel_switch().set(on); }
/// Whether this CPU runs AVX512-BF16 dot products in this build (an AVX-512 build of the packed kernel; the tier not
/// capped below avx512 by EMBER_CPU_ISA).
inline bool bf16_dot_available() { return detail::gemm::bf16::available(); }
/// Whether bfloat16 GEMMs run on AVX512-BF16 dot products now (set_bf16_dot, and bf16_dot_available()).
inline bool bf16_dot_active() { return detail::gemm::bf16::active(); }

}  // namespace ember::cpu
