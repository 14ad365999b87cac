// CUDA twins of sort, argsort, topk, cumsum and cumprod (cuda/sort.cuh against cpu/sort.hpp): the same indices as the
// CPU's stable sort, position for position (ties in position order, NaN above every number, -0 equal to +0), in both
// directions and along every dim, for float, double, half, bfloat16 and int64; the scans and their gradients (cumprod
// through zeros) equal the CPU's; multinomial draws the CPU's samples from the same seed. Every device case skips
// itself when no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuda_compare.hpp"

namespace {

/// Values with many ties (a few levels), a NaN, infinities and both zeros in every dim's rows.
template <class T>
Tensor<T> tie_data(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  Tensor<double> v = cast<double>(randint(-4, 5, s, g));
  Tensor<double> c = v.contiguous();
  if constexpr (is_floating_v<T>) {
    const i64 n = c.numel();
    for (i64 i = 0; i < n; i += 7) c.data()[i] = 0.5 * double(i % 3);  // non-integers
    for (i64 i = 3; i < n; i += 11) c.data()[i] = std::numeric_limits<double>::quiet_NaN();
    for (i64 i = 5; i < n; i += 13) c.data()[i] = (i % 2 ? 1 : -1) * std::numeric_limits<double>::infinity();
    for (i64 i = 2; i < n; i += 9) c.data()[i] = -0.0;
  }
  Tensor<T> r = cast<T>(c);
  return r;
}

void expect_same_indices(const Tensor<i64>& dev, const Tensor<i64>& ref, const std::string& what) {
  INFO(what);
  REQUIRE(dev.device() == kDev);
  REQUIRE(dev.shape() == ref.shape());
  const Tensor<i64> h = dev.to(Device::cpu()).contiguous(), r = ref.contiguous();
  i64 bad = 0;
  for (i64 i = 0; i < r.numel(); ++i)
    if (h.data()[i] != r.data()[i] && bad++ < 5)
      FAIL_CHECK(what << ": position " << i << " cpu " << r.data()[i] << " cuda " << h.data()[i]);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE_TEMPLATE("cuda sort, argsort and topk give the CPU's stable order along every dim", T, float, double,
                   ember::half, ember::bfloat16, std::int64_t) {
  SKIP_WITHOUT_CUDA();
  const Tensor<T> x = tie_data<T>({5, 37, 6}, 201), X = to_dev(x);
  for (int d = 0; d < 3; ++d)
    for (bool desc : {false, true}) {
      CAPTURE(d);
      CAPTURE(desc);
      const auto rc = sort(x, d, desc);
      const auto rd = sort(X, d, desc);
      expect_same_indices(rd.indices, rc.indices, "sort indices");
      expect_match(rc.values, rd.values, 0.0, 0.0, "sort values");
      expect_same_indices(argsort(X, d, desc), argsort(x, d, desc), "argsort");
      for (i64 k : {i64(0), i64(1), i64(3), x.size(d)}) {
        CAPTURE(k);
        const auto tc = topk(x, k, d, desc);
        const auto td = topk(X, k, d, desc);
        expect_same_indices(td.indices, tc.indices, "topk indices");
        expect_match(tc.values, td.values, 0.0, 0.0, "topk values");
      }
    }
  // A strided input, one long row, and an empty tensor.
  expect_same_indices(argsort(X.transpose(0, 2), 1), argsort(x.transpose(0, 2), 1), "argsort of a transposed view");
  const Tensor<T> longrow = tie_data<T>({50000}, 202);
  expect_same_indices(argsort(to_dev(longrow)), argsort(longrow), "argsort of 50000 values");
  CHECK(argsort(to_dev(zeros<T>({0, 4})), 0).shape() == Shape{0, 4});
}

TEST_CASE_TEMPLATE("cuda sort and topk values pass the CPU's gradient", T, float, double) {
  SKIP_WITHOUT_CUDA();
  Tensor<T> xc = seeded_randn<T>({4, 9}, 211), xd = to_dev(xc);
  xc.requires_grad_();
  xd.requires_grad_();
  const Tensor<T> g = seeded_randn<T>({4, 9}, 212), gk = seeded_randn<T>({4, 3}, 213);
  sort(xc, 1, true).values.backward(g);
  sort(xd, 1, true).values.backward(to_dev(g));
  expect_match(xc.grad(), xd.grad(), 0.0, 0.0, "sort: x.grad");
  xc.grad() = Tensor<T>();
  xd.grad() = Tensor<T>();
  topk(xc, 3, 1).values.backward(gk);
  topk(xd, 3, 1).values.backward(to_dev(gk));
  expect_match(xc.grad(), xd.grad(), 0.0, 0.0, "topk: x.grad");
}

TEST_CASE_TEMPLATE("cuda cumsum and cumprod equal the CPU along every dim, values and gradients", T, float, double,
                   ember::half, ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  Tensor<T> x = seeded_randn<T>({4, 7, 5}, 221);
  {
    Tensor<T> c = x.contiguous();  // zeros in some rows: cumprod's backward around the first zero
    c.data()[3] = T(0);
    c.data()[40] = T(0);
    c.data()[47] = T(0);
    x = c;
  }
  for (int d = 0; d < 3; ++d)
    for (bool prod : {false, true}) {
      CAPTURE(d);
      CAPTURE(prod);
      Tensor<T> xc = x.clone(), xd = to_dev(x);
      xc.requires_grad_();
      xd.requires_grad_();
      Tensor<T> yc = prod ? cumprod(xc, d) : cumsum(xc, d), yd = prod ? cumprod(xd, d) : cumsum(xd, d);
      expect_match(yc, yd, tol<T>(), tol<T>(), "values");
      const Tensor<T> g = seeded_randn<T>(x.shape(), 230 + d);
      yc.backward(g);
      yd.backward(to_dev(g));
      expect_match(xc.grad(), xd.grad(), tol<T>(), tol<T>(), "x.grad");
    }
  // One long row (a single thread walks it, as the CPU does), a strided input, and integers.
  const Tensor<T> r = seeded_randn<T>({100000}, 240);
  expect_match(cumsum(r, 0), cumsum(to_dev(r), 0), tol<T>(), tol<T>(), "cumsum of 100000 values");
  expect_match(cumsum(x.transpose(0, 2), 1), cumsum(to_dev(x).transpose(0, 2), 1), tol<T>(), tol<T>(),
               "cumsum of a view");
  Generator gi(241);
  const Tensor<i64> xi = randint(-50, 50, {6, 33}, gi);
  expect_match(cumsum(xi, 1), cumsum(to_dev(xi), 1), 0.0, 0.0, "cumsum of int64");
}

TEST_CASE_TEMPLATE("cuda multinomial draws the CPU's samples from the same seed, with and without replacement", T,
                   float, double, ember::half, ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  // Weights with zeros, one dominant category and many small ones; a 1-D row and a batch of rows.
  const Tensor<double> a = abs(seeded_randn<double>({6, 50}, 251));
  Tensor<T> w = cast<T>(a);
  {
    Tensor<T> c = w.contiguous();
    for (i64 r = 0; r < 6; ++r) {
      c.data()[r * 50 + r] = T(0);
      c.data()[r * 50 + 10 + r] = T(0);
      c.data()[r * 50 + 20] = T(40);
    }
    w = c;
  }
  for (bool replacement : {true, false}) {
    CAPTURE(replacement);
    const i64 n = replacement ? 300 : 40;
    Generator gc(77), gd(77);
    const auto c = multinomial(w, n, replacement, gc);
    const auto d = multinomial(to_dev(w), n, replacement, gd);
    expect_same_indices(d, c, "multinomial, a batch of rows");
    const Tensor<T> row = w.select(0, 2).contiguous();
    expect_same_indices(multinomial(to_dev(row), 7, replacement, gd), multinomial(row, 7, replacement, gc),
                        "multinomial, one row after another draw from the same generators");
    CHECK(gc.offset() == gd.offset());
  }
  // A bad row is the CPU's error, naming the same row and weight.
  Tensor<T> bad = w.clone();
  bad.data()[3 * 50 + 5] = T(-1);
  Generator g(1);
  EXPECT_ERROR([&] { (void)multinomial(to_dev(bad), 2, true, g); }, {"multinomial", "row 3", "-1", "non-negative"});
  EXPECT_ERROR([&] { (void)multinomial(to_dev(zeros<T>({2, 4})), 1, true, g); },
               {"multinomial", "row 0", "sums to zero"});
  EXPECT_ERROR([&] { (void)multinomial(to_dev(w), 49, false, g); }, {"multinomial", "fewer than the 49 samples"});
}
