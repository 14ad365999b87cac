// Autograd: every differentiable op against central finite differences in double precision (ember::gradcheck),
// hand-computed gradients where finite differences cannot see the convention (ties, kinks, zeros), and the
// semantics of the tape (accumulation, grad mode, detach, retain_graph, hooks, retain_grad, freeing, in-place).
//
// Compile time: every distinct expression type instantiates a forward and a fused backward kernel, so the
// functions under test are written over named lvalue tensors (`const TD& a = v[0]`): `square(t)` is then the
// same type whether t is an input, a transposed view or a slice, and one instantiation serves many checks.
// gradcheck itself is instantiated once, for std::function. (Splitting this file in two was measured: ~30 s more
// CPU in total for the duplicated instantiations, so it stays one translation unit.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;

namespace {

using TD = Tensor<double>;
using Inputs = std::vector<TD>;
using Fn = std::function<TD(const Inputs&)>;

// ---- inputs (built with plain loops, so no extra expression types) ------------------------------------------

TD normal(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn<double>(s, g);
}
TD uniform(const Shape& s, double lo, double hi, std::uint64_t seed) {
  Generator g(seed);
  TD t = rand<double>(s, g);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = lo + (hi - lo) * t.data()[i];
  return t;
}
/// Moves every element at least `margin` away from each point (kinks, clamp bounds, ...).
TD away(TD t, std::initializer_list<double> points, double margin) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    for (double p : points) {
      double& x = t.data()[i];
      if (std::fabs(x - p) < margin) x = x >= p ? p + margin : p - margin;
    }
  return t;
}
/// Distinct values (a shuffled, scaled arange with a random sign), so max/min/inf-norm have no ties.
TD distinct(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  TD u = rand<double>(s, g);
  const std::int64_t n = u.numel();
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[std::size_t(i)] = i;
  for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher–Yates with the uniforms
    const auto j = std::int64_t(u.data()[i] * double(i + 1));
    std::swap(order[std::size_t(i)], order[std::size_t(std::min(j, i))]);
  }
  TD t = empty<double>(s);
  for (std::int64_t i = 0; i < n; ++i) t.data()[i] = 0.1 + 0.13 * double(order[std::size_t(i)]);
  for (std::int64_t i = 0; i < n; ++i)
    if (i % 3 == 1) t.data()[i] = -t.data()[i] - 0.05;  // mixed signs, |values| still distinct
  return t;
}
TD vals(const std::vector<double>& v, const Shape& s) { return from_vector<double>(v, s); }
TD leaf(TD t) {
  t.requires_grad_(true);
  return t;
}

// ---- checks ------------------------------------------------------------------------------------------------

void check_grad(const std::string& what, const Fn& f, const Inputs& in, double eps = 1e-6, double atol = 1e-6,
                double rtol = 1e-5) {
  INFO(what);
  GradcheckResult r = gradcheck(f, in, eps, atol, rtol);
  CHECK_MESSAGE(r.ok, r.message);
}

template <class T>
void check_values(const Tensor<T>& t, const std::vector<double>& expect, double tol = 1e-12) {
  REQUIRE(t.defined());
  const std::vector<T> got = t.to_vector();
  REQUIRE(got.size() == expect.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i);
    CHECK(double(got[i]) == doctest::Approx(expect[i]).epsilon(tol));
  }
}

std::vector<double> vec(const TD& t) { return t.to_vector(); }

}  // namespace

// One lambda per function under test; `a`, `b`, `c` are the (leaf) inputs.
#define GC1(EXPR, X, ...) \
  check_grad(#EXPR, [](const Inputs& v) -> TD { const TD& a = v[0]; return TD(EXPR); }, {X} __VA_OPT__(,) __VA_ARGS__)
#define GC2(EXPR, X, Y, ...)                                                            \
  check_grad(                                                                           \
      #EXPR,                                                                            \
      [](const Inputs& v) -> TD {                                                       \
        const TD &a = v[0], &b = v[1];                                                  \
        return TD(EXPR);                                                                \
      },                                                                                \
      {X, Y} __VA_OPT__(,) __VA_ARGS__)
#define GC3(EXPR, X, Y, Z, ...)                                                         \
  check_grad(                                                                           \
      #EXPR,                                                                            \
      [](const Inputs& v) -> TD {                                                       \
        const TD &a = v[0], &b = v[1], &c = v[2];                                       \
        return TD(EXPR);                                                                \
      },                                                                                \
      {X, Y, Z} __VA_OPT__(,) __VA_ARGS__)

// =============================================================================================== gradcheck itself

TEST_CASE("gradcheck reports a wrong gradient") {
  // f(a) = a * detach(a): autograd sees a, the true derivative is 2a.
  const TD x = uniform({2, 3}, 0.5, 1.5, 1);
  GradcheckResult r = gradcheck(
      Fn([](const Inputs& v) -> TD {
        const TD& a = v[0];
        const TD b = a.detach();
        return TD(a * b);
      }),
      {x});
  CHECK_FALSE(r.ok);
  CHECK(r.message.find("input 0") != std::string::npos);
  CHECK(r.max_error > 0.4);
}

// ======================================================================================== element-wise unary ops

TEST_CASE("gradcheck: unary element-wise ops") {
  const TD x = away(normal({3, 4}, 11), {0.0}, 0.05);        // both signs, away from kinks at 0
  const TD p = uniform({3, 4}, 0.2, 2.0, 12);                // positive: log, sqrt, rsqrt
  const TD l = uniform({3, 4}, -0.6, 2.0, 13);               // > -1: log1p
  const TD sp = vals({-3, -1, -0.2, 0.3, 1, 4, 15, 25}, {2, 4});  // both branches of softplus (threshold 20)
  const TD cl = away(normal({3, 4}, 14), {-0.5, 0.8}, 0.05);  // away from clamp's bounds

  GC1(neg(a), x);
  GC1(-a, x);
  GC1(abs(a), x);
  GC1(exp(a), x);
  GC1(expm1(a), x);
  GC1(log(a), p);
  GC1(log1p(a), l);
  GC1(sqrt(a), p);
  GC1(rsqrt(a), p);
  GC1(square(a), x);
  GC1(sin(a), x);
  GC1(cos(a), x);
  GC1(tanh(a), x);
  GC1(sigmoid(a), x);
  GC1(relu(a), x);
  GC1(leaky_relu(a, 0.1), x);
  GC1(leaky_relu(a), x);
  GC1(elu(a, 1.5), x);
  GC1(gelu(a), x);
  GC1(gelu_tanh(a), x);
  GC1(silu(a), x);
  GC1(softplus(a), x);
  GC1(softplus(a), sp);
  GC1(clamp(a, -0.5, 0.8), cl);
  GC1(clamp_min(a, -0.5), cl);
  GC1(clamp_max(a, 0.8), cl);
}

TEST_CASE("unary ops: gradients at the kinks follow PyTorch's conventions") {
  const TD x = leaf(vals({-1.5, 0.0, 2.0, -0.5, 0.8, 1.0}, {6}));
  auto grad_of = [&](auto make) {
    x.grad() = TD();
    TD y = make(x);
    TD s = sum(y);
    s.backward();
    return vec(x.grad());
  };
  // relu and abs: zero gradient at 0.
  CHECK(grad_of([](const TD& a) { return TD(relu(a)); }) == std::vector<double>{0, 0, 1, 0, 1, 1});
  CHECK(grad_of([](const TD& a) { return TD(abs(a)); }) == std::vector<double>{-1, 0, 1, -1, 1, 1});
  // leaky_relu at 0 takes the negative slope; elu at 0 takes alpha * exp(0).
  CHECK(grad_of([](const TD& a) { return TD(leaky_relu(a, 0.1)); }) ==
        std::vector<double>{0.1, 0.1, 1, 0.1, 1, 1});
  const std::vector<double> ge = grad_of([](const TD& a) { return TD(elu(a, 1.5)); });
  CHECK(ge[0] == doctest::Approx(1.5 * std::exp(-1.5)));
  CHECK(ge[1] == doctest::Approx(1.5));
  CHECK(ge[2] == 1.0);
  // clamp: the gradient passes strictly between lo and hi; 0 at the bounds (PyTorch 2.15), each bound alone too.
  CHECK(grad_of([](const TD& a) { return TD(clamp(a, -0.5, 0.8)); }) == std::vector<double>{0, 1, 0, 0, 0, 0});
  CHECK(grad_of([](const TD& a) { return TD(clamp_min(a, -0.5)); }) == std::vector<double>{0, 1, 1, 0, 1, 1});
  CHECK(grad_of([](const TD& a) { return TD(clamp_max(a, 0.8)); }) == std::vector<double>{1, 1, 0, 1, 0, 0});
  // relu at NaN passes the gradient (PyTorch masks x <= 0 only); more in test_numerics' edge fixtures.
  const TD n = leaf(vals({std::numeric_limits<double>::quiet_NaN(), -1.0}, {2}));
  TD rn = relu(n);
  rn.backward(vals({2, 2}, {2}));
  CHECK(vec(n.grad()) == std::vector<double>{2, 0});
}

// ======================================================================================= element-wise binary ops

TEST_CASE("gradcheck: binary element-wise ops, tensor and scalar operands on both sides") {
  const TD x = away(normal({3, 4}, 21), {0.0, 0.3}, 0.05);
  const TD y = away(normal({3, 4}, 22), {0.0}, 0.2);  // divisor
  const TD p = uniform({3, 4}, 0.3, 2.0, 23);          // positive base for pow
  TD z = normal({3, 4}, 24);                            // for maximum/minimum: |x - z| >= 0.1
  for (std::int64_t i = 0; i < z.numel(); ++i)
    if (std::fabs(z.data()[i] - x.data()[i]) < 0.1) z.data()[i] = x.data()[i] + 0.2;

  GC2(a + b, x, y);
  GC2(a - b, x, y);
  GC2(a * b, x, y);
  GC2(a / b, x, y);
  GC2(pow(a, b), p, x);
  GC2(maximum(a, b), x, z);
  GC2(minimum(a, b), x, z);

  GC1(a + 2.5, x);
  GC1(2.5 + a, x);
  GC1(a - 2.5, x);
  GC1(2.5 - a, x);
  GC1(a * 2.5, x);
  GC1(2.5 * a, x);
  GC1(a / 2.5, x);
  GC1(2.5 / a, y);
  GC1(pow(a, 2.5), p);
  GC1(pow(a, 3), x);  // integer exponent, negative bases
  GC1(pow(2.5, a), x);
  GC1(pow(a, 0.0), x);  // d/da of a^0 is 0 (not 0 * a^-1, NaN at a = 0)
  GC1(pow(0.0, a), p);  // 0^b for b > 0: d/db is 0
  GC1(maximum(a, 0.3), x);
  GC1(maximum(0.3, a), x);
  GC1(minimum(a, 0.3), x);
  GC1(minimum(0.3, a), x);
}

TEST_CASE("maximum/minimum split the gradient evenly on ties") {
  const TD a = leaf(vals({1, 2, 3}, {3}));
  const TD b = leaf(vals({1, 5, 0}, {3}));
  TD m = maximum(a, b);
  TD n = minimum(a, b);
  TD s = sum(m);
  s.backward();
  CHECK(vec(a.grad()) == std::vector<double>{0.5, 0, 1});
  CHECK(vec(b.grad()) == std::vector<double>{0.5, 1, 0});
  a.grad() = TD();
  b.grad() = TD();
  TD t = sum(n);
  t.backward();
  CHECK(vec(a.grad()) == std::vector<double>{0.5, 1, 0});
  CHECK(vec(b.grad()) == std::vector<double>{0.5, 0, 1});
}

TEST_CASE("gradcheck: where, cast round trips, composites, repeated tensors") {
  const TD x = away(normal({3, 4}, 31), {0.0}, 0.05);
  const TD y = away(normal({3, 4}, 32), {0.0}, 0.2);
  const TD w = normal({3, 4}, 33);
  const TD b = normal({4}, 34);

  // where: both branches carry gradients; the condition does not.
  GC2(where(a > 0.0, a * b, sin(b)), x, y);
  GC1(where(a > 0.0, a, 0.0), x);
  GC1(where(a > 0.0, 1.5, a), x);

  // cast<float> then cast<double> inside one expression: the math runs in float, so the finite differences
  // need a larger step and a looser tolerance.
  GC2(cast<double>(square(cast<float>(a))) * b, x, w, 1e-2, 1e-4, 1e-3);

  GC3(gelu(a * b + c), x, w, b);  // c (4) broadcasts over rows
  GC2(sigmoid(a) * tanh(b) - a / b, x, y);
  GC1(a * a, x);
  GC2(a * b + a, x, w);
}

TEST_CASE("where: gradients go to the selected branch only") {
  const TD x = leaf(vals({-1, 2, -3, 4}, {4}));
  const TD y = leaf(vals({10, 20, 30, 40}, {4}));
  TD r = where(x > 0.0, x * y, sin(y));
  TD s = sum(r);
  s.backward();
  CHECK(vec(x.grad()) == std::vector<double>{0, 20, 0, 40});
  const std::vector<double> gy = vec(y.grad());
  CHECK(gy[0] == doctest::Approx(std::cos(10.0)));
  CHECK(gy[1] == 2.0);
  CHECK(gy[2] == doctest::Approx(std::cos(30.0)));
  CHECK(gy[3] == 4.0);
}

// ============================================================================================ broadcast, strides

TEST_CASE("gradcheck: broadcast operands") {
  const TD m = normal({3, 4}, 41);
  GC3(a * b + c, m, normal({4}, 42), normal({3, 1}, 43));   // (B,N) with (N) and (B,1)
  GC2(a * b, normal({3, 1}, 44), normal({1, 4}, 45));       // both sides broadcast
  GC2(a * b, normal({4}, 46), m);                           // the broadcast operand on the left
  GC2(a * b, m, normal({}, 47));                            // a 0-d tensor
  GC2(a * b, normal({2, 3, 4}, 48), normal({3, 1}, 49));    // rank difference and a size-1 dim
  GC3(a * b + c, normal({2, 1, 4}, 50), normal({3, 1}, 51), normal({1}, 52));
}

TEST_CASE("gradcheck: strided operands (views taken inside the function)") {
  const TD m = normal({3, 4}, 61);
  check_grad("transposed * contiguous", [](const Inputs& v) -> TD {
    const TD a = v[0].t(), &b = v[1];
    return TD(a * b);
  }, {normal({4, 3}, 62), m});
  check_grad("exp(transposed)", [](const Inputs& v) -> TD {
    const TD a = v[0].transpose(0, 1);
    return TD(exp(a));
  }, {normal({4, 3}, 63)});
  check_grad("slice with step * slice", [](const Inputs& v) -> TD {
    const TD a = v[0].slice(1, 0, 8, 2), b = v[1].slice(0, 1, 4);
    return TD(a * b);
  }, {normal({3, 8}, 64), normal({4, 4}, 65)});
  check_grad("expanded * expanded", [](const Inputs& v) -> TD {
    const TD a = v[0].expand({3, 4}), b = v[1].expand({3, 4});
    return TD(a * b);
  }, {normal({4}, 66), normal({3, 1}, 67)});
  check_grad("selected, narrowed, permuted", [](const Inputs& v) -> TD {
    const TD a = v[0].select(0, 1).narrow(1, 1, 3), b = v[1].permute({1, 0});
    return TD(a * b + a);
  }, {normal({2, 3, 5}, 68), normal({3, 3}, 69)});
  check_grad("a strided operand used twice, one broadcast", [](const Inputs& v) -> TD {
    const TD a = v[0].t(), &b = v[1], c = v[0].t().slice(0, 0, 1);
    return TD(a * b + c);
  }, {normal({4, 3}, 70), m});
}

// ================================================================================================== reductions

TEST_CASE("gradcheck: sum, mean over all dims, one dim, several dims, keepdim") {
  const TD x = normal({2, 3, 4}, 71);
  GC1(sum(a), x);
  GC1(sum(a, 1), x);
  GC1(sum(a, -1), x);
  GC1(sum(a, {0, 2}), x);
  GC1(sum(a, {0, 2}, true), x);
  GC1(sum(a, {}, true), x);
  GC1(mean(a), x);
  GC1(mean(a, 0), x);
  GC1(mean(a, {1, 2}), x);
  GC1(mean(a, 2, true), x);
}

TEST_CASE("gradcheck: max, min without ties") {
  const TD x = distinct({2, 3, 4}, 72);
  GC1(max(a), x);
  GC1(max(a, 1), x);
  GC1(max(a, {0, 2}, true), x);
  GC1(min(a), x);
  GC1(min(a, 2), x);
  GC1(min(a, {0, 1}), x);
}

TEST_CASE("max/min: tied extremes share the gradient evenly") {
  const TD x = leaf(vals({1, 3, 3, 2, 2, 2}, {2, 3}));
  TD m = max(x, 1);
  m.backward(vals({1, 6}, {2}));
  check_values(x.grad(), {0, 0.5, 0.5, 2, 2, 2});

  x.grad() = TD();
  TD all = max(x);  // 3 appears twice
  all.backward();
  check_values(x.grad(), {0, 0.5, 0.5, 0, 0, 0});

  x.grad() = TD();
  TD lo = min(x);  // 1 once
  lo.backward();
  check_values(x.grad(), {1, 0, 0, 0, 0, 0});

  x.grad() = TD();
  TD lo1 = min(x, 0, true);  // columns: (1,2) (3,2) (3,2)
  lo1.backward(vals({1, 1, 1}, {1, 3}));
  check_values(x.grad(), {1, 0, 0, 0, 1, 1});

  const TD y = leaf(vals({5, 5, 5, 5}, {4}));  // four-way tie
  TD my = max(y);
  my.backward();
  check_values(y.grad(), {0.25, 0.25, 0.25, 0.25});
}

TEST_CASE("max/min over dims: a group holding a NaN has a NaN gradient (torch.amax); over all, the NaNs share it") {
  // PyTorch's references (tests/fixtures/gen_parity.py): torch.amax/amin over dims spread the gradient over the
  // elements equal to the result, and NaN equals nothing, so the count is 0 and the whole group's gradient is NaN;
  // torch.max(x) over everything gives it to the NaN elements, shared evenly.
  static const ember_test::Fixtures fx("parity.txt");
  auto same = [](const TD& got, const TD& want) {
    REQUIRE(got.defined());
    REQUIRE(got.shape() == want.shape());
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      const double g = got.data()[i], w = want.data()[i];
      INFO("element " << i << ": got " << g << ", want " << w);
      CHECK((std::isnan(w) ? std::isnan(g) : std::fabs(g - w) <= 1e-12 * (1 + std::fabs(w))));
    }
  };
  const std::vector<std::pair<std::string, std::function<TD(const TD&)>>> cases = {
      {"amax1", [](const TD& a) { return max(a, 1); }},
      {"amin1", [](const TD& a) { return min(a, 1, true); }},
      {"amax0", [](const TD& a) { return max(a, 0); }},
      {"amax01", [](const TD& a) { return max(a, {0, 1}); }},
      {"max_all", [](const TD& a) { return max(a); }},
      {"min_all", [](const TD& a) { return min(a); }}};
  for (const auto& c : cases) {
    const std::string name = c.first;  // (a plain variable: clang before 16 cannot capture structured bindings)
    const auto& f = c.second;
    INFO("case nanmax." << name);
    const TD x = leaf(fx["nanmax." + name + ".in0"]);
    TD y = f(x);
    same(y, fx["nanmax." + name + ".y"]);
    y.backward(fx["nanmax." + name + ".g"]);
    same(x.grad(), fx["nanmax." + name + ".d0"]);
  }
}

TEST_CASE("prod: gradients with no zero, one zero, two zeros") {
  const TD x = uniform({2, 3, 2}, 0.5, 1.5, 73);
  GC1(prod(a), x);
  GC1(prod(a, 1), x);
  GC1(prod(a, {0, 2}, true), x);
  const TD z1 = vals({0.7, -1.2, 0.0, 1.3, 0.9, -0.8}, {2, 3});
  const TD z2 = vals({0.7, 0.0, 0.0, 1.3, 0.0, -0.8}, {2, 3});
  GC1(prod(a), z1);
  GC1(prod(a, 1), z1);
  GC1(prod(a), z2);
  GC1(prod(a, 0), z2);

  // By hand: d prod / d x_i is the product of the others.
  const TD a = leaf(vals({2, 0, 3}, {3}));
  TD pa = prod(a);
  pa.backward();
  check_values(a.grad(), {0, 6, 0});
  const TD b = leaf(vals({2, 0, 0, 3}, {4}));
  TD pb = prod(b);
  pb.backward();
  check_values(b.grad(), {0, 0, 0, 0});
  const TD c = leaf(vals({2, 0, 3, 1, 2, 4}, {2, 3}));
  TD pc = prod(c, 1);
  pc.backward(vals({1, 1}, {2}));
  check_values(c.grad(), {0, 6, 0, 8, 4, 2});
}

TEST_CASE("gradcheck: var and std") {
  const TD x = normal({2, 3, 4}, 74);
  GC1(var(a), x);
  GC1(var(a, 1), x);
  GC1(var(a, {0, 2}, 0, true), x);
  GC1(std_dev(a), x);
  GC1(std_dev(a, 2), x);
  GC1(std_dev(a, {0, 1}, 0), x);
  GC1(std_dev(a, -1, 1, true), x);
}

TEST_CASE("gradcheck: norm with p = 1, 2, 3, inf") {
  const TD x = away(normal({2, 3, 4}, 75), {0.0}, 0.05);
  const TD d = distinct({2, 3, 4}, 76);  // |values| distinct for the inf-norm
  GC1(norm(a, 1), x);
  GC1(norm(a, 1, 2), x);
  GC1(norm(a), x);
  GC1(norm(a, 2, 1), x);
  GC1(norm(a, 2, {0, 2}, true), x);
  GC1(norm(a, 3), x);
  GC1(norm(a, 3, -1), x);
  GC1(norm(a, 3, {0, 1}, true), x);
  GC1(norm(a, 0.5), x);
  GC1(norm(a, std::numeric_limits<double>::infinity()), d);
  GC1(norm(a, std::numeric_limits<double>::infinity(), 1), d);
  GC1(norm(a, std::numeric_limits<double>::infinity(), {0, 2}, true), d);

  // The 2-norm of a zero vector has gradient 0 (not NaN), as in PyTorch; the inf-norm splits ties.
  const TD z = leaf(zeros<double>({3}));
  TD nz = norm(z);
  nz.backward();
  check_values(z.grad(), {0, 0, 0});
  const TD t = leaf(vals({-2, 1, 2}, {3}));
  TD nt = norm(t, std::numeric_limits<double>::infinity());
  nt.backward();
  check_values(t.grad(), {-0.5, 0, 0.5});
}

TEST_CASE("gradcheck: reductions over expressions") {
  const TD x = normal({3, 4}, 77), y = normal({3, 4}, 78);
  GC2(sum(a * b + 1.0, 1), x, y);
  GC2(sum(a * b + 1.0), x, y);
  GC2(mean(a * b + 1.0, 0, true), x, y);
  GC2(sum(a * b, 1), x, normal({4}, 79));  // a broadcast leaf inside the reduction
  GC1(max(a * a, 1), distinct({3, 4}, 80));
}

// ======================================================================================================= views

TEST_CASE("gradcheck: views") {
  const TD x = normal({2, 3, 4}, 81);
  const std::vector<std::pair<std::string, Fn>> views = {
      {"slice", [](const Inputs& v) { return v[0].slice(2, 1, 4); }},
      {"slice step", [](const Inputs& v) { return v[0].slice(2, 0, 4, 3); }},
      {"slice negative", [](const Inputs& v) { return v[0].slice(1, -2, 3); }},
      {"select", [](const Inputs& v) { return v[0].select(1, 2); }},
      {"select negative", [](const Inputs& v) { return v[0].select(0, -1); }},
      {"operator[]", [](const Inputs& v) { return v[0][1]; }},
      {"narrow", [](const Inputs& v) { return v[0].narrow(2, 1, 2); }},
      {"transpose", [](const Inputs& v) { return v[0].transpose(0, 2); }},
      {"permute", [](const Inputs& v) { return v[0].permute({2, 0, 1}); }},
      {"reshape (view)", [](const Inputs& v) { return v[0].reshape({4, 6}); }},
      {"reshape (copy)", [](const Inputs& v) { return v[0].permute({2, 0, 1}).reshape({4, -1}); }},
      {"view", [](const Inputs& v) { return v[0].view({-1}); }},
      {"expand", [](const Inputs& v) { return v[0].select(2, 0).unsqueeze(0).expand({5, 2, 3}); }},
      {"expand new dims", [](const Inputs& v) { return v[0].select(0, 0).select(0, 1).expand({2, 3, 4}); }},
      {"unsqueeze/squeeze", [](const Inputs& v) { return v[0].unsqueeze(1).unsqueeze(4).squeeze(1); }},
      {"squeeze all", [](const Inputs& v) { return v[0].narrow(1, 2, 1).squeeze(); }},
      {"flatten", [](const Inputs& v) { return v[0].flatten(); }},
      {"flatten(1)", [](const Inputs& v) { return v[0].transpose(1, 2).flatten(1); }},
      {"contiguous", [](const Inputs& v) { return v[0].transpose(0, 1).contiguous(); }},
      {"clone", [](const Inputs& v) { return v[0].clone(); }},
      {"t of a slice", [](const Inputs& v) { return v[0].select(0, 1).t().slice(0, 1, 4, 2); }},
  };
  for (const auto& [name, f] : views) check_grad(name, f, {x});
  // A view chain feeding an element-wise op (the op reads it strided).
  check_grad("square(view chain)", [](const Inputs& v) -> TD {
    const TD a = v[0].permute({1, 2, 0}).slice(1, 1, 4, 2).unsqueeze(0).expand({2, 3, 2, 2});
    return TD(square(a));
  }, {x});
}

TEST_CASE("views: gradients land in the right places") {
  const TD x = leaf(zeros<double>({2, 3}));
  TD s = x.slice(1, 0, 3, 2);  // columns 0 and 2
  s.backward(vals({1, 2, 3, 4}, {2, 2}));
  check_values(x.grad(), {1, 0, 2, 3, 0, 4});
  x.grad() = TD();
  TD e = x.select(0, 1).unsqueeze(0).expand({4, 3});  // row 1, four times
  e.backward(ones<double>({4, 3}));
  check_values(x.grad(), {0, 0, 0, 4, 4, 4});
  x.grad() = TD();
  TD t = x.t();
  t.backward(vals({1, 2, 3, 4, 5, 6}, {3, 2}));
  check_values(x.grad(), {1, 3, 5, 2, 4, 6});
}

// ============================================================================================ matrix products

TEST_CASE("gradcheck: matmul in all its shapes, mm, bmm, linear") {
  GC2(matmul(a, b), normal({4}, 91), normal({4}, 92));                   // 1D . 1D
  GC2(matmul(a, b), normal({3, 4}, 93), normal({4}, 94));                // 2D . 1D
  GC2(matmul(a, b), normal({4}, 95), normal({4, 5}, 96));                // 1D . 2D
  GC2(matmul(a, b), normal({3, 4}, 97), normal({4, 5}, 98));             // 2D . 2D
  GC2(matmul(a, b), normal({2, 3, 4}, 99), normal({2, 4, 5}, 100));      // 3D . 3D
  GC2(matmul(a, b), normal({2, 3, 4}, 101), normal({4, 5}, 102));        // 3D . 2D
  GC2(matmul(a, b), normal({3, 4}, 103), normal({2, 4, 5}, 104));        // 2D . 3D
  GC2(matmul(a, b), normal({2, 3, 2, 4}, 105), normal({3, 4, 5}, 106));  // 4D . 3D, broadcast batch
  GC2(matmul(a, b), normal({2, 1, 2, 4}, 107), normal({3, 4, 5}, 108));  // size-1 batch dim broadcast
  GC2(matmul(a, b), normal({2, 3, 4}, 109), normal({4}, 110));           // 3D . 1D
  GC2(matmul(a, b), normal({4}, 111), normal({2, 4, 5}, 112));           // 1D . 3D
  GC2(mm(a, b), normal({3, 4}, 113), normal({4, 5}, 114));
  check_grad("mm of transposed operands", [](const Inputs& v) -> TD { return mm(v[0].t(), v[1].t()); },
             {normal({4, 3}, 115), normal({5, 4}, 116)});
  check_grad("mm of a sliced operand", [](const Inputs& v) -> TD { return mm(v[0].slice(1, 0, 8, 2), v[1]); },
             {normal({3, 8}, 117), normal({4, 5}, 118)});
  GC2(bmm(a, b), normal({2, 3, 4}, 119), normal({2, 4, 5}, 120));
  check_grad("bmm of transposed operands",
             [](const Inputs& v) -> TD { return bmm(v[0].transpose(1, 2), v[1].transpose(0, 1)); },
             {normal({2, 4, 3}, 121), normal({4, 2, 5}, 122)});
  GC3(linear(a, b, c), normal({3, 4}, 123), normal({5, 4}, 124), normal({5}, 125));
  GC2(linear(a, b), normal({3, 4}, 126), normal({5, 4}, 127));
  GC3(linear(a, b, c), normal({2, 3, 4}, 128), normal({5, 4}, 129), normal({5}, 130));
  GC3(linear(a, b, c), normal({4}, 131), normal({5, 4}, 132), normal({5}, 133));
  // With an activation: ReLU in the fused node, GELU and SiLU as their own op after it.
  GC3(linear(a, b, c, Activation::relu), normal({6, 4}, 134), normal({5, 4}, 135), normal({5}, 136));
  GC2(linear(a, b, TD(), Activation::relu), normal({2, 3, 4}, 137), normal({5, 4}, 138));
  GC3(linear(a, b, c, Activation::gelu), normal({3, 4}, 139), normal({5, 4}, 140), normal({5}, 141));
  GC3(linear(a, b, c, Activation::silu), normal({3, 4}, 142), normal({5, 4}, 143), normal({5}, 144));
  // Only some operands differentiated (the others constants): each gradient on its own.
  check_grad("linear, weight and bias only", [](const Inputs& v) -> TD {
    return linear(normal({7, 4}, 145), v[0], v[1], Activation::relu);
  }, {normal({3, 4}, 146), normal({3}, 147)});
  check_grad("linear, input only", [](const Inputs& v) -> TD {
    return linear(v[0], normal({3, 4}, 148), normal({3}, 149), Activation::relu);
  }, {normal({7, 4}, 150)});
  check_grad("3-layer chain", [](const Inputs& v) -> TD {
    const TD h1 = mm(v[0], v[1]), a1 = tanh(h1), h2 = mm(a1, v[2]), a2 = tanh(h2);
    return mm(a2, v[3]);
  }, {normal({4, 3}, 134), normal({3, 5}, 135), normal({5, 5}, 136), normal({5, 2}, 137)});
}

TEST_CASE("matmul: gradient by hand") {
  // c = a @ b, dc = 1: da = 1 @ bᵀ (row sums of b), db = aᵀ @ 1 (column sums of a).
  const TD a = leaf(vals({1, 2, 3, 4, 5, 6}, {2, 3}));
  const TD b = leaf(vals({1, -1, 2, 0, -2, 3}, {3, 2}));
  TD c = matmul(a, b);
  check_values(c, {1 + 4 - 6, -1 + 0 + 9, 4 + 10 - 12, -4 + 0 + 18});
  c.backward(ones<double>({2, 2}));
  check_values(a.grad(), {0, 2, 1, 0, 2, 1});
  check_values(b.grad(), {5, 5, 7, 7, 9, 9});
}

// ============================================================================================ cat, stack, index

TEST_CASE("gradcheck: cat, stack, index_select") {
  GC2(cat(std::vector<TD>{a, b}, 0), normal({2, 3}, 141), normal({4, 3}, 142));
  GC3(cat(std::vector<TD>{a, b, c}, 1), normal({2, 1}, 143), normal({2, 3}, 144), normal({2, 2}, 145));
  GC2(cat(std::vector<TD>{a, b}, -1), normal({2, 3, 2}, 146), normal({2, 3, 1}, 147));
  check_grad("cat with a constant piece",
             [](const Inputs& v) -> TD { return cat(std::vector<TD>{ones<double>({1, 3}), v[0]}, 0); },
             {normal({2, 3}, 148)});
  check_grad("cat of views",
             [](const Inputs& v) -> TD { return cat(std::vector<TD>{v[0].t(), v[0].slice(1, 0, 2)}, 1); },
             {normal({3, 3}, 149)});
  GC2(stack(std::vector<TD>{a, b}, 0), normal({2, 3}, 150), normal({2, 3}, 151));
  GC3(stack(std::vector<TD>{a, b, c}, 2), normal({2, 3}, 152), normal({2, 3}, 153), normal({2, 3}, 154));
  GC2(stack(std::vector<TD>{a, b}, -1), normal({4}, 155), normal({4}, 156));
  check_grad("index_select, repeated indices",
             [](const Inputs& v) -> TD { return index_select(v[0], 0, from_vector<std::int64_t>({2, 0, 2, 2, 1})); },
             {normal({3, 4}, 157)});
  check_grad("index_select dim 1, last and repeated indices",  // negative indices are an error, as in PyTorch
             [](const Inputs& v) -> TD { return index_select(v[0], 1, from_vector<std::int64_t>({3, 0, 0})); },
             {normal({2, 4, 2}, 158)});
  check_grad("index_select of a transposed view",
             [](const Inputs& v) -> TD { return index_select(v[0].t(), 1, from_vector<std::int64_t>({1, 1, 0})); },
             {normal({3, 4}, 159)});
}

TEST_CASE("index_select: repeated indices add up") {
  const TD x = leaf(zeros<double>({3, 2}));
  TD r = index_select(x, 0, from_vector<std::int64_t>({2, 0, 2, 2}));
  r.backward(vals({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  check_values(x.grad(), {3, 4, 0, 0, 1 + 5 + 7, 2 + 6 + 8});
}

// ================================================================================================== semantics

TEST_CASE("backward on a scalar and with an explicit gradient") {
  const TD x = leaf(vals({1, 2, 3}, {3}));
  TD y = x * x;
  TD s = sum(y);
  CHECK(s.dim() == 0);
  s.backward();
  check_values(x.grad(), {2, 4, 6});

  const TD z = leaf(vals({1, -2, 3}, {3}));
  TD w = z * z;
  w.backward(vals({1, 10, 100}, {3}));
  check_values(z.grad(), {2, -40, 600});

  // A one-element (not 0-d) output also takes the implicit gradient 1.
  const TD u = leaf(vals({4}, {1, 1}));
  TD uu = u * u;
  uu.backward();
  check_values(u.grad(), {8});
}

TEST_CASE("gradients accumulate across backward calls; reset and zero") {
  const TD x = leaf(vals({1, 2, 3}, {3}));
  for (int i = 0; i < 2; ++i) {
    TD y = x * x;
    TD s = sum(y);
    s.backward();
  }
  check_values(x.grad(), {4, 8, 12});

  x.grad() = TD();  // reset: the next backward starts afresh
  CHECK_FALSE(x.grad().defined());
  {
    TD y = x * x;
    TD s = sum(y);
    s.backward();
  }
  check_values(x.grad(), {2, 4, 6});

  TD g = x.grad();  // zero_() keeps the buffer and later backward accumulates into it
  x.grad().zero_();
  check_values(g, {0, 0, 0});
  {
    TD y = x * 2.5;
    TD s = sum(y);
    s.backward();
  }
  check_values(x.grad(), {2.5, 2.5, 2.5});

  // The same with float tensors, as a training loop would write it.
  Tensor<float> f = from_vector<float>({1.f, 2.f});
  f.requires_grad_();
  for (int i = 0; i < 3; ++i) {
    Tensor<float> y = f * 2.f;
    Tensor<float> s = sum(y);
    s.backward();
  }
  check_values(f.grad(), {6, 6}, 1e-6);
  f.grad() = Tensor<float>();
  CHECK_FALSE(f.grad().defined());
}

TEST_CASE("NoGradGuard and GradModeGuard") {
  const TD x = leaf(vals({1, 2, 3}, {3}));
  REQUIRE(is_grad_enabled());
  {
    NoGradGuard ng;
    CHECK_FALSE(is_grad_enabled());
    TD y = x * x;
    CHECK_FALSE(y.requires_grad());
    CHECK(y.is_leaf());
    CHECK(y.grad_fn() == nullptr);
    TD s = sum(x);
    CHECK_FALSE(s.requires_grad());
    TD t = x.unsqueeze(1).t();
    CHECK_FALSE(t.requires_grad());
    TD v = x.slice(0, 0, 2);
    CHECK(v.grad_fn() == nullptr);
    TD m = matmul(x, x);
    CHECK_FALSE(m.requires_grad());
    TD c = cat(std::vector<TD>{x, x});
    CHECK_FALSE(c.requires_grad());
    {
      NoGradGuard nested;
      CHECK_FALSE(is_grad_enabled());
    }
    CHECK_FALSE(is_grad_enabled());  // the nested guard restored "off", not "on"
    {
      GradModeGuard on(true);
      CHECK(is_grad_enabled());
      TD z = x * x;
      CHECK(z.requires_grad());
      CHECK(z.grad_fn() != nullptr);
    }
    CHECK_FALSE(is_grad_enabled());
  }
  CHECK(is_grad_enabled());
  {
    GradModeGuard off(false);
    TD y = x * x;
    CHECK_FALSE(y.requires_grad());
  }
  CHECK(is_grad_enabled());
  try {
    NoGradGuard ng;
    throw 1;
  } catch (int) {
  }
  CHECK(is_grad_enabled());  // restored on unwinding too
  TD y = x * x;
  CHECK(y.requires_grad());
  CHECK(y.grad_fn() != nullptr);
}

TEST_CASE("InferenceMode: no nodes, no version counter, and its tensors refuse autograd outside it") {
  nn::Linear fc(3, 2);
  const Tensor<float> x = ones<float>(Shape{4, 3});
  // Outside: a forward records nodes (so the counter below can fail).
  std::uint64_t n0 = autograd::nodes_created();
  Tensor<float> y_grad = sum(relu(fc(x)));
  CHECK(autograd::nodes_created() > n0);
  CHECK(y_grad.requires_grad());

  Tensor<float> y, buf;
  n0 = autograd::nodes_created();
  {
    InferenceMode im;
    CHECK(InferenceMode::is_enabled());
    CHECK_FALSE(is_grad_enabled());
    y = relu(fc(x));
    Tensor<float> s = sum(y * y);
    CHECK_FALSE(y.requires_grad());
    CHECK_FALSE(s.requires_grad());
    CHECK(y.is_inference());
    CHECK(s.is_inference());
    CHECK(y.slice(0, 0, 2).is_inference());  // a view of an inference tensor is one too
    // No version counter: in-place writes to an inference tensor leave it at 0.
    buf = zeros<float>(Shape{3});
    buf += ones<float>(Shape{3});
    buf.fill_(2.f);
    CHECK(buf.version() == 0);
    {
      InferenceMode off(false);  // a nested guard can switch it off
      CHECK_FALSE(is_inference_mode_enabled());
      CHECK_FALSE(zeros<float>(Shape{1}).is_inference());
    }
    CHECK(is_inference_mode_enabled());
  }
  CHECK(autograd::nodes_created() == n0);  // nothing was recorded, not even gradient sinks
  CHECK_FALSE(is_inference_mode_enabled());
  CHECK(is_grad_enabled());
  CHECK(buf.to_vector() == std::vector<float>{2.f, 2.f, 2.f});
  // A normal tensor still counts versions; one created outside the guard is not an inference tensor.
  Tensor<float> normal = zeros<float>(Shape{3});
  normal += ones<float>(Shape{3});
  CHECK(normal.version() == 1);
  CHECK_FALSE(normal.is_inference());

  // Outside the guard, an inference tensor cannot enter autograd: saved by an expression, by a matmul, or
  // made to require gradients.
  Tensor<float> w = ones<float>(Shape{2, 2}).requires_grad_(), v = ones<float>(Shape{2}).requires_grad_();
  CHECK_THROWS_WITH_AS(Tensor<float>(y * v), doctest::Contains("created under InferenceMode cannot be saved for "
                                                               "backward"),
                       Error);
  CHECK_THROWS_WITH_AS(matmul(y, w), doctest::Contains("a tensor of shape [4, 2] (float32) created under "
                                                       "InferenceMode"),
                       Error);
  CHECK_THROWS_WITH_AS(y.detach().requires_grad_(), doctest::Contains("created under InferenceMode and cannot "
                                                                      "require gradients outside it"),
                       Error);
  // Without a tensor that requires grad nothing is saved, so plain use is fine; clone() gives a normal tensor.
  CHECK(Tensor<float>(y * 2.f).to_vector().size() == 8);
  Tensor<float> yc = y.clone();
  CHECK_FALSE(yc.is_inference());
  Tensor<float> loss = sum(matmul(yc, w));
  loss.backward();
  CHECK(w.grad().defined());
  // Unwinding restores both flags.
  try {
    InferenceMode im;
    throw 1;
  } catch (int) {
  }
  CHECK(is_grad_enabled());
  CHECK_FALSE(is_inference_mode_enabled());
}

TEST_CASE("detach cuts the graph and shares storage") {
  const TD x = leaf(vals({1, 2, 3}, {3}));
  TD y = x * x;
  TD d = y.detach();
  CHECK_FALSE(d.requires_grad());
  CHECK(d.is_leaf());
  CHECK(d.data() == y.data());
  TD z = d * x;  // d is a constant here: dz/dx = d = x², not 3x²
  TD s = sum(z);
  s.backward();
  check_values(x.grad(), {1, 4, 9});
  d.data()[0] = 42;  // shared storage
  CHECK(y.data()[0] == 42);
}

TEST_CASE("retain_graph allows a second backward; without it the second one throws") {
  const TD x = leaf(vals({0.5, -1, 2}, {3}));
  TD y = exp(x);
  TD s = sum(y);
  s.backward(true);
  check_values(x.grad(), {std::exp(0.5), std::exp(-1.0), std::exp(2.0)});
  s.backward();  // the graph was retained
  check_values(x.grad(), {2 * std::exp(0.5), 2 * std::exp(-1.0), 2 * std::exp(2.0)});
  CHECK_THROWS_AS(s.backward(), ember::Error);
  try {
    s.backward();
    FAIL("expected an error");
  } catch (const ember::Error& e) {
    CHECK(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
}

TEST_CASE("gradient-ready hooks on leaves") {
  Generator gen(201);
  const TD x = randn<double>({4, 3}, gen);
  const TD w1 = leaf(randn<double>({3, 5}, gen)), w2 = leaf(randn<double>({5, 5}, gen)),
           w3 = leaf(randn<double>({5, 2}, gen));
  const TD* ws[3] = {&w1, &w2, &w3};
  std::vector<int> order;
  std::vector<TD> seen(3);
  std::vector<bool> complete(3, false);
  for (int i = 0; i < 3; ++i) {
    const TD* w = ws[i];
    TD(*w).register_hook([&, i, w](const TD& g) {
      order.push_back(i + 1);
      seen[std::size_t(i)] = g.clone();
      // When the hook runs, the leaf's .grad() is already the complete gradient it is given.
      complete[std::size_t(i)] = w->grad().defined() && w->grad().data() == g.data();
    });
  }
  auto forward_backward = [&] {
    TD h1 = mm(x, w1), a1 = tanh(h1), h2 = mm(a1, w2), a2 = tanh(h2), h3 = mm(a2, w3);
    TD loss = sum(h3);
    loss.backward();
  };
  forward_backward();
  // Each fires exactly once, last layer first (readiness order), the first layer's weight included.
  CHECK(order == std::vector<int>{3, 2, 1});
  for (int i = 0; i < 3; ++i) {
    INFO("w" << i + 1);
    CHECK(complete[std::size_t(i)]);
    check_values(seen[std::size_t(i)], vec(ws[i]->grad()));
  }
  const std::vector<double> first = vec(w1.grad());

  // A second backward: once more each, with the accumulated gradient.
  order.clear();
  forward_backward();
  CHECK(order == std::vector<int>{3, 2, 1});
  std::vector<double> twice = first;
  for (double& v : twice) v *= 2;
  check_values(seen[0], twice);
  check_values(w1.grad(), twice);
}

TEST_CASE("a hook on a leaf used twice fires once, after both contributions") {
  const TD w = leaf(vals({1, -2, 3}, {3}));
  int fired = 0;
  std::vector<double> got;
  TD(w).register_hook([&](const TD& g) {
    ++fired;
    got = g.to_vector();
  });
  TD p = w * 2.5;  // first consumer
  TD q = w * w;    // second consumer
  TD r = p + q;
  TD s = sum(r);
  s.backward();
  CHECK(fired == 1);
  CHECK(got == std::vector<double>{2.5 + 2, 2.5 - 4, 2.5 + 6});  // 2.5 + 2w
}

TEST_CASE("hooks on non-leaf tensors and retain_grad") {
  const TD x = leaf(vals({0.5, -1, 2}, {3}));
  TD y = exp(x);
  y.retain_grad();
  std::vector<double> hook_grad;
  y.register_hook([&](const TD& g) { hook_grad = g.to_vector(); });
  TD z = y * y;  // not retained
  TD s = sum(z);
  s.backward();
  const std::vector<double> e = {std::exp(0.5), std::exp(-1.0), std::exp(2.0)};
  check_values(y.grad(), {2 * e[0], 2 * e[1], 2 * e[2]});  // dz/dy = 2y
  CHECK(hook_grad == vec(y.grad()));
  CHECK_FALSE(z.grad().defined());
  check_values(x.grad(), {2 * e[0] * e[0], 2 * e[1] * e[1], 2 * e[2] * e[2]});
}

TEST_CASE("backward frees the tape") {
  const TD x = leaf(normal({1000}, 211));
  std::weak_ptr<TensorImpl<double>> big;
  std::weak_ptr<autograd::Node> root_fn, inner_fn;
  TD loss;
  {
    TD h = exp(x);  // a big intermediate, saved by the next op
    big = h.impl_ptr();
    inner_fn = h.grad_fn();
    TD h2 = h * h;
    loss = sum(h2);
    root_fn = loss.grad_fn();
  }
  CHECK_FALSE(big.expired());  // only the tape holds it now
  loss.backward();
  CHECK(big.expired());        // released by backward
  CHECK_FALSE(root_fn.expired());
  loss = TD();                 // dropping the output drops the whole graph (no cycles)
  CHECK(root_fn.expired());
  CHECK(inner_fn.expired());

  // With retain_graph the saved tensors survive until the last backward.
  {
    TD h = exp(x);
    big = h.impl_ptr();
    TD h2 = h * h;
    loss = sum(h2);
  }
  loss.backward(true);
  CHECK_FALSE(big.expired());
  loss.backward();
  CHECK(big.expired());

  // A graph that is never run is freed with its output too.
  {
    TD h = exp(x);
    big = h.impl_ptr();
    TD h2 = h * h;
    loss = sum(h2);
    root_fn = loss.grad_fn();
  }
  loss = TD();
  CHECK(big.expired());
  CHECK(root_fn.expired());
}

TEST_CASE("in-place write into a tensor the tape still needs makes backward throw") {
  auto expect_inplace_error = [](const TD& loss) {
    try {
      loss.backward();
      FAIL("expected an in-place error");
    } catch (const ember::Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("in-place") != std::string::npos);
    }
  };
  const TD x = leaf(vals({0.5, -1, 2}, {3}));
  {
    TD a = exp(x);
    TD b = a * a;  // saves a
    {
      NoGradGuard ng;
      a.fill_(1.0);
    }
    TD s = sum(b);
    expect_inplace_error(s);
  }
  {
    TD a = exp(x);
    TD b = a * a;
    a += 1.0;  // differentiable in-place write: a new version of a, but b needs the old one
    TD s = sum(b);
    expect_inplace_error(s);
  }
  {
    TD y = x * x;  // saves the leaf x
    {
      NoGradGuard ng;  // e.g. an optimizer step before backward
      TD(x).fill_(3.0);
    }
    TD s = sum(y);
    expect_inplace_error(s);
  }
  {
    const TD w = leaf(vals({1, 2, 3, 4}, {2, 2}));
    TD m = mm(w, w);  // saves w
    {
      NoGradGuard ng;
      TD(w).fill_(0.0);
    }
    expect_inplace_error(sum(m));
  }
  {
    TD a = exp(x);
    TD m = max(a);  // its backward reads the saved result
    {
      NoGradGuard ng;
      m.fill_(-1.0);
    }
    expect_inplace_error(m);
  }
}

TEST_CASE("in-place assignment on a non-leaf that requires grad") {
  const TD x = leaf(vals({0.5, -1, 2}, {3}));
  TD y = exp(x);
  const double* mem = y.data();
  y = y * 2.5;  // written into y's memory; the tape keeps a copy of the old y
  CHECK(y.data() == mem);
  y = y * y;    // y = (2.5 eˣ)² = 6.25 e²ˣ
  TD s = sum(y);
  s.backward();
  std::vector<double> ey, eg;
  for (double v : {0.5, -1.0, 2.0}) {
    ey.push_back(6.25 * std::exp(2 * v));
    eg.push_back(12.5 * std::exp(2 * v));
  }
  check_values(y, ey);
  check_values(x.grad(), eg);

  // The same in float, as `y = y * 2.f` is written in a training step.
  Tensor<float> xf = from_vector<float>({0.5f, -1.f});
  xf.requires_grad_();
  Tensor<float> yf = exp(xf);
  yf = yf * 2.f;
  Tensor<float> sf = sum(yf);
  sf.backward();
  check_values(xf.grad(), {2 * std::exp(0.5), 2 * std::exp(-1.0)}, 1e-6);
}

TEST_CASE("in-place assignment into the result of a reduction") {
  const TD x = leaf(vals({1, 2, 3}, {3}));
  TD s = sum(x);  // not a view of anything the user holds, so it can be written in place
  s = s * 2.5;
  CHECK(s.item() == 15.0);
  s.backward();
  check_values(x.grad(), {2.5, 2.5, 2.5});
}

TEST_CASE("retain_grad on a tensor modified in place keeps the gradient of its latest version") {
  const TD x = leaf(vals({0.5, -1, 2}, {3}));
  TD y = exp(x);
  y.retain_grad();
  y = y * 2.5;
  TD s = sum(y);
  s.backward();
  check_values(y.grad(), {1, 1, 1});  // d sum(y) / dy for the y that was summed
  check_values(x.grad(), {2.5 * std::exp(0.5), 2.5 * std::exp(-1.0), 2.5 * std::exp(2.0)});
}

TEST_CASE("diamond graph: an intermediate with two consumers") {
  const TD x = leaf(vals({0.3, -0.7, 1.1}, {3}));
  TD a = exp(x);
  TD b = a * 2.5;   // consumer 1
  TD c = sin(a);    // consumer 2
  TD d = b + c;
  TD s = sum(d);
  s.backward();
  std::vector<double> expect;
  for (double v : {0.3, -0.7, 1.1}) expect.push_back((2.5 + std::cos(std::exp(v))) * std::exp(v));
  check_values(x.grad(), expect);
  // And a leaf reached along paths of different lengths.
  const TD w = leaf(vals({1, 2}, {2}));
  TD p = w * w;
  TD q = p * w;  // w³
  TD r = q + w;  // w³ + w
  TD t = sum(r);
  t.backward();
  check_values(w.grad(), {3 * 1 + 1, 3 * 4 + 1});
}

TEST_CASE("large tensors (threaded paths) give the gradients computed by hand") {
  const std::int64_t B = 1000, N = 1000;  // 1M elements: many chunks and reduction blocks
  Generator gen(301);
  Tensor<float> x = randn<float>({B, N}, gen), w = randn<float>({B, N}, gen), b = randn<float>({N}, gen);
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  Tensor<float> loss = sum(tanh(x * w + b));  // fused reduction, broadcast leaf b
  loss.backward();

  const std::vector<float> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector();
  const std::vector<float> gx = x.grad().to_vector(), gw = w.grad().to_vector(), gb = b.grad().to_vector();
  std::vector<double> db(std::size_t(N), 0.0);
  double total = 0, max_dx = 0, max_dw = 0;
  for (std::int64_t i = 0; i < B; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const auto k = std::size_t(i * N + j);
      const double t = std::tanh(double(xv[k]) * double(wv[k]) + double(bv[std::size_t(j)]));
      const double d = 1 - t * t;
      total += t;
      db[std::size_t(j)] += d;
      max_dx = std::max(max_dx, std::fabs(double(gx[k]) - d * double(wv[k])));
      max_dw = std::max(max_dw, std::fabs(double(gw[k]) - d * double(xv[k])));
    }
  CHECK(double(loss.item()) == doctest::Approx(total).epsilon(1e-5));
  CHECK(max_dx < 1e-5);
  CHECK(max_dw < 1e-5);
  double max_db = 0;
  for (std::size_t j = 0; j < std::size_t(N); ++j)
    max_db = std::max(max_db, std::fabs(double(gb[j]) - db[j]) / (1 + std::fabs(db[j])));
  CHECK(max_db < 1e-5);

  // Double precision, reductions along each dim and over everything.
  const TD m = leaf(normal({B, N}, 302));
  TD s0 = sum(m, 0);
  s0.backward(ones<double>({N}));
  TD mx = max(m, 1);  // one-hot per row
  mx.backward(ones<double>({B}));
  TD mn = mean(m);
  mn.backward();
  const std::vector<double> mv = m.to_vector(), gm = m.grad().to_vector();
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    std::int64_t arg = 0;
    for (std::int64_t j = 1; j < N; ++j)
      if (mv[std::size_t(i * N + j)] > mv[std::size_t(i * N + arg)]) arg = j;
    for (std::int64_t j = 0; j < N; ++j) {
      const double expect = 1.0 + (j == arg ? 1.0 : 0.0) + 1.0 / double(B * N);
      bad += std::fabs(gm[std::size_t(i * N + j)] - expect) > 1e-12;
    }
  }
  CHECK(bad == 0);
}

// ---- autograd::apply_function: ops with a backward of the user's --------------------------------------------------

namespace {
// swish(x) = x * sigmoid(x) with its derivative by hand, and a two-input op (a * b^2) returning gradients for both.
template <class T>
Tensor<T> my_swish(const Tensor<T>& x) {
  return autograd::apply_function<T>(
      "MySwish", {x}, [](const std::vector<Tensor<T>>& in) { return Tensor<T>(in[0] * sigmoid(in[0])); },
      [](const Tensor<T>& g, const std::vector<Tensor<T>>& in, const Tensor<T>&) {
        const Tensor<T> s = sigmoid(in[0]);
        return std::vector<Tensor<T>>{Tensor<T>(g * s * (T(1) + in[0] * (T(1) - s)))};
      });
}
template <class T>
Tensor<T> my_mul_sq(const Tensor<T>& a, const Tensor<T>& b) {
  return autograd::apply_function<T>(
      "MyMulSq", {a, b}, [](const std::vector<Tensor<T>>& in) { return Tensor<T>(in[0] * square(in[1])); },
      [](const Tensor<T>& g, const std::vector<Tensor<T>>& in, const Tensor<T>& out) {
        (void)out;
        return std::vector<Tensor<T>>{Tensor<T>(g * square(in[1])), Tensor<T>(g * in[0] * in[1] * T(2))};
      });
}
}  // namespace

TEST_CASE("apply_function: a user's forward and backward, recorded as one node, pass gradcheck") {
  manual_seed(4);
  const Tensor<double> x = randn<double>({3, 5}), a = randn<double>({4}), b = randn<double>({4});
  auto r1 = gradcheck([](const std::vector<Tensor<double>>& in) { return my_swish(in[0]); }, {x});
  CHECK_MESSAGE(r1.ok, r1.message);
  auto r2 = gradcheck(
      [](const std::vector<Tensor<double>>& in) { return Tensor<double>(my_mul_sq(in[0], in[1]) * 3.0); }, {a, b});
  CHECK_MESSAGE(r2.ok, r2.message);
  // A backward that is wrong fails gradcheck: the check can fail.
  auto wrong = gradcheck(
      [](const std::vector<Tensor<double>>& in) {
        return autograd::apply_function<double>(
            "Wrong", {in[0]}, [](const std::vector<Tensor<double>>& v) { return Tensor<double>(square(v[0])); },
            [](const Tensor<double>& g, const std::vector<Tensor<double>>& v, const Tensor<double>&) {
              return std::vector<Tensor<double>>{Tensor<double>(g * v[0])};  // misses the factor 2
            });
      },
      {x});
  CHECK_FALSE(wrong.ok);
  // Equal to autograd's own derivative of the same formula, and one node on the tape.
  Tensor<float> xf = randn<float>({64}).requires_grad_();
  Tensor<float> yf = my_swish(xf);
  CHECK(yf.requires_grad());
  sum(yf).backward();
  const Tensor<float> mine = xf.grad().clone();
  xf.grad() = Tensor<float>();
  sum(Tensor<float>(silu(xf))).backward();
  const auto m = mine.to_vector(), ref = xf.grad().to_vector();
  for (std::size_t i = 0; i < m.size(); ++i) CHECK(m[i] == doctest::Approx(ref[i]).epsilon(1e-5));
  // No input needs a gradient, or grad mode is off: nothing is recorded.
  CHECK_FALSE(my_swish(randn<float>({3})).requires_grad());
  {
    NoGradGuard ng;
    CHECK_FALSE(my_swish(xf).requires_grad());
  }
}

TEST_CASE("apply_function: a backward that returns the wrong gradients, and inputs changed before backward") {
  Tensor<float> x = randn<float>({2, 3}).requires_grad_();
  auto op = [&](std::vector<Tensor<float>> grads) {
    return autograd::apply_function<float>(
        "Bad", {x}, [](const std::vector<Tensor<float>>& in) { return Tensor<float>(in[0] * 2.f); },
        [grads](const Tensor<float>&, const std::vector<Tensor<float>>&, const Tensor<float>&) { return grads; });
  };
  EXPECT_ERROR([&] { sum(op({zeros<float>({3, 2})})).backward(); },
               {"Bad", "gradient of shape [3, 2] for input 0 of shape [2, 3]"});
  EXPECT_ERROR([&] { sum(op({})).backward(); }, {"Bad", "returned 0 gradients for 1 inputs"});
  sum(op({Tensor<float>()})).backward();  // an undefined gradient: none for that input
  CHECK_FALSE(x.grad().defined());
  // The saved input was modified in place before backward: an error, as for ember's own ops.
  Tensor<float> y = my_swish(x);
  {
    NoGradGuard ng;
    x += 1.f;
  }
  EXPECT_ERROR([&] { sum(y).backward(); }, {"MySwish", "modified by an in-place operation"});
  EXPECT_ERROR([] { autograd::apply_function<float>(
                        "Undef", {Tensor<float>()}, [](const std::vector<Tensor<float>>& in) { return in[0]; },
                        [](const Tensor<float>& g, const std::vector<Tensor<float>>&, const Tensor<float>&) {
                          return std::vector<Tensor<float>>{g};
                        }); },
               {"Undef", "input 0 is an undefined tensor"});
}
