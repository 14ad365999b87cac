// ember — x86 instruction-set tiers: the tier this machine runs (CPUID and the state the OS enables in XCR0), the
// tier a translation unit's kernels were compiled for (its -march), and a line that says both (cpu::describe()).
//
// Tiers, lowest first: portable (SSE2 and the compiler's vector extensions), avx2 (AVX2 + FMA + F16C), avx512
// (AVX-512 F, CD, BW, DQ, VL), amx (avx512 plus AMX-TILE, AMX-BF16 and AMX-INT8). A CPU's features count only where
// the OS saves their registers (XCR0): a hypervisor or kernel that leaves the AVX-512 state off gives avx2, whatever
// CPUID lists. EMBER_CPU_ISA=portable|avx2|avx512|amx caps the tier this process reports (for comparisons and tests).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ember/config.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#include <cpuid.h>
#define EMBER_CPU_X86 1
#else
#define EMBER_CPU_X86 0
#endif

namespace ember::cpu {

enum class Isa : int { portable = 0, avx2 = 1, avx512 = 2, amx = 3 };

/// "portable", "avx2", "avx512" or "amx".
inline const char* isa_name(Isa i) {
  switch (i) {
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::amx: return "amx";
    default: return "portable";
  }
}

/// The CPUID words and the XCR0 value the tier is read from (a value, so tests can give any CPU's).
struct CpuidWords {
  std::uint32_t leaf0_ebx = 0;    ///< CPUID.(0):EBX: the vendor string's first four letters ("Auth" on AMD).
  std::uint32_t leaf1_ecx = 0;    ///< CPUID.(1):ECX: FMA bit 12, OSXSAVE 27, AVX 28, F16C 29.
  std::uint32_t leaf7_ebx = 0;    ///< CPUID.(7,0):EBX: AVX2 5, AVX512F 16, DQ 17, CD 28, BW 30, VL 31.
  std::uint32_t leaf7_ecx = 0;    ///< CPUID.(7,0):ECX: AVX512_VNNI 11.
  std::uint32_t leaf7_edx = 0;    ///< CPUID.(7,0):EDX: AMX-BF16 22, AMX-TILE 24, AMX-INT8 25.
  std::uint32_t leaf7_1_eax = 0;  ///< CPUID.(7,1):EAX: AVX-VNNI 4, AVX512_BF16 5.
  std::uint64_t xcr0 = 0;         ///< XGETBV(0), read only when OSXSAVE is set: 0 otherwise.
};

namespace detail {
constexpr bool bit(std::uint64_t w, int b) { return (w >> b) & 1u; }
}  // namespace detail

/// The highest tier the words allow: each tier needs its instructions in CPUID and its register state enabled by
/// the OS in XCR0 (SSE and AVX state for avx2; opmask, ZMM_Hi256 and Hi16_ZMM too for avx512; the tile
/// configuration and data for amx).
constexpr Isa isa_from_cpuid(const CpuidWords& w) {
  using detail::bit;
  const bool os_avx = bit(w.leaf1_ecx, 27) && bit(w.xcr0, 1) && bit(w.xcr0, 2);
  const bool avx2 = os_avx && bit(w.leaf1_ecx, 28) && bit(w.leaf1_ecx, 12) && bit(w.leaf1_ecx, 29) &&
                    bit(w.leaf7_ebx, 5);
  if (!avx2) return Isa::portable;
  const bool os_avx512 = bit(w.xcr0, 5) && bit(w.xcr0, 6) && bit(w.xcr0, 7);
  const bool avx512 = os_avx512 && bit(w.leaf7_ebx, 16) && bit(w.leaf7_ebx, 17) && bit(w.leaf7_ebx, 28) &&
                      bit(w.leaf7_ebx, 30) && bit(w.leaf7_ebx, 31);
  if (!avx512) return Isa::avx2;
  const bool os_amx = bit(w.xcr0, 17) && bit(w.xcr0, 18);
  const bool amx = os_amx && bit(w.leaf7_edx, 22) && bit(w.leaf7_edx, 24) && bit(w.leaf7_edx, 25);
  return amx ? Isa::amx : Isa::avx512;
}

/// Whether the words list a VNNI dot product (vpdpbusd) for int8: AVX512-VNNI or AVX-VNNI, with the AVX state
/// enabled by the OS.
constexpr bool has_vnni(const CpuidWords& w) {
  using detail::bit;
  return isa_from_cpuid(w) != Isa::portable && (bit(w.leaf7_ecx, 11) || bit(w.leaf7_1_eax, 4));
}

/// Whether the words list AVX512_BF16 (vdpbf16ps, bfloat16 pairs' dot products) with the avx512 tier: the
/// instructions, and the AVX-512 register state enabled by the OS.
constexpr bool has_avx512_bf16(const CpuidWords& w) {
  return int(isa_from_cpuid(w)) >= int(Isa::avx512) && detail::bit(w.leaf7_1_eax, 5);
}

/// Whether the words name an AMD CPU (vendor "AuthenticAMD": EBX holds "Auth").
constexpr bool is_amd(const CpuidWords& w) { return w.leaf0_ebx == 0x68747541u; }

/// Whether bfloat16 GEMMs should run on the AVX512-BF16 dot products by default: where the instruction adds more
/// products per cycle than fp32 FMAs do. On AMD's cores (Zen 4, Zen 5) one vdpbf16ps does twice an FMA's work at the
/// same rate (a bf16 GEMM ran at 1.94-2.11x fp32 on Zen 5). Intel's cores run it at half the FMAs' rate or less
/// (a register-bound loop on the Emerald Rapids-class Xeon: 41 G products/s against 85 G multiply-adds/s for fp32
/// FMAs; the GEMM 0.70x the fp32 kernel on converted operands), so there the fp32 kernel stays the default (and AMX,
/// where the CPU has it, comes first anyway).
constexpr bool bf16_dot_pays(const CpuidWords& w) { return has_avx512_bf16(w) && is_amd(w); }

/// This CPU's words (all zero on a CPU that is not x86).
inline CpuidWords read_cpuid() {
  CpuidWords w;
#if EMBER_CPU_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d)) w.leaf0_ebx = b;
  if (__get_cpuid(1, &a, &b, &c, &d)) w.leaf1_ecx = c;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    w.leaf7_ebx = b, w.leaf7_ecx = c, w.leaf7_edx = d;
    if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) w.leaf7_1_eax = a;
  }
  if (detail::bit(w.leaf1_ecx, 27)) {
    std::uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    w.xcr0 = (std::uint64_t(hi) << 32) | lo;
  }
#endif
  return w;
}

/// The tier a cap names, for EMBER_CPU_ISA; an ember::Error for any other text.
inline Isa parse_isa(std::string_view s, const char* what = "EMBER_CPU_ISA") {
  for (Isa i : {Isa::portable, Isa::avx2, Isa::avx512, Isa::amx})
    if (s == isa_name(i)) return i;
  EMBER_CHECK(false, what, " is ", ember::detail::quote_untrusted(s), "; expected portable, avx2, avx512 or amx");
  return Isa::portable;
}

/// This machine's tier, capped by EMBER_CPU_ISA when it is set (read once per process).
inline Isa machine_isa() {
  static const Isa tier = [] {
    const Isa hw = isa_from_cpuid(read_cpuid());
    const char* cap = std::getenv("EMBER_CPU_ISA");
    if (!cap || !*cap) return hw;
    const Isa c = parse_isa(cap);
    return int(c) < int(hw) ? c : hw;
  }();
  return tier;
}

/// The tier this translation unit's kernels were compiled for (its -march): what the GEMM, convolution and int8
/// kernels it instantiates can use.
constexpr Isa compiled_isa() {
#if defined(__AVX512F__) && defined(__AVX512CD__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AMX_INT8__)
  return Isa::amx;
#else
  return Isa::avx512;
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  return Isa::avx2;
#else
  return Isa::portable;
#endif
}

#if defined(EMBER_PRECOMPILED) || defined(EMBER_PRECOMPILED_BUILD)
/// The tier ember::precompiled's kernels were compiled for (the library's -march, src/precompiled.inc).
Isa precompiled_isa();
#endif

/// One line for a program's header: the tier compiled in (this TU's, and ember::precompiled's when linked) and this
/// machine's, e.g. "kernels avx512, machine amx with AVX512-BF16".
inline std::string describe() {
  std::string s = std::string("kernels ") + isa_name(compiled_isa());
#if defined(EMBER_PRECOMPILED)
  s += std::string(" (ember::precompiled: ") + isa_name(precompiled_isa()) + ")";
#endif
  const Isa m = machine_isa();
  s += std::string(", machine ") + isa_name(m);
  // (bfloat16 GEMMs use its dot products by default where they pay and the kernels are avx512: cpu/detail/gemm_bf16.hpp)
  const CpuidWords w = read_cpuid();
  if (int(m) >= int(Isa::avx512) && has_avx512_bf16(w))
    s += bf16_dot_pays(w) ? " with AVX512-BF16" : " with AVX512-BF16 (off by default: slower than fp32 FMAs here)";
  if (int(m) > int(compiled_isa())) s += " (build with -march=native for its kernels)";
  return s;
}

}  // namespace ember::cpu
