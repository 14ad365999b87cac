// CUDA twins of test_reduce.cpp: reductions over everything and along dims, keepdim, non-contiguous operands,
// expressions, ties, NaN, integer and bool sums, 16-bit inputs and large sums, compared with the CPU's. Each case
// skips when no device is present.
#include "cuda_compare.hpp"

namespace {
template <class F>
void same_reduction(const Tensor<float>& x, F f, const std::string& what, double rtol = 1e-5, double atol = 1e-5) {
  const auto yc = f(x);
  const Tensor<float> xd = to_dev(x);
  const auto yd = f(xd);
  expect_match(yc, yd, rtol, atol, what);
}
}  // namespace

TEST_CASE("cuda: reductions over everything and along dims, keepdim, non-contiguous, expressions") {
  SKIP_WITHOUT_CUDA();
  manual_seed(7);
  for (const Shape& s : {Shape{5, 6, 7}, Shape{3, 200, 1000}, Shape{1000, 3, 2}, Shape{1, 1, 1}}) {
    const Tensor<float> x = randn<float>(s);
    const Tensor<float> pos = ev(abs(x) * 0.1f + 0.95f);  // products stay in range
    const std::vector<Dims> dimsets = {Dims{}, Dims{0}, Dims{1}, Dims{2}, Dims{0, 2}, Dims{-1, -2}, Dims{0, 1, 2}};
    for (const Dims& d : dimsets) {
      for (bool keep : {false, true}) {
        std::string w = s.str() + " dims";
        for (auto v : d.v) w += " " + std::to_string(v);
        w += keep ? " keepdim" : "";
        // Float sums: the CPU accumulates in double, the device in float (a tree of partials): about 1e-6 of the
        // sum of |x| apart, which near-cancelling sums of a few thousand values turn into ~1e-5 absolute.
        same_reduction(x, [&](const auto& t) { return sum(t, d, keep); }, "sum" + w, 1e-5, 2e-4);
        same_reduction(x, [&](const auto& t) { return mean(t, d, keep); }, "mean" + w, 1e-5, 2e-6);
        same_reduction(x, [&](const auto& t) { return max(t, d, keep); }, "max" + w, 0, 0);
        same_reduction(x, [&](const auto& t) { return min(t, d, keep); }, "min" + w, 0, 0);
        same_reduction(pos, [&](const auto& t) { return prod(t, d, keep); }, "prod" + w, 1e-4, 0);
        same_reduction(x, [&](const auto& t) { return var(t, d, 1, keep); }, "var" + w, 1e-4, 1e-5);
        same_reduction(x, [&](const auto& t) { return std_dev(t, d, 0, keep); }, "std" + w, 1e-4, 1e-5);
        for (double p : {1.0, 2.0, 3.0, double(INFINITY)})
          same_reduction(x, [&](const auto& t) { return norm(t, p, d, keep); }, "norm" + w, 1e-4, 1e-5);
        same_reduction(x, [&](const auto& t) { return sum(t * t - exp(t), d, keep); }, "sum(expr)" + w, 1e-4, 2e-3);
        same_reduction(x, [&](const auto& t) { return sum(t.permute({2, 0, 1}), d, keep); }, "sum permuted" + w, 1e-5, 2e-4);
      }
    }
    for (int dim = 0; dim < 3; ++dim)
      for (bool keep : {false, true}) {
        const std::string w = s.str() + " dim " + std::to_string(dim);
        expect_match(argmax(x, dim, keep), argmax(to_dev(x), dim, keep), 0, 0, "argmax" + w);
        expect_match(argmin(x, dim, keep), argmin(to_dev(x), dim, keep), 0, 0, "argmin" + w);
        expect_match(argmax(x.transpose(0, 2), dim, keep), argmax(to_dev(x).transpose(0, 2), dim, keep), 0, 0, "argmax transposed" + w);
      }
    expect_match(argmax(x), argmax(to_dev(x)), 0, 0, "argmax flat " + s.str());
    expect_match(argmin(x), argmin(to_dev(x)), 0, 0, "argmin flat " + s.str());
  }
}

TEST_CASE("cuda: reduction ties, NaN, integer and bool sums, 16-bit inputs, large sums") {
  SKIP_WITHOUT_CUDA();
  manual_seed(8);
  // Ties: argmax picks the first index, as on the CPU, whichever thread saw which copy.
  Tensor<float> t = ev(cast<float>(randint<std::int32_t>(0, 3, {300000})));
  expect_match(argmax(t), argmax(to_dev(t)), 0, 0, "argmax ties");
  expect_match(argmin(t), argmin(to_dev(t)), 0, 0, "argmin ties");
  Tensor<float> t2 = ev(cast<float>(randint<std::int32_t>(0, 3, {50, 3000})));
  expect_match(argmax(t2, 1), argmax(to_dev(t2), 1), 0, 0, "argmax ties per row");
  expect_match(argmax(t2, 0), argmax(to_dev(t2), 0), 0, 0, "argmax ties per column");
  // NaN wins max/min and argmax.
  Tensor<float> n = randn<float>({1000, 100});
  n.at(123, 45) = NAN;
  n.at(700, 45) = NAN;
  expect_match(max(n), max(to_dev(n)), 0, 0, "max NaN");
  expect_match(min(n, 0), min(to_dev(n), 0), 0, 0, "min NaN along dim 0");
  expect_match(argmax(n), argmax(to_dev(n)), 0, 0, "argmax NaN (first NaN)");
  expect_match(argmax(n, 0), argmax(to_dev(n), 0), 0, 0, "argmax NaN along dim 0");
  // Integers and bools sum to int64, exactly.
  const Tensor<std::int32_t> k = randint<std::int32_t>(-1000000, 1000000, {1000, 1000});
  const Tensor<std::int32_t> kd = to_dev(k);
  expect_match(sum(k), sum(kd), 0, 0, "int32 sum");
  expect_match(sum(k, 0), sum(kd, 0), 0, 0, "int32 sum dim 0");
  expect_match(sum(k > 0, 1), sum(kd > 0, 1), 0, 0, "bool sum dim 1");
  expect_match(max(k, 1), max(kd, 1), 0, 0, "int32 max");
  // 16-bit inputs accumulate in float.
  const Tensor<f16> h = randn_t<f16>({4096, 33});
  const Tensor<bf16> b = randn_t<bf16>({4096, 33});
  expect_match(sum(h, 0), sum(to_dev(h), 0), 2e-3, 1e-2, "half sum dim 0");
  expect_match(sum(b, 1), sum(to_dev(b), 1), 1e-2, 1e-2, "bfloat16 sum dim 1");
  expect_match(mean(h), mean(to_dev(h)), 2e-3, 1e-3, "half mean");
  // A large float sum against a double reference (the tree of partials keeps the float error small).
  const i64 big = (1 << 24) + 3;
  const Tensor<float> u = rand<float>({big});
  double ref = 0;
  for (i64 i = 0; i < big; ++i) ref += u.data()[i];
  const double got = double(to_host(sum(to_dev(u))).item());
  CHECK(std::fabs(got - ref) <= 1e-6 * ref);
  // Empty reductions give the identity.
  const Tensor<float> e = randn<float>({0, 5});
  expect_match(sum(e, 0), sum(to_dev(e), 0), 0, 0, "empty sum");
  expect_match(prod(e, 0), prod(to_dev(e), 0), 0, 0, "empty prod");
}
