// ember — INT8 GEMM for quantized inference (quant/): C[m][n] = Σ_k A[m][k] · B[n][k] in int32, one operand
// unsigned 8-bit and the other signed 8-bit, as the x86 dot-product instructions multiply them.
//
// B is packed once (weights) or built packed (im2col columns) in blocks of 16 rows: for each group of 4 k, the 16
// rows' 4 bytes lie together (64 bytes), so one 512-bit load (or two 256-bit loads) gives every lane the next 4
// values of its row, and A's 4 values are broadcast to all lanes. Per lane and group of 4:
//   vnni512  vpdpbusd zmm (AVX512-VNNI): 4 u8·s8 products summed into the int32 lane, 16 lanes per instruction;
//   vnni256  vpdpbusd ymm (AVX-VNNI, or AVX512-VNNI with VL);
//   avx2     vpmaddubsw + vpmaddwd. vpmaddubsw sums two u8·s8 products into int16 with saturation, and 2·255·127
//            overflows it; the unsigned operand is split into its low 7 bits and its top bit (u = lo + 128·hi), two
//            vpmaddubsw (2·127·128 and 2·1·128 both fit) are widened to int32 by vpmaddwd, with 1 and with 128, and
//            added: exact for every input;
//   scalar   plain loops (every target).
// The compiler's target picks the default path at compile time like the fp32 kernel; every path the target can run
// is compiled, so the tests check each one on the same machine. Results are exact in every path (integer math), so
// they equal each other bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define EMBER_QGEMM_VNNI512 1
#else
#define EMBER_QGEMM_VNNI512 0
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define EMBER_QGEMM_VNNI256 1
#define EMBER_QGEMM_DPBUSD256(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__)
#define EMBER_QGEMM_VNNI256 1
#define EMBER_QGEMM_DPBUSD256(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define EMBER_QGEMM_VNNI256 0
#endif
#if defined(__AVX2__)
#define EMBER_QGEMM_AVX2 1
#else
#define EMBER_QGEMM_AVX2 0
#endif
// The direct convolution (conv_direct below) has a kernel for each of these paths.
#define EMBER_QCONV_DIRECT (EMBER_QGEMM_VNNI512 || EMBER_QGEMM_VNNI256 || EMBER_QGEMM_AVX2)

namespace ember::cpu::q {

enum class Path : unsigned char { scalar, avx2, vnni256, vnni512 };

inline const char* path_name(Path p) {
  switch (p) {
    case Path::avx2: return "avx2";
    case Path::vnni256: return "vnni256";
    case Path::vnni512: return "vnni512";
    default: return "scalar";
  }
}

/// Whether this build compiled path p (the compiler targets its instructions).
constexpr bool path_compiled(Path p) {
  switch (p) {
    case Path::avx2: return EMBER_QGEMM_AVX2 != 0;
    case Path::vnni256: return EMBER_QGEMM_VNNI256 != 0;
    case Path::vnni512: return EMBER_QGEMM_VNNI512 != 0;
    default: return true;
  }
}

/// The fastest compiled path, used unless a caller names one.
constexpr Path best_path() {
  return path_compiled(Path::vnni512)  ? Path::vnni512
         : path_compiled(Path::vnni256) ? Path::vnni256
         : path_compiled(Path::avx2)    ? Path::avx2
                                        : Path::scalar;
}

inline constexpr std::int64_t kBlock = 16;  // B rows per packed block

constexpr std::int64_t round_up(std::int64_t v, std::int64_t m) { return (v + m - 1) / m * m; }

/// Offset of B[r][c] in the packed layout of a matrix whose K is padded to kp.
constexpr std::int64_t packed_index(std::int64_t r, std::int64_t c, std::int64_t kp) {
  return (r / kBlock) * kp * kBlock + (c / 4) * (4 * kBlock) + (r % kBlock) * 4 + (c % 4);
}

/// Bytes a packed B of n rows and k columns takes.
constexpr std::int64_t packed_size(std::int64_t n, std::int64_t k) { return round_up(n, kBlock) * round_up(k, 4); }

/// B (n rows of k, row stride ldb) packed; padding rows and columns are zero.
template <class TB>
struct PackedB {
  std::int64_t n = 0, k = 0, kp = 0;
  std::vector<TB> data;
};

template <class TB>
void pack_b(const TB* b, std::int64_t ldb, std::int64_t n, std::int64_t k, PackedB<TB>& out) {
  static_assert(sizeof(TB) == 1);
  out.n = n;
  out.k = k;
  out.kp = round_up(k, 4);
  out.data.assign(std::size_t(packed_size(n, k)), TB(0));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t c = 0; c < k; ++c) out.data[std::size_t(packed_index(r, c, out.kp))] = b[r * ldb + c];
}

namespace detail {

inline std::int32_t load4(const void* p) {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// One tile: rows [0, mr) of A (rows past mr repeat the last, their results are dropped) against nv blocks of B
// (16 rows each, nr of them valid). AU: A is the unsigned operand.
template <bool AU>
void tile_scalar(const unsigned char* a, std::int64_t lda, int mr, const unsigned char* b, std::int64_t bstride,
                 int nr, std::int64_t kp, std::int32_t* c, std::int64_t ldc) {
  using TA = std::conditional_t<AU, std::uint8_t, std::int8_t>;
  using TB = std::conditional_t<AU, std::int8_t, std::uint8_t>;
  for (int i = 0; i < mr; ++i) {
    const TA* ar = reinterpret_cast<const TA*>(a + i * lda);
    for (int j = 0; j < nr; ++j) {
      const TB* bb = reinterpret_cast<const TB*>(b + (j / kBlock) * bstride) + (j % kBlock) * 4;
      std::int32_t s = 0;
      for (std::int64_t k = 0; k < kp; k += 4)
        for (int t = 0; t < 4; ++t) s += std::int32_t(ar[k + t]) * std::int32_t(bb[k * kBlock + t]);
      c[i * ldc + j] = s;
    }
  }
}

#if EMBER_QGEMM_VNNI512
template <bool AU, int MR, int NV>
void tile512(const unsigned char* a, std::int64_t lda, int mr, const unsigned char* b, std::int64_t bstride, int nr,
             std::int64_t kp, std::int32_t* c, std::int64_t ldc) {
  __m512i acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_si512();
  const unsigned char* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  for (std::int64_t k = 0; k < kp; k += 4) {
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(b + v * bstride + k * kBlock);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(load4(ar[i] + k));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        acc[i][v] = AU ? _mm512_dpbusd_epi32(acc[i][v], av, bv[v]) : _mm512_dpbusd_epi32(acc[i][v], bv[v], av);
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int left = nr - v * 16;
    if (left <= 0) break;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)  // to MR, not mr: a loop the compiler unrolls keeps acc in registers
      if (i < mr) _mm512_mask_storeu_epi32(c + i * ldc + v * 16, m, acc[i][v]);
  }
}
#endif

#if EMBER_QGEMM_VNNI256 || EMBER_QGEMM_AVX2
// A 256-bit tile covers one packed block (16 lanes) in two registers: lanes 0-7 and 8-15.
inline __m256i lane_mask256(int left) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), idx);
}
// Inlined, with loops to MR the compiler unrolls: otherwise acc would live in memory through the whole tile.
template <int MR>
EMBER_INLINE void store256(const __m256i (&acc)[MR][2], int mr, int nr, std::int32_t* c, std::int64_t ldc) {
#pragma GCC unroll 2
  for (int v = 0; v < 2; ++v) {
    const int left = nr - v * 8;
    if (left <= 0) break;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      if (i >= mr) break;
      if (left >= 8)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i * ldc + v * 8), acc[i][v]);
      else
        _mm256_maskstore_epi32(c + i * ldc + v * 8, lane_mask256(left), acc[i][v]);
    }
  }
}
#endif

#if EMBER_QGEMM_VNNI256
template <bool AU, int MR>
void tile256(const unsigned char* a, std::int64_t lda, int mr, const unsigned char* b, int nr, std::int64_t kp,
             std::int32_t* c, std::int64_t ldc) {
  __m256i acc[MR][2];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  const unsigned char* ar[MR];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  for (std::int64_t k = 0; k < kp; k += 4) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k * kBlock));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k * kBlock + 32));
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256i av = _mm256_set1_epi32(load4(ar[i] + k));
      if constexpr (AU) {
        acc[i][0] = EMBER_QGEMM_DPBUSD256(acc[i][0], av, b0);
        acc[i][1] = EMBER_QGEMM_DPBUSD256(acc[i][1], av, b1);
      } else {
        acc[i][0] = EMBER_QGEMM_DPBUSD256(acc[i][0], b0, av);
        acc[i][1] = EMBER_QGEMM_DPBUSD256(acc[i][1], b1, av);
      }
    }
  }
  store256<MR>(acc, mr, nr, c, ldc);
}
#endif

#if EMBER_QGEMM_AVX2
// Σ over each lane's 4 byte pairs of u·s, exact: u = lo + 128·hi with lo < 128 and hi ∈ {0, 1}.
EMBER_INLINE __m256i dot4_split(__m256i u_lo, __m256i u_hi, __m256i s) {
  const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(u_lo, s), _mm256_set1_epi16(1));
  const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(u_hi, s), _mm256_set1_epi16(128));
  return _mm256_add_epi32(lo, hi);
}
template <bool AU, int MR>
void tile_avx2(const unsigned char* a, std::int64_t lda, int mr, const unsigned char* b, int nr, std::int64_t kp,
               std::int32_t* c, std::int64_t ldc) {
  __m256i acc[MR][2];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
  const unsigned char* ar[MR];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = a + std::min(i, mr - 1) * lda;
  const __m256i low7 = _mm256_set1_epi8(0x7F), one = _mm256_set1_epi8(1);
  for (std::int64_t k = 0; k < kp; k += 4) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k * kBlock));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k * kBlock + 32));
    if constexpr (AU) {  // A unsigned (broadcast): split it once per row
      #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        const std::uint32_t w = std::uint32_t(load4(ar[i] + k));
        const __m256i lo = _mm256_set1_epi32(std::int32_t(w & 0x7F7F7F7Fu));
        const __m256i hi = _mm256_set1_epi32(std::int32_t((w >> 7) & 0x01010101u));
        acc[i][0] = _mm256_add_epi32(acc[i][0], dot4_split(lo, hi, b0));
        acc[i][1] = _mm256_add_epi32(acc[i][1], dot4_split(lo, hi, b1));
      }
    } else {  // B unsigned (the vectors): split them once per group of 4
      const __m256i lo0 = _mm256_and_si256(b0, low7), hi0 = _mm256_and_si256(_mm256_srli_epi16(b0, 7), one);
      const __m256i lo1 = _mm256_and_si256(b1, low7), hi1 = _mm256_and_si256(_mm256_srli_epi16(b1, 7), one);
      #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
        const __m256i av = _mm256_set1_epi32(load4(ar[i] + k));
        acc[i][0] = _mm256_add_epi32(acc[i][0], dot4_split(lo0, hi0, av));
        acc[i][1] = _mm256_add_epi32(acc[i][1], dot4_split(lo1, hi1, av));
      }
    }
  }
  store256<MR>(acc, mr, nr, c, ldc);
}
#endif

template <bool AU>
void gemm_u8s8(Path path, const unsigned char* a, std::int64_t lda, std::int64_t m, const unsigned char* b,
               std::int64_t n, std::int64_t kp, std::int32_t* c, std::int64_t ldc) {
  const std::int64_t bstride = kp * kBlock, nblocks = (n + kBlock - 1) / kBlock;
  if (m <= 0 || n <= 0) return;
  switch (path) {
#if EMBER_QGEMM_VNNI512
    case Path::vnni512: {
      constexpr int MR = 6;
      for (std::int64_t jb = 0; jb < nblocks; jb += 2) {
        const int nv = int(std::min<std::int64_t>(2, nblocks - jb));
        const int nr = int(std::min<std::int64_t>(n - jb * kBlock, nv * kBlock));
        const unsigned char* bj = b + jb * bstride;
        for (std::int64_t i = 0; i < m; i += MR) {
          const int mr = int(std::min<std::int64_t>(MR, m - i));
          std::int32_t* ct = c + i * ldc + jb * kBlock;
          if (nv == 2)
            tile512<AU, MR, 2>(a + i * lda, lda, mr, bj, bstride, nr, kp, ct, ldc);
          else
            tile512<AU, MR, 1>(a + i * lda, lda, mr, bj, bstride, nr, kp, ct, ldc);
        }
      }
      return;
    }
#endif
#if EMBER_QGEMM_VNNI256
    case Path::vnni256: {
      constexpr int MR = 6;
      for (std::int64_t jb = 0; jb < nblocks; ++jb) {
        const int nr = int(std::min<std::int64_t>(n - jb * kBlock, kBlock));
        for (std::int64_t i = 0; i < m; i += MR)
          tile256<AU, MR>(a + i * lda, lda, int(std::min<std::int64_t>(MR, m - i)), b + jb * bstride, nr, kp,
                          c + i * ldc + jb * kBlock, ldc);
      }
      return;
    }
#endif
#if EMBER_QGEMM_AVX2
    case Path::avx2: {
      constexpr int MR = 4;
      for (std::int64_t jb = 0; jb < nblocks; ++jb) {
        const int nr = int(std::min<std::int64_t>(n - jb * kBlock, kBlock));
        for (std::int64_t i = 0; i < m; i += MR)
          tile_avx2<AU, MR>(a + i * lda, lda, int(std::min<std::int64_t>(MR, m - i)), b + jb * bstride, nr, kp,
                            c + i * ldc + jb * kBlock, ldc);
      }
      return;
    }
#endif
    default:
      for (std::int64_t jb = 0; jb < nblocks; ++jb)
        for (std::int64_t i = 0; i < m; i += 4)
          tile_scalar<AU>(a + i * lda, lda, int(std::min<std::int64_t>(4, m - i)), b + jb * bstride, bstride,
                          int(std::min<std::int64_t>(n - jb * kBlock, kBlock)), kp, c + i * ldc + jb * kBlock, ldc);
      return;
  }
}

#if EMBER_QGEMM_VNNI512
// One tile of the direct convolution: MR positions (rows of A, read in place from the input at in + pos[i] + koff[kg]
// for group kg of 4 bytes; rows past mr repeat the last) against NV blocks of 16 output channels of w (each block
// nkg · 64 bytes). C's rows are ldc apart and hold NV · 16 values.
template <int MR, int NV>
void conv_tile512(const unsigned char* in, const std::int64_t* pos, int mr, const std::int64_t* koff, std::int64_t nkg,
                  const signed char* w, std::int64_t wstride, std::int32_t* c, std::int64_t ldc) {
  __m512i acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_si512();
  const unsigned char* ar[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ar[i] = in + pos[std::min(i, mr - 1)];
  for (std::int64_t kg = 0; kg < nkg; ++kg) {
    const std::int64_t o = koff[kg];
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_si512(w + v * wstride + kg * 64);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512i av = _mm512_set1_epi32(load4(ar[i] + o));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbusd_epi32(acc[i][v], av, bv[v]);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    if (i < mr)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_si512(c + i * ldc + v * 16, acc[i][v]);
}

#endif

#if EMBER_QGEMM_VNNI256 || EMBER_QGEMM_AVX2
// The 256-bit tiles of the direct convolution: MR positions against one block of 16 output channels (two vectors).
// VNNI: vpdpbusd on the bytes u at in, the accumulators starting at init = 0. AVX2: the input is stored split
// (split_signed): the signed a = u - 128 at in and |a| at in + mag, and vpmaddubsw(|a|, sign(w, a)) sums two products
// a·w into int16 exactly (|a| <= 128 and |w| <= 127, so 2·128·127 < 2^15: weights of -128 are refused when a layer is
// prepared), widened by vpmaddwd; the accumulators start at init = 128·Σw, which makes Σ a·w into Σ u·w. Two
// broadcasts and four vector operations per 32 products where the GEMM's split form takes six; taking a and |a| from
// u inside the loop instead costs a quarter of the kernel's rate (Zen 4, 58 against 74 GMAC/s on one core).
template <bool VNNI, int MR>
void conv_tile256(const unsigned char* in, [[maybe_unused]] std::int64_t mag, const std::int64_t* pos, int mr,
                  const std::int64_t* koff, std::int64_t nkg, const signed char* w, const __m256i (&init)[2],
                  std::int32_t* c, std::int64_t ldc) {
  __m256i acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = init[0], acc[i][1] = init[1];
  const unsigned char* ar[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) ar[i] = in + pos[std::min(i, mr - 1)];
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  for (std::int64_t kg = 0; kg < nkg; ++kg) {
    const std::int64_t o = koff[kg];
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kg * 64));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kg * 64 + 32));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      if constexpr (VNNI) {
#if EMBER_QGEMM_VNNI256
        const __m256i av = _mm256_set1_epi32(load4(ar[i] + o));
        acc[i][0] = EMBER_QGEMM_DPBUSD256(acc[i][0], av, b0);
        acc[i][1] = EMBER_QGEMM_DPBUSD256(acc[i][1], av, b1);
#endif
      } else {
        const __m256i av = _mm256_set1_epi32(load4(ar[i] + o));
        const __m256i mv = _mm256_set1_epi32(load4(ar[i] + o + mag));
        const __m256i p0 = _mm256_maddubs_epi16(mv, _mm256_sign_epi8(b0, av));
        acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(p0, ones));
        const __m256i p1 = _mm256_maddubs_epi16(mv, _mm256_sign_epi8(b1, av));
        acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(p1, ones));
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    if (i < mr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i * ldc), acc[i][0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + i * ldc + 8), acc[i][1]);
    }
}

template <bool VNNI, int MR>
void conv_rows256(const unsigned char* in, std::int64_t mag, const std::int64_t* pos, std::int64_t m,
                  const std::int64_t* koff, std::int64_t nkg, const signed char* w, std::int32_t* c, std::int64_t ldc) {
  __m256i init[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
  if constexpr (!VNNI) {  // 128·Σw per channel: vpmaddubsw of ones and w, widened, summed over the groups
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (std::int64_t kg = 0; kg < nkg; ++kg)
      for (int h = 0; h < 2; ++h) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kg * 64 + 32 * h));
        init[h] = _mm256_add_epi32(init[h], _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, b), ones16));
      }
    init[0] = _mm256_slli_epi32(init[0], 7);
    init[1] = _mm256_slli_epi32(init[1], 7);
  }
  for (std::int64_t i = 0; i < m; i += MR)
    conv_tile256<VNNI, MR>(in, mag, pos + i, int(std::min<std::int64_t>(MR, m - i)), koff, nkg, w, init, c + i * ldc,
                           ldc);
}
#endif

#if EMBER_QGEMM_VNNI512
template <int MR, int NV>
void conv_rows512(const unsigned char* in, const std::int64_t* pos, std::int64_t m, const std::int64_t* koff,
                  std::int64_t nkg, const signed char* w, std::int64_t wstride, std::int32_t* c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; i += MR)
    conv_tile512<MR, NV>(in, pos + i, int(std::min<std::int64_t>(MR, m - i)), koff, nkg, w, wstride, c + i * ldc, ldc);
}
#endif

}  // namespace detail

/// C[i][j] (int32, row stride ldc) = Σ_k A[i][k]·B[j][k] for i < m and j < b.n. A is row-major with row stride
/// lda ≥ b.kp; its columns past b.k are read and must be finite bytes (B is zero there). One of A and B is uint8
/// and the other int8. A path the build did not compile falls back to the scalar loops; path_compiled tells.
template <class TA, class TB>
void gemm(const TA* a, std::int64_t lda, std::int64_t m, const PackedB<TB>& b, std::int32_t* c, std::int64_t ldc,
          Path path = best_path()) {
  static_assert((std::is_same_v<TA, std::uint8_t> && std::is_same_v<TB, std::int8_t>) ||
                    (std::is_same_v<TA, std::int8_t> && std::is_same_v<TB, std::uint8_t>),
                "cpu::q::gemm: one operand uint8, the other int8");
  detail::gemm_u8s8<std::is_same_v<TA, std::uint8_t>>(path, reinterpret_cast<const unsigned char*>(a), lda, m,
                                                      reinterpret_cast<const unsigned char*>(b.data.data()), b.n,
                                                      b.kp, c, ldc);
}

/// The same on a B already packed in `b` (n rows, kp a multiple of 4): the columns of an image built packed.
template <class TA, class TB>
void gemm_raw(const TA* a, std::int64_t lda, std::int64_t m, const TB* b, std::int64_t n, std::int64_t kp,
              std::int32_t* c, std::int64_t ldc, Path path = best_path()) {
  static_assert(sizeof(TA) == 1 && sizeof(TB) == 1 && !std::is_same_v<TA, TB>);
  detail::gemm_u8s8<std::is_same_v<TA, std::uint8_t>>(path, reinterpret_cast<const unsigned char*>(a), lda, m,
                                                      reinterpret_cast<const unsigned char*>(b), n, kp, c, ldc);
}

/// Whether this build has the direct convolution kernel below for some path (AVX512-VNNI, AVX-VNNI or AVX2).
inline constexpr bool conv_direct_compiled = EMBER_QCONV_DIRECT != 0;

/// Whether conv_direct has a kernel for `path` in this build (every compiled path but the scalar one).
inline constexpr bool conv_direct_runs(Path path) { return path != Path::scalar && path_compiled(path); }

/// Whether conv_direct on `path` reads its input split by split_signed (Path::avx2) rather than as the bytes u.
inline constexpr bool conv_direct_split(Path path) { return path == Path::avx2; }

/// The input form Path::avx2's kernel reads, from n bytes u at p: p[i] becomes the signed a = u - 128 (u ^ 0x80) and
/// mag[i] its magnitude |a| (128 for a = -128, as vpabsb gives).
inline void split_signed(std::uint8_t* p, std::int64_t n, std::uint8_t* mag) {
  for (std::int64_t i = 0; i < n; ++i) {
    const auto a = static_cast<std::int8_t>(p[i] ^ 0x80u);
    p[i] = static_cast<std::uint8_t>(a);
    mag[i] = static_cast<std::uint8_t>(a < 0 ? -int(a) : int(a));
  }
}

/// The direct convolution's product on `path` (conv_direct_runs(path) must hold): for positions p < m and output
/// channels o < 16 · nblocks,
///   C[p][o] = Σ_{kg < nkg} Σ_{t < 4} u[pos[p] + koff[kg] + t] · W[o][4 kg + t]
/// with u uint8 (an input whose 4 consecutive bytes are 4 channels at one position, so every k-group of a position
/// is one 4-byte read in place) and W int8 in [-127, 127], packed in blocks of 16 output channels: block b's group kg
/// is 64 bytes at w + (b · nkg + kg) · 64, channel b·16 + l's 4 bytes at offset 4 l. C's rows are ldc ≥ 16 · nblocks
/// apart. Exact integer sums: every path gives the same C. `in` holds u, or where conv_direct_split(path) u split by
/// split_signed: a at in and |a| at in + mag (mag is unused otherwise).
inline void conv_direct(const std::uint8_t* in, std::int64_t mag, const std::int64_t* pos, std::int64_t m,
                        const std::int64_t* koff, std::int64_t nkg, const std::int8_t* w, std::int64_t nblocks,
                        std::int32_t* c, std::int64_t ldc, Path path = best_path()) {
  EMBER_CHECK(conv_direct_runs(path), "cpu::q::conv_direct: no kernel for path ", path_name(path), " in this build");
  [[maybe_unused]] const auto* u = reinterpret_cast<const unsigned char*>(in);
  [[maybe_unused]] const auto* s = reinterpret_cast<const signed char*>(w);
  [[maybe_unused]] const std::int64_t wstride = nkg * 64;
  switch (path) {
#if EMBER_QGEMM_VNNI512
    case Path::vnni512:
      // 4 blocks of 16 channels against 6 positions keep 24 accumulators, 4 weight vectors and a broadcast in the
      // 32 registers; fewer blocks take more positions.
      for (std::int64_t b = 0; b < nblocks; b += 4) {
        const std::int64_t nb = std::min<std::int64_t>(4, nblocks - b);
        const signed char* wb = s + b * wstride;
        std::int32_t* cb = c + b * 16;
        switch (nb) {
          case 4: detail::conv_rows512<6, 4>(u, pos, m, koff, nkg, wb, wstride, cb, ldc); break;
          case 3: detail::conv_rows512<8, 3>(u, pos, m, koff, nkg, wb, wstride, cb, ldc); break;
          case 2: detail::conv_rows512<12, 2>(u, pos, m, koff, nkg, wb, wstride, cb, ldc); break;
          default: detail::conv_rows512<16, 1>(u, pos, m, koff, nkg, wb, wstride, cb, ldc); break;
        }
      }
      return;
#endif
#if EMBER_QGEMM_VNNI256
    case Path::vnni256:  // 6 positions: 12 accumulators, 2 weight vectors and a broadcast of the 16 registers
      for (std::int64_t b = 0; b < nblocks; ++b)
        detail::conv_rows256<true, 6>(u, 0, pos, m, koff, nkg, s + b * wstride, c + b * 16, ldc);
      return;
#endif
#if EMBER_QGEMM_AVX2
    case Path::avx2:  // 4 positions: 8 accumulators, 2 weight vectors, the broadcast, its magnitude and temporaries
      for (std::int64_t b = 0; b < nblocks; ++b)
        detail::conv_rows256<false, 4>(u, mag, pos, m, koff, nkg, s + b * wstride, c + b * 16, ldc);
      return;
#endif
    default: return;  // (refused above)
  }
}

}  // namespace ember::cpu::q
