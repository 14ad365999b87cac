// The CPU GEMM (cpu/gemm.hpp) against a naive double-precision reference: odd sizes around the micro-tile and
// cache-block edges, all four transpose combinations, accumulate mode, padded leading dims, 1 and 2 threads,
// float and double. Integer-valued operands make every product and partial sum exact, so those results must
// match bit for bit whatever the summation order; real-valued operands are checked against the worst-case
// rounding bound.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "helpers.hpp"

namespace {

using namespace ember_test;

// A column-major or row-major matrix with a padded leading dimension, stored in a plain vector.
template <class T>
struct Mat {
  i64 rows, cols, ld;
  bool col_major;
  std::vector<T> v;
  Mat(i64 r, i64 c, bool cm, i64 pad) : rows(r), cols(c), ld((cm ? r : c) + pad), col_major(cm) {
    v.assign(std::size_t((cm ? c : r) * ld + 1), T(-777));  // padding holds a sentinel
  }
  i64 rs() const { return col_major ? 1 : ld; }
  i64 cs() const { return col_major ? ld : 1; }
  T& at(i64 i, i64 j) { return v[std::size_t(i * rs() + j * cs())]; }
  T at(i64 i, i64 j) const { return v[std::size_t(i * rs() + j * cs())]; }
  cpu::MatView<T> view() const { return {v.data(), rs(), cs()}; }
};

template <class T>
void fill(Mat<T>& m, std::mt19937& g, bool integers) {
  std::uniform_int_distribution<int> di(-3, 3);
  std::normal_distribution<double> dn(0.0, 1.0);
  for (i64 i = 0; i < m.rows; ++i)
    for (i64 j = 0; j < m.cols; ++j) m.at(i, j) = integers ? T(di(g)) : T(dn(g));
}

struct Case {
  i64 m, n, k;
  bool ta, tb, accumulate;
  i64 pad;
};

// Runs C = [C +] A @ B through cpu::gemm and compares with the double reference. Returns the number of wrong
// elements (a padding element that changed counts as wrong).
template <class T>
int run_case(const Case& c, bool integers, std::uint32_t seed) {
  std::mt19937 g(seed);
  Mat<T> a(c.m, c.k, c.ta, c.pad), b(c.k, c.n, c.tb, c.pad), out(c.m, c.n, false, c.pad);
  fill(a, g, integers);
  fill(b, g, integers);
  fill(out, g, integers);
  const std::vector<T> before = out.v;
  cpu::gemm<T>(c.m, c.n, c.k, a.view(), b.view(), out.v.data(), out.ld, c.accumulate);
  int wrong = 0;
  for (i64 i = 0; i < c.m; ++i)
    for (i64 j = 0; j < c.n; ++j) {
      double ref = c.accumulate ? double(before[std::size_t(i * out.ld + j)]) : 0.0, mag = std::abs(ref);
      for (i64 p = 0; p < c.k; ++p) {
        ref += double(a.at(i, p)) * double(b.at(p, j));
        mag += std::abs(double(a.at(i, p)) * double(b.at(p, j)));
      }
      const double got = double(out.at(i, j));
      // Worst-case bound of a sum of k + 1 rounded products (any order): (k + 2) u sum |terms|.
      const double tol = integers ? 0.0 : double(c.k + 2) * std::numeric_limits<T>::epsilon() * mag;
      if (!(std::abs(got - ref) <= tol)) ++wrong;
    }
  for (i64 i = 0; i < c.m; ++i)
    for (i64 j = c.n; j < out.ld; ++j)
      if (out.v[std::size_t(i * out.ld + j)] != before[std::size_t(i * out.ld + j)]) ++wrong;
  return wrong;
}

template <class T>
void sweep(const std::vector<i64>& sizes, bool integers) {
  std::uint32_t seed = 1;
  for (i64 m : sizes)
    for (i64 n : sizes)
      for (i64 k : sizes)
        for (int t = 0; t < 4; ++t) {
          const Case c{m, n, k, (t & 1) != 0, (t & 2) != 0, ((m + n + k + t) & 1) != 0, (m + k) % 3};
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(c.ta);
          CAPTURE(c.tb);
          CAPTURE(c.accumulate);
          CAPTURE(c.pad);
          CHECK(run_case<T>(c, integers, seed++) == 0);
        }
}

}  // namespace

TEST_CASE("gemm: odd sizes, all transposes, accumulate, padded leading dims (float, exact)") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    sweep<float>({1, 7, 17, 63, 129}, true);
  }
}

TEST_CASE("gemm: odd sizes, all transposes (double, exact and rounded)") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    sweep<double>({1, 5, 33, 130}, true);
    sweep<double>({3, 65}, false);
  }
}

TEST_CASE("gemm: real values within the rounding bound (float)") {
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  sweep<float>({2, 31, 100}, false);
}

TEST_CASE("gemm: sizes past every cache block (k > kc, m > mc, n > nc) and skinny shapes") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    std::uint32_t seed = 100;
    for (const Case& c : {Case{300, 70, 1100, false, false, false, 1}, Case{13, 4200, 40, false, true, true, 2},
                          Case{37, 300, 2100, false, true, false, 0}, Case{290, 4111, 9, true, false, true, 3},
                          Case{1, 1000, 513, true, true, false, 0}, Case{1000, 1, 300, false, false, true, 1}}) {
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      CHECK(run_case<float>(c, true, seed++) == 0);
      CHECK(run_case<float>(c, false, seed++) == 0);
    }
  }
}

TEST_CASE("gemm: k == 0 writes zeros, or leaves C alone when accumulating") {
  std::vector<float> c(6, 5.0f), a(1), b(1);
  cpu::gemm<float>(2, 3, 0, {a.data(), 0, 1}, {b.data(), 3, 1}, c.data(), 3, true);
  for (float x : c) CHECK(x == 5.0f);
  cpu::gemm<float>(2, 3, 0, {a.data(), 0, 1}, {b.data(), 3, 1}, c.data(), 3, false);
  for (float x : c) CHECK(x == 0.0f);
}

TEST_CASE("mm: transposed and sliced views agree with contiguous copies") {
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  Generator g(7);
  const Tensor<float> a = randn<float>({70, 90}, g), b = randn<float>({90, 50}, g);
  const Tensor<float> want = mm(a.contiguous(), b.contiguous());
  // a^T^T and b^T^T: column-major views of the same values.
  const Tensor<float> at = a.t().contiguous().t(), bt = b.t().contiguous().t();
  const Tensor<float> got = mm(at, bt);
  const Tensor<float> acc = zeros<float>({70, 50});
  ops::mm_into(acc, a, b, /*accumulate=*/true);
  ops::mm_into(acc, at, bt, /*accumulate=*/true);
  for (i64 i = 0; i < want.numel(); ++i) {
    CHECK(rd(got, i) == doctest::Approx(rd(want, i)).epsilon(1e-5));
    CHECK(rd(acc, i) == doctest::Approx(2 * rd(want, i)).epsilon(1e-5));
  }
}

TEST_CASE("ops::linear: bias and activation in one pass equal matmul, add and the activation") {
  Generator g(11);
  const Tensor<double> x = randn<double>({2, 5, 7}, g), w = randn<double>({4, 7}, g), b = randn<double>({4}, g);
  const Tensor<double> base = matmul(x, w.t());
  const Tensor<double> plus = base + b;
  const Tensor<double> want_relu = relu(plus), want_gelu = gelu_tanh(plus), want_gelu_nb = gelu_tanh(base);
  auto max_abs = [](const Tensor<double>& p, const Tensor<double>& q) {
    REQUIRE(p.shape() == q.shape());
    double m = 0;
    for (i64 i = 0; i < p.numel(); ++i) m = std::max(m, std::abs(rd(p, i) - rd(q, i)));
    return m;
  };
  CHECK(max_abs(ops::linear(x, w), base) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b), plus) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b, ops::LinearAct::relu), want_relu) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b, ops::LinearAct::gelu_tanh), want_gelu) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, Tensor<double>(), ops::LinearAct::gelu_tanh), want_gelu_nb) < 1e-12);
  // A transposed weight view and a 1-D input.
  const Tensor<double> wt = w.t().contiguous();
  CHECK(max_abs(ops::linear(x, wt.t(), b, ops::LinearAct::relu), want_relu) < 1e-12);
  const Tensor<double> x1 = x.select(0, 1).select(0, 2);
  CHECK(max_abs(ops::linear(x1, w, b), plus.select(0, 1).select(0, 2)) < 1e-12);
  // No autograd record, whatever the inputs need.
  Tensor<double> wg = w.detach().clone();
  wg.requires_grad_();
  CHECK_FALSE(ops::linear(x, wg, b, ops::LinearAct::relu).requires_grad());
  CHECK(error_of([&] { (void)ops::linear(x, w, randn<double>({5}, g)); }).find("bias of shape [5]") !=
        std::string::npos);
}
