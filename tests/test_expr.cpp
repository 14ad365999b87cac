// Fused element-wise expressions (expr/, evaluated by ops/elementwise.hpp and cpu/executor.hpp), checked element by
// element against references computed independently in double precision with <cmath> and plain loops, and the
// multi-output pass the optimizers and the scaler run (ops::assign_multi). (Reductions over expressions are in
// test_reduce.cpp: one translation unit for both took over two minutes to compile at -O2.)
//
// Tolerances. Results are float; the reference is the exact function value in double.
//  * + - * / and sqrt of floats must be correctly rounded: float(double op) is exact for them (double rounding
//    through double is innocuous for these ops), so they are compared for equality.
//  * Everything else (the vectorisable exp/log/tanh/erf/sigmoid, and composites like gelu that chain several
//    float operations) is compared with |got - ref| <= kAtol + kRtol * |ref|, kRtol = 1e-5 (~ 80 ulp of float; the
//    elementary functions themselves are <= 2 ulp, composites lose a few more ulp and gelu's 1 + erf(x) cancels
//    for negative x) and kAtol = 1e-6 (for results that cross or approach zero).
//  * NaN must give NaN and infinities must match exactly.
//
// Compile time: every float expression materialised through the public API (`Tensor<float> y = expr;`) also
// instantiates its fused backward kernel, which costs about as much to compile as the forward loop. The op sweeps
// below therefore evaluate through the CPU executor directly (run_expr: the same cpu::assign that materialising
// calls, minus recording the autograd node); the tests of assignment, views, aliasing and broadcasting go through
// the public API.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using namespace ember_test;

namespace {

constexpr double kRtol = 1e-5, kAtol = 1e-6;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();


bool close(double got, double ref, double rtol = kRtol, double atol = kAtol) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::fabs(ref) > double(std::numeric_limits<float>::max())) ref = double(float(ref));  // overflows in float
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= atol + rtol * std::fabs(ref);
}



/// A spread of arguments: a dense grid over [-8, 8], small and large magnitudes, signed zeros, infinities, NaN.
Tensor<float> general_inputs() {
  std::vector<float> v;
  for (int i = -800; i <= 800; ++i) v.push_back(float(i) / 100.f);
  for (float s : {1.f, -1.f})
    for (float m : {1e-7f, 1e-4f, 0.3f, 12.5f, 19.9f, 20.1f, 30.f, 55.5f, 80.f, kInfF}) v.push_back(s * m);
  v.push_back(-0.f);
  v.push_back(kNaNF);
  return fvec(v);
}
/// Non-negative arguments, log-spaced from 1e-6 to 1e6, plus 0 and +inf.
Tensor<float> positive_inputs() {
  std::vector<float> v{0.f, kInfF};
  for (int i = 0; i <= 600; ++i) v.push_back(float(std::pow(10.0, -6.0 + i / 50.0)));
  return fvec(v);
}

/// y = make(x) for every element against ref(double(x)). `make` receives an lvalue tensor.
template <class Make, class Ref>
void check_unary(const char* name, const Tensor<float>& x, Make make, Ref ref, double rtol = kRtol,
                 double atol = kAtol) {
  Tensor<float> y = run_expr(make(x));
  REQUIRE(y.shape() == x.shape());
  int bad = 0;
  for (i64 i = 0; i < x.numel(); ++i) {
    const float xi = rd(x, i), g = rd(y, i);
    const double r = ref(double(xi));
    if (!close(g, r, rtol, atol) && bad++ < 5)
      FAIL_CHECK(name << "(" << xi << ") = " << g << ", expected " << r << " (diff " << double(g) - r << ")");
  }
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " mismatches");
}

/// z = make(a, b) (same shapes) against ref(double(a), double(b)).
template <class Make, class Ref>
void check_binary(const char* name, const Tensor<float>& a, const Tensor<float>& b, Make make, Ref ref,
                  double rtol = kRtol, double atol = kAtol) {
  Tensor<float> z = run_expr(make(a, b));
  REQUIRE(z.shape() == a.shape());
  int bad = 0;
  for (i64 i = 0; i < a.numel(); ++i) {
    const float ai = rd(a, i), bi = rd(b, i), g = rd(z, i);
    const double r = ref(double(ai), double(bi));
    if (!close(g, r, rtol, atol) && bad++ < 5) FAIL_CHECK(name << "(" << ai << ", " << bi << ") = " << g << ", expected " << r);
  }
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " mismatches");
}

/// A bool-valued expression against a predicate.
template <class Make, class Ref>
void check_pred(const char* name, const Tensor<float>& a, const Tensor<float>& b, Make make, Ref ref) {
  Tensor<bool> z = run_expr(make(a, b));
  REQUIRE(z.shape() == a.shape());
  int bad = 0;
  for (i64 i = 0; i < a.numel(); ++i) {
    const float ai = rd(a, i), bi = rd(b, i);
    if (rd(z, i) != ref(ai, bi) && bad++ < 5) FAIL_CHECK(name << "(" << ai << ", " << bi << ") = " << rd(z, i));
  }
  CHECK_MESSAGE(bad == 0, name << ": " << bad << " mismatches");
}


double relu_ref(double v) { return v < 0 ? 0.0 : v; }  // NaN passes
double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

// =========================================================================================== arithmetic ops

TEST_CASE("+ - * / : tensor-tensor, tensor-scalar, scalar-tensor are correctly rounded") {
  Generator g(1);
  Tensor<float> a = run_expr(randn<float>({3000}, g) * 10.f);
  Tensor<float> b = run_expr(randn<float>({3000}, g) * 10.f);
  Tensor<float> c = run_expr(rand<float>({3000}, g) + 0.5f);  // safe divisor
  // exact: the float result must equal the correctly rounded double result
  const double ex = 0, ea = 0;
  check_binary("add", a, b, [](auto& x, auto& y) { return x + y; }, [](double x, double y) { return double(float(x + y)); }, ex, ea);
  check_binary("sub", a, b, [](auto& x, auto& y) { return x - y; }, [](double x, double y) { return double(float(x - y)); }, ex, ea);
  check_binary("mul", a, b, [](auto& x, auto& y) { return x * y; }, [](double x, double y) { return double(float(x * y)); }, ex, ea);
  check_binary("div", a, c, [](auto& x, auto& y) { return x / y; }, [](double x, double y) { return double(float(x / y)); }, ex, ea);
  check_unary("x + 2.5", a, [](auto& x) { return x + 2.5f; }, [](double x) { return double(float(x + 2.5)); }, ex, ea);
  check_unary("x - 2.5", a, [](auto& x) { return x - 2.5f; }, [](double x) { return double(float(x - 2.5)); }, ex, ea);
  check_unary("x * 0.3", a, [](auto& x) { return x * 0.3f; }, [](double x) { return double(float(x * double(0.3f))); }, ex, ea);
  check_unary("x / 3", a, [](auto& x) { return x / 3.f; }, [](double x) { return double(float(x / 3)); }, ex, ea);
  check_unary("2.5 + x", a, [](auto& x) { return 2.5f + x; }, [](double x) { return double(float(2.5 + x)); }, ex, ea);
  check_unary("2.5 - x", a, [](auto& x) { return 2.5f - x; }, [](double x) { return double(float(2.5 - x)); }, ex, ea);
  check_unary("0.3 * x", a, [](auto& x) { return 0.3f * x; }, [](double x) { return double(float(double(0.3f) * x)); }, ex, ea);
  check_unary("3 / c", c, [](auto& x) { return 3.f / x; }, [](double x) { return double(float(3 / x)); }, ex, ea);
  // integer scalars with a float tensor, double scalars (converted to the tensor's type)
  check_unary("x * 2 (int)", a, [](auto& x) { return x * 2; }, [](double x) { return 2 * x; }, ex, ea);
  check_unary("x + 0.1 (double)", a, [](auto& x) { return x + 0.1; }, [](double x) { return double(float(x + double(0.1f))); }, ex, ea);
  // division by zero follows IEEE
  Tensor<float> num = fvec({1.f, -1.f, 0.f});
  Tensor<float> q = num / 0.f;  // (through the public API)
  CHECK(q.data()[0] == kInfF);
  CHECK(q.data()[1] == -kInfF);
  CHECK(std::isnan(q.data()[2]));
}

TEST_CASE("integer and double tensors: arithmetic in their own type") {
  Tensor<i64> a = tensor<i64>({-7, 0, 5, 1000000000000});
  Tensor<i64> b = tensor<i64>({3, 4, -2, 3});
  Tensor<i64> s = a + b * 2 - 1;
  CHECK(s.to_vector() == std::vector<i64>{-2, 7, 0, 1000000000005});
  Tensor<i64> m = a * b;
  CHECK(m.to_vector() == std::vector<i64>{-21, 0, -10, 3000000000000});
  Tensor<i64> n = -a;
  CHECK(n.to_vector() == std::vector<i64>{7, 0, -5, -1000000000000});
  Tensor<i64> ab = abs(a);
  CHECK(ab.to_vector() == std::vector<i64>{7, 0, 5, 1000000000000});
  Tensor<i64> mx = maximum(a, b);
  CHECK(mx.to_vector() == std::vector<i64>{3, 4, 5, 1000000000000});
  Tensor<std::int32_t> i32 = tensor<std::int32_t>({1, 2, 3});
  Tensor<std::int32_t> i32b = i32 * i32 + 1;
  CHECK(i32b.to_vector() == std::vector<std::int32_t>{2, 5, 10});
  Tensor<double> d = tensor<double>({0.1, 0.2});
  Tensor<double> dd = run_expr(d + d * 3.0);
  CHECK(dd.data()[0] == 0.1 + 0.1 * 3.0);
  Tensor<double> de = run_expr(exp(d));
  CHECK(de.data()[1] == std::exp(0.2));  // double math forwards to libm
}

// =============================================================================================== unary ops

TEST_CASE("every unary op against a double reference (including NaN, infinities, signed zeros)") {
  const Tensor<float> x = general_inputs();
  const Tensor<float> p = positive_inputs();
  const double inf = HUGE_VAL;
  check_unary("neg", x, [](auto& t) { return neg(t); }, [](double v) { return -v; }, 0, 0);
  check_unary("unary -", x, [](auto& t) { return -t; }, [](double v) { return -v; }, 0, 0);
  check_unary("abs", x, [](auto& t) { return abs(t); }, [](double v) { return std::fabs(v); }, 0, 0);
  // sign keeps NaN (as NumPy); +-0 give 0
  check_unary("sign", x, [](auto& t) { return sign(t); },
              [](double v) { return std::isnan(v) ? v : double((v > 0) - (v < 0)); }, 0, 0);
  check_unary("square", x, [](auto& t) { return square(t); }, [](double v) { return double(float(v * v)); }, 0, 0);
  check_unary("exp", x, [](auto& t) { return exp(t); }, [](double v) { return std::exp(v); });
  check_unary("expm1", x, [](auto& t) { return expm1(t); }, [](double v) { return std::expm1(v); });
  // log/sqrt/rsqrt over the general inputs: negative arguments give NaN, log(0) = -inf, rsqrt(-0) = -inf
  check_unary("log", x, [](auto& t) { return log(t); },
              [&](double v) { return v > 0 ? std::log(v) : v == 0 ? -inf : kNaN; });
  check_unary("log (wide range)", p, [](auto& t) { return log(t); }, [](double v) { return std::log(v); });
  check_unary("log1p", x, [](auto& t) { return log1p(t); },
              [&](double v) { return v > -1 ? std::log1p(v) : v == -1 ? -inf : kNaN; });
  check_unary("log1p (wide range)", p, [](auto& t) { return log1p(t); }, [](double v) { return std::log1p(v); });
  check_unary("sqrt", x, [](auto& t) { return sqrt(t); },
              [](double v) { return v >= 0 ? double(float(std::sqrt(v))) : kNaN; }, 0, 0);
  check_unary("sqrt (wide range)", p, [](auto& t) { return sqrt(t); }, [](double v) { return double(float(std::sqrt(v))); }, 0, 0);
  check_unary("rsqrt", x, [](auto& t) { return rsqrt(t); }, [](double v) { return v >= 0 ? 1 / std::sqrt(v) : kNaN; },
              3e-7, 0);
  check_unary("rsqrt (wide range)", p, [](auto& t) { return rsqrt(t); }, [](double v) { return 1 / std::sqrt(v); }, 3e-7, 0);
  check_unary("sin", x, [](auto& t) { return sin(t); }, [](double v) { return std::sin(v); });
  check_unary("cos", x, [](auto& t) { return cos(t); }, [](double v) { return std::cos(v); });
  check_unary("tanh", x, [](auto& t) { return tanh(t); }, [](double v) { return std::tanh(v); });
  check_unary("sigmoid", x, [](auto& t) { return sigmoid(t); }, sigmoid_ref);
  // PyTorch's relu is clamp_min(x, 0): NaN propagates
  check_unary("relu", x, [](auto& t) { return relu(t); }, relu_ref, 0, 0);
  check_unary("leaky_relu(0.2)", x, [](auto& t) { return leaky_relu(t, 0.2); },
              [](double v) { return v > 0 ? v : double(float(double(0.2f) * v)); }, 0, 0);
  check_unary("leaky_relu()", x, [](auto& t) { return leaky_relu(t); },
              [](double v) { return v > 0 ? v : double(float(double(0.01f) * v)); }, 0, 0);
  check_unary("elu(1.5)", x, [](auto& t) { return elu(t, 1.5); }, [](double v) { return v > 0 ? v : 1.5 * std::expm1(v); });
  check_unary("elu()", x, [](auto& t) { return elu(t); }, [](double v) { return v > 0 ? v : std::expm1(v); });
  // (gelu, gelu_tanh and silu of -inf are -inf * 0 = NaN by their definitions, in the reference too)
  check_unary("gelu", x, [](auto& t) { return gelu(t); }, gelu_ref);
  check_unary("gelu_tanh", x, [](auto& t) { return gelu_tanh(t); }, gelu_tanh_ref);
  check_unary("silu", x, [](auto& t) { return silu(t); }, [](double v) { return v * sigmoid_ref(v); });
  check_unary("softplus", x, [](auto& t) { return softplus(t); }, [](double v) { return std::log1p(std::exp(v)); });
  check_unary("clamp(-1, 2)", x, [](auto& t) { return clamp(t, -1.0, 2.0); },
              [](double v) { return std::min(std::max(v, -1.0), 2.0); }, 0, 0);  // NaN passes through std::max/min
  check_unary("clamp_min(0.5)", x, [](auto& t) { return clamp_min(t, 0.5); }, [](double v) { return std::max(v, 0.5); }, 0, 0);
  check_unary("clamp_max(-0.5)", x, [](auto& t) { return clamp_max(t, -0.5); }, [](double v) { return std::min(v, -0.5); }, 0, 0);
  check_unary("pow(x, 3)", x, [](auto& t) { return pow(t, 3.f); }, [](double v) { return v * v * v; });
  check_unary("pow(p, 0.5)", p, [](auto& t) { return pow(t, 0.5f); }, [](double v) { return std::sqrt(v); });
  check_unary("pow(p, -1.5)", p, [](auto& t) { return pow(t, -1.5f); }, [](double v) { return std::pow(v, -1.5); });
  check_unary("pow(2, x)", x, [](auto& t) { return pow(2.f, t); }, [](double v) { return std::exp2(v); });
  CHECK_THROWS_AS(clamp(x, 2.0, 1.0), ember::Error);
  // The public path (materialising, which also records autograd) gives the same values as the executor.
  Tensor<float> pub = gelu(x);
  CHECK(bitwise_equal(pub, run_expr(gelu(x))));
}

TEST_CASE("pow(tensor, tensor), maximum, minimum") {
  Generator g(2);
  Tensor<float> base = run_expr(rand<float>({2000}, g) * 4.f + 0.01f);
  Tensor<float> ex = run_expr(randn<float>({2000}, g) * 3.f);
  check_binary("pow", base, ex, [](auto& a, auto& b) { return pow(a, b); }, [](double a, double b) { return std::pow(a, b); });
  Tensor<float> a = randn<float>({2000}, g), b = randn<float>({2000}, g);
  b.slice(0, 0, 100).copy_(a.slice(0, 0, 100));  // ties
  check_binary("maximum", a, b, [](auto& x, auto& y) { return maximum(x, y); }, [](double x, double y) { return std::max(x, y); }, 0, 0);
  check_binary("minimum", a, b, [](auto& x, auto& y) { return minimum(x, y); }, [](double x, double y) { return std::min(x, y); }, 0, 0);
  check_unary("maximum(x, 0.25)", a, [](auto& x) { return maximum(x, 0.25f); }, [](double x) { return std::max(x, 0.25); }, 0, 0);
  check_unary("minimum(0.25, x)", a, [](auto& x) { return minimum(0.25f, x); }, [](double x) { return std::min(x, 0.25); }, 0, 0);
  // NaN on either side propagates (torch.maximum / torch.minimum)
  Tensor<float> n1 = fvec({kNaNF, 1.f, kNaNF}), n2 = fvec({1.f, kNaNF, kNaNF});
  Tensor<float> mx = run_expr(maximum(n1, n2)), mn = run_expr(minimum(n1, n2));
  for (int i = 0; i < 3; ++i) {
    CHECK(std::isnan(mx.data()[i]));
    CHECK(std::isnan(mn.data()[i]));
  }
}

TEST_CASE("where: tensor and scalar branches, broadcast condition") {
  Tensor<float> x = fvec({-2.f, -0.5f, 0.f, 0.5f, 2.f});
  Tensor<float> y = fvec({10.f, 20.f, 30.f, 40.f, 50.f});
  Tensor<float> w = run_expr(where(x > 0.f, x, y));
  CHECK(w.to_vector() == std::vector<float>{10, 20, 30, 0.5f, 2});
  Tensor<float> w1 = run_expr(where(x > 0.f, 1.f, y));
  CHECK(w1.to_vector() == std::vector<float>{10, 20, 30, 1, 1});
  Tensor<float> w2 = run_expr(where(x > 0.f, x, -1.f));
  CHECK(w2.to_vector() == std::vector<float>{-1, -1, -1, 0.5f, 2});
  Tensor<bool> c = from_vector<bool>({true, false, true, false, true});
  Tensor<float> w3 = run_expr(where(c, x * 2.f, y + 1.f));
  CHECK(w3.to_vector() == std::vector<float>{-4, 21, 0, 41, 4});
  // (3, 1) condition, (1, 4) and (4) branches -> (3, 4)
  Tensor<bool> col = from_vector<bool>({true, false, true}, Shape{3, 1});
  Tensor<float> r = arange<float>(4).view({1, 4}), s = run_expr(arange<float>(4) * -1.f);
  Tensor<float> w4 = run_expr(where(col, r, s));
  REQUIRE(w4.shape() == Shape{3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(w4.at(i, j) == (i != 1 ? float(j) : -float(j)));
  // NaN-safe selection: the unselected branch does not leak
  Tensor<float> z = fvec({0.f, 4.f});
  Tensor<float> safe = run_expr(where(z > 0.f, sqrt(z), 0.f));
  CHECK(safe.to_vector() == std::vector<float>{0, 2});
  Tensor<i64> wi = where(x > 0.f, tensor<i64>({1, 2, 3, 4, 5}), i64(0));
  CHECK(wi.to_vector() == std::vector<i64>{0, 0, 0, 4, 5});
  CHECK_THROWS_AS((void)run_expr(where(col, r, fvec({1.f, 2.f}))), ember::Error);
}

// ====================================================================================== comparisons and logic

TEST_CASE("comparisons produce Tensor<bool>, operators and named functions alike") {
  Tensor<float> a = fvec({1.f, 2.f, 3.f, kNaNF, -0.f, kInfF});
  Tensor<float> b = fvec({2.f, 2.f, 1.f, 1.f, 0.f, kInfF});
  check_pred("<", a, b, [](auto& x, auto& y) { return x < y; }, [](float x, float y) { return x < y; });
  check_pred("<=", a, b, [](auto& x, auto& y) { return x <= y; }, [](float x, float y) { return x <= y; });
  check_pred(">", a, b, [](auto& x, auto& y) { return x > y; }, [](float x, float y) { return x > y; });
  check_pred(">=", a, b, [](auto& x, auto& y) { return x >= y; }, [](float x, float y) { return x >= y; });
  check_pred("==", a, b, [](auto& x, auto& y) { return x == y; }, [](float x, float y) { return x == y; });
  check_pred("!=", a, b, [](auto& x, auto& y) { return x != y; }, [](float x, float y) { return x != y; });
  check_pred("lt", a, b, [](auto& x, auto& y) { return lt(x, y); }, [](float x, float y) { return x < y; });
  check_pred("le", a, b, [](auto& x, auto& y) { return le(x, y); }, [](float x, float y) { return x <= y; });
  check_pred("gt", a, b, [](auto& x, auto& y) { return gt(x, y); }, [](float x, float y) { return x > y; });
  check_pred("ge", a, b, [](auto& x, auto& y) { return ge(x, y); }, [](float x, float y) { return x >= y; });
  check_pred("eq", a, b, [](auto& x, auto& y) { return eq(x, y); }, [](float x, float y) { return x == y; });
  check_pred("ne", a, b, [](auto& x, auto& y) { return ne(x, y); }, [](float x, float y) { return x != y; });
  // with scalars on either side
  Tensor<bool> gt2 = a > 1.5f;
  CHECK(gt2.to_vector() == std::vector<bool>{false, true, true, false, false, true});
  Tensor<bool> lt2 = 1.5f < a;
  CHECK(lt2.to_vector() == gt2.to_vector());
  Tensor<bool> eq2 = a == 2.f;
  CHECK(eq2.to_vector() == std::vector<bool>{false, true, false, false, false, false});
  // integer comparisons
  Tensor<i64> i = tensor<i64>({-1, 0, 1});
  Tensor<bool> ip = i >= i64(0);
  CHECK(ip.to_vector() == std::vector<bool>{false, true, true});
  // comparisons of expressions, broadcast
  Tensor<bool> m = (a * 2.f) > fvec({3.f}).view({1});
  CHECK(m.to_vector() == std::vector<bool>{false, true, true, false, false, true});
}

TEST_CASE("logical ops on bool and on numbers (nonzero is true)") {
  Tensor<bool> p = from_vector<bool>({true, true, false, false});
  Tensor<bool> q = from_vector<bool>({true, false, true, false});
  auto v = [](const Tensor<bool>& t) { return t.to_vector(); };
  CHECK(v(logical_and(p, q)) == std::vector<bool>{true, false, false, false});
  CHECK(v(logical_or(p, q)) == std::vector<bool>{true, true, true, false});
  CHECK(v(logical_xor(p, q)) == std::vector<bool>{false, true, true, false});
  CHECK(v(logical_not(p)) == std::vector<bool>{false, false, true, true});
  CHECK(v(p & q) == std::vector<bool>{true, false, false, false});
  CHECK(v(p | q) == std::vector<bool>{true, true, true, false});
  CHECK(v(p ^ q) == std::vector<bool>{false, true, true, false});
  CHECK(v(!p) == std::vector<bool>{false, false, true, true});
  CHECK(v(p & true) == std::vector<bool>{true, true, false, false});
  Tensor<float> x = fvec({0.f, 2.f, -0.f, kNaNF});
  Tensor<float> y = fvec({1.f, 0.f, 3.f, 0.f});
  CHECK(v(logical_and(x, y)) == std::vector<bool>{false, false, false, false});
  CHECK(v(logical_or(x, y)) == std::vector<bool>{true, true, true, true});  // NaN is nonzero
  CHECK(v(logical_not(x)) == std::vector<bool>{true, false, true, false});
  // combining comparisons: 0 < x < 3
  Tensor<float> r = fvec({-1.f, 0.5f, 2.f, 3.f, 4.f});
  CHECK(v((r > 0.f) & (r < 3.f)) == std::vector<bool>{false, true, true, false, false});
  CHECK(v(!((r > 0.f) | (r == -1.f))) == std::vector<bool>{false, false, false, false, false});
}

TEST_CASE("cast<T> converts inside the loop") {
  Tensor<float> x = fvec({-2.7f, -0.5f, 0.f, 0.5f, 2.7f, 1e10f});
  Tensor<i64> i = cast<i64>(x);  // truncation toward zero, as .to(torch.int64)
  CHECK(i.to_vector() == std::vector<i64>{-2, 0, 0, 0, 2, 10000000000});
  Tensor<double> d = run_expr(cast<double>(x));
  for (int k = 0; k < 6; ++k) CHECK(d.data()[k] == double(x.data()[k]));
  Tensor<bool> b = cast<bool>(x);
  CHECK(b.to_vector() == std::vector<bool>{true, true, false, true, true, true});
  Tensor<float> f = cast<float>(tensor<i64>({3, -4}));
  CHECK(f.to_vector() == std::vector<float>{3, -4});
  Tensor<float> fb = cast<float>(x > 0.f) * 2.f;
  CHECK(fb.to_vector() == std::vector<float>{0, 0, 0, 2, 2, 2});
  Tensor<float> mix = run_expr(cast<float>(tensor<i64>({1, 2, 3, 4, 5, 6})) / 4.f + x);  // 1/4 is exact
  for (int k = 0; k < 6; ++k) CHECK(mix.data()[k] == float((k + 1) / 4.0 + double(x.data()[k])));
  Tensor<std::uint8_t> u8 = cast<std::uint8_t>(fvec({0.f, 255.f, 17.9f}));
  CHECK(u8.to_vector() == std::vector<std::uint8_t>{0, 255, 17});
}

// ============================================================================================== broadcasting

TEST_CASE("broadcasting in expressions: (B,N)+(N), (B,1)*(1,N), 0-d tensors") {
  Tensor<float> m = arange<float>(12).view({3, 4});
  Tensor<float> row = fvec({10.f, 20.f, 30.f, 40.f});
  Tensor<float> col = fvec({1.f, 2.f, 3.f}).view({3, 1});
  Tensor<float> s = scalar_tensor(0.5f);
  Tensor<float> r1 = m + row;
  REQUIRE(r1.shape() == Shape{3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(r1.at(i, j) == float(4 * i + j) + row.at(j));
  Tensor<float> row2 = row.view({1, 4});
  Tensor<float> r2 = col * row2;
  REQUIRE(r2.shape() == Shape{3, 4});
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(r2.at(i, j) == col.at(i, 0) * row.at(j));
  Tensor<float> r3 = m * s;
  REQUIRE(r3.shape() == Shape{3, 4});
  for (int i = 0; i < 12; ++i) CHECK(r3.data()[i] == float(i) * 0.5f);
  Tensor<float> r4 = s + s;  // 0-d result
  CHECK(r4.dim() == 0);
  CHECK(r4.item() == 1.f);
  Tensor<float> r5 = row + s;
  CHECK(r5.shape() == Shape{4});
  // (2, 1, 4) + (3, 1) -> (2, 3, 4)
  Tensor<float> a3 = arange<float>(8).view({2, 1, 4});
  Tensor<float> r6 = a3 + col;
  REQUIRE(r6.shape() == Shape{2, 3, 4});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) CHECK(r6.at(i, j, k) == float(4 * i + k) + float(j + 1));
  // incompatible shapes: an error naming both
  Tensor<float> bad = fvec({1.f, 2.f, 3.f});
  std::string msg;
  try {
    Tensor<float> r = m + bad;
  } catch (const ember::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("[3, 4]") != std::string::npos);
  CHECK(msg.find("[3]") != std::string::npos);
}

TEST_CASE("strided operands: transposed, sliced with step, expanded") {
  Generator g(3);
  Tensor<float> base = randn<float>({6, 10}, g);
  Tensor<float> other = randn<float>({10, 6}, g);
  Tensor<float> t = base.t();               // (10, 6) strides (1, 10)
  Tensor<float> r = t * other;
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 6; ++j) CHECK(r.at(i, j) == base.at(j, i) * other.at(i, j));
  Tensor<float> sl = base.slice(1, 1, 10, 3);  // columns 1, 4, 7
  Tensor<float> r2 = run_expr(exp(sl));
  REQUIRE(r2.shape() == Shape{6, 3});
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) CHECK(close(r2.at(i, j), std::exp(double(base.at(i, 1 + 3 * j)))));
  Tensor<float> ex = base.slice(0, 2, 3).expand({6, 10});  // row 2 repeated
  Tensor<float> r3 = base - ex;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 10; ++j) CHECK(r3.at(i, j) == base.at(i, j) - base.at(2, j));
  // unary ops use the same machinery: check them on a strided view too
  Tensor<float> big = general_inputs();
  Tensor<float> every2 = big.slice(0, 1, big.numel(), 2);
  check_unary("tanh (strided)", every2, [](auto& v) { return tanh(v); }, [](double v) { return std::tanh(v); });
  check_unary("gelu (strided)", every2, [](auto& v) { return gelu(v); }, gelu_ref);
}

// ================================================================================= writing into tensors

TEST_CASE("y = expr writes into y's memory; into a view it writes through and leaves the rest") {
  Tensor<float> a = arange<float>(6).view({2, 3});
  Tensor<float> y = zeros<float>({2, 3});
  Tensor<float> alias = y;  // another handle to the same memory
  float* before = y.data();
  y = a * 2.f;
  CHECK(y.data() == before);
  CHECK(alias.to_vector() == std::vector<float>{0, 2, 4, 6, 8, 10});
  // A broadcastable expression fills the target
  Tensor<float> row = fvec({1.f, 2.f, 3.f});
  y = row * 2.f;
  CHECK(alias.to_vector() == std::vector<float>{2, 4, 6, 2, 4, 6});
  // A bigger result does not fit
  Tensor<float> big = arange<float>(12).view({4, 3});
  CHECK_THROWS_AS(y = big * 2.f, ember::Error);
  // An undefined tensor gets allocated
  Tensor<float> u;
  u = a + 1.f;
  CHECK(u.shape() == Shape{2, 3});
  CHECK(u.to_vector() == std::vector<float>{1, 2, 3, 4, 5, 6});

}

TEST_CASE("writing into views: slice, transpose, select") {
  Tensor<float> x = zeros<float>({4, 5});
  Tensor<float> v = arange<float>(8).view({4, 2});
  x.slice(1, 1, 5, 2) = v * 10.f;  // columns 1 and 3
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      const float e = (j == 1 || j == 3) ? float(10 * (2 * i + (j - 1) / 2)) : 0.f;
      CHECK(x.at(i, j) == e);
    }
  Tensor<float> y = zeros<float>({3, 3});
  Tensor<float> ar = arange<float>(9).view({3, 3});
  y.t() = ar + 0.f;  // y = arange.T
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) CHECK(y.at(i, j) == float(3 * j + i));
  Tensor<float> r789 = fvec({7.f, 8.f, 9.f});
  y[1] = r789 * 2.f;
  CHECK(y.to_vector() == std::vector<float>{0, 3, 6, 14, 16, 18, 2, 5, 8});
  Tensor<float> c0 = y.select(1, 0);
  y.select(1, 2) = c0 * -1.f;  // column 2 = -column 0 (reads another view of the same storage)
  CHECK(y.to_vector() == std::vector<float>{0, 3, 0, 14, 16, -14, 2, 5, -2});
  Tensor<float> wrong = arange<float>(6).view({3, 2});
  CHECK_THROWS_AS(x.slice(1, 1, 5, 2) = wrong * 2.f, ember::Error);
  // an expanded (stride 0) target cannot be written
  Tensor<float> two = fvec({1.f, 2.f});
  Tensor<float> e = two.expand({3, 2});
  CHECK_THROWS_AS(e = two * 2.f, ember::Error);
}

TEST_CASE("compound assignment: += -= *= /= with tensors, expressions, scalars, broadcast, views") {
  Tensor<float> a = fvec({1.f, 2.f, 3.f, 4.f});
  Tensor<float> b = fvec({0.5f, 0.25f, 2.f, -1.f});
  Tensor<float> y = a.clone();
  float* p = y.data();
  y += b;
  CHECK(y.to_vector() == std::vector<float>{1.5f, 2.25f, 5.f, 3.f});
  y -= b * 2.f;
  CHECK(y.to_vector() == std::vector<float>{0.5f, 1.75f, 1.f, 5.f});
  y *= a;
  CHECK(y.to_vector() == std::vector<float>{0.5f, 3.5f, 3.f, 20.f});
  Tensor<float> a1 = run_expr(a + 1.f);
  y /= a1;
  CHECK(y.to_vector() == std::vector<float>{0.5f / 2, 3.5f / 3, 3.f / 4, 20.f / 5});
  y += 1.f;
  y -= 0.5f;
  y *= 4.f;
  y /= 2.f;
  const std::vector<float> expect{((0.5f / 2 + 1.f) - 0.5f) * 4.f / 2.f, ((3.5f / 3 + 1.f) - 0.5f) * 4.f / 2.f,
                                  ((3.f / 4 + 1.f) - 0.5f) * 4.f / 2.f, ((20.f / 5 + 1.f) - 0.5f) * 4.f / 2.f};
  CHECK(y.to_vector() == expect);
  CHECK(y.data() == p);  // always in place

  Tensor<float> m = zeros<float>({3, 4});
  m += fvec({1.f, 2.f, 3.f, 4.f});          // broadcast row
  m *= fvec({1.f, 10.f, 100.f}).view({3, 1});  // broadcast column
  CHECK(m.to_vector() == std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40, 100, 200, 300, 400});
  m.slice(1, 0, 2) -= 1.f;  // a view: only columns 0, 1
  CHECK(m.to_vector() == std::vector<float>{0, 1, 3, 4, 9, 19, 30, 40, 99, 199, 300, 400});
  m.t()[3] /= 4.f;          // column 3 through a transposed view
  CHECK(m.to_vector() == std::vector<float>{0, 1, 3, 1, 9, 19, 30, 10, 99, 199, 300, 100});
  CHECK_THROWS_AS(fvec({1.f}) += m, ember::Error);  // result does not fit

  Tensor<i64> i = tensor<i64>({1, 2, 3});
  i += i64(10);
  i *= tensor<i64>({2, 3, 4});
  CHECK(i.to_vector() == std::vector<i64>{22, 36, 52});
  Tensor<float> und;
  CHECK_THROWS_AS(und += a, ember::Error);
}

// ==================================================================================================== aliasing

TEST_CASE("aliasing: results are as if the right-hand side were evaluated into a temporary") {
  Generator g(4);
  SUBCASE("a = a * b + a and a = (a + b) * a (same geometry, in place)") {
    Tensor<float> a = randn<float>({50}, g), b = randn<float>({50}, g);
    const auto a0 = a.to_vector();
    a = a * b + a;
    for (std::size_t i = 0; i < a0.size(); ++i)
      CHECK(close(a.data()[i], double(a0[i]) * b.data()[i] + a0[i], 1.2e-7, 1e-7));
    const auto a1 = a.to_vector();
    a = (a + b) * a;  // no multiply-add: exactly the float result
    for (std::size_t i = 0; i < a1.size(); ++i) CHECK(a.data()[i] == (a1[i] + b.data()[i]) * a1[i]);
  }
  SUBCASE("a = a.t() * 1 transposes a square matrix") {
    Tensor<float> a = arange<float>(16).view({4, 4}).clone();
    Tensor<float> at = a.t();
    a = at * 1.f;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) CHECK(a.at(i, j) == float(4 * j + i));
  }
  SUBCASE("a = a + a.t() (symmetrise) and a += a.t()") {
    Tensor<float> a = arange<float>(9).view({3, 3}).clone();
    Tensor<float> at = a.t();
    a = a + at;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) CHECK(a.at(i, j) == float(3 * i + j + 3 * j + i));
    Tensor<float> c = arange<float>(9).view({3, 3}).clone();
    c += c.t();
    CHECK(c.to_vector() == a.to_vector());
    Tensor<float> big = randn<float>({300, 300}, g);  // the threaded path too
    Tensor<float> bt = big.t();
    Tensor<float> bref = big + bt;
    big += big.t();
    CHECK(bitwise_equal(big, bref));
  }
  SUBCASE("x.slice(...) = f(overlapping slice) in both directions") {
    Tensor<float> x = arange<float>(8);
    Tensor<float> head = x.slice(0, 0, 7);
    x.slice(0, 1, 8) = head + 100.f;  // reads before writes
    CHECK(x.to_vector() == std::vector<float>{0, 100, 101, 102, 103, 104, 105, 106});
    Tensor<float> z = arange<float>(8);
    Tensor<float> tail = z.slice(0, 1, 8);
    z.slice(0, 0, 7) = tail * 2.f;
    CHECK(z.to_vector() == std::vector<float>{2, 4, 6, 8, 10, 12, 14, 7});
    Tensor<float> w = arange<float>(8);
    Tensor<float> even = w.slice(0, 0, 8, 2), odd = w.slice(0, 1, 8, 2);
    w.slice(0, 0, 4) = even + odd;  // 0+1, 2+3, ...
    CHECK(w.to_vector() == std::vector<float>{1, 5, 9, 13, 4, 5, 6, 7});
  }
  SUBCASE("a broadcast read of the output's first row") {
    Tensor<float> y = arange<float>(6).view({3, 2}).clone();
    Tensor<float> first = y.slice(0, 0, 1);
    y = y + first;  // every row plus the original row 0
    CHECK(y.to_vector() == std::vector<float>{0, 2, 2, 4, 4, 6});
    Tensor<float> z = arange<float>(6).view({3, 2}).clone();
    z -= z[0];
    CHECK(z.to_vector() == std::vector<float>{0, 0, 2, 2, 4, 4});
  }
  SUBCASE("a reshaped alias of the output") {
    Tensor<float> x = arange<float>(6).clone();
    Tensor<float> m = x.view({2, 3});
    Tensor<float> mt = m.t();
    x.view({3, 2}) = mt * 1.f;  // same storage, different geometry
    CHECK(x.to_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  }
  SUBCASE("copy_ from an overlapping view") {
    Tensor<float> x = arange<float>(5);
    x.slice(0, 1, 5).copy_(x.slice(0, 0, 4));
    CHECK(x.to_vector() == std::vector<float>{0, 0, 1, 2, 3});
  }
}

// ================================================================================= expressions own their operands

namespace {
// Returns an expression over a tensor local to this function: the expression must keep it alive.
auto plus_one_of_local(i64 n) {
  Tensor<float> s = full<float>({n}, 2.f);
  return s + 1.f;
}
}  // namespace

TEST_CASE("an expression holds its tensors by value: it outlives them and sees the ones it was built from") {
  SUBCASE("returned from the function whose local tensor it reads") {
    auto e = plus_one_of_local(1000);
    std::vector<float> junk(4096, -7.f);  // reuse the freed memory if the local had died
    Tensor<float> other = full<float>({1000}, -5.f);
    Tensor<float> y = e;
    CHECK(y.to_vector() == std::vector<float>(1000, 3.f));
    CHECK(junk[0] == -7.f);
    CHECK(other.data()[0] == -5.f);
  }
  SUBCASE("rebinding an operand's handle after building the expression") {
    Tensor<float> a = full<float>({4}, 2.f), b = full<float>({4}, 3.f);
    auto e = a * b;
    a = full<float>({4}, 100.f);  // a now names another tensor; e still holds the first
    Tensor<float> y = e;
    CHECK(y.to_vector() == std::vector<float>(4, 6.f));
    CHECK(a.to_vector() == std::vector<float>(4, 100.f));
  }
  SUBCASE("writing into an operand's memory is seen (a handle, not a copy of the data)") {
    Tensor<float> a = full<float>({4}, 2.f);
    auto e = a * 2.f;
    a.fill_(5.f);
    Tensor<float> y = e;
    CHECK(y.to_vector() == std::vector<float>(4, 10.f));
  }
}

// ============================================================================================ fused = unfused

TEST_CASE("fused equals unfused") {
  Generator g(5);
  Tensor<float> a = randn<float>({4096}, g), b = randn<float>({4096}, g), c = rand<float>({4096}, g);
  SUBCASE("a chain without multiply-add: bitwise equal") {
    // (no product feeds a sum across op boundaries, so contraction into FMAs cannot make the forms differ)
    Tensor<float> fused = run_expr((sigmoid((a - b) / (c + 2.f)) - tanh(b)) * exp(-a) / (abs(c) + 1.f));
    Tensor<float> t1 = run_expr(a - b);
    Tensor<float> t2 = run_expr(c + 2.f);
    Tensor<float> t3 = run_expr(t1 / t2);
    Tensor<float> t4 = run_expr(sigmoid(t3));
    Tensor<float> t5 = run_expr(tanh(b));
    Tensor<float> t6 = run_expr(t4 - t5);
    Tensor<float> t7 = run_expr(-a);
    Tensor<float> t8 = run_expr(exp(t7));
    Tensor<float> t9 = run_expr(t6 * t8);
    Tensor<float> t10 = run_expr(abs(c));
    Tensor<float> t11 = run_expr(t10 + 1.f);
    Tensor<float> unfused = run_expr(t9 / t11);
    CHECK(bitwise_equal(fused, unfused));
  }
  SUBCASE("relu(a * b + c): equal up to one rounding of a * b (a fused multiply-add may skip it)") {
    Tensor<float> fused = run_expr(relu(a * b + c));
    Tensor<float> ab = run_expr(a * b);
    Tensor<float> abc = run_expr(ab + c);
    Tensor<float> unfused = run_expr(relu(abc));
    for (i64 i = 0; i < a.numel(); ++i) {
      const double scale = std::fabs(double(a.data()[i]) * b.data()[i]) + std::fabs(double(c.data()[i]));
      CHECK(std::fabs(double(fused.data()[i]) - unfused.data()[i]) <= 1.2e-7 * scale);
    }
  }
  SUBCASE("silu(x) and square(x) equal their definitions op by op") {
    Tensor<float> x = run_expr(a * 3.f);
    Tensor<float> s = run_expr(sigmoid(x));
    Tensor<float> silu_unfused = run_expr(x * s);
    Tensor<float> silu_fused = run_expr(silu(x));
    CHECK(bitwise_equal(silu_fused, silu_unfused));
    Tensor<float> sq = run_expr(square(x));
    Tensor<float> sq2 = run_expr(x * x);
    CHECK(bitwise_equal(sq, sq2));
  }
}

// ============================================================================================== threaded path

TEST_CASE("large expressions (threaded) equal the serial answer and an element-wise reference") {
  ThreadsGuard guard;
  const int nt = std::max(2, guard.saved);
  Generator g(6);
  const i64 n = 1024;  // 1M elements: many chunks of the threaded loop
  Tensor<float> a = randn<float>({n, n}, g), b = randn<float>({n, n}, g), c = rand<float>({n, n}, g);
  const Tensor<float> at = a.t(), ae = a.slice(1, 0, n, 2), bo = b.slice(1, 1, n, 2), cs = c.slice(1, 0, n, 2),
                      c0 = c.slice(0, 0, 1);
  // Two expression shapes (the ones of "fused equals unfused"), over contiguous, transposed, stepped and broadcast
  // operands: the linear path, and the row path with each kind of stride.
  auto chain = [](const Tensor<float>& x, const Tensor<float>& y, const Tensor<float>& z) {
    return run_expr((sigmoid((x - y) / (z + 2.f)) - tanh(y)) * exp(-x) / (abs(z) + 1.f));
  };
  auto chain_ref = [](double x, double y, double z) {
    return (sigmoid_ref((x - y) / (z + 2)) - std::tanh(y)) * std::exp(-x) / (std::fabs(z) + 1);
  };
  auto mad = [](const Tensor<float>& x, const Tensor<float>& y, const Tensor<float>& z) { return run_expr(relu(x * y + z)); };
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<Tensor<float>> out;
    out.push_back(chain(a, b, c));    // contiguous: linear path
    out.push_back(chain(at, b, c));   // transposed operand: row path
    out.push_back(mad(ae, bo, cs));   // stepped slices
    out.push_back(mad(a, b, c0));     // broadcast row
    Tensor<float> inplace = a.clone();
    Tensor<float> it = inplace.t();
    inplace += it * 0.5f;             // aliasing, through the public path
    out.push_back(inplace);
    return out;
  };
  const auto serial = run(1);
  const auto threaded = run(nt);
  REQUIRE(cpu::get_num_threads() == nt);
  for (std::size_t k = 0; k < serial.size(); ++k) {
    INFO("expression " << k);
    CHECK(bitwise_equal(serial[k], threaded[k]));
  }
  // Every element against an independent reference (so no chunk was skipped or written twice). Tolerances scale
  // with the terms: sigmoid - tanh may cancel before the product with exp(-x); x * y + z may cancel.
  auto chain_ok = [&](float got, double x, double y, double z) {
    return close(got, chain_ref(x, y, z), 1e-5, 1e-6 * (1 + std::exp(-x)));
  };
  auto mad_ok = [](float got, double x, double y, double z) {
    return close(got, std::max(0.0, x * y + z), 0, 2.5e-7 * (std::fabs(x * y) + std::fabs(z)));
  };
  int bad[5] = {};
  for (i64 i = 0; i < n; ++i)
    for (i64 j = 0; j < n; ++j) {
      const double ai = a.data()[i * n + j], bi = b.data()[i * n + j], ci = c.data()[i * n + j];
      bad[0] += !chain_ok(threaded[0].data()[i * n + j], ai, bi, ci);
      bad[1] += !chain_ok(threaded[1].data()[i * n + j], a.data()[j * n + i], bi, ci);
      bad[3] += !mad_ok(threaded[3].data()[i * n + j], ai, bi, c.data()[j]);
      bad[4] += threaded[4].data()[i * n + j] != a.data()[i * n + j] + 0.5f * a.data()[j * n + i];
      if (j < n / 2)
        bad[2] += !mad_ok(threaded[2].data()[i * (n / 2) + j], a.data()[i * n + 2 * j], b.data()[i * n + 2 * j + 1],
                          c.data()[i * n + 2 * j]);
    }
  for (int k = 0; k < 5; ++k) CHECK_MESSAGE(bad[k] == 0, "expression " << k);
}

// ============================================================================================== streaming stores

TEST_CASE("streaming stores (cpu/detail/stream_store.hpp): stream_copy at every alignment, and passes that stream "
          "write what ordinary stores write") {
  SUBCASE("stream_copy: every head alignment and length, no byte outside touched") {
    std::vector<unsigned char> src(400), dst(600);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
    int bad = 0;
    for (std::size_t off = 0; off < 64; ++off)
      for (std::size_t len = 0; len <= 300; len += (len < 140 ? 1 : 7)) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        // dst's offset within a 64-byte line varies with off (the vector's own alignment is at least 16)
        cpu::detail::stream::stream_copy(dst.data() + 64 + off, src.data() + (off % 5), len);
        cpu::detail::stream::fence();
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + off && i < 64 + off + len;
          bad += dst[i] != (inside ? src[i - 64 - off + off % 5] : 0xA5);
        }
      }
    CHECK(bad == 0);
  }
  SUBCASE("passes on two threads: every dtype, sizes around the block and the thread chunk, misaligned outputs") {
    ThreadsGuard guard;
    const std::int64_t saved = cpu::streaming_store_min_bytes();
    struct Restore {
      std::int64_t v;
      ~Restore() { cpu::set_streaming_stores(v); }
    } restore{saved};
    cpu::set_num_threads(2);
    Generator g(31);
    auto passes = [] { return cpu::detail::stream::streamed_passes().load(); };
    // (Only passes of at least two thread chunks stream: 2 * cpu::kGrain elements.)
    for (const i64 n : {2 * cpu::kGrain, 2 * cpu::kGrain + 2047, i64(70001), i64(200003)}) {
      for (const i64 off : {i64(0), i64(1), i64(3)}) {
        INFO("n " << n << " offset " << off);
        const Tensor<float> a = randn<float>({n}, g), b = randn<float>({n}, g), c = randn<float>({n}, g);
        const Tensor<double> da = randn<double>({n}, g);
        const Tensor<int> ia = randint<int>(-1000, 1000, {n}, g);
        Tensor<float> plain = empty<float>({n + off}).slice(0, off, off + n);
        Tensor<float> streamed = empty<float>({n + off}).slice(0, off, off + n);
        Tensor<double> dplain = empty<double>({n + off}).slice(0, off, off + n);
        Tensor<double> dstreamed = empty<double>({n + off}).slice(0, off, off + n);
        Tensor<bfloat16> hplain = empty<bfloat16>({n + off}).slice(0, off, off + n);
        Tensor<bfloat16> hstreamed = empty<bfloat16>({n + off}).slice(0, off, off + n);
        Tensor<int> iplain = empty<int>({n + off}).slice(0, off, off + n);
        Tensor<int> istreamed = empty<int>({n + off}).slice(0, off, off + n);
        cpu::set_streaming_stores(-1);
        const auto p0 = passes();
        cpu::assign(plain, a * b + c * 2.f - a);
        cpu::assign(dplain, da * da - 3.0);
        cpu::assign(hplain, cast<bfloat16>(a * c));
        cpu::assign(iplain, ia * 7 - 5);
        CHECK(passes() == p0);  // off: nothing streams
        cpu::set_streaming_stores(0);
        cpu::assign(streamed, a * b + c * 2.f - a);
        cpu::assign(dstreamed, da * da - 3.0);
        cpu::assign(hstreamed, cast<bfloat16>(a * c));
        cpu::assign(istreamed, ia * 7 - 5);
        CHECK(passes() == p0 + (cpu::kStreamingStores ? 4 : 0));  // the test sees the streaming path run
        CHECK(bitwise_equal(plain, streamed));
        CHECK(std::memcmp(dplain.data(), dstreamed.data(), std::size_t(n) * sizeof(double)) == 0);
        CHECK(std::memcmp(hplain.data(), hstreamed.data(), std::size_t(n) * sizeof(bfloat16)) == 0);
        CHECK(std::memcmp(iplain.data(), istreamed.data(), std::size_t(n) * sizeof(int)) == 0);
        for (i64 i = 0; i < n; i += 997) REQUIRE(rd(streamed, i) == rd(plain, i));  // and plain is the expression
      }
    }
    // In place, below the threshold, on one thread, or smaller than two chunks: ordinary stores.
    cpu::set_streaming_stores(0);
    Tensor<float> x = randn<float>({100000}, g);
    const Tensor<float> x0 = x.clone();
    auto p0 = passes();
    x += x0 * 2.f;
    CHECK(passes() == p0);
    Tensor<float> small = run_expr(x0.slice(0, 0, 2 * cpu::kGrain - 1) * 3.f);
    CHECK(passes() == p0);
    cpu::set_num_threads(1);
    Tensor<float> one = run_expr(x0 * 3.f);
    CHECK(passes() == p0);
    cpu::set_num_threads(2);
    for (i64 i = 0; i < small.numel(); i += 101) REQUIRE(rd(small, i) == 3.f * rd(x0, i));
    for (i64 i = 0; i < x.numel(); i += 101) REQUIRE(rd(x, i) == rd(x0, i) + 2.f * rd(x0, i));
    cpu::set_streaming_stores(100000 * 4 + 1);
    Tensor<float> y = empty<float>({100000});
    cpu::assign(y, x0 * 3.f);
    CHECK(passes() == p0);
    cpu::set_streaming_stores(100000 * 4);
    cpu::assign(y, x0 * 3.f);
    CHECK(passes() == p0 + (cpu::kStreamingStores ? 1 : 0));
    // A pass with an elementary function or a division is not memory-bound: never streamed.
    static_assert(expr::memory_bound_v<decltype(x0 * 3.f + cast<float>(x0 < 0.f))>);
    static_assert(expr::memory_bound_v<decltype(where(x0 > 0.f, relu(x0), -abs(x0)))>);
    static_assert(!expr::memory_bound_v<decltype(gelu(x0 * 3.f))>);
    static_assert(!expr::memory_bound_v<decltype(x0 / 3.f)>);
    Tensor<float> gl = run_expr(gelu(x0 * 3.f));
    CHECK(passes() == p0 + (cpu::kStreamingStores ? 1 : 0));
    CHECK_THROWS_WITH_AS(cpu::set_streaming_stores(-2), doctest::Contains("expected -1 (off) or >= 0"), ember::Error);
  }
  SUBCASE("multi-output passes (ops::assign_multi): several outputs of two dtypes, slots, the check, misaligned") {
    ThreadsGuard guard;
    struct Restore {
      std::int64_t v;
      ~Restore() { cpu::set_streaming_stores(v); }
    } restore{cpu::streaming_store_min_bytes()};
    cpu::set_num_threads(2);
    Generator g(32);
    auto passes = [] { return cpu::detail::stream::streamed_passes().load(); };
    for (const i64 n : {2 * cpu::kGrain + 777, i64(200003)}) {
      for (const i64 off : {i64(0), i64(1)}) {
        INFO("n " << n << " offset " << off);
        const Tensor<float> x = randn<float>({n}, g), y = randn<float>({n}, g);
        x.data()[n / 3] = std::numeric_limits<float>::quiet_NaN();
        const auto X = expr::slot<0>(x);
        const auto Y = expr::slot<1>(x);
        auto run = [&](std::int64_t from) {
          cpu::set_streaming_stores(from);
          Tensor<float> u = empty<float>({n + off}).slice(0, off, off + n);
          Tensor<double> v = empty<double>({n + off}).slice(0, off, off + n);
          Tensor<std::int64_t> flag = zeros<std::int64_t>({1});
          ops::assign_multi_flag(std::make_tuple(u, v), std::make_tuple(X * Y + Y, cast<double>(X - Y) * 0.5),
                                 x.shape(), std::make_tuple(x, y), X != X, flag, "test");
          return std::make_tuple(u, v, flag.item());
        };
        const auto p0 = passes();
        const auto [u0, v0, f0] = run(-1);
        CHECK(passes() == p0);
        const auto [u1, v1, f1] = run(0);
        CHECK(passes() == p0 + (cpu::kStreamingStores ? 1 : 0));
        CHECK(f0 == 1);
        CHECK(f1 == 1);  // the check still sees the NaN
        CHECK(std::memcmp(u0.data(), u1.data(), std::size_t(n) * sizeof(float)) == 0);
        CHECK(std::memcmp(v0.data(), v1.data(), std::size_t(n) * sizeof(double)) == 0);
        const float xy = rd(x, 5) * rd(y, 5);
        CHECK((rd(u1, 5) == xy + rd(y, 5) || rd(u1, 5) == std::fma(rd(x, 5), rd(y, 5), rd(y, 5))));  // FMA or not
        CHECK(v1.data()[7] == double(rd(x, 7) - rd(y, 7)) * 0.5);  // float subtraction, then the cast
      }
    }
    // An in-place update (an output is also read) never streams.
    cpu::set_streaming_stores(0);
    Tensor<float> z = randn<float>({300000}, g);
    const auto p0 = passes();
    ops::assign_multi(std::make_tuple(z), std::make_tuple(expr::slot<0>(z) * 2.f), z.shape(), std::make_tuple(z),
                      "test");
    CHECK(passes() == p0);
  }
  SUBCASE("off by default; EMBER_STREAM_STORES=1 turns it on from the last-level cache's size; other text is an "
          "error") {
    const std::int64_t saved = cpu::streaming_store_min_bytes();
    struct Restore {
      std::int64_t v;
      ~Restore() {
        unsetenv("EMBER_STREAM_STORES");
        cpu::set_streaming_stores(v);
      }
    } restore{saved};
    auto fresh = [](const char* env) {
      if (env) setenv("EMBER_STREAM_STORES", env, 1);
      else unsetenv("EMBER_STREAM_STORES");
      cpu::detail::stream::min_bytes_state().store(-2);
      return cpu::streaming_store_min_bytes();
    };
    const std::int64_t llc = cpu::detail::stream::last_level_cache_bytes();
    CHECK(llc >= (std::int64_t(256) << 10));
    CHECK(fresh(nullptr) == -1);
    CHECK(fresh("1") == (cpu::kStreamingStores ? llc : -1));
    CHECK(fresh("0") == -1);
    CHECK(fresh("") == -1);
    CHECK_THROWS_WITH_AS(fresh("yes"), doctest::Contains("EMBER_STREAM_STORES is \"yes\", not 0 or 1"), ember::Error);
  }
}

// ============================================================================================== half, bfloat16

TEST_CASE("half and bfloat16 expressions compute in float and round once") {
  Generator g(7);
  const i64 n = 20000;
  Tensor<float> fa = randn<float>({n}, g), fb = randn<float>({n}, g), fc = randn<float>({n}, g), fd = randn<float>({n}, g);
  SUBCASE("half") {
    Tensor<half> a = run_expr(cast<half>(fa)), b = run_expr(cast<half>(fb)), c = run_expr(cast<half>(fc)),
                 d = run_expr(cast<half>(fd));
    Tensor<half> r = run_expr((a * b + c) * d);
    int wrong = 0, double_rounding_differs = 0;
    for (i64 i = 0; i < n; ++i) {
      const float x = a.data()[i], y = b.data()[i], z = c.data()[i], w = d.data()[i];
      const half once = half((x * y + z) * w);  // x*y is exact in float, so FMA or not gives the same
      const half stepwise = half(float(half(float(half(x * y)) + z)) * w);
      wrong += r.data()[i].bits != once.bits;
      double_rounding_differs += once.bits != stepwise.bits;
    }
    CHECK(wrong == 0);
    CHECK(double_rounding_differs > 100);  // the test can tell the two apart
    Tensor<float> f = run_expr(cast<float>(a));
    for (i64 i = 0; i < n; ++i) REQUIRE(f.data()[i] == float(a.data()[i]));
    Tensor<half> e = run_expr(exp(a * 0.5f));
    int bad = 0;
    for (i64 i = 0; i < n; ++i) bad += !close(float(e.data()[i]), std::exp(0.5 * float(a.data()[i])), 1e-3, 1e-4);
    CHECK(bad == 0);
    Tensor<bool> cmp = a > b;
    for (i64 i = 0; i < 100; ++i) CHECK(cmp.data()[i] == (float(a.data()[i]) > float(b.data()[i])));
  }
  SUBCASE("bfloat16") {
    Tensor<bfloat16> a = run_expr(cast<bfloat16>(fa)), b = run_expr(cast<bfloat16>(fb)),
                     c = run_expr(cast<bfloat16>(fc)), d = run_expr(cast<bfloat16>(fd));
    Tensor<bfloat16> r = run_expr((a * b + c) * d);
    int wrong = 0, double_rounding_differs = 0;
    for (i64 i = 0; i < n; ++i) {
      const float x = a.data()[i], y = b.data()[i], z = c.data()[i], w = d.data()[i];
      const bfloat16 once = bfloat16((x * y + z) * w);
      const bfloat16 stepwise = bfloat16(float(bfloat16(float(bfloat16(x * y)) + z)) * w);
      wrong += r.data()[i].bits != once.bits;
      double_rounding_differs += once.bits != stepwise.bits;
    }
    CHECK(wrong == 0);
    CHECK(double_rounding_differs > 100);
    Tensor<float> f = run_expr(cast<float>(a) * 2.f);
    for (i64 i = 0; i < n; ++i) REQUIRE(f.data()[i] == 2.f * float(a.data()[i]));
  }
  SUBCASE("mixed: fp16 storage, fp32 math, fp32 result") {
    Tensor<half> a = run_expr(cast<half>(fa));
    Tensor<float> r = run_expr(cast<float>(a) * fb + 1.f);
    for (i64 i = 0; i < 200; ++i) CHECK(r.data()[i] == doctest::Approx(float(a.data()[i]) * fb.data()[i] + 1.f).epsilon(1e-6));
  }
}

// ---- the multi-output pass the optimizers and the scaler run (ops::assign_multi) --------------------------------

using ember_test::bitwise_equal;
using ember_test::expect_error;
using ember_test::fvec;

TEST_CASE("ops::assign_multi updates outputs in place from their old values, through slots, leaves and params") {
  Tensor<float> a = fvec({1, 2, 3, 4}), b = fvec({10, 20, 30, 40});
  const auto A = expr::slot<0>(a);
  const auto B = expr::slot<1>(a);
  ops::assign_multi(std::make_tuple(a, b), std::make_tuple(A + B, A * B), a.shape(), std::make_tuple(a, b), "test");
  CHECK(a.to_vector() == std::vector<float>{11, 22, 33, 44});  // a + b, old values
  CHECK(b.to_vector() == std::vector<float>{10, 40, 90, 160});  // a * b with the old a
  // Tensor leaves that are outputs read their old values too; params are the pass's scalars.
  const auto two = expr::param<0, float>();
  ops::assign_multi(std::make_tuple(a, b), std::make_tuple(b * two, a - b), a.shape(),
                    expr::Slots(std::tuple<>{}, {2.0}), "test");
  CHECK(a.to_vector() == std::vector<float>{20, 80, 180, 320});
  CHECK(b.to_vector() == std::vector<float>{1, -18, -57, -116});
  // A strided output (a transposed view) walks rows; a broadcast operand reads one row for all.
  Tensor<float> m = arange<float>(0, 6).reshape({2, 3}).clone();
  Tensor<float> mt = m.t();  // (3, 2) view of m
  Tensor<float> row = fvec({100, 200});
  ops::assign_multi(std::make_tuple(mt), std::make_tuple(expr::slot<0>(mt) + row), mt.shape(), std::make_tuple(mt),
                    "test");
  CHECK(m.to_vector() == std::vector<float>{100, 101, 102, 203, 204, 205});
  // Large enough for several threads' chunks: the same as the element-wise formula.
  Tensor<float> x = arange<float>(0, 200000), y = full<float>({200000}, 0.5f);
  const Tensor<float> want_x = x + y, want_y = x * y;
  ops::assign_multi(std::make_tuple(x, y), std::make_tuple(expr::slot<0>(x) + expr::slot<1>(x),
                                                            expr::slot<0>(x) * expr::slot<1>(x)),
                    x.shape(), std::make_tuple(x, y), "test");
  CHECK(bitwise_equal(x, want_x));
  CHECK(bitwise_equal(y, want_y));
}

TEST_CASE("ops::assign_multi: an operand reading an output's memory shifted goes through temporaries; overlapping "
          "outputs and bad shapes are errors") {
  // out = x[1:] from x[:-1]: every value is read before any is written, as if into a temporary first.
  for (std::int64_t n : {8, 100000}) {
    CAPTURE(n);
    Tensor<float> x = arange<float>(0, double(n));
    Tensor<float> out = x.slice(0, 1, n), in = x.slice(0, 0, n - 1);
    ops::assign_multi(std::make_tuple(out), std::make_tuple(expr::slot<0>(out) * 0.f + in + 10.f), out.shape(),
                      std::make_tuple(out), "test");
    CHECK(x.data()[0] == 0.f);
    bool ok = true;
    for (std::int64_t i = 1; i < n; ++i) ok = ok && x.data()[i] == float(i - 1) + 10.f;
    CHECK(ok);
  }
  Tensor<float> a = zeros<float>({4}), b = zeros<float>({3});
  expect_error(__LINE__, [&] {
    ops::assign_multi(std::make_tuple(a, a.view(Shape{4})), std::make_tuple(a + 1.f, a + 2.f), a.shape(),
                      std::tuple<>{}, "test.op");
  }, {"test.op: outputs 0 and 1 of one pass share memory"});
  expect_error(__LINE__, [&] {
    ops::assign_multi(std::make_tuple(a, b), std::make_tuple(a + 1.f, b + 1.f), a.shape(), std::tuple<>{}, "test.op");
  }, {"test.op: output 1 has shape [3] but the pass runs over [4]"});
  expect_error(__LINE__, [&] {
    ops::assign_multi(std::make_tuple(a), std::make_tuple(b + 1.f), a.shape(), std::tuple<>{}, "test.op");
  }, {"test.op"});
  expect_error(__LINE__, [&] {
    ops::assign_multi(std::make_tuple(a), std::make_tuple(a + 1.f), a.shape(), std::make_tuple(Tensor<float>()),
                      "test.op");
  }, {"test.op: an operand is an undefined tensor"});
}

TEST_CASE("ops::assign_multi_flag: the check of the same pass sets the flag where it holds anywhere, never clears it") {
  for (std::int64_t n : {5, 300001}) {
    for (std::int64_t at : {std::int64_t(0), n / 2, n - 1}) {
      CAPTURE(n);
      CAPTURE(at);
      Tensor<float> g = full<float>({n}, 4.f);
      g.data()[at] = std::numeric_limits<float>::infinity();
      Tensor<std::int64_t> flag = zeros<std::int64_t>({1});
      const auto v = expr::slot<0>(g) * 0.25;
      ops::assign_multi_flag(std::make_tuple(g), std::make_tuple(v), g.shape(), std::make_tuple(g),
                             !(abs(v) <= std::numeric_limits<float>::max()), flag, "test");
      CHECK(flag.item() == 1);
      CHECK(g.data()[at == 0 ? n - 1 : 0] == 1.f);
      CHECK(std::isinf(g.data()[at]));
      // A clean pass leaves the flag set.
      Tensor<float> h = full<float>({n}, 2.f);
      ops::assign_multi_flag(std::make_tuple(h), std::make_tuple(expr::slot<0>(h) * 0.5), h.shape(),
                             std::make_tuple(h), expr::slot<0>(h) != expr::slot<0>(h), flag, "test");
      CHECK(flag.item() == 1);
      CHECK(h.data()[n - 1] == 1.f);
    }
  }
  // A NaN in a strided gradient (a column of a matrix), and a clean one that leaves a fresh flag at 0.
  Tensor<float> m = ones<float>({300, 400});
  m.data()[299 * 400 + 7] = std::numeric_limits<float>::quiet_NaN();
  Tensor<float> col = m.slice(1, 7, 8);
  Tensor<std::int64_t> flag = zeros<std::int64_t>({1});
  const auto c = expr::slot<0>(col) * 2.0;
  ops::assign_multi_flag(std::make_tuple(col), std::make_tuple(c), col.shape(), std::make_tuple(col),
                         !(abs(c) <= std::numeric_limits<float>::max()), flag, "test");
  CHECK(flag.item() == 1);
  CHECK(m.data()[7] == 2.f);
  CHECK(m.data()[8] == 1.f);  // only the column was written
  Tensor<std::int64_t> clean = zeros<std::int64_t>({1});
  Tensor<float> col2 = m.slice(1, 8, 9);
  const auto c2 = expr::slot<0>(col2) * 2.0;
  ops::assign_multi_flag(std::make_tuple(col2), std::make_tuple(c2), col2.shape(), std::make_tuple(col2),
                         !(abs(c2) <= std::numeric_limits<float>::max()), clean, "test");
  CHECK(clean.item() == 0);
  CHECK(m.data()[8] == 2.f);
  expect_error(__LINE__, [&] {
    ops::assign_multi_flag(std::make_tuple(col2), std::make_tuple(c2), col2.shape(), std::make_tuple(col2),
                           c2 != c2, zeros<std::int64_t>({2}), "test.flag");
  }, {"test.flag: the flag is one int64 element"});
}
