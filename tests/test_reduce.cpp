// Reductions (sum, mean, max, min, prod, var, std_dev, norm, argmax, argmin) over tensors and fused expressions:
// all elements, one or several dims, keepdim, non-contiguous inputs, both code paths of cpu/reduce.hpp (reducing
// the innermost dim and reducing leading dims), integer/bool sums, NaN propagation, accuracy against a double
// reference, independence of the thread count, 16-bit inputs. References are plain loops in double.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using namespace ember_test;

namespace {



bool close(double got, double ref, double rtol, double atol) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return std::fabs(got - ref) <= atol + rtol * std::fabs(ref);
}




}  // namespace

// ================================================================================================= reductions

namespace {
/// Reference reduction of a (A, B, C) float tensor over a set of dims, in double: returns the keepdim-shaped
/// result as a flat vector, with f(values) computing one output from the values of its group (row-major order).
template <class F>
std::vector<double> ref_reduce(const Tensor<float>& x, std::vector<int> red, F f) {
  const int nd = x.dim();
  std::vector<bool> is_red(std::size_t(nd), false);
  for (int d : red) is_red[std::size_t(d)] = true;
  Shape keep = x.shape();
  for (int d = 0; d < nd; ++d)
    if (is_red[std::size_t(d)]) keep[d] = 1;
  std::vector<std::vector<double>> groups(std::size_t(keep.numel()));
  for (i64 i = 0; i < x.numel(); ++i) {
    i64 r = i, o = 0, mul = 1;
    std::vector<i64> c(static_cast<std::size_t>(nd));
    for (int d = nd - 1; d >= 0; --d) {
      c[std::size_t(d)] = r % x.shape()[d];
      r /= x.shape()[d];
    }
    for (int d = nd - 1; d >= 0; --d) {
      o += (is_red[std::size_t(d)] ? 0 : c[std::size_t(d)]) * mul;
      mul *= keep[d];
    }
    groups[std::size_t(o)].push_back(double(rd(x, i)));
  }
  std::vector<double> out;
  for (auto& gv : groups) out.push_back(f(gv));
  return out;
}
double r_sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double r_mean(const std::vector<double>& v) { return r_sum(v) / double(v.size()); }
double r_var(const std::vector<double>& v) {
  const double m = r_mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return s / double(v.size() - 1);
}
double r_max(const std::vector<double>& v) {
  double m = -HUGE_VAL;
  for (double x : v) m = std::max(m, x);
  return m;
}
double r_min(const std::vector<double>& v) {
  double m = HUGE_VAL;
  for (double x : v) m = std::min(m, x);
  return m;
}
double r_prod(const std::vector<double>& v) {
  double p = 1;
  for (double x : v) p *= x;
  return p;
}
double r_argmax(const std::vector<double>& v) {
  std::size_t k = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[k]) k = i;
  return double(k);
}
double r_argmin(const std::vector<double>& v) {
  std::size_t k = 0;
  for (std::size_t i = 1; i < v.size(); ++i)
    if (v[i] < v[k]) k = i;
  return double(k);
}
template <class T>
void check_against(const Tensor<T>& got, const std::vector<double>& ref, double rtol = 1e-6, double atol = 1e-6) {
  REQUIRE(got.numel() == i64(ref.size()));
  int bad = 0;
  for (i64 i = 0; i < got.numel(); ++i)
    if (!close(double(rd(got, i)), ref[std::size_t(i)], rtol, atol) && bad++ < 5)
      FAIL_CHECK("element " << i << ": " << double(rd(got, i)) << " vs " << ref[std::size_t(i)]);
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("reductions over all elements, one dim, several dims, keepdim; inner and outer paths") {
  Generator g(8);
  Tensor<float> x = randn<float>({5, 7, 33}, g);
  const std::vector<std::vector<int>> dimsets{{}, {0}, {1}, {2}, {-1}, {0, 1}, {1, 2}, {0, 2}, {0, 1, 2}};
  for (const auto& ds : dimsets) {
    std::vector<int> red;
    for (int d : ds) red.push_back(d < 0 ? d + 3 : d);
    if (ds.empty()) red = {0, 1, 2};
    std::vector<i64> dv(ds.begin(), ds.end());
    const Dims dims = ds.empty() ? Dims() : Dims(dv);
    for (bool keepdim : {false, true}) {
      INFO("dims {" << (ds.size() > 0 ? ds[0] : 99) << (ds.size() > 1 ? ", +" : "") << "} keepdim " << keepdim);
      Tensor<float> s = sum(x, dims, keepdim);
      // shape: reduced dims become 1 (keepdim) or vanish
      Shape es;
      for (int d = 0; d < 3; ++d) {
        const bool r = std::find(red.begin(), red.end(), d) != red.end();
        if (!r) es.push_back(x.shape()[d]);
        else if (keepdim) es.push_back(1);
      }
      CHECK(s.shape() == es);
      check_against(s, ref_reduce(x, red, r_sum), 1e-6, 1e-5);
      check_against(Tensor<float>(mean(x, dims, keepdim)), ref_reduce(x, red, r_mean), 1e-6, 1e-6);
      check_against(Tensor<float>(max(x, dims, keepdim)), ref_reduce(x, red, r_max), 0, 0);
      check_against(Tensor<float>(min(x, dims, keepdim)), ref_reduce(x, red, r_min), 0, 0);
      check_against(Tensor<float>(var(x, dims, 1, keepdim)), ref_reduce(x, red, r_var), 1e-5, 1e-6);
      check_against(Tensor<float>(std_dev(x, dims, 1, keepdim)),
                    ref_reduce(x, red, [](const std::vector<double>& v) { return std::sqrt(r_var(v)); }), 1e-5, 1e-6);
    }
  }
  // prod on values near 1 (no overflow), over each path
  Tensor<float> y = rand<float>({4, 6, 9}, g) * 0.5f + 0.75f;
  check_against(Tensor<float>(prod(y)), ref_reduce(y, {0, 1, 2}, r_prod), 1e-5, 0);
  check_against(Tensor<float>(prod(y, {2})), ref_reduce(y, {2}, r_prod), 1e-6, 0);
  check_against(Tensor<float>(prod(y, {0})), ref_reduce(y, {0}, r_prod), 1e-6, 0);
  check_against(Tensor<float>(prod(y, {0, 2}, true)), ref_reduce(y, {0, 2}, r_prod), 1e-6, 0);
  // a 0-d result for a full reduction
  CHECK(sum(x).dim() == 0);
  CHECK(sum(x, {}, true).shape() == Shape{1, 1, 1});
  CHECK_THROWS_AS(sum(x, {0, 0}), ember::Error);
  CHECK_THROWS_AS(sum(x, {3}), ember::Error);
}

TEST_CASE("reductions of non-contiguous inputs and of expressions") {
  Generator g(9);
  Tensor<float> base = randn<float>({40, 30}, g);
  Tensor<float> t = base.t();  // (30, 40)
  check_against(Tensor<float>(sum(t, {1})), ref_reduce(t, {1}, r_sum), 1e-6, 1e-5);
  check_against(Tensor<float>(sum(t, {0})), ref_reduce(t, {0}, r_sum), 1e-6, 1e-5);
  check_against(Tensor<float>(max(t, {1})), ref_reduce(t, {1}, r_max), 0, 0);
  Tensor<float> sl = base.slice(1, 1, 30, 3);  // stepped columns
  check_against(Tensor<float>(sum(sl, {1})), ref_reduce(sl, {1}, r_sum), 1e-6, 1e-5);
  check_against(Tensor<float>(min(sl, {0}, true)), ref_reduce(sl, {0}, r_min), 0, 0);
  Tensor<float> ex = base.slice(0, 0, 1).expand({5, 30});
  check_against(Tensor<float>(sum(ex, {0})), ref_reduce(ex, {0}, r_sum), 1e-6, 1e-5);
  // reductions of expressions (fused) equal reductions of the materialised expression
  Tensor<float> a = randn<float>({64, 50}, g), b = randn<float>({64, 50}, g);
  Tensor<float> prodab = run_expr(a * b);
  check_against(Tensor<float>(sum(a * b, {1})), ref_reduce(prodab, {1}, r_sum), 1e-6, 1e-5);
  check_against(Tensor<float>(max(a * b, {0})), ref_reduce(prodab, {0}, r_max), 0, 0);
  check_against(Tensor<float>(mean(a * b, {0})), ref_reduce(prodab, {0}, r_mean), 1e-6, 1e-6);
  // an expression over transposed operands
  const Tensor<float> at = a.t(), bt = b.t();
  Tensor<float> prodt = run_expr(at * bt);
  check_against(Tensor<float>(sum(at * bt, {1})), ref_reduce(prodt, {1}, r_sum), 1e-6, 1e-5);
  // argmax/argmin of an expression, along each dim
  check_against(argmax(a * b, 1), ref_reduce(prodab, {1}, r_argmax), 0, 0);
  check_against(argmin(a * b, 0), ref_reduce(prodab, {0}, r_argmin), 0, 0);
}

TEST_CASE("argmax / argmin: flat, per dim, keepdim, ties, size-1 dims") {
  Tensor<float> x = tensor<float>({{1.f, 5.f, 5.f, -2.f}, {7.f, 0.f, 7.f, 7.f}, {-1.f, -1.f, -3.f, -3.f}});
  Tensor<i64> am = argmax(x);
  CHECK(am.dim() == 0);
  CHECK(am.item() == 4);  // first 7 in row-major order
  CHECK(argmin(x).item() == 10);
  CHECK(argmax(x, 1).to_vector() == std::vector<i64>{1, 0, 0});
  CHECK(argmin(x, 1).to_vector() == std::vector<i64>{3, 1, 2});
  CHECK(argmax(x, 0).to_vector() == std::vector<i64>{1, 0, 1, 1});
  CHECK(argmin(x, 0).to_vector() == std::vector<i64>{2, 2, 2, 2});
  CHECK(argmax(x, -1, true).shape() == Shape{3, 1});
  CHECK(argmax(x, 0, true).shape() == Shape{1, 4});
  CHECK(argmax(x.t(), 1).to_vector() == std::vector<i64>{1, 0, 1, 1});
  // reducing a size-1 dim: every index is 0
  Tensor<float> col = tensor<float>({{1.f}, {5.f}, {3.f}});
  CHECK(argmax(col, 1).to_vector() == std::vector<i64>{0, 0, 0});
  CHECK(argmin(col, 1).to_vector() == std::vector<i64>{0, 0, 0});
  CHECK(argmax(col, 0).to_vector() == std::vector<i64>{1});
  Tensor<float> row = tensor<float>({{4.f, 9.f, 2.f}});
  CHECK(argmax(row, 0).to_vector() == std::vector<i64>{0, 0, 0});
  CHECK(argmax(row, 1).to_vector() == std::vector<i64>{1});
  // large: the per-block merge keeps the first maximum
  Tensor<float> big = zeros<float>({100000});
  big.at(70000) = 3.f;
  big.at(90000) = 3.f;
  big.at(5) = -1.f;
  CHECK(argmax(big).item() == 70000);
  CHECK(argmin(big).item() == 5);
  // integers
  CHECK(argmax(tensor<i64>({3, 9, 9, 1})).item() == 1);
  CHECK_THROWS_AS(argmax(zeros<float>({0})), ember::Error);
  CHECK_THROWS_AS(argmax(x, 2), ember::Error);
}

TEST_CASE("NaN propagates through max/min; argmax points at the NaN") {
  Tensor<float> x = tensor<float>({{1.f, kNaNF, 3.f}, {4.f, 5.f, 6.f}});
  CHECK(std::isnan(max(x).item()));
  CHECK(std::isnan(min(x).item()));
  Tensor<float> m1 = max(x, {1});
  CHECK(std::isnan(m1.data()[0]));
  CHECK(m1.data()[1] == 6.f);
  Tensor<float> m0 = min(x, {0});
  CHECK(m0.data()[0] == 1.f);
  CHECK(std::isnan(m0.data()[1]));
  CHECK(m0.data()[2] == 3.f);
  CHECK(argmax(x).item() == 1);
  CHECK(argmin(x).item() == 1);
  CHECK(argmax(x, 1).to_vector() == std::vector<i64>{1, 2});
  // NaN first, later larger values do not replace it
  Tensor<float> y = fvec({kNaNF, 100.f, -100.f});
  CHECK(std::isnan(max(y).item()));
  CHECK(std::isnan(min(y).item()));
  CHECK(argmax(y).item() == 0);
  // in a large tensor, across blocks
  Tensor<float> big = zeros<float>({200000});
  big.at(150000) = kNaNF;
  big.at(199999) = 1e30f;
  CHECK(std::isnan(max(big).item()));
  CHECK(argmax(big).item() == 150000);
  CHECK(std::isnan(sum(big).item()));
  // infinities are ordinary extremes
  Tensor<float> inf = fvec({-kInfF, -kInfF});
  CHECK(max(inf).item() == -kInfF);
  CHECK(argmax(inf).item() == 0);
}

TEST_CASE("norm: p = 1, 2, inf, 3 over all elements and dims") {
  Generator g(10);
  Tensor<float> x = randn<float>({6, 20}, g);
  auto lp = [](double p) {
    return [p](const std::vector<double>& v) {
      if (std::isinf(p)) {
        double m = 0;
        for (double a : v) m = std::max(m, std::fabs(a));
        return m;
      }
      double s = 0;
      for (double a : v) s += std::pow(std::fabs(a), p);
      return std::pow(s, 1 / p);
    };
  };
  for (double p : {1.0, 2.0, 3.0, double(INFINITY)}) {
    INFO("p = " << p);
    check_against(Tensor<float>(norm(x, p)), ref_reduce(x, {0, 1}, lp(p)), 1e-5, 0);
    check_against(Tensor<float>(norm(x, p, {1})), ref_reduce(x, {1}, lp(p)), 1e-5, 0);
    check_against(Tensor<float>(norm(x, p, {0}, true)), ref_reduce(x, {0}, lp(p)), 1e-5, 0);
    check_against(Tensor<float>(norm(x.t(), p, {1})), ref_reduce(Tensor<float>(x.t()), {1}, lp(p)), 1e-5, 0);
  }
  CHECK(norm(zeros<float>({3})).item() == 0.f);
  CHECK(norm(fvec({3.f, -4.f})).item() == 5.f);
  CHECK_THROWS_AS(norm(x, 0.0), ember::Error);
  CHECK_THROWS_AS(norm(x, -1.0), ember::Error);
}

TEST_CASE("var and std_dev: correction, known values") {
  Tensor<float> x = fvec({2.f, 4.f, 4.f, 4.f, 5.f, 5.f, 7.f, 9.f});  // mean 5, sum of squares 32
  CHECK(var(x).item() == doctest::Approx(32.0 / 7));
  CHECK(var(x, {}, 0).item() == doctest::Approx(4.0));
  CHECK(std_dev(x, {}, 0).item() == doctest::Approx(2.0));
  CHECK(std_dev(x).item() == doctest::Approx(std::sqrt(32.0 / 7)));
  // large offset: a two-pass variance stays accurate where E[x^2] - E[x]^2 in float would not
  Tensor<float> off = x + 10000.f;
  CHECK(var(off, {}, 0).item() == doctest::Approx(4.0).epsilon(1e-4));
  // one element with correction 1: 0/0 = NaN, as PyTorch
  CHECK(std::isnan(var(fvec({3.f})).item()));
  Tensor<float> m = tensor<float>({{1.f, 2.f, 3.f}, {2.f, 4.f, 6.f}});
  CHECK(var(m, {1}).to_vector() == std::vector<float>{1.f, 4.f});
  Tensor<float> v0 = var(m, {0}, 1, true);
  CHECK(v0.shape() == Shape{1, 3});
  CHECK(v0.to_vector() == std::vector<float>{0.5f, 2.f, 4.5f});
}

TEST_CASE("sums of integers and bools are int64; empty reductions") {
  Tensor<std::int32_t> i = tensor<std::int32_t>({{2000000000, 2000000000}, {1, 2}});
  Tensor<i64> s = sum(i);
  CHECK(s.item() == 4000000003LL);  // no int32 overflow
  CHECK(sum(i, {0}).to_vector() == std::vector<i64>{2000000001, 2000000002});
  CHECK(sum(i, {1}).to_vector() == std::vector<i64>{4000000000LL, 3});
  Tensor<bool> b = from_vector<bool>({true, false, true, true});
  Tensor<i64> cnt = sum(b);
  CHECK(cnt.item() == 3);
  Tensor<float> f = fvec({-1.f, 2.f, 3.f, -4.f, 5.f});
  CHECK(sum(f > 0.f).item() == 3);  // counting through a fused comparison
  CHECK(sum(tensor<std::uint8_t>({200, 200})).item() == 400);
  CHECK(prod(tensor<i64>({3, -4, 5})).item() == -60);
  CHECK(max(tensor<i64>({3, -4, 5})).item() == 5);
  CHECK(min(tensor<std::int32_t>({3, -4, 5})).item() == -4);
  CHECK(mean(cast<float>(tensor<i64>({1, 2, 3, 4}))).item() == 2.5f);

  // Empty reductions: sum = 0, prod = 1, mean = NaN; max of nothing is an error.
  CHECK(sum(zeros<float>({0})).item() == 0.f);
  CHECK(prod(zeros<float>({0})).item() == 1.f);
  CHECK(std::isnan(mean(zeros<float>({0})).item()));
  {  // make recycled blocks dirty, so an output the reduction forgets to write shows
    std::vector<Tensor<float>> dirty;
    for (int k = 0; k < 8; ++k) dirty.push_back(full<float>({16}, 7.f));
  }
  Tensor<float> e = zeros<float>({3, 0});
  Tensor<float> se = sum(e, {1});
  CHECK(se.shape() == Shape{3});
  CHECK(se.to_vector() == std::vector<float>{0, 0, 0});
  {
    std::vector<Tensor<float>> dirty;
    for (int k = 0; k < 8; ++k) dirty.push_back(full<float>({16}, 7.f));
  }
  Tensor<float> pe = prod(e, {1});
  CHECK(pe.to_vector() == std::vector<float>{1, 1, 1});
  CHECK(sum(e, {0}).shape() == Shape{0});
  CHECK_THROWS_AS(max(e, {1}), ember::Error);
}

TEST_CASE("sum accuracy: 16M floats match a double reference (a naive float sum does not)") {
  const i64 n = i64(1) << 24;
  Tensor<float> x = full<float>({n}, 0.1f);
  const double ref = double(n) * double(0.1f);  // exact: 1677721.625
  const float s = sum(x).item();
  CHECK(std::fabs(double(s) - ref) / ref <= 1e-7);
  // A naive running float sum rounds every step to the sum's ulp (0.125 from 2^20, 0.25 from 2^21): it ends at
  // 1935089, 15% high (relative error 0.153). Shown here so the tolerance above is known to have teeth.
  float naive = 0;
  for (i64 i = 0; i < n; ++i) naive += x.data()[i];
  CHECK(std::fabs(double(naive) - ref) / ref > 1e-2);
  // Random values in [0, 1): the float result is the correctly rounded double sum (to ~1 ulp).
  Generator g(12);
  Tensor<float> r = rand<float>({n}, g);
  double dref = 0;
  for (i64 i = 0; i < n; ++i) dref += r.data()[i];
  CHECK(std::fabs(double(sum(r).item()) - dref) / dref <= 1e-7);
  CHECK(std::fabs(double(mean(r).item()) - dref / double(n)) / (dref / double(n)) <= 1e-7);
  // Along a dim too (both code paths): 4096 x 4096 of 0.1f
  Tensor<float> m = x.view({4096, 4096});
  const double rowref = 4096.0 * double(0.1f);
  Tensor<float> rows = sum(m, {1}), cols = sum(m, {0});
  CHECK(std::fabs(double(rows.data()[123]) - rowref) / rowref <= 1e-7);
  CHECK(std::fabs(double(cols.data()[4000]) - rowref) / rowref <= 1e-7);
}

TEST_CASE("reductions do not depend on the thread count (bitwise)") {
  ThreadsGuard guard;
  Generator g(13);
  Tensor<float> x = randn<float>({3000, 700}, g);  // 2.1M elements
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<Tensor<float>> r;
    r.push_back(sum(x));
    r.push_back(sum(x * x));
    r.push_back(mean(x, {1}));
    r.push_back(sum(x, {0}));
    const Tensor<float> xt = x.t();
    r.push_back(sum(xt, {1}));
    r.push_back(var(x, {0}));
    r.push_back(norm(x, 2.0));
    r.push_back(max(x, {1}));
    std::vector<float> idx;
    for (auto v : argmax(x, 0).to_vector()) idx.push_back(float(v));
    r.push_back(from_vector(idx));
    return r;
  };
  const auto one = run(1), two = run(2), three = run(3);
  for (std::size_t k = 0; k < one.size(); ++k) {
    INFO("reduction " << k);
    CHECK(bitwise_equal(one[k], two[k]));
    CHECK(bitwise_equal(one[k], three[k]));
  }
}

TEST_CASE("the fused reduction sum(a * a) equals sum(Tensor<float>(a * a))") {
  Generator g(14);
  Tensor<float> a = randn<float>({1000, 333}, g);
  Tensor<float> sq = a * a;  // (public materialisation)
  CHECK(bits(sum(a * a).item()) == bits(sum(sq).item()));
  CHECK(bitwise_equal(sum(a * a, {1}), sum(sq, {1})));
  CHECK(bitwise_equal(sum(a * a, {0}), sum(sq, {0})));
  CHECK(bitwise_equal(max(a * a, {0}), max(sq, {0})));
  CHECK(bits(mean(a * a).item()) == bits(mean(sq).item()));
}

TEST_CASE("reductions of half and bfloat16 accumulate in double") {
  const i64 n = 4096;
  Tensor<half> h = full<half>({n}, half(0.1f));
  const double ref = double(n) * double(float(half(0.1f)));
  const half s = sum(h).item();
  CHECK(s.bits == half(float(ref)).bits);
  // accumulating in half would stall at 256 (ulp 0.25 > 2 * 0.1)
  half naive(0.f);
  for (i64 i = 0; i < n; ++i) naive = naive + h.data()[i];
  CHECK(std::fabs(float(naive) - ref) > 10);
  Tensor<bfloat16> b = run_expr(cast<bfloat16>(arange<float>(100)));
  CHECK(float(sum(b).item()) == 4960.f);  // 4950 rounded to bfloat16 (spacing 32 in [4096, 8192))
  CHECK(float(max(b).item()) == 99.f);
  CHECK(float(mean(b).item()) == 49.5f);
  CHECK(argmax(b).item() == 99);
  Tensor<half> m = run_expr(cast<half>(arange<float>(6).view({2, 3})));
  Tensor<half> sm = sum(m, {0});
  CHECK(float(sm.data()[2]) == 7.f);
  Tensor<float> f = sum(cast<float>(m), {1});  // fp16 storage, fp32 result
  CHECK(f.to_vector() == std::vector<float>{3.f, 12.f});
}

TEST_CASE("reducers: partials merge in either order to the same result (the CUDA reduction merges out of order)") {
  using A = expr::ArgR<float, false>;
  using M = expr::ExtremumR<float, false>;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<A::acc> parts = {A::init(), {1.f, 4}, {1.f, 2}, {3.f, 9}, {3.f, 7}, {nan, 8}, {nan, 5}, {-2.f, 0}};
  for (const auto& a : parts)
    for (const auto& b : parts) {
      const A::acc x = A::merge(a, b), y = A::merge(b, a);
      CHECK(x.i == y.i);
      CHECK(std::bit_cast<std::uint32_t>(x.v) == std::bit_cast<std::uint32_t>(y.v));
    }
  // Folding every partial, in any order, finds the first NaN (index 5).
  A::acc fwd = A::init(), bwd = A::init();
  for (std::size_t k = 0; k < parts.size(); ++k) {
    fwd = A::merge(fwd, parts[k]);
    bwd = A::merge(bwd, parts[parts.size() - 1 - k]);
  }
  CHECK(fwd.i == 5);
  CHECK(bwd.i == 5);
  // Without NaN: the largest value, first index among ties.
  CHECK(A::merge(A::merge(parts[3], parts[1]), parts[4]).i == 7);
  CHECK(std::isnan(M::merge(1.f, nan)));
  CHECK(std::isnan(M::merge(nan, 1.f)));
  CHECK(M::merge(2.f, M::init()) == 2.f);
  CHECK(expr::ExtremumR<std::int32_t, true>::init() == std::numeric_limits<std::int32_t>::max());
  CHECK(expr::ExtremumR<double, true>::init() == std::numeric_limits<double>::infinity());
}

TEST_CASE("one reduction plan for both executors: only size-1 dims reduced walks columns, or rows of 1 for arg reducers") {
  // The plan of out (3, 1, 4) from e (3, 1, 4): nothing left to reduce after collapse() drops the size-1 dim.
  const Shape space{3, 1, 4};
  auto planned = [&](bool indexed) {
    expr::PlanBuilder b(space);
    b.add(space, contiguous_strides(space));  // the output, keepdim form
    b.add(space, contiguous_strides(space));  // the expression's one leaf
    return expr::plan_reduce(b.collapse(), indexed);
  };
  const expr::ReducePlan plain = planned(false);
  CHECK_FALSE(plain.rows);  // each output folds its one element, rows of outputs at once
  CHECK(plain.nred == 0);
  CHECK(plain.q.shape == Shape{12});
  const expr::ReducePlan arg = planned(true);
  CHECK(arg.rows);  // a row of length 1 (index 0) per output
  CHECK(arg.nred == 1);
  CHECK(arg.nkept == 1);
  CHECK(arg.q.shape == Shape{12, 1});
  CHECK(arg.q.st[0][1] == 0);
  CHECK(arg.q.st[1][1] == 0);
  // A real reduction keeps its walk: rows when the inner dim is reduced, columns otherwise.
  expr::PlanBuilder b(Shape{5, 6});
  b.add(Shape{5, 1}, contiguous_strides(Shape{5, 1}));
  b.add(Shape{5, 6}, contiguous_strides(Shape{5, 6}));
  const expr::ReducePlan inner = expr::plan_reduce(b.collapse(), false);
  CHECK(inner.rows);
  CHECK(inner.q.shape == Shape{5, 6});
  expr::PlanBuilder c(Shape{5, 6});
  c.add(Shape{1, 6}, contiguous_strides(Shape{1, 6}));
  c.add(Shape{5, 6}, contiguous_strides(Shape{5, 6}));
  const expr::ReducePlan outer = expr::plan_reduce(c.collapse(), false);
  CHECK_FALSE(outer.rows);
  CHECK(outer.nred == 1);
  CHECK(outer.q.shape == Shape{5, 6});

  // What the plan computes: reducing a size-1 dim gives the input back (NaN included), indices 0.
  Tensor<float> x = arange<float>(0, 12).reshape({3, 1, 4}).clone();
  x.data()[5] = std::numeric_limits<float>::quiet_NaN();
  auto same = [](const Tensor<float>& a, const Tensor<float>& b) {
    REQUIRE(a.numel() == b.numel());
    const auto u = a.contiguous().to_vector(), v = b.contiguous().to_vector();
    for (std::size_t i = 0; i < u.size(); ++i)
      CHECK(std::bit_cast<std::uint32_t>(u[i]) == std::bit_cast<std::uint32_t>(v[i]));
  };
  for (bool keep : {true, false}) {
    CAPTURE(keep);
    same(sum(x, {1}, keep), x);
    same(max(x, {1}, keep), x);
    same(min(x, {1}, keep), x);
    same(prod(x, {1}, keep), x);
    same(sum(x.transpose(0, 2), {1}, keep), x.transpose(0, 2));
    const Tensor<std::int64_t> am = argmax(x, 1, keep);
    CHECK(am.shape() == (keep ? Shape{3, 1, 4} : Shape{3, 4}));
    for (std::int64_t v : am.to_vector()) CHECK(v == 0);
  }
}
