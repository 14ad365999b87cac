// ember — bfloat16 GEMM on Intel AMX (AMX-BF16 tiles, `tdpbf16ps`): C = [C +] A @ B with bfloat16 operands, fp32
// accumulation and one rounding into the output (bfloat16 or float), as the AVX-512 kernel computes it, at many
// times its rate of multiply-adds (one tile instruction is 16 x 16 x 32 of them).
//
// On by default, as PyTorch's bfloat16 matmuls and convolutions take AMX through oneDNN; cpu::set_amx(false) or
// EMBER_AMX=0 in the environment turns it off, and so does EMBER_CPU_ISA below amx. Used only where the CPU has
// AMX-BF16 and Linux grants the tile state to the process (arch_prctl(ARCH_REQ_XCOMP_PERM), asked once); anywhere
// else the AVX-512 kernel runs. Its results differ from that kernel's within the GEMM's rounding bound: the fp32 sums run in
// another order (the instruction adds each pair of products first), and bfloat16 subnormal inputs and fp32
// subnormal partial sums are flushed to zero (the instruction's DAZ/FTZ). cpu::PackedA and cpu::PackedB (a
// convolution's weights, a linear layer's pre-packed weight) multiply through cpu::gemm, and so on the tiles, while
// the AVX512-BF16 kernel is on (the default, cpu/detail/gemm_bf16.hpp); with it off they keep the fp32 kernel.
//
// Layout: B's block of kNC columns is packed whole along k into 16-column strips of bfloat16 pairs (the tile
// instruction's "VNNI" form: row q of a strip holds (b[2q][j], b[2q+1][j]) for its 16 columns j, 64 bytes); A's
// block of kMC rows into 16-row strips with k contiguous (a tile row is 32 values of k). Each 32 x 32 group of
// outputs keeps four fp32 tiles in tile registers through all of the panel's k (kKC at most), then goes to C through
// a 32 x 32 fp32 buffer, rounded (and added) as the AVX-512 kernel stores. k is zero-padded to whole pairs and
// tiles, m and n to whole tiles.
#pragma once

#include "ember/cpu/detail/gemm_bf16.hpp"  // (B packed in pairs, as the dot-product kernel reads it)

#if EMBER_GEMM_PACKED && EMBER_GEMM_AVX512 && defined(__x86_64__) && defined(__linux__) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define EMBER_GEMM_AMX 1
#else
#define EMBER_GEMM_AMX 0
#endif

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if EMBER_GEMM_AMX
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace ember::cpu {
namespace detail::gemm::amx {

/// The switch: on by default; EMBER_AMX=0 in the environment turns it off at the first ask.
inline KernelSwitch& kernel_switch() {
  static KernelSwitch s{"EMBER_AMX", true};
  return s;
}

#if EMBER_GEMM_AMX
#define EMBER_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

/// Whether this process may run AMX-BF16 tiles: the CPU says so (cpuid), the tier (capped by EMBER_CPU_ISA) is amx,
/// and Linux grants the tile data state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, 18); asked once per process.
inline bool available() {
  static const bool ok = [] {
    if (machine_isa() != Isa::amx) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;  // CPUID.(7, 0):EDX
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

inline constexpr std::int64_t kKC = 2048;  // k per panel: a 16-row strip of A is 64 KiB, a B strip 128 KiB
inline constexpr std::int64_t kMC = 256;   // rows of A per packed block (1 MiB at kKC)
inline constexpr std::int64_t kNC = 512;   // columns of B per packed block (2 MiB at kKC, packed once per panel)

using bf16::round_up;

/// The tile configuration: palette 1, tiles 0-7 each 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// GCC's tile macros are asm statements without a memory operand: this orders them against ordinary loads and
// stores of the packed buffers and of the output buffer.
inline void compiler_barrier() { __asm__ __volatile__("" ::: "memory"); }
// ldtilecfg with the whole 64-byte configuration as its operand (GCC's _tile_loadconfig names only 8 bytes of it).
EMBER_AMX_TARGET inline void load_tile_config(const TileConfig& c) { __asm__ __volatile__("ldtilecfg %0" ::"m"(c)); }

/// Rows [0, mc) x k [0, kc) of A (element (i, p) at a[i * rs + p * cs]) as 16-row strips of kp (kc rounded up to
/// whole tiles) values each, zero-padded along k and below the last row: strip s, row r at dst + (16 s + r) * kp.
EMBER_AMX_TARGET inline void pack_a(std::int64_t mc, std::int64_t kc, const std::uint16_t* a, std::int64_t rs,
                                    std::int64_t cs, std::int64_t kp, std::uint16_t* dst) {
  const std::int64_t mp = round_up(mc, 32);
  for (std::int64_t i = 0; i < mp; ++i) {
    std::uint16_t* d = dst + i * kp;
    if (i >= mc) {
      std::memset(d, 0, std::size_t(kp) * 2);
      continue;
    }
    const std::uint16_t* s = a + i * rs;
    if (cs == 1) {
      std::memcpy(d, s, std::size_t(kc) * 2);
    } else {
      for (std::int64_t p = 0; p < kc; ++p) d[p] = s[p * cs];
    }
    std::memset(d + kc, 0, std::size_t(kp - kc) * 2);
  }
}

/// out (32 x 32 fp32, rows of 32) = A strips (two of 16 rows, row stride kp values) @ B strips (two of 16
/// columns, 16 * kp values apart), over kp values of k.
EMBER_AMX_TARGET inline void tiles_32x32(std::int64_t kp, const std::uint16_t* a, const std::uint16_t* b, float* out) {
  const long as = long(kp) * 2;  // bytes between rows of an A strip
  const std::uint16_t* a1 = a + 16 * kp;
  const std::uint16_t* b1 = b + 16 * kp;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::int64_t p = 0; p < kp; p += 32) {
    _tile_loadd(4, a + p, as);
    _tile_loadd(5, a1 + p, as);
    _tile_loadd(6, b + p * 16, 64);  // 16 pairs of rows: 1 KiB
    _tile_loadd(7, b1 + p * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  _tile_stored(2, out + 16 * 32, 128);
  _tile_stored(3, out + 16 * 32 + 16, 128);
  compiler_barrier();
}

/// C (m, n; leading dim ldc) = [C +] A @ B for k within one panel (kKC); TC bfloat16 or float.
template <class TC>
EMBER_AMX_TARGET void gemm_panel(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a,
                                 std::int64_t ars, std::int64_t acs, const std::uint16_t* b, std::int64_t brs,
                                 std::int64_t bcs, TC* c, std::int64_t ldc, bool add) {
  const std::int64_t kp = round_up(k, 32);
  const std::int64_t nc_max = round_up(std::min(kNC, n), 32), mc_max = round_up(std::min(kMC, m), 32);
  auto* bpack = scratch_b().get<std::uint16_t>(std::size_t(kp * nc_max));
  auto* apack = scratch_a().get<std::uint16_t>(std::size_t(kp * mc_max));
  alignas(64) float out[32 * 32];
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  load_tile_config(cfg);
  for (std::int64_t jc = 0; jc < n; jc += kNC) {
    const std::int64_t nc = std::min(kNC, n - jc);
    bf16::pack_b_pairs(k, nc, b + jc * bcs, brs, bcs, kp, bpack);
    for (std::int64_t ic = 0; ic < m; ic += kMC) {
      const std::int64_t mc = std::min(kMC, m - ic);
      pack_a(mc, k, a + ic * ars, ars, acs, kp, apack);
      compiler_barrier();
      for (std::int64_t jr = 0; jr < nc; jr += 32) {
        const int cols = int(std::min<std::int64_t>(32, nc - jr));
        for (std::int64_t ir = 0; ir < mc; ir += 32) {
          const int rows = int(std::min<std::int64_t>(32, mc - ir));
          tiles_32x32(kp, apack + ir * kp, bpack + jr * kp, out);
          TC* cp = c + (ic + ir) * ldc + jc + jr;
          for (int r = 0; r < rows; ++r) store_run(cp + r * ldc, out + r * 32, cols, add);
        }
      }
    }
  }
  _tile_release();
}

/// C (m, n) = [C +] A @ B, any k: one panel, or fp32 accumulation over panels of kKC (in C itself for a float C,
/// else in a scratch block rounded once at the end: rounded_once).
template <class TC>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const bfloat16* a, std::int64_t ars, std::int64_t acs,
          const bfloat16* b, std::int64_t brs, std::int64_t bcs, TC* c, std::int64_t ldc, bool accumulate) {
  const auto* a16 = reinterpret_cast<const std::uint16_t*>(a);
  const auto* b16 = reinterpret_cast<const std::uint16_t*>(b);
  if (k <= kKC) {
    gemm_panel<TC>(m, n, k, a16, ars, acs, b16, brs, bcs, c, ldc, accumulate);
    return;
  }
  if constexpr (std::is_same_v<TC, float>) {
    for (std::int64_t pc = 0; pc < k; pc += kKC)
      gemm_panel<float>(m, n, std::min(kKC, k - pc), a16 + pc * acs, ars, acs, b16 + pc * brs, brs, bcs, c, ldc,
                        accumulate || pc > 0);
  } else {
    const auto panels = [&](std::int64_t j0, std::int64_t w, float* acc) {
      for (std::int64_t pc = 0; pc < k; pc += kKC)
        gemm_panel<float>(m, w, std::min(kKC, k - pc), a16 + pc * acs, ars, acs, b16 + pc * brs + j0 * bcs, brs,
                          bcs, acc, w, accumulate || pc > 0);
    };
    rounded_once<float>(m, n, std::min(kNC, n), c, ldc, accumulate, panels);
  }
}
#else
inline bool available() { return false; }
#endif

/// Whether bfloat16 GEMMs take the AMX kernel now: switched on and available.
inline bool active() { return kernel_switch().on() && available(); }

}  // namespace detail::gemm::amx

/// bfloat16 GEMMs (matmul, linear, the im2col convolution's GEMMs) on Intel AMX tiles when `on` and the CPU and
/// OS allow them (cpu::amx_available()); on by default, or as the environment's EMBER_AMX=0/1 says. See
/// cpu/detail/gemm_amx.hpp for how its results differ from the AVX-512 kernel's (within the rounding bound).
inline void set_amx(bool on) { detail::gemm::amx::kernel_switch().set(on); }
/// Whether this CPU and OS run AMX-BF16 tiles (cpuid, and Linux's permission for the tile state).
inline bool amx_available() { return detail::gemm::amx::available(); }
/// Whether bfloat16 GEMMs run on AMX now (switched on, the default, and amx_available()).
inline bool amx_active() { return detail::gemm::amx::active(); }

}  // namespace ember::cpu
