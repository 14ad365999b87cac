// Numerics: the 16-bit storage types (exhaustive round trips, rounding against an exact reference), the
// vectorisable float elementary functions (max ulp error against double-precision libm over a sweep of the whole
// float range, plus special values), and gradients at the edges (bounds, NaN, ±inf, zeros) against PyTorch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/core/float16.hpp"
#include "ember/expr/detail/fastmath.hpp"
#include "helpers.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using ember::bfloat16;
using ember::half;
namespace fm = ember::detail::fm;
namespace f16 = ember::detail::f16;

namespace {

float f32_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// ------------------------------------------------------------------------------ exact references (double)

/// binary16 value by the definition (independent of the code under test); NaN for NaN patterns.
double half_value(std::uint16_t b) {
  const int e = (b >> 10) & 31, m = b & 1023;
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : s * HUGE_VAL;
  return s * (e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25));
}
double bf16_value(std::uint16_t b) {
  const int e = (b >> 7) & 255, m = b & 127;
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 255) return m ? std::numeric_limits<double>::quiet_NaN() : s * HUGE_VAL;
  return s * (e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134));
}

/// Round |f| to the nearest entry of an ascending table of the non-negative finite values of a format (whose
/// index is the bit pattern), ties to the even pattern; `table.back()` is the first value past the largest finite
/// one (2^16 for half, 2^128 for bfloat16) and stands for +inf. Returns the bit pattern with f's sign.
std::uint16_t round_by_table(float f, const std::vector<double>& table, std::uint16_t inf_bits) {
  const double a = std::fabs(static_cast<double>(f));
  const auto sign = static_cast<std::uint16_t>(std::signbit(f) ? 0x8000 : 0);
  if (a >= table.back()) return sign | inf_bits;
  const std::size_t i = static_cast<std::size_t>(std::upper_bound(table.begin(), table.end(), a) - table.begin()) - 1;
  std::size_t pick = i;
  if (table[i] != a) {
    const double below = a - table[i], above = table[i + 1] - a;  // exact: few significant bits
    pick = below < above ? i : above < below ? i + 1 : (i % 2 == 0 ? i : i + 1);
  }
  return static_cast<std::uint16_t>(sign | (pick == table.size() - 1 ? inf_bits : pick));
}

const std::vector<double>& half_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (std::uint32_t b = 0; b < 0x7c00; ++b) v.push_back(half_value(static_cast<std::uint16_t>(b)));
    v.push_back(65536.0);
    return v;
  }();
  return t;
}
const std::vector<double>& bf16_table() {
  static const std::vector<double> t = [] {
    std::vector<double> v;
    for (std::uint32_t b = 0; b < 0x7f80; ++b) v.push_back(bf16_value(static_cast<std::uint16_t>(b)));
    v.push_back(std::ldexp(1.0, 128));
    return v;
  }();
  return t;
}
std::uint16_t half_ref(float f) { return round_by_table(f, half_table(), 0x7c00); }
std::uint16_t bf16_ref(float f) { return round_by_table(f, bf16_table(), 0x7f80); }

/// Floats worth testing around each representable value of a 16-bit format: the value, the midpoint to the
/// next one (a tie) and the floats just either side of value and midpoint, with both signs.
template <class Value>
std::vector<float> boundary_points(std::uint32_t n_finite, Value value) {
  std::vector<float> pts;
  for (std::uint32_t b = 0; b < n_finite; ++b) {
    const double v = value(b), next = value(b + 1);  // value(n_finite) is the inf stand-in
    const auto mid = static_cast<float>((v + next) / 2);  // exact in float
    REQUIRE(static_cast<double>(mid) == (v + next) / 2);
    for (float p : {static_cast<float>(v), mid}) {
      for (float q : {p, std::nextafter(p, 0.0f), std::nextafter(p, HUGE_VALF)}) {
        pts.push_back(q);
        pts.push_back(-q);
      }
    }
  }
  return pts;
}

// ---------------------------------------------------------------------------------------- ulp measurement

/// |y - ref| in units of the float spacing at ref (subnormal spacing below 2^-126). A result that rounds to the
/// same infinity as ref, or NaN for NaN, is exact; a wrong NaN or infinity is "infinitely" wrong.
double ulp_error(float y, double ref) {
  constexpr double kWrong = 1e30;
  if (std::isnan(ref) || std::isnan(y)) return std::isnan(ref) && std::isnan(y) ? 0.0 : kWrong;
  const auto ref_f = static_cast<float>(ref);
  if (std::isinf(ref_f) || std::isinf(y)) return y == ref_f ? 0.0 : kWrong;
  int e = -126;
  if (ref != 0) e = std::max(std::ilogb(ref), -126);
  return std::fabs(static_cast<double>(y) - ref) / std::ldexp(1.0, e - 23);
}

struct SweepResult {
  double max_ulp = 0;
  float worst_x = 0;
  std::size_t count = 0;
};

/// Evaluates f over the float bit patterns start, start+step, ... below `end` in fixed-size blocks (a constant
/// trip count, so the loop vectorises even at -O2 and the vector code is what gets checked) and compares with
/// the double reference.
template <class F, class Ref>
SweepResult sweep(F f, Ref ref, std::uint64_t start, std::uint64_t end, std::uint64_t step) {
  constexpr int kBlock = 4096;
  alignas(64) float in[kBlock], out[kBlock];
  SweepResult res;
  for (std::uint64_t u = start; u < end;) {
    int n = 0;
    for (; n < kBlock && u < end; ++n, u += step) in[n] = f32_from_bits(static_cast<std::uint32_t>(u));
    for (int i = n; i < kBlock; ++i) in[i] = 0.0f;
    for (int i = 0; i < kBlock; ++i) out[i] = f(in[i]);
    for (int i = 0; i < n; ++i) {
      const double err = ulp_error(out[i], ref(static_cast<double>(in[i])));
      if (err > res.max_ulp) res.max_ulp = err, res.worst_x = in[i];
    }
    res.count += static_cast<std::size_t>(n);
  }
  return res;
}

/// Whole range: every 997th bit pattern of all 2^32 (both signs, subnormals, inf/NaN encodings included).
template <class F, class Ref>
SweepResult sweep_all(F f, Ref ref) {
  return sweep(f, ref, 0, std::uint64_t{1} << 32, 997);
}
/// About 2 million evenly spaced bit patterns of [lo, hi] (lo and hi of one sign; every float if fewer).
template <class F, class Ref>
SweepResult sweep_range(F f, Ref ref, float lo, float hi) {
  REQUIRE(std::signbit(lo) == std::signbit(hi));
  std::uint32_t a = bits_of(lo), b = bits_of(hi);
  if (a > b) std::swap(a, b);
  return sweep(f, ref, a, std::uint64_t{b} + 1, std::max<std::uint64_t>(1, (b - a) / 2000000));
}

double sigmoid_ref(double x) {
  const double e = std::exp(-std::fabs(x));
  return (x >= 0 ? 1.0 : e) / (1.0 + e);
}

#define EMBER_CHECK_ULP(result, bound)                                                                 \
  do {                                                                                                 \
    const SweepResult r_ = (result);                                                                   \
    INFO("max ulp " << r_.max_ulp << " at x = " << r_.worst_x << " over " << r_.count << " points"); \
    CHECK(r_.max_ulp <= (bound));                                                                      \
  } while (0)

}  // namespace

// ================================================================================================ half

TEST_CASE("half: layout, constexpr construction, numeric_limits") {
  static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
  static_assert(std::is_trivially_default_constructible_v<half>);
  static_assert(half(1.0f).bits == 0x3c00 && half(-2.0f).bits == 0xc000);
  static_assert(half(65504.0f).bits == 0x7bff && half(1e6f).bits == 0x7c00);
  static_assert(static_cast<float>(half::from_bits(0x3555)) == 0.333251953125f);
  static_assert(half(1).bits == 0x3c00 && half(0.5).bits == 0x3800);

  using L = std::numeric_limits<half>;
  static_assert(L::is_specialized && L::digits == 11 && L::has_infinity && L::has_quiet_NaN);
  CHECK(static_cast<float>(L::max()) == 65504.0f);
  CHECK(static_cast<float>(L::lowest()) == -65504.0f);
  CHECK(static_cast<float>(L::min()) == std::ldexp(1.0f, -14));
  CHECK(static_cast<float>(L::denorm_min()) == std::ldexp(1.0f, -24));
  CHECK(static_cast<float>(L::epsilon()) == std::ldexp(1.0f, -10));
  CHECK(static_cast<float>(half(1.0f + static_cast<float>(L::epsilon()))) > 1.0f);
  CHECK(std::isinf(static_cast<float>(L::infinity())));
  CHECK(ember::isnan(L::quiet_NaN()));
  CHECK(ember::isnan(L::signaling_NaN()));
  CHECK(ember::isinf(L::infinity()));
  CHECK(ember::isfinite(L::max()));
  CHECK_FALSE(ember::isfinite(-L::infinity()));
}

TEST_CASE("half: all 65536 bit patterns convert to float exactly and back unchanged") {
  int nans = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const half h = half::from_bits(bits);
    const float f = h;
    const float f_soft = f16::half_bits_to_float(bits);
    const double exact = half_value(bits);
    if (std::isnan(exact)) {
      ++nans;
      CHECK(ember::isnan(h));
      CHECK(std::isnan(f));
      CHECK(std::isnan(f_soft));
      CHECK(std::signbit(f) == ((bits & 0x8000) != 0));
      CHECK(ember::isnan(half(f)));  // NaN stays NaN (quieted)
      CHECK(ember::isnan(half::from_bits(f16::float_to_half_bits(f_soft))));
      continue;
    }
    CHECK_FALSE(ember::isnan(h));
    REQUIRE(static_cast<double>(f) == exact);
    REQUIRE(bits_of(f_soft) == bits_of(f));  // same bits incl. the sign of zero
    REQUIRE(half(f).bits == bits);
    REQUIRE(f16::float_to_half_bits(f) == bits);
  }
  CHECK(nans == 2 * 1023);
}

TEST_CASE("half: float -> half rounds to nearest even, against an exact reference") {
  // Every value, every tie between neighbours (subnormal ones and 65520 -> inf included), and one float either
  // side of each.
  const auto pts = boundary_points(0x7c00, [](std::uint32_t b) { return half_table()[b]; });
  std::size_t bad_hw = 0, bad_soft = 0;
  for (float f : pts) {
    const std::uint16_t want = half_ref(f);
    bad_hw += half(f).bits != want;
    bad_soft += f16::float_to_half_bits(f) != want;
  }
  CHECK(bad_hw == 0);
  CHECK(bad_soft == 0);

  // A stride through all finite floats.
  std::size_t bad = 0, n = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 1009) {
    const float f = f32_from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    const std::uint16_t want = half_ref(f);
    bad += (half(f).bits != want) + (f16::float_to_half_bits(f) != want);
    ++n;
  }
  CHECK(bad == 0);
  CHECK(n > 4000000);

  // Spot checks that name the interesting thresholds.
  CHECK(half(65519.996f).bits == 0x7bff);
  CHECK(half(65520.0f).bits == 0x7c00);                      // the tie rounds to "even" = overflow
  CHECK(half(-65520.0f).bits == 0xfc00);
  CHECK(half(std::ldexp(1.0f, -25)).bits == 0x0000);         // tie between 0 and denorm_min -> 0
  CHECK(half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits == 0x0001);
  CHECK(half(std::ldexp(3.0f, -25)).bits == 0x0002);         // tie between 1 and 2 (x 2^-24) -> 2
  CHECK(half(std::ldexp(2047.0f, -25)).bits == 0x0400);      // tie at the subnormal/normal border -> 2^-14
  CHECK(half(-0.0f).bits == 0x8000);
  CHECK(half(HUGE_VALF).bits == 0x7c00);
  CHECK(half(-HUGE_VALF).bits == 0xfc00);
  CHECK(half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie -> even mantissa
  CHECK(half(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);
}

TEST_CASE("half: NaN conversions keep NaN and its sign") {
  for (std::uint32_t payload : {0x400000u, 0x000001u, 0x001fffu, 0x002000u, 0x3fffffu, 0x7fffffu}) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      const float f = f32_from_bits(sign | 0x7f800000u | payload);
      REQUIRE(std::isnan(f));
      const half h(f);
      CHECK(ember::isnan(h));
      CHECK(ember::signbit(h) == (sign != 0));
      CHECK((h.bits & 0x0200) != 0);  // quiet
      CHECK(f16::float_to_half_bits(f) == h.bits);  // soft path == selected (F16C) path, payload included
    }
  }
}

#if defined(__F16C__)
TEST_CASE("half: the portable conversion matches the F16C instructions") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float hw = _cvtsh_ss(static_cast<unsigned short>(b));
    const float sw = f16::half_bits_to_float(static_cast<std::uint16_t>(b));
    REQUIRE((bits_of(hw) == bits_of(sw) || (std::isnan(hw) && std::isnan(sw))));
  }
  std::size_t bad = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 61) {
    const float f = f32_from_bits(static_cast<std::uint32_t>(u));
    const auto hw = static_cast<std::uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
    bad += hw != f16::float_to_half_bits(f);
  }
  CHECK(bad == 0);
}
#endif

TEST_CASE("half: arithmetic and comparisons go through float") {
  const half a = 1.5f, b = 2.25f;
  static_assert(std::is_same_v<decltype(a + b), half>);
  static_assert(std::is_same_v<decltype(a * 2.0f), float>);
  static_assert(std::is_same_v<decltype(2.0 * a), double>);
  static_assert(std::is_same_v<decltype(a + 1), float>);
  CHECK(static_cast<float>(a + b) == 3.75f);
  CHECK(static_cast<float>(a - b) == -0.75f);
  CHECK(static_cast<float>(a * b) == 3.375f);
  CHECK(static_cast<float>(b / a) == 1.5f);
  CHECK(static_cast<float>(-a) == -1.5f);
  CHECK(a * 2.0f == 3.0f);
  CHECK(1 + a == 2.5f);
  half c = a;
  c += b;
  CHECK(c == 3.75f);
  c *= 2;
  CHECK(c == 7.5f);
  c -= half(0.5f);
  CHECK(c == 7);
  c /= 7.0;
  CHECK(c == 1);
  CHECK(a < b);
  CHECK(b >= a);
  CHECK(a != b);
  CHECK(a == 1.5);
  CHECK(half(0.0f) == half(-0.0f));
  const half nan = std::numeric_limits<half>::quiet_NaN();
  CHECK_FALSE(nan == nan);
  CHECK(nan != nan);
  CHECK(ember::isnan(-nan));
  CHECK(static_cast<float>(half(60000.0f) + half(60000.0f)) == HUGE_VALF);  // overflow in the store
  CHECK(ember::signbit(-half(0.0f)));
  CHECK(static_cast<int>(half(3.75f)) == 3);
  const bfloat16 x = 2.0f;
  CHECK(a + x == 3.5f);  // mixed 16-bit types meet in float
}

// ============================================================================================ bfloat16

TEST_CASE("bfloat16: layout, constexpr construction, numeric_limits") {
  static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
  static_assert(bfloat16(1.0f).bits == 0x3f80 && bfloat16(-2.0f).bits == 0xc000);
  static_assert(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
  using L = std::numeric_limits<bfloat16>;
  static_assert(L::is_specialized && L::digits == 8);
  CHECK(static_cast<float>(L::max()) == static_cast<float>(std::ldexp(255.0, 120)));
  CHECK(static_cast<float>(L::lowest()) == -static_cast<float>(L::max()));
  CHECK(static_cast<float>(L::min()) == std::numeric_limits<float>::min());
  CHECK(static_cast<float>(L::denorm_min()) == std::ldexp(1.0f, -133));
  CHECK(static_cast<float>(L::epsilon()) == std::ldexp(1.0f, -7));
  CHECK(ember::isinf(L::infinity()));
  CHECK(ember::isnan(L::quiet_NaN()));
  CHECK(ember::isnan(L::signaling_NaN()));
}

TEST_CASE("bfloat16: all 65536 bit patterns round-trip") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const bfloat16 h = bfloat16::from_bits(bits);
    const float f = h;
    const double exact = bf16_value(bits);
    if (std::isnan(exact)) {
      CHECK(ember::isnan(h));
      CHECK(std::isnan(f));
      CHECK(ember::isnan(bfloat16(f)));
      continue;
    }
    REQUIRE(static_cast<double>(f) == exact);
    REQUIRE(bfloat16(f).bits == bits);
  }
}

TEST_CASE("bfloat16: float -> bfloat16 rounds to nearest even, against an exact reference") {
  const auto pts = boundary_points(0x7f80, [](std::uint32_t b) { return bf16_table()[b]; });
  std::size_t bad = 0;
  for (float f : pts) bad += bfloat16(f).bits != bf16_ref(f);
  CHECK(bad == 0);
  std::size_t n = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 1009) {
    const float f = f32_from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    bad += bfloat16(f).bits != bf16_ref(f);
    ++n;
  }
  CHECK(bad == 0);
  CHECK(n > 4000000);
  CHECK(bfloat16(f32_from_bits(0x3f808000u)).bits == 0x3f80);  // tie -> even
  CHECK(bfloat16(f32_from_bits(0x3f818000u)).bits == 0x3f82);  // tie -> even (up)
  CHECK(bfloat16(f32_from_bits(0x3f808001u)).bits == 0x3f81);
  CHECK(bfloat16(std::numeric_limits<float>::max()).bits == 0x7f80);  // above the last midpoint: overflow
  CHECK(bfloat16(f32_from_bits(0x7f7f7fffu)).bits == 0x7f7f);
  CHECK(bfloat16(f32_from_bits(0x00008000u)).bits == 0x0000);  // subnormal tie -> even 0
  CHECK(bfloat16(f32_from_bits(0x00018000u)).bits == 0x0002);
  CHECK(bfloat16(-0.0f).bits == 0x8000);
  CHECK(bfloat16(-HUGE_VALF).bits == 0xff80);
}

TEST_CASE("bfloat16: NaN stays NaN even with its payload only in the dropped low bits") {
  for (std::uint32_t payload : {0x000001u, 0x00ffffu, 0x008000u, 0x010000u, 0x400000u, 0x7fffffu}) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      const bfloat16 h(f32_from_bits(sign | 0x7f800000u | payload));
      CHECK(ember::isnan(h));
      CHECK(ember::signbit(h) == (sign != 0));
      CHECK(std::isnan(static_cast<float>(h)));
    }
  }
}

// ============================================================================================ fastmath

// The bounds asserted here are the maxima of exhaustive runs over all 2^32 inputs (with and without FMA; see the
// table in fastmath.hpp), rounded up to the next half ulp.

TEST_CASE("fastmath: exp and log, max ulp over the whole float range") {
  auto f_exp = [](float x) { return fm::exp(x); };
  auto f_log = [](float x) { return fm::log(x); };
  auto r_exp = [](double x) { return std::exp(x); };
  auto r_log = [](double x) { return std::log(x); };
  EMBER_CHECK_ULP(sweep_all(f_exp, r_exp), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_exp, r_exp, 0.0625f, 89.0f), 1.0);  // the non-trivial part, densely
  EMBER_CHECK_ULP(sweep_range(f_exp, r_exp, -0.0625f, -88.0f), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_exp, r_exp, -87.0f, -104.0f), 1.0);  // subnormal results
  EMBER_CHECK_ULP(sweep_all(f_log, r_log), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_log, r_log, 0.5f, 2.0f), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_log, r_log, 0.0f, 1.2e-38f), 1.0);  // subnormal arguments
}

TEST_CASE("fastmath: expm1, log1p, tanh, erf, sigmoid, max ulp over the whole float range") {
  auto f_expm1 = [](float x) { return fm::expm1(x); };
  auto r_expm1 = [](double x) { return std::expm1(x); };
  EMBER_CHECK_ULP(sweep_all(f_expm1, r_expm1), 1.5);
  EMBER_CHECK_ULP(sweep_range(f_expm1, r_expm1, 0.25f, 1.5f), 1.5);
  EMBER_CHECK_ULP(sweep_range(f_expm1, r_expm1, -0.25f, -1.5f), 1.5);

  auto f_log1p = [](float x) { return fm::log1p(x); };
  auto r_log1p = [](double x) { return std::log1p(x); };
  EMBER_CHECK_ULP(sweep_all(f_log1p, r_log1p), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_log1p, r_log1p, -0.5f, -1.0f), 1.0);
  EMBER_CHECK_ULP(sweep_range(f_log1p, r_log1p, 0.25f, 2.0f), 1.0);

  auto f_tanh = [](float x) { return fm::tanh(x); };
  auto r_tanh = [](double x) { return std::tanh(x); };
  EMBER_CHECK_ULP(sweep_all(f_tanh, r_tanh), 1.5);
  EMBER_CHECK_ULP(sweep_range(f_tanh, r_tanh, 0.0625f, 4.0f), 1.5);

  auto f_erf = [](float x) { return fm::erf(x); };
  auto r_erf = [](double x) { return std::erf(x); };
  EMBER_CHECK_ULP(sweep_all(f_erf, r_erf), 1.5);
  EMBER_CHECK_ULP(sweep_range(f_erf, r_erf, 0.5f, 4.0f), 1.5);

  auto f_sig = [](float x) { return fm::sigmoid(x); };
  EMBER_CHECK_ULP(sweep_all(f_sig, sigmoid_ref), 2.0);
  EMBER_CHECK_ULP(sweep_range(f_sig, sigmoid_ref, -1.0f, -20.0f), 2.0);
}

TEST_CASE("fastmath: special values") {
  const float inf = HUGE_VALF, nan = std::numeric_limits<float>::quiet_NaN();
  const float dmin = std::numeric_limits<float>::denorm_min(), fmax = std::numeric_limits<float>::max();
  auto same = [](float a, float b) { return bits_of(a) == bits_of(b); };

  // exp
  CHECK(same(fm::exp(-inf), 0.0f));
  CHECK(fm::exp(inf) == inf);
  CHECK(std::isnan(fm::exp(nan)));
  CHECK(std::isnan(fm::exp(-nan)));
  CHECK(fm::exp(0.0f) == 1.0f);
  CHECK(fm::exp(-0.0f) == 1.0f);
  auto ulps = [](float y, double ref) { return ulp_error(y, ref); };
  CHECK(ulps(fm::exp(88.72283f), std::exp(static_cast<double>(88.72283f))) <= 1.0);  // near the largest finite result
  CHECK(fm::exp(88.72284f) == inf);                  // first overflow
  CHECK(fm::exp(fmax) == inf);
  CHECK(fm::exp(-fmax) == 0.0f);
  CHECK(ulps(fm::exp(-103.0f), std::exp(static_cast<double>(-103.0f))) <= 0.5);  // a subnormal result, rounded once
  CHECK(fm::exp(-103.972f) == dmin);
  CHECK(fm::exp(-104.0f) == 0.0f);
  CHECK(fm::exp(dmin) == 1.0f);

  // expm1
  CHECK(same(fm::expm1(-0.0f), -0.0f));
  CHECK(same(fm::expm1(0.0f), 0.0f));
  CHECK(same(fm::expm1(-dmin), -dmin));
  CHECK(fm::expm1(-inf) == -1.0f);
  CHECK(fm::expm1(-50.0f) == -1.0f);
  CHECK(fm::expm1(inf) == inf);
  CHECK(fm::expm1(89.0f) == inf);
  CHECK(std::isnan(fm::expm1(nan)));
  CHECK(fm::expm1(1e-10f) == 1e-10f);

  // log
  CHECK(fm::log(0.0f) == -inf);
  CHECK(fm::log(-0.0f) == -inf);
  CHECK(std::isnan(fm::log(-1.0f)));
  CHECK(std::isnan(fm::log(-dmin)));
  CHECK(std::isnan(fm::log(-inf)));
  CHECK(std::isnan(fm::log(nan)));
  CHECK(fm::log(inf) == inf);
  CHECK(same(fm::log(1.0f), 0.0f));
  CHECK(ulps(fm::log(dmin), std::log(static_cast<double>(dmin))) <= 1.0);  // -103.28
  CHECK(ulps(fm::log(fmax), std::log(static_cast<double>(fmax))) <= 1.0);

  // log1p
  CHECK(fm::log1p(-1.0f) == -inf);
  CHECK(std::isnan(fm::log1p(-1.0000001f)));
  CHECK(std::isnan(fm::log1p(-inf)));
  CHECK(std::isnan(fm::log1p(nan)));
  CHECK(fm::log1p(inf) == inf);
  CHECK(same(fm::log1p(-0.0f), -0.0f));
  CHECK(same(fm::log1p(dmin), dmin));
  CHECK(fm::log1p(1e-10f) == 1e-10f);
  CHECK(ulps(fm::log1p(fmax), std::log1p(static_cast<double>(fmax))) <= 1.0);

  // tanh
  CHECK(fm::tanh(inf) == 1.0f);
  CHECK(fm::tanh(-inf) == -1.0f);
  CHECK(fm::tanh(9.1f) == 1.0f);
  CHECK(fm::tanh(-1e30f) == -1.0f);
  CHECK(same(fm::tanh(-0.0f), -0.0f));
  CHECK(same(fm::tanh(dmin), dmin));
  CHECK(std::isnan(fm::tanh(nan)));
  CHECK(std::isnan(fm::tanh(-nan)));

  // erf
  CHECK(fm::erf(inf) == 1.0f);
  CHECK(fm::erf(-inf) == -1.0f);
  CHECK(fm::erf(4.0f) == 1.0f);
  CHECK(same(fm::erf(-0.0f), -0.0f));
  CHECK(std::isnan(fm::erf(nan)));
  CHECK(ulps(fm::erf(-dmin), std::erf(-static_cast<double>(dmin))) <= 1.0);

  // sigmoid
  CHECK(fm::sigmoid(inf) == 1.0f);
  CHECK(same(fm::sigmoid(-inf), 0.0f));
  CHECK(fm::sigmoid(0.0f) == 0.5f);
  CHECK(fm::sigmoid(-100.0f) > 0.0f);  // a subnormal, not 0
  CHECK(ulps(fm::sigmoid(-100.0f), sigmoid_ref(-100.0)) <= 1.0);
  CHECK(fm::sigmoid(-200.0f) == 0.0f);
  CHECK(fm::sigmoid(100.0f) == 1.0f);
  CHECK(std::isnan(fm::sigmoid(nan)));
}

TEST_CASE("fastmath: double overloads forward to libm; half goes through float") {
  static_assert(std::is_same_v<decltype(fm::exp(1.0)), double>);
  static_assert(std::is_same_v<decltype(fm::exp(1.0f)), float>);
  static_assert(std::is_same_v<decltype(fm::tanh(half(1.0f))), float>);
  CHECK(fm::exp(1.0) == std::exp(1.0));
  CHECK(fm::expm1(1e-3) == std::expm1(1e-3));
  CHECK(fm::log(3.0) == std::log(3.0));
  CHECK(fm::log1p(1e-3) == std::log1p(1e-3));
  CHECK(fm::tanh(0.3) == std::tanh(0.3));
  CHECK(fm::erf(0.3) == std::erf(0.3));
  CHECK(fm::sigmoid(-800.0) == 0.0);
  CHECK(fm::sigmoid(2.0) == doctest::Approx(1.0 / (1.0 + std::exp(-2.0))).epsilon(1e-15));
}

// ------------------------------------------------------------------------------ bool arithmetic

// Assigning into an existing Tensor<bool> instantiates every compound-assignment form, Mul<bool> among them; an
// int product turned back into bool warned under -Wint-in-bool-context (-Werror in CI). bool * bool is the
// logical and, bool + bool the logical or, as in PyTorch.
TEST_CASE("bool tensors: a comparison assigned into an existing Tensor<bool>; *= is and, += is or") {
  const ember::Tensor<float> a = ember_test::fvec({1, 2, 3, 4}), b = ember_test::fvec({2, 2, 1, 5});
  ember::Tensor<bool> m = ember::empty<bool>({4});
  m = a > b;
  CHECK(m.to_vector() == std::vector<bool>{false, false, true, false});
  m += a == b;
  CHECK(m.to_vector() == std::vector<bool>{false, true, true, false});
  m *= a != b;
  CHECK(m.to_vector() == std::vector<bool>{false, false, true, false});
  m *= a >= b;
  CHECK(m.to_vector() == std::vector<bool>{false, false, true, false});
}

// ------------------------------------------------------------------------------ gradients at the edges (PyTorch)
// tests/fixtures/edges.txt (gen_edges.py, PyTorch 2.15): inputs, upstream gradient, result and gradients of each
// case. Non-finite values are stored as 0 plus a `.special` record (1 NaN, 2 +inf, 3 -inf). Each case runs in
// double and in float; NaN and ±inf must sit exactly where PyTorch has them, finite values must be close.

namespace {

using ember::Dims;
using ember::Tensor;

ember::Tensor<double> edge_record(const ember_test::Fixtures& fx, const std::string& name) {
  Tensor<double> v = fx[name];
  const Tensor<double> sp = fx[name + ".special"];
  REQUIRE(sp.shape() == v.shape());
  for (std::int64_t i = 0; i < v.numel(); ++i) {
    const double c = sp.data()[i];
    if (c == 1) v.data()[i] = std::numeric_limits<double>::quiet_NaN();
    else if (c == 2) v.data()[i] = std::numeric_limits<double>::infinity();
    else if (c == 3) v.data()[i] = -std::numeric_limits<double>::infinity();
    else REQUIRE(c == 0);
  }
  return v;
}

template <class T>
Tensor<T> to_dtype(const Tensor<double>& x) {
  Tensor<T> r = ember::empty<T>(x.shape());
  for (std::int64_t i = 0; i < x.numel(); ++i) r.data()[i] = T(x.data()[i]);
  return r;
}

/// NaN and ±inf exactly where `want` has them; finite elements within atol + rtol * |want|.
template <class T>
void check_edge(const std::string& what, const Tensor<T>& got, const Tensor<double>& want, double rtol, double atol) {
  REQUIRE(got.defined());
  REQUIRE_MESSAGE(got.shape() == want.shape(), what << ": shape " << got.shape().str() << ", want "
                                                    << want.shape().str());
  const Tensor<T> g = got.contiguous();
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double x = double(g.data()[i]), w = want.data()[i];
    INFO(what << " element " << i << ": got " << x << ", want " << w);
    if (std::isnan(w)) CHECK(std::isnan(x));
    else if (std::isinf(w)) CHECK(x == w);
    else CHECK((std::isfinite(x) && std::fabs(x - w) <= atol + rtol * std::fabs(w)));
  }
}

template <class T>
using EdgeFn = std::function<Tensor<T>(const std::vector<Tensor<T>>&)>;

/// The cases of gen_edges.py, by name: the same op on the ember side.
template <class T>
std::vector<std::pair<std::string, EdgeFn<T>>> edge_cases() {
  using V = std::vector<Tensor<T>>;
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<std::string, EdgeFn<T>>> c;
  auto add = [&](std::string name, EdgeFn<T> f) { c.emplace_back(std::move(name), std::move(f)); };
  add("clamp.0.1", [](const V& x) { return Tensor<T>(ember::clamp(x[0], 0.0, 1.0)); });
  add("clamp.eq", [](const V& x) { return Tensor<T>(ember::clamp(x[0], 1.0, 1.0)); });
  add("clamp_min.0", [](const V& x) { return Tensor<T>(ember::clamp_min(x[0], 0.0)); });
  add("clamp_max.1", [](const V& x) { return Tensor<T>(ember::clamp_max(x[0], 1.0)); });
  add("clamp.inexact", [](const V& x) { return Tensor<T>(ember::clamp(x[0], 0.1, 0.7)); });
  add("maximum", [](const V& x) { return Tensor<T>(ember::maximum(x[0], x[1])); });
  add("minimum", [](const V& x) { return Tensor<T>(ember::minimum(x[0], x[1])); });
  for (const char* n : {"max.all.nan", "max.all.2nan", "max.all.ties", "max.all.inf"})
    add(n, [](const V& x) { return ember::max(x[0]); });
  for (const char* n : {"min.all.nan", "min.all.ties"}) add(n, [](const V& x) { return ember::min(x[0]); });
  for (const char* n : {"max.dim1.nan", "max.dim1.ties"}) add(n, [](const V& x) { return ember::max(x[0], 1); });
  for (const char* n : {"min.dim1.nan", "min.dim1.ties"}) add(n, [](const V& x) { return ember::min(x[0], 1); });
  add("max.dim0.nan", [](const V& x) { return ember::max(x[0], 0); });
  add("max.dim01.ties", [](const V& x) { return ember::max(x[0], Dims{0, 1}); });
  add("relu", [](const V& x) { return Tensor<T>(ember::relu(x[0])); });
  for (const char* n : {"prod.all.nan", "prod.all.nan0", "prod.all.nan00", "prod.all.inf", "prod.all.inf0",
                        "prod.all.plain", "prod.all.0", "prod.all.00"})
    add(n, [](const V& x) { return ember::prod(x[0]); });
  for (const char* n : {"prod.dim1.nozero", "prod.dim1.zero"}) add(n, [](const V& x) { return ember::prod(x[0], 1); });
  add("prod.dim0.zero", [](const V& x) { return ember::prod(x[0], 0); });
  add("pow", [](const V& x) { return Tensor<T>(ember::pow(x[0], x[1])); });
  for (double e : {0.0, 1.0, 2.0, 3.0, 0.5, -1.0, -0.5}) {
    std::ostringstream n;
    n << "pow.scalar_exp." << e;
    add(n.str(), [e](const V& x) { return Tensor<T>(ember::pow(x[0], T(e))); });
  }
  for (double b : {0.0, 2.0, -2.0}) {
    std::ostringstream n;
    n << "pow.scalar_base." << b;
    add(n.str(), [b](const V& x) { return Tensor<T>(ember::pow(T(b), x[0])); });
  }
  for (int corr : {0, 1}) {
    add("std.dim1.c" + std::to_string(corr), [corr](const V& x) { return ember::std_dev(x[0], 1, corr); });
    add("var.dim1.c" + std::to_string(corr), [corr](const V& x) { return ember::var(x[0], 1, corr); });
  }
  add("std.all.const", [](const V& x) { return ember::std_dev(x[0]); });
  add("std.one.c0", [](const V& x) { return ember::std_dev(x[0], Dims{}, 0); });
  add("std.one.c1", [](const V& x) { return ember::std_dev(x[0], Dims{}, 1); });
  add("var.one.c1", [](const V& x) { return ember::var(x[0], Dims{}, 1); });
  for (double p : {2.0, 1.0, inf, 3.0, 1.5, 0.5}) {
    std::ostringstream n;
    n << "norm.p";
    if (p == inf) n << "inf";
    else n << p;
    add(n.str() + ".zero", [p](const V& x) { return ember::norm(x[0], p); });
    add(n.str() + ".dim1", [p](const V& x) { return ember::norm(x[0], p, 1); });
  }
  add("norm.p2.nan", [](const V& x) { return ember::norm(x[0]); });
#define EMBER_EDGE_SWEEP(NAME, ...) \
  add("sweep." NAME, [](const V& x) { return Tensor<T>(__VA_ARGS__); });
  EMBER_EDGE_SWEEP("neg", ember::neg(x[0]))
  EMBER_EDGE_SWEEP("abs", ember::abs(x[0]))
  EMBER_EDGE_SWEEP("exp", ember::exp(x[0]))
  EMBER_EDGE_SWEEP("expm1", ember::expm1(x[0]))
  EMBER_EDGE_SWEEP("log", ember::log(x[0]))
  EMBER_EDGE_SWEEP("log1p", ember::log1p(x[0]))
  EMBER_EDGE_SWEEP("sqrt", ember::sqrt(x[0]))
  EMBER_EDGE_SWEEP("rsqrt", ember::rsqrt(x[0]))
  EMBER_EDGE_SWEEP("square", ember::square(x[0]))
  EMBER_EDGE_SWEEP("sin", ember::sin(x[0]))
  EMBER_EDGE_SWEEP("cos", ember::cos(x[0]))
  EMBER_EDGE_SWEEP("tanh", ember::tanh(x[0]))
  EMBER_EDGE_SWEEP("sigmoid", ember::sigmoid(x[0]))
  EMBER_EDGE_SWEEP("silu", ember::silu(x[0]))
  EMBER_EDGE_SWEEP("softplus", ember::softplus(x[0]))
  EMBER_EDGE_SWEEP("gelu", ember::gelu(x[0]))
  EMBER_EDGE_SWEEP("gelu_tanh", ember::gelu_tanh(x[0]))
  EMBER_EDGE_SWEEP("leaky_relu", ember::leaky_relu(x[0], 0.1))
  EMBER_EDGE_SWEEP("elu", ember::elu(x[0], 0.5))
#undef EMBER_EDGE_SWEEP
  return c;
}

template <class T>
void run_edge_cases(double rtol, double atol) {
  static const ember_test::Fixtures fx("edges.txt");
  const auto cases = edge_cases<T>();
  REQUIRE(double(cases.size()) == fx["edges.count"].data()[0]);
  for (const auto& [name, f] : cases) {
    SUBCASE(name.c_str()) {
      std::vector<Tensor<T>> xs;
      for (int i = 0; i < 2; ++i) {
        if (i == 1 && name != "maximum" && name != "minimum" && name != "pow") break;
        xs.push_back(to_dtype<T>(edge_record(fx, name + ".x" + std::to_string(i))).requires_grad_());
      }
      const Tensor<T> y = f(xs);
      check_edge(name + " result", y, edge_record(fx, name + ".y"), rtol, atol);
      y.backward(to_dtype<T>(edge_record(fx, name + ".g")));
      for (std::size_t i = 0; i < xs.size(); ++i)
        check_edge(name + " gradient " + std::to_string(i), xs[i].grad(),
                   edge_record(fx, name + ".dx" + std::to_string(i)), rtol, atol);
    }
  }
}

}  // namespace

TEST_CASE("edges: results and gradients at bounds, NaN, ±inf and zeros match PyTorch (double)") {
  run_edge_cases<double>(1e-12, 1e-14);
}

TEST_CASE("edges: results and gradients at bounds, NaN, ±inf and zeros match PyTorch (float)") {
  run_edge_cases<float>(1e-5, 1e-6);
}
