// ember — the SIMD vocabulary of the CPU kernels: simd::Vec<T>, one register of float or double lanes for the tier
// the translation unit is compiled for, and the operations the kernels are written in (loads and stores, whole or
// the first n lanes, broadcasts, fused multiply-adds, and for float ReLU, max-pool's pick and a width x width
// transpose). One kernel source, generic over Vec<T>::width, serves every tier: the GEMM's micro-kernels
// (cpu/detail/gemm_kernel.hpp), the direct and Winograd convolutions (cpu/conv_direct.hpp, cpu/conv_winograd.hpp).
//
// Tiers, chosen at compile time from the target macros: AVX-512 (16 floats, cpu/detail/simd_avx512.hpp), AVX2 +
// FMA (8 floats, cpu/detail/simd_avx2.hpp), or 16-byte vectors through GCC/Clang vector extensions (SSE2 on any
// x86-64, NEON on ARM; no float extras: kernels that need them are off there). EMBER_SIMD_NO_AVX512 selects the
// AVX2 tier on an AVX-512 target (the tests of the AVX2 GEMM on an AVX-512 machine).
#pragma once

#include <cstring>

#include "ember/cpu/detail/simd_avx2.hpp"
#include "ember/cpu/detail/simd_avx512.hpp"

#if defined(__AVX512F__) && !defined(EMBER_SIMD_NO_AVX512)
#define EMBER_SIMD_AVX512 1
#define EMBER_SIMD_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#define EMBER_SIMD_AVX512 0
#define EMBER_SIMD_AVX2 1
#else
#define EMBER_SIMD_AVX512 0
#define EMBER_SIMD_AVX2 0
#endif
// The tiers with the float extras (set1, sub, fnma, loadu_n/storeu_n, relu, pool_pick, transpose).
#define EMBER_SIMD_FLOAT_EXTRAS (EMBER_SIMD_AVX512 || EMBER_SIMD_AVX2)
// Whether simd::Vec exists at all (AVX-512, AVX2 or the vector extensions).
#if EMBER_SIMD_FLOAT_EXTRAS || ((defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__))
#define EMBER_SIMD_VEC 1
#else
#define EMBER_SIMD_VEC 0
#endif

#if EMBER_SIMD_VEC
namespace ember::cpu::simd {

/// One register of T (float or double) for this translation unit's tier: `type`, `width` lanes, zero, load (64-byte
/// aligned where the tier's width needs it), loadu, storeu, bcast, fma (a b + c) and add.
template <class T>
struct Vec;

#if EMBER_SIMD_AVX512
template <>
struct Vec<float> : avx512::F32 {};
template <>
struct Vec<double> : avx512::F64 {};
#elif EMBER_SIMD_AVX2
template <>
struct Vec<float> : avx2::F32 {};
template <>
struct Vec<double> : avx2::F64 {};
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
#endif

}  // namespace ember::cpu::simd
#endif
