// The sort, scan and sampling ops (ops/sort.hpp, their loops in cpu/sort.hpp; the differentiable ops in
// autograd/manip.hpp): sort, argsort and topk, cumsum and cumprod, multinomial. Values and gradients against PyTorch
// (fixtures written by tests/fixtures/gen_manip.py with the PyPI wheel), gradcheck in double, multinomial's
// distributions, and the errors bad arguments get. CUDA twin: test_sort_cuda.cu.
//
// Compile time: every op is called through one std::function type over double tensors, so each op is
// instantiated once, for double, whatever the number of cases.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"

using namespace ember;
using ember_test::Fixtures;

namespace {

using ember_test::TD;
using ember_test::Inputs;
using Fn = ember_test::GradFn;

constexpr auto fx = &ember_test::manip_fixtures;

using ember_test::check_case;

}  // namespace

TEST_CASE("sort, argsort and topk match PyTorch; NaN sorts last, ties keep their order") {
  for (int dim : {0, 1})
    for (int desc : {0, 1}) {
      const std::string name = "sort." + std::to_string(dim) + "." + std::to_string(desc);
      check_case(name, 1, [dim, desc](const Inputs& v) { return sort(v[0], dim, desc != 0).values; });
      const TD x = fx()[name + ".in0"];
      const Tensor<std::int64_t> want = fx().index(name + ".indices");
      CHECK(sort(x, dim, desc != 0).indices.to_vector() == want.to_vector());
      CHECK(argsort(x, dim, desc != 0).to_vector() == want.to_vector());
    }
  for (int largest : {0, 1}) {
    const std::string name = "topk." + std::to_string(largest);
    check_case(name, 1, [largest](const Inputs& v) { return topk(v[0], 3, 1, largest != 0).values; });
    CHECK(topk(fx()[name + ".in0"], 3, 1, largest != 0).indices.to_vector() ==
          fx().index(name + ".indices").to_vector());
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto [v, i] = sort(tensor<double>({2, nan, 1, 2, -1}));
  CHECK(i.to_vector() == std::vector<std::int64_t>{4, 2, 0, 3, 1});
  CHECK(std::isnan(v.to_vector()[4]));
  CHECK(sort(tensor<double>({2, nan, 1, 2}), 0, true).indices.to_vector() == std::vector<std::int64_t>{1, 0, 3, 2});
  CHECK(topk(tensor<double>({1, 3, 3, 2}), 2).indices.to_vector() == std::vector<std::int64_t>{1, 2});
  CHECK(topk(tensor<double>({1, 3}), 0).values.numel() == 0);
  CHECK(sort(tensor<std::int64_t>({3, -1, 2})).values.to_vector() == std::vector<std::int64_t>{-1, 2, 3});
  EXPECT_ERROR([] { (void)topk(ones<double>({2, 3}), 4); }, {"topk", "k = 4", "[2, 3]"});
}

TEST_CASE("cumsum and cumprod match PyTorch; cumprod's gradient is exact with zeros") {
  for (int dim : {0, 1}) {
    check_case("cumsum." + std::to_string(dim), 1, [dim](const Inputs& v) { return cumsum(v[0], dim); });
    check_case("cumprod." + std::to_string(dim), 1, [dim](const Inputs& v) { return cumprod(v[0], dim); });
  }
  check_case("cumprod.zeros", 1, [](const Inputs& v) { return cumprod(v[0], 1); });
  CHECK(cumsum(tensor<std::int64_t>({1, 2, 3}), 0).to_vector() == std::vector<std::int64_t>{1, 3, 6});
  // Accumulated in double: float32 running sums of many small terms do not drift.
  Tensor<float> many = full<float>({1 << 20}, 0.1f);
  CHECK(double(cumsum(many, 0).to_vector().back()) == doctest::Approx(104857.6).epsilon(1e-6));
}

TEST_CASE("multinomial: seeded, every row's distribution, no repeats without replacement, zero weights never drawn") {
  Tensor<double> probs = tensor<double>({{0.1, 0.0, 0.6, 0.3}, {1.0, 1.0, 0.0, 2.0}});
  Generator g(7);
  const auto a = multinomial(probs, 20000, true, g);
  Generator g2(7);
  CHECK(multinomial(probs, 20000, true, g2).to_vector() == a.to_vector());  // reproducible from the seed
  CHECK(a.shape() == Shape{2, 20000});
  const double want[2][4] = {{0.1, 0, 0.6, 0.3}, {0.25, 0.25, 0, 0.5}};
  for (int r = 0; r < 2; ++r) {
    std::vector<double> count(4, 0);
    for (std::int64_t s = 0; s < 20000; ++s) count[std::size_t(a.at(r, s))] += 1;
    for (int c = 0; c < 4; ++c) {
      INFO("row " << r << " category " << c);
      if (want[r][c] == 0) CHECK(count[std::size_t(c)] == 0);
      // 5 standard deviations of a binomial proportion over 20000 draws
      CHECK(std::fabs(count[std::size_t(c)] / 20000 - want[r][c]) <= 5 * std::sqrt(want[r][c] * (1 - want[r][c]) / 20000) + 1e-12);
    }
  }
  // Without replacement: every row a permutation of the non-zero categories when all are drawn.
  const auto b = multinomial(probs, 3, false, g);
  for (int r = 0; r < 2; ++r) {
    std::set<std::int64_t> seen;
    for (int s = 0; s < 3; ++s) seen.insert(b.at(r, s));
    CHECK(seen.size() == 3);
    CHECK(!seen.count(r == 0 ? 1 : 2));
  }
  // The first draw without replacement follows the weights.
  std::vector<double> first(4, 0);
  Tensor<double> p1 = tensor<double>({0.1, 0.2, 0.3, 0.4});
  for (int t = 0; t < 4000; ++t) first[std::size_t(multinomial(p1, 2, false, g).at(0))] += 1;
  for (int c = 0; c < 4; ++c) CHECK(first[std::size_t(c)] / 4000 == doctest::Approx(0.1 * (c + 1)).epsilon(0.2));
  EXPECT_ERROR([&] { (void)multinomial(probs, 4, false, g); }, {"multinomial", "fewer than the 4 samples"});
  EXPECT_ERROR([] { (void)multinomial(tensor<double>({0.5, -0.1}), 1); }, {"multinomial", "-0.1", "non-negative"});
  EXPECT_ERROR([] { (void)multinomial(tensor<double>({0.0, 0.0}), 1); }, {"multinomial", "sums to zero"});
}
