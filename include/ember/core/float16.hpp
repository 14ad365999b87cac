// ember — 16-bit floating-point storage types: `half` (IEEE 754 binary16) and `bfloat16` (brain float).
//
// Both are plain 2-byte, trivially copyable values holding their bit pattern in `bits`. Arithmetic and
// comparisons go through float ("fp16 storage, fp32 math"). Conversions round to nearest, ties to even, keep
// subnormals, overflow to ±inf, keep ±0 and ±inf, and turn NaN into a quiet NaN of the same sign.
//
// Every member is EMBER_HOST_DEVICE and does plain bit manipulation, so the types work unchanged in CUDA device
// code. Nothing here is named like, or includes, CUDA's own `__half` / `__nv_bfloat16`; the CUDA layer converts
// between the two by bit pattern.
//
// The conversions are branch-free integer code (ember::detail::f16), the same on every host and in device code, so
// that element-wise loops over half vectorise; the GEMM converts whole runs with F16C/AVX-512 instructions itself.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ember/config.hpp"

// Whether the host compiler targets F16C (the GEMM's packing uses its vector conversions).
#if defined(__F16C__) && !defined(__CUDA_ARCH__)
#define EMBER_HAS_F16C 1
#else
#define EMBER_HAS_F16C 0
#endif

namespace ember {

namespace detail::f16 {

#if defined(__has_builtin)
#if __has_builtin(__builtin_bit_cast)
#define EMBER_F16_BUILTIN_BIT_CAST 1
#endif
#endif

/// float <-> uint32 bit cast usable in constant expressions and in device code.
EMBER_HOST_DEVICE constexpr std::uint32_t float_bits(float f) noexcept {
#if defined(EMBER_F16_BUILTIN_BIT_CAST)
  return __builtin_bit_cast(std::uint32_t, f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

EMBER_HOST_DEVICE constexpr float bits_float(std::uint32_t u) noexcept {
#if defined(EMBER_F16_BUILTIN_BIT_CAST)
  return __builtin_bit_cast(float, u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
#undef EMBER_F16_BUILTIN_BIT_CAST

/// c ? a : b without a branch (an all-ones or all-zeros mask): the conversions below are straight-line code, so a
/// loop over them vectorises. With a ternary, GCC keeps the float operation of one arm behind a branch (it may not
/// speculate it under -ftrapping-math) and the loop stays scalar.
EMBER_HOST_DEVICE constexpr std::uint32_t pick(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

/// float -> binary16 bits, round to nearest even. Every case is computed and the right one picked:
/// - NaN: quieted, the top 9 payload bits kept (what F16C does);
/// - |f| >= 65520 (halfway between 65504 and 2^16, ties to the "even" 2^16): overflow to inf, and inf itself;
/// - a normal half: rebias the exponent, round the 13 dropped bits to nearest even (a carry out of the mantissa
///   bumps the exponent, up to 0x7bff at most under the threshold above);
/// - subnormal or zero: |f| + 0.5 puts |f| rounded to a multiple of 2^-24 (the ulp of 0.5, the subnormal step)
///   into the low mantissa bits, rounded to nearest even by the FPU; 1024 units is the smallest normal, 0x0400.
EMBER_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  const std::uint32_t r = ax - ((127u - 15u) << 23);
  const std::uint32_t normal = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  const std::uint32_t sub = float_bits(bits_float(ax) + 0.5f) - 0x3f000000u;
  const std::uint32_t nan = 0x7e00u | ((ax >> 13) & 0x03ffu);
  const std::uint32_t h =
      pick(ax > 0x7f800000u, nan, pick(ax >= 0x477ff000u, 0x7c00u, pick(ax >= 0x38800000u, normal, sub)));
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bits -> float (exact). Normal: rebias the exponent; zero or subnormal: m * 2^-24 (exact in float,
/// computed from an integer so no float subnormal is involved, whatever the FTZ/DAZ mode); inf, or a NaN that comes
/// back quiet with its payload ((m + 0x3ff) >> 10 is 1 exactly when the payload m is not 0).
EMBER_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t em = h & 0x7fffu;
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t normal = (em << 13) + ((127u - 15u) << 23);
  const std::uint32_t sub = float_bits(static_cast<float>(static_cast<std::int32_t>(em)) * 5.9604644775390625e-8f);
  const std::uint32_t m = em & 0x03ffu;
  const std::uint32_t special = 0x7f800000u | (m << 13) | (((m + 0x03ffu) >> 10) << 22);
  return bits_float(sign | pick(em >= 0x7c00u, special, pick(em >= 0x0400u, normal, sub)));
}

/// float -> bfloat16 bits, round to nearest even. NaN stays NaN (quiet bit forced, sign kept) even when its
/// payload sits only in the low 16 bits that truncation drops.
EMBER_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds to nearest even; a carry ripples into the exponent and turns
  // values at or above the largest-bfloat16 midpoint into inf, as it should.
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

EMBER_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// The conversions half uses, on the host and the device alike. Not F16C's scalar instructions: a scalar
/// intrinsic per element keeps a loop from vectorising, while the straight-line integer code above vectorises
/// (16 lanes with AVX-512) and gives the same bits (tests/test_numerics.cpp checks both against F16C).
EMBER_HOST_DEVICE constexpr std::uint16_t to_half_bits(float f) noexcept { return float_to_half_bits(f); }
EMBER_HOST_DEVICE constexpr float from_half_bits(std::uint16_t h) noexcept { return half_bits_to_float(h); }

template <class T>
inline constexpr bool is_arith_v = std::is_arithmetic_v<T>;

}  // namespace detail::f16

// Arithmetic and comparisons of a 16-bit type with itself and with built-in arithmetic types, all through float.
// Mixed forms are templates so that `h + 1`, `2.0f * h`, `h < 0.5` pick them (exact match) rather than being
// ambiguous between "convert h to float" and "convert the scalar to half". A mixed op yields the scalar's
// promoted floating type (float, or double for a double operand); `h op h` yields the 16-bit type.
#define EMBER_F16_OPERATORS(T)                                                                                  \
  EMBER_HOST_DEVICE friend constexpr T operator+(T a) noexcept { return a; }                                     \
  EMBER_HOST_DEVICE friend constexpr T operator-(T a) noexcept {                                                \
    return from_bits(static_cast<std::uint16_t>(a.bits ^ 0x8000u));                                             \
  }                                                                                                             \
  EMBER_F16_BINARY(T, +)                                                                                        \
  EMBER_F16_BINARY(T, -)                                                                                        \
  EMBER_F16_BINARY(T, *)                                                                                        \
  EMBER_F16_BINARY(T, /)                                                                                        \
  EMBER_F16_COMPARE(T, ==)                                                                                      \
  EMBER_F16_COMPARE(T, !=)                                                                                      \
  EMBER_F16_COMPARE(T, <)                                                                                       \
  EMBER_F16_COMPARE(T, <=)                                                                                      \
  EMBER_F16_COMPARE(T, >)                                                                                       \
  EMBER_F16_COMPARE(T, >=)

#define EMBER_F16_BINARY(T, op)                                                                                 \
  EMBER_HOST_DEVICE friend constexpr T operator op(T a, T b) noexcept {                                          \
    return T(static_cast<float>(a) op static_cast<float>(b));                                                   \
  }                                                                                                             \
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S>, int> = 0>                                    \
  EMBER_HOST_DEVICE friend constexpr auto operator op(T a, S b) noexcept {                                       \
    return static_cast<float>(a) op b;                                                                          \
  }                                                                                                             \
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S>, int> = 0>                                    \
  EMBER_HOST_DEVICE friend constexpr auto operator op(S a, T b) noexcept {                                       \
    return a op static_cast<float>(b);                                                                          \
  }                                                                                                             \
  template <class S, std::enable_if_t<std::is_same_v<S, T> || detail::f16::is_arith_v<S>, int> = 0>           \
  EMBER_HOST_DEVICE friend constexpr T& operator op##=(T & a, S b) noexcept {                                    \
    a = T(static_cast<float>(a) op static_cast<float>(b));                                                      \
    return a;                                                                                                   \
  }

#define EMBER_F16_COMPARE(T, op)                                                                                \
  EMBER_HOST_DEVICE friend constexpr bool operator op(T a, T b) noexcept {                                       \
    return static_cast<float>(a) op static_cast<float>(b);                                                      \
  }                                                                                                             \
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S>, int> = 0>                                    \
  EMBER_HOST_DEVICE friend constexpr bool operator op(T a, S b) noexcept {                                       \
    return static_cast<float>(a) op b;                                                                          \
  }                                                                                                             \
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S>, int> = 0>                                    \
  EMBER_HOST_DEVICE friend constexpr bool operator op(S a, T b) noexcept {                                       \
    return a op static_cast<float>(b);                                                                          \
  }

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; range ±65504, 11 significant bits.
struct half {
  std::uint16_t bits;  ///< the raw binary16 pattern

  half() = default;  ///< trivial: the value is indeterminate, as for float
  /// Rounds f to the nearest binary16 (ties to even; overflow gives ±inf, NaN stays NaN), as `torch.half`'s cast.
  EMBER_HOST_DEVICE constexpr half(float f) noexcept : bits(detail::f16::to_half_bits(f)) {}
  /// Any other arithmetic type converts through float (so a double rounds twice, like `half(float(d))`).
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S> && !std::is_same_v<S, float>, int> = 0>
  EMBER_HOST_DEVICE constexpr half(S v) noexcept : half(static_cast<float>(v)) {}

  /// The half whose binary16 pattern is b (no conversion): `half::from_bits(0x3c00)` is 1.
  EMBER_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
    half h{};
    h.bits = b;
    return h;
  }

  /// The value as a float (exact: every half is a float). Implicit, so a half works wherever a float does.
  EMBER_HOST_DEVICE constexpr operator float() const noexcept { return detail::f16::from_half_bits(bits); }

  EMBER_F16_OPERATORS(half)
};

/// bfloat16: the top half of a float — 1 sign, 8 exponent, 7 mantissa bits; float's range, 8 significant bits.
struct bfloat16 {
  std::uint16_t bits;  ///< the raw bfloat16 pattern (the high 16 bits of the float it stands for)

  bfloat16() = default;  ///< trivial: the value is indeterminate, as for float
  /// Rounds f to the nearest bfloat16 (ties to even; NaN stays NaN), as `torch.bfloat16`'s cast.
  EMBER_HOST_DEVICE constexpr bfloat16(float f) noexcept : bits(detail::f16::float_to_bfloat16_bits(f)) {}
  /// Any other arithmetic type converts through float.
  template <class S, std::enable_if_t<detail::f16::is_arith_v<S> && !std::is_same_v<S, float>, int> = 0>
  EMBER_HOST_DEVICE constexpr bfloat16(S v) noexcept : bfloat16(static_cast<float>(v)) {}

  /// The bfloat16 whose bit pattern is b (no conversion): `bfloat16::from_bits(0x3f80)` is 1.
  EMBER_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h{};
    h.bits = b;
    return h;
  }

  /// The value as a float (exact: the bits become a float's high half). Implicit, as half's.
  EMBER_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::f16::bfloat16_bits_to_float(bits);
  }

  EMBER_F16_OPERATORS(bfloat16)
};

#undef EMBER_F16_OPERATORS
#undef EMBER_F16_BINARY
#undef EMBER_F16_COMPARE

static_assert(sizeof(half) == 2 && alignof(half) == 2, "half must be exactly 2 bytes");
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2, "bfloat16 must be exactly 2 bytes");
static_assert(std::is_trivially_copyable_v<half> && std::is_trivially_default_constructible_v<half>);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_trivially_default_constructible_v<bfloat16>);
static_assert(std::is_standard_layout_v<half> && std::is_standard_layout_v<bfloat16>);

// Classification by bit pattern (exact, no conversion). Found by ADL for ember::half / ember::bfloat16.
EMBER_HOST_DEVICE constexpr bool isnan(half h) noexcept { return (h.bits & 0x7fffu) > 0x7c00u; }
EMBER_HOST_DEVICE constexpr bool isinf(half h) noexcept { return (h.bits & 0x7fffu) == 0x7c00u; }
EMBER_HOST_DEVICE constexpr bool isfinite(half h) noexcept { return (h.bits & 0x7fffu) < 0x7c00u; }
EMBER_HOST_DEVICE constexpr bool signbit(half h) noexcept { return (h.bits & 0x8000u) != 0; }
EMBER_HOST_DEVICE constexpr bool isnan(bfloat16 h) noexcept { return (h.bits & 0x7fffu) > 0x7f80u; }
EMBER_HOST_DEVICE constexpr bool isinf(bfloat16 h) noexcept { return (h.bits & 0x7fffu) == 0x7f80u; }
EMBER_HOST_DEVICE constexpr bool isfinite(bfloat16 h) noexcept { return (h.bits & 0x7fffu) < 0x7f80u; }
EMBER_HOST_DEVICE constexpr bool signbit(bfloat16 h) noexcept { return (h.bits & 0x8000u) != 0; }

// No operator<<: both types convert implicitly to float, so `std::cout << h` already prints the value (the
// float overload is the unique best match), without this header including <iostream>/<ostream>.

}  // namespace ember

namespace std {

/// std::numeric_limits for ember::half, with binary16's values (as `torch.finfo(torch.half)`): max 65504, min
/// (smallest normal) 2^-14, denorm_min 2^-24, epsilon 2^-10, 11 digits; IEEE 754, with infinities, NaNs and
/// subnormals. The members have the standard meanings.
template <>
class numeric_limits<ember::half> {
 public:
  /// \cond
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = true;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 11;
  static constexpr int digits10 = 3;
  static constexpr int max_digits10 = 5;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -13;
  static constexpr int min_exponent10 = -4;
  static constexpr int max_exponent = 16;
  static constexpr int max_exponent10 = 4;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr ember::half min() noexcept { return ember::half::from_bits(0x0400); }  // 2^-14
  static constexpr ember::half lowest() noexcept { return ember::half::from_bits(0xfbff); }  // -65504
  static constexpr ember::half max() noexcept { return ember::half::from_bits(0x7bff); }  // 65504
  static constexpr ember::half epsilon() noexcept { return ember::half::from_bits(0x1400); }  // 2^-10
  static constexpr ember::half round_error() noexcept { return ember::half::from_bits(0x3800); }  // 0.5
  static constexpr ember::half infinity() noexcept { return ember::half::from_bits(0x7c00); }
  static constexpr ember::half quiet_NaN() noexcept { return ember::half::from_bits(0x7e00); }
  static constexpr ember::half signaling_NaN() noexcept { return ember::half::from_bits(0x7d00); }
  static constexpr ember::half denorm_min() noexcept { return ember::half::from_bits(0x0001); }  // 2^-24
  /// \endcond
};

/// std::numeric_limits for ember::bfloat16 (as `torch.finfo(torch.bfloat16)`): float's range (max ~3.39e38, min
/// 2^-126) with 8 digits, epsilon 2^-7; infinities, NaNs and subnormals, but not IEEE 754 (is_iec559 is false).
/// The members have the standard meanings.
template <>
class numeric_limits<ember::bfloat16> {
 public:
  /// \cond
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool is_exact = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr bool has_signaling_NaN = true;
  static constexpr float_denorm_style has_denorm = denorm_present;
  static constexpr bool has_denorm_loss = false;
  static constexpr float_round_style round_style = round_to_nearest;
  static constexpr bool is_iec559 = false;
  static constexpr bool is_bounded = true;
  static constexpr bool is_modulo = false;
  static constexpr int digits = 8;
  static constexpr int digits10 = 2;
  static constexpr int max_digits10 = 4;
  static constexpr int radix = 2;
  static constexpr int min_exponent = -125;
  static constexpr int min_exponent10 = -37;
  static constexpr int max_exponent = 128;
  static constexpr int max_exponent10 = 38;
  static constexpr bool traps = false;
  static constexpr bool tinyness_before = false;

  static constexpr ember::bfloat16 min() noexcept { return ember::bfloat16::from_bits(0x0080); }  // 2^-126
  static constexpr ember::bfloat16 lowest() noexcept { return ember::bfloat16::from_bits(0xff7f); }
  static constexpr ember::bfloat16 max() noexcept { return ember::bfloat16::from_bits(0x7f7f); }  // ~3.39e38
  static constexpr ember::bfloat16 epsilon() noexcept { return ember::bfloat16::from_bits(0x3c00); }  // 2^-7
  static constexpr ember::bfloat16 round_error() noexcept { return ember::bfloat16::from_bits(0x3f00); }
  static constexpr ember::bfloat16 infinity() noexcept { return ember::bfloat16::from_bits(0x7f80); }
  static constexpr ember::bfloat16 quiet_NaN() noexcept { return ember::bfloat16::from_bits(0x7fc0); }
  static constexpr ember::bfloat16 signaling_NaN() noexcept { return ember::bfloat16::from_bits(0x7fa0); }
  static constexpr ember::bfloat16 denorm_min() noexcept { return ember::bfloat16::from_bits(0x0001); }
  /// \endcond
};

}  // namespace std
