// ember — conversion runs between the 16-bit storage types and the type the CPU kernels compute in: n bfloat16 or
// half values widened to float (exact), and n float values rounded once to bfloat16 or half (round to nearest
// even; a NaN stays a NaN with its sign and quiet bit), bit for bit the scalar conversions of core/float16.hpp,
// with AVX-512 or AVX2 + F16C vector loops where the tier has them. The packed GEMM converts its
// operands and stores its tiles with them (cpu/detail/gemm_kernel.hpp), the executor a plain cast between float and
// a 16-bit type (cpu/executor.hpp), the convolutions their 16-bit outputs.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/float16.hpp"
#include "ember/cpu/detail/simd.hpp"

namespace ember::cpu::detail::cast16 {

/// The type the kernels compute in for operands stored as T: double for double, fp32 for everything else.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

#if EMBER_SIMD_AVX512
// The zero-masked forms of the conversions and shifts: GCC 12.2 reports its own unmasked forms (which start from
// _mm512_undefined) as maybe-uninitialized once inlined; with an all-ones mask they compile to the same instruction.
inline __m512 cvt16_ps(__m256i h, bool is_half) {
  return is_half ? _mm512_maskz_cvtph_ps(0xffff, h)
                 : _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}
#endif

/// n values of S converted to the compute type at dst (a plain copy when S is the compute type). half uses the
/// F16C/AVX-512 vector conversions, bfloat16 a widening shift; both are exact.
template <class S>
inline void to_compute_run(const S* EMBER_RESTRICT src, compute_t<S>* EMBER_RESTRICT dst, std::int64_t n) {
  if constexpr (std::is_same_v<S, compute_t<S>>) {
    std::memcpy(dst, src, std::size_t(n) * sizeof(S));
  } else {
    std::int64_t i = 0;
#if EMBER_SIMD_AVX512
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
      _mm512_storeu_ps(dst + i, cvt16_ps(h, std::is_same_v<S, half>));
    }
#elif EMBER_SIMD_AVX2 && EMBER_HAS_F16C
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      if constexpr (std::is_same_v<S, half>)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      else
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    }
#endif
    for (; i < n; ++i) dst[i] = float(src[i]);
  }
}

/// dst[0, n) = round(src[0, n) [+ dst[0, n)]) in T, from the kernel's compute type: one rounding per element.
template <class T>
inline void store_run(T* EMBER_RESTRICT dst, const compute_t<T>* EMBER_RESTRICT src, std::int64_t n, bool add) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    if (add)
      for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
    else
      std::memcpy(dst, src, std::size_t(n) * sizeof(T));
  } else {
    std::int64_t i = 0;
#if EMBER_SIMD_AVX512
    for (; i + 16 <= n; i += 16) {
      __m512 v = _mm512_loadu_ps(src + i);
      __m256i* d = reinterpret_cast<__m256i*>(dst + i);
      if (add) {
        const __m256i o = _mm256_loadu_si256(d);
        v = _mm512_add_ps(v, cvt16_ps(o, std::is_same_v<T, half>));
      }
      if constexpr (std::is_same_v<T, half>) {
        _mm256_storeu_si256(d, _mm512_maskz_cvtps_ph(0xffff, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        // Round to nearest even (x + 0x7fff + lsb) >> 16; a NaN keeps its sign and top bits with the quiet bit set.
        const __m512i x = _mm512_castps_si512(v), hi = _mm512_maskz_srli_epi32(0xffff, x, 16);
        const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
        __m512i r = _mm512_maskz_srli_epi32(
            0xffff, _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
        r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r,
                                    _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
        _mm256_storeu_si256(d, _mm512_maskz_cvtepi32_epi16(0xffff, r));  // maskz: GCC 12 warns on the unmasked form
      }
    }
#elif EMBER_SIMD_AVX2 && EMBER_HAS_F16C
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(src + i);
      __m128i* d = reinterpret_cast<__m128i*>(dst + i);
      if constexpr (std::is_same_v<T, half>) {
        if (add) v = _mm256_add_ps(v, _mm256_cvtph_ps(_mm_loadu_si128(d)));
        _mm_storeu_si128(d, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        if (add) {
          const __m256i o = _mm256_cvtepu16_epi32(_mm_loadu_si128(d));
          v = _mm256_add_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(o, 16)));
        }
        // As above; the 32-bit results are below 2^16, so packing them with unsigned saturation is exact.
        const __m256i x = _mm256_castps_si256(v), hi = _mm256_srli_epi32(x, 16);
        const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)),
                               _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
        _mm_storeu_si128(d, _mm256_castsi256_si128(packed));
      }
    }
#endif
    for (; i < n; ++i) dst[i] = T(add ? float(dst[i]) + src[i] : src[i]);
  }
}

}  // namespace ember::cpu::detail::cast16
