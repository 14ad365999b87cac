// The tensor ops a transformer needs (autograd/manip.hpp) and nn::functional's pad, interpolate and one_hot:
// values and gradients against PyTorch (fixtures written by tests/fixtures/gen_manip.py with the PyPI wheel),
// gradcheck in double for every differentiable one, and the errors bad arguments get.
//
// Compile time: every op is called through one std::function type over double tensors, so each op is
// instantiated once, for double, whatever the number of cases.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"

using namespace ember;
using ember_test::Fixtures;

namespace {

using TD = Tensor<double>;
using Inputs = std::vector<TD>;
using Fn = std::function<TD(const Inputs&)>;
namespace F = ember::nn::functional;

const Fixtures& fx() {
  static const Fixtures f("manip.txt");
  return f;
}

Tensor<bool> mask_of(const TD& t) {
  Tensor<bool> m = empty<bool>(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t.data()[i] != 0;
  return m;
}

/// Runs `f` on the case's inputs (name.in0, ...): the value against name.y, the gradients for upstream name.g
/// against name.d0, ..., then gradcheck on the same inputs.
void check_case(const std::string& name, std::size_t n_inputs, const Fn& f, bool grad = true) {
  INFO("case " << name);
  Inputs in;
  for (std::size_t i = 0; i < n_inputs; ++i) in.push_back(fx()[name + ".in" + std::to_string(i)].requires_grad_(true));
  TD y = f(in);
  ember_test::check_close(y, fx()[name + ".y"], 1e-12, 1e-12);
  if (!grad) return;
  y.backward(fx()[name + ".g"]);
  for (std::size_t i = 0; i < n_inputs; ++i) {
    INFO("gradient of input " << i);
    REQUIRE(in[i].grad().defined());
    ember_test::check_close(in[i].grad(), fx()[name + ".d" + std::to_string(i)], 1e-12, 1e-12);
  }
  Inputs fresh;
  for (std::size_t i = 0; i < n_inputs; ++i) fresh.push_back(fx()[name + ".in" + std::to_string(i)].requires_grad_(true));
  ember_test::check_grad(name, f, fresh);
}

}  // namespace

TEST_CASE("tril, triu and masked_fill match PyTorch, gradients included") {
  for (int d : {0, 1, -2}) {
    check_case("tril." + std::to_string(d), 1, [d](const Inputs& v) { return tril(v[0], d); });
    check_case("triu." + std::to_string(d), 1, [d](const Inputs& v) { return triu(v[0], d); });
  }
  const Tensor<bool> m = mask_of(fx()["masked_fill.mask"]);
  check_case("masked_fill", 1, [m](const Inputs& v) { return masked_fill(v[0], m, -2.5); });
  // A causal mask: -inf above the diagonal, so softmax gives those positions exactly zero.
  TD s = ones<double>({3, 3});
  TD p = softmax(masked_fill(s, Tensor<bool>(triu(ones<double>({3, 3}), 1) > 0.5), -std::numeric_limits<double>::infinity()), -1);
  CHECK(p.at(0, 0) == 1.0);
  CHECK(p.at(0, 1) == 0.0);
  CHECK(p.at(1, 2) == 0.0);
  CHECK(p.at(2, 1) == doctest::Approx(1.0 / 3));
  EXPECT_ERROR([] { (void)tril(ones<double>({4})); }, {"tril", "at least 2 dims", "[4]"});
  EXPECT_ERROR([] { (void)masked_fill(ones<double>({2, 3}), empty<bool>({3, 3}), 0); }, {"masked_fill", "[3, 3]",
               "[2, 3]"});
}

TEST_CASE("split, chunk and unbind are views whose gradients reach the input") {
  TD x = arange<double>(10).reshape({2, 5}).requires_grad_(true);
  auto a = split(x, 2, 1);
  REQUIRE(a.size() == 3);
  CHECK(a[2].shape() == Shape{2, 1});
  CHECK(a[1].at(1, 0) == 7);
  auto b = split(x, std::vector<std::int64_t>{1, 4}, -1);
  CHECK(b[1].shape() == Shape{2, 4});
  auto c = chunk(x, 3, 1);  // ceil(5 / 3) = 2: pieces of 2, 2, 1
  REQUIRE(c.size() == 3);
  CHECK(c[2].shape() == Shape{2, 1});
  CHECK(chunk(arange<double>(6), 4).size() == 3);  // PyTorch: sizes 2, 2, 2 (fewer chunks than asked)
  auto u = unbind(x, 0);
  REQUIRE(u.size() == 2);
  CHECK(u[1].shape() == Shape{5});
  CHECK(u[1].at(4) == 9);
  TD loss = sum(c[0] * 1.0 + 0.0) + sum(u[1] * 3.0);
  loss.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{1, 1, 0, 0, 0, 4, 4, 3, 3, 3});
  EXPECT_ERROR([&] { (void)split(x, std::vector<std::int64_t>{1, 2}, 1); }, {"split", "add up to 3", "size 5"});
  EXPECT_ERROR([&] { (void)chunk(x, 0); }, {"chunk", "positive"});
}

TEST_CASE("gather, scatter, scatter_add and index_add match PyTorch, gradients included") {
  const Tensor<std::int64_t> gi = fx().index("gather.index");
  check_case("gather", 1, [gi](const Inputs& v) { return gather(v[0], 1, gi); });
  const Tensor<std::int64_t> si = fx().index("scatter.index");
  check_case("scatter", 2, [si](const Inputs& v) { return scatter(v[0], 1, si, v[1]); });
  ember_test::check_close(scatter(zeros<double>({3, 5}), 1, si, 1.25), fx()["scatter_value.y"]);
  const Tensor<std::int64_t> ai = fx().index("scatter_add.index");
  check_case("scatter_add", 2, [ai](const Inputs& v) { return scatter_add(v[0], 0, ai, v[1]); });
  const Tensor<std::int64_t> ii = fx().index("index_add.index");
  check_case("index_add", 2, [ii](const Inputs& v) { return index_add(v[0], 0, ii, v[1], 1.5); });

  // A src larger than the index: only its leading corner is read, and only that part gets a gradient.
  TD src = arange<double>(6).reshape({2, 3}).requires_grad_(true);
  TD y = scatter(zeros<double>({2, 4}), 1, tensor<std::int64_t>({{3}, {0}}), src);
  CHECK(y.to_vector() == std::vector<double>{0, 0, 0, 0, 3, 0, 0, 0});
  sum(y * 2.0).backward();
  CHECK(src.grad().to_vector() == std::vector<double>{2, 0, 0, 2, 0, 0});

  EXPECT_ERROR([] { (void)gather(ones<double>({2, 3}), 1, tensor<std::int64_t>({{0, 3}})); }, {"gather",
               "index 3 is out of bounds for dim 1 with size 3"});
  EXPECT_ERROR([] { (void)gather(ones<double>({2, 3}), 1, tensor<std::int64_t>({{-1}})); }, {"gather", "index -1"});
  EXPECT_ERROR([] { (void)gather(ones<double>({2, 3}), 0, tensor<std::int64_t>({0, 1})); }, {"gather",
               "as many dims"});
  EXPECT_ERROR([] { (void)gather(ones<double>({2, 3}), 0, zeros<std::int64_t>({1, 4})); }, {"gather",
               "larger than the input"});
  EXPECT_ERROR([] { (void)scatter_add(ones<double>({2, 3}), 0, zeros<std::int64_t>({2, 3}), ones<double>({2, 2})); },
               {"scatter_add", "larger than src"});
  EXPECT_ERROR([] { (void)index_add(ones<double>({2, 3}), 0, tensor<std::int64_t>({0, 1}), ones<double>({3, 3})); },
               {"index_add", "expected [2, 3]"});
}

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

TEST_CASE("flip, roll, repeat and tile match PyTorch, gradients included") {
  check_case("flip", 1, [](const Inputs& v) { return flip(v[0], {0, 2}); });
  check_case("roll.dims", 1, [](const Inputs& v) { return roll(v[0], {1, -2}, {1, 2}); });
  check_case("roll.flat", 1, [](const Inputs& v) { return roll(v[0], {3}); });
  check_case("repeat", 1, [](const Inputs& v) { return repeat(v[0], {2, 1, 3}); });
  check_case("tile", 1, [](const Inputs& v) { return tile(v[0], {2}); });
  EXPECT_ERROR([] { (void)flip(ones<double>({2, 3}), {1, -1}); }, {"flip", "more than once"});
  EXPECT_ERROR([] { (void)repeat(ones<double>({2, 3}), {2}); }, {"repeat", "[2, 3]"});
}

TEST_CASE("outer, baddbmm and einsum match PyTorch, gradients included") {
  check_case("outer", 2, [](const Inputs& v) { return outer(v[0], v[1]); });
  check_case("baddbmm", 3, [](const Inputs& v) { return baddbmm(v[0], v[1], v[2], 0.5, 2.0); });
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"bmm", "bij,bjk->bik"},        {"attn", "bhqd,bhkd->bhqk"}, {"outer", "i,j->ij"},
      {"implicit", "ij,jk"},          {"ellipsis", "...ij,...jk->...ik"},
      {"sumout", "bij,jk->bk"},       {"dot", "bi,bi->b"},         {"broadcast", "bij,bjk->bik"}};
  for (const auto& [name, eq] : cases) {
    const std::string e = eq;
    check_case("einsum." + name, 2, [e](const Inputs& v) { return einsum(e, v[0], v[1]); });
  }
  for (const auto& [name, eq] : std::vector<std::pair<std::string, std::string>>{
           {"transpose", "ij->ji"}, {"total", "ij->"}, {"rowsum", "ijk->ki"}}) {
    const std::string e = eq;
    check_case("einsum." + name, 1, [e](const Inputs& v) { return einsum(e, v[0]); });
  }
  // beta = 0 ignores the input, NaN included (as PyTorch).
  TD nan_in = full<double>({2, 2}, std::numeric_limits<double>::quiet_NaN());
  CHECK(baddbmm(nan_in, ones<double>({1, 2, 3}), ones<double>({1, 3, 2}), 0.0).to_vector() ==
        std::vector<double>{3, 3, 3, 3});
  EXPECT_ERROR([] { (void)einsum("ii->i", ones<double>({3, 3})); }, {"einsum", "repeats within operand 0"});
  EXPECT_ERROR([] { (void)einsum("ij,jk->ik", ones<double>({2, 3}), ones<double>({4, 2})); }, {"einsum", "size 4",
               "has 3"});
  EXPECT_ERROR([] { (void)einsum("ij,jk->iz", ones<double>({2, 3}), ones<double>({3, 2})); }, {"einsum",
               "does not appear"});
  EXPECT_ERROR([] { (void)einsum("ijk,jk->i", ones<double>({2, 3}), ones<double>({3, 2})); }, {"einsum",
               "operand 0 has 2 dims"});
}

TEST_CASE("nn::functional pad, interpolate and one_hot match PyTorch, gradients included") {
  check_case("pad.constant", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2}, F::PadMode::constant, 0.5); });
  check_case("pad.crop", 1, [](const Inputs& v) { return F::pad(v[0], {1, 1, -1, 2}); });
  check_case("pad.reflect", 1, [](const Inputs& v) { return F::pad(v[0], {2, 1, 1, 2}, F::PadMode::reflect); });
  check_case("pad.replicate", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2, 2, 0}, F::PadMode::replicate); });
  check_case("pad.circular", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2}, F::PadMode::circular); });
  using M = F::InterpolateMode;
  const std::vector<std::pair<std::string, F::InterpolateOptions>> cases = {
      {"nearest.size", {{5, 7}, {}, M::nearest, false}},
      {"nearest.scale", {{}, {2.0}, M::nearest, false}},
      {"nearest.down", {{2, 3}, {}, M::nearest, false}},
      {"bilinear.size", {{5, 7}, {}, M::bilinear, false}},
      {"bilinear.corners", {{5, 7}, {}, M::bilinear, true}},
      {"bilinear.scale", {{}, {1.5}, M::bilinear, false}},
      {"bilinear.down", {{2, 3}, {}, M::bilinear, false}},
      {"linear", {{7}, {}, M::linear, false}}};
  for (const auto& [name, o] : cases) {
    const F::InterpolateOptions opt = o;
    check_case("interpolate." + name, 1, [opt](const Inputs& v) { return F::interpolate(v[0], opt); });
  }
  const Tensor<std::int64_t> oi = fx().index("one_hot.index");
  CHECK(F::one_hot(oi).to_vector() == fx().index("one_hot.auto").to_vector());
  CHECK(F::one_hot(oi, 5).shape() == Shape{2, 2, 5});
  CHECK(F::one_hot(oi, 5).to_vector() == fx().index("one_hot.5").to_vector());
  EXPECT_ERROR([] { (void)F::pad(ones<double>({1, 2, 3}), {3, 0}, F::PadMode::reflect); }, {"pad", "reflect",
               "smaller than its size 3"});
  EXPECT_ERROR([] { (void)F::pad(ones<double>({3}), {1, 1}, F::PadMode::replicate); }, {"pad", "2-D or 3-D"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 1, 2, 2}), {{3, 3}, {2.0}, M::nearest, false}); },
               {"interpolate", "not both"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 2}), {{3, 3}, {}, M::bilinear, false}); },
               {"interpolate", "bilinear needs a 4-D input"});
  EXPECT_ERROR([] { (void)F::one_hot(tensor<std::int64_t>({0, 5}), 3); }, {"one_hot", "class value 5"});
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

