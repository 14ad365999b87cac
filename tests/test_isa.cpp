// The instruction-set tiers (cpu/isa.hpp): the tier read from CPUID words and XCR0 for each kind of CPU, the OS's
// register state deciding over what CPUID lists, the EMBER_CPU_ISA names, and the one-line hints (core/hint.hpp).
#include <doctest/doctest.h>

#include "helpers.hpp"
#include "ember/core/hint.hpp"
#include "ember/cpu/detail/gemm_bf16.hpp"
#include "ember/cpu/isa.hpp"

using namespace ember;
using cpu::CpuidWords;
using cpu::Isa;

namespace {
constexpr std::uint32_t b(int i) { return std::uint32_t(1) << i; }
// A CPU's words: leaf 1 ECX with FMA, OSXSAVE, AVX, F16C; leaf 7 EBX with AVX2; XCR0 with the SSE and AVX state.
CpuidWords avx2_cpu() {
  CpuidWords w;
  w.leaf1_ecx = b(12) | b(27) | b(28) | b(29);
  w.leaf7_ebx = b(5);
  w.xcr0 = 0x7;  // x87, SSE, AVX
  return w;
}
CpuidWords avx512_cpu() {
  CpuidWords w = avx2_cpu();
  w.leaf7_ebx |= b(16) | b(17) | b(28) | b(30) | b(31);  // F, DQ, CD, BW, VL
  w.xcr0 |= 0xe0;                                        // opmask, ZMM_Hi256, Hi16_ZMM
  return w;
}
CpuidWords amx_cpu() {
  CpuidWords w = avx512_cpu();
  w.leaf7_edx = b(22) | b(24) | b(25);  // AMX-BF16, AMX-TILE, AMX-INT8
  w.xcr0 |= std::uint64_t(3) << 17;     // XTILECFG, XTILEDATA
  return w;
}
}  // namespace

TEST_CASE("isa: the tier of each kind of CPU from its CPUID words and XCR0") {
  CHECK(cpu::isa_from_cpuid(CpuidWords{}) == Isa::portable);  // not x86, or an SSE-only CPU
  CHECK(cpu::isa_from_cpuid(avx2_cpu()) == Isa::avx2);           // Zen 3, Haswell to Alder Lake
  CHECK(cpu::isa_from_cpuid(avx512_cpu()) == Isa::avx512);       // Zen 4, Ice Lake, Cooper Lake
  CHECK(cpu::isa_from_cpuid(amx_cpu()) == Isa::amx);             // Sapphire Rapids
}

TEST_CASE("isa: instructions count only where the OS saves their registers") {
  // CPUID lists AVX-512, but the OS (a hypervisor, a kernel booted with it off) leaves its state out of XCR0.
  CpuidWords w = avx512_cpu();
  w.xcr0 &= ~std::uint64_t(0xe0);
  CHECK(cpu::isa_from_cpuid(w) == Isa::avx2);
  w.xcr0 |= 0x60;  // opmask and ZMM_Hi256 but not Hi16_ZMM
  CHECK(cpu::isa_from_cpuid(w) == Isa::avx2);
  // AMX listed, its tile state not enabled: AVX-512.
  w = amx_cpu();
  w.xcr0 &= ~(std::uint64_t(1) << 18);
  CHECK(cpu::isa_from_cpuid(w) == Isa::avx512);
  // No OSXSAVE: the OS saves no AVX state at all, whatever the rest says.
  w = amx_cpu();
  w.leaf1_ecx &= ~b(27);
  CHECK(cpu::isa_from_cpuid(w) == Isa::portable);
  // AVX state off in XCR0.
  w = avx2_cpu();
  w.xcr0 = 0x3;
  CHECK(cpu::isa_from_cpuid(w) == Isa::portable);
}

TEST_CASE("isa: each tier needs all of its instructions") {
  for (int bit : {12, 28, 29}) {  // FMA, AVX, F16C
    CpuidWords w = avx2_cpu();
    w.leaf1_ecx &= ~b(bit);
    INFO("leaf 1 ECX bit " << bit);
    CHECK(cpu::isa_from_cpuid(w) == Isa::portable);
  }
  for (int bit : {16, 17, 28, 30, 31}) {  // AVX-512 F, DQ, CD, BW, VL
    CpuidWords w = avx512_cpu();
    w.leaf7_ebx &= ~b(bit);
    INFO("leaf 7 EBX bit " << bit);
    CHECK(cpu::isa_from_cpuid(w) == Isa::avx2);
  }
  for (int bit : {22, 24, 25}) {  // AMX-BF16, AMX-TILE, AMX-INT8
    CpuidWords w = amx_cpu();
    w.leaf7_edx &= ~b(bit);
    INFO("leaf 7 EDX bit " << bit);
    CHECK(cpu::isa_from_cpuid(w) == Isa::avx512);
  }
}

TEST_CASE("isa: VNNI dot products for int8, from AVX512-VNNI or AVX-VNNI") {
  CHECK_FALSE(cpu::has_vnni(avx2_cpu()));  // Zen 3
  CpuidWords w = avx2_cpu();
  w.leaf7_1_eax = b(4);  // AVX-VNNI: Alder Lake
  CHECK(cpu::has_vnni(w));
  w = avx512_cpu();
  CHECK_FALSE(cpu::has_vnni(w));  // Skylake-SP
  w.leaf7_ecx = b(11);            // AVX512-VNNI: Cascade Lake on
  CHECK(cpu::has_vnni(w));
  w.xcr0 = 0x3;  // no AVX state: nothing
  CHECK_FALSE(cpu::has_vnni(w));
}

// AVX512_BF16 (CPUID.(7,1):EAX bit 5) counts only on the avx512 tier: with the OS's AVX-512 state, and not on an AVX2
// CPU whatever the bit says.
TEST_CASE("isa: AVX512-BF16 dot products need the avx512 tier and the bit") {
  CpuidWords w = avx512_cpu();
  CHECK_FALSE(cpu::has_avx512_bf16(w));  // Ice Lake: AVX-512 without BF16
  w.leaf7_1_eax = b(5);
  CHECK(cpu::has_avx512_bf16(w));  // Zen 4 and later, Cooper Lake, Sapphire Rapids
  w.xcr0 &= ~std::uint64_t(0xe0);  // the OS leaves the AVX-512 state off
  CHECK_FALSE(cpu::has_avx512_bf16(w));
  CpuidWords a = avx2_cpu();
  a.leaf7_1_eax = b(5) | b(4);  // AVX-VNNI and the bit, but no AVX-512
  CHECK_FALSE(cpu::has_avx512_bf16(a));
}

// The dot-product kernel is the default only where it beats the fp32 FMAs: AMD's cores, not Intel's.
TEST_CASE("isa: bfloat16 GEMMs default to the dot products on AMD only, and only with AVX512-BF16") {
  CpuidWords w = avx512_cpu();
  w.leaf7_1_eax = b(5);
  w.leaf0_ebx = 0x756e6547;  // "Genu"ineIntel: Cooper Lake, Sapphire Rapids
  CHECK(cpu::has_avx512_bf16(w));
  CHECK_FALSE(cpu::is_amd(w));
  CHECK_FALSE(cpu::bf16_dot_pays(w));
  w.leaf0_ebx = 0x68747541;  // "Auth"enticAMD: Zen 4, Zen 5
  CHECK(cpu::is_amd(w));
  CHECK(cpu::bf16_dot_pays(w));
  w.leaf7_1_eax = 0;  // no AVX512-BF16 (an AMD CPU before Zen 4)
  CHECK_FALSE(cpu::bf16_dot_pays(w));
  w.leaf7_1_eax = b(5);
  w.xcr0 &= ~std::uint64_t(0xe0);  // the OS leaves the AVX-512 state off
  CHECK_FALSE(cpu::bf16_dot_pays(w));
  // This machine: the switch starts where bf16_dot_pays says unless EMBER_BF16_DOT decides.
  if (!std::getenv("EMBER_BF16_DOT") && !std::getenv("EMBER_CPU_ISA") && cpu::bf16_dot_available())
    CHECK(cpu::bf16_dot_active() == cpu::bf16_dot_pays(cpu::read_cpuid()));
}

TEST_CASE("isa: this machine, this build, and the names of EMBER_CPU_ISA") {
  const Isa hw = cpu::isa_from_cpuid(cpu::read_cpuid());
  CHECK(int(cpu::machine_isa()) <= int(hw));  // capped by EMBER_CPU_ISA at most
  for (Isa i : {Isa::portable, Isa::avx2, Isa::avx512, Isa::amx}) CHECK(cpu::parse_isa(cpu::isa_name(i)) == i);
  EXPECT_ERROR([] { cpu::parse_isa("avx1024"); }, {"EMBER_CPU_ISA is \"avx1024\"", "portable, avx2, avx512 or amx"});
  EXPECT_ERROR([] { cpu::parse_isa("avx2\x1b[0m"); }, {"\"avx2\\x1b[0m\""});
  // A binary runs only instructions its CPU has, so what it was compiled for is at most the machine's tier (the
  // AMX tier also needs the OS's tile state, which a build for an AMX CPU assumes).
  if (!std::getenv("EMBER_CPU_ISA"))
    CHECK(int(cpu::compiled_isa()) <= std::max(int(hw), int(Isa::avx512)));
  const std::string d = cpu::describe();
  CHECK(d.find(std::string("kernels ") + cpu::isa_name(cpu::compiled_isa())) == 0);
  CHECK(d.find(std::string("machine ") + cpu::isa_name(cpu::machine_isa())) != std::string::npos);
}

TEST_CASE("hints: once per topic, and none when switched off") {
  const bool was = hints_enabled();
  set_hints(true);
  CHECK(hint("test-topic-a", "a first hint from the test suite"));
  CHECK_FALSE(hint("test-topic-a", "the same topic again"));
  set_hints(false);
  CHECK_FALSE(hint("test-topic-b", "not printed"));
  set_hints(true);
  CHECK(hint("test-topic-b", "printed now that hints are on"));
  set_hints(was);
}
