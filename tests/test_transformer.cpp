// What a transformer needs: the tensor ops of autograd/manip.hpp, nn::functional pad/interpolate/one_hot,
// scaled_dot_product_attention, MultiheadAttention and TransformerEncoderLayer. Values and gradients against
// PyTorch (fixtures written by tests/fixtures/gen_manip.py, gen_attention.py and gen_parity.py with the PyPI
// wheel), gradcheck in double for every differentiable op, the blocked attention against the unfused composition,
// its memory, and the errors bad arguments get.
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
#include <tuple>
#include <utility>
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

/// The fixtures of tests/fixtures/gen_parity.py (options beyond the basics, PyTorch's less obvious rules).
const Fixtures& pfx() {
  static const Fixtures f("parity.txt");
  return f;
}

/// Runs `f` on the case's inputs (name.in0, ...): the value against name.y, the gradients for upstream name.g
/// against name.d0, ..., then gradcheck on the same inputs. The records come from `src` (manip.txt by default).
void check_case(const std::string& name, std::size_t n_inputs, const Fn& f, bool grad = true,
                const Fixtures& src = fx()) {
  INFO("case " << name);
  Inputs in;
  for (std::size_t i = 0; i < n_inputs; ++i) in.push_back(src[name + ".in" + std::to_string(i)].requires_grad_(true));
  TD y = f(in);
  ember_test::check_close(y, src[name + ".y"], 1e-12, 1e-12);
  if (!grad) return;
  y.backward(src[name + ".g"]);
  for (std::size_t i = 0; i < n_inputs; ++i) {
    INFO("gradient of input " << i);
    REQUIRE(in[i].grad().defined());
    ember_test::check_close(in[i].grad(), src[name + ".d" + std::to_string(i)], 1e-12, 1e-12);
  }
  Inputs fresh;
  for (std::size_t i = 0; i < n_inputs; ++i)
    fresh.push_back(src[name + ".in" + std::to_string(i)].requires_grad_(true));
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

TEST_CASE("split, chunk and unbind are views whose gradients reach the input; they match PyTorch") {
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
  // Against PyTorch, each piece scaled by its position so every piece's gradient differs.
  auto scaled_cat = [](const std::vector<TD>& ps, int dim) {
    std::vector<TD> qs;
    for (std::size_t i = 0; i < ps.size(); ++i) qs.push_back(TD(ps[i] * double(i + 1)));
    return cat(qs, dim);
  };
  check_case("chunk", 1, [scaled_cat](const Inputs& v) { return scaled_cat(chunk(v[0], 3, 1), 1); });
  check_case("split", 1, [scaled_cat](const Inputs& v) {
    return scaled_cat(split(v[0], std::vector<std::int64_t>{2, 4, 1}, 1), 1);
  });
  check_case("unbind", 1, [](const Inputs& v) {
    std::vector<TD> ps = unbind(v[0], 2), qs;
    for (std::size_t i = 0; i < ps.size(); ++i) qs.push_back(TD(ps[i] * double(i + 1)));
    return stack(qs, 0);
  });
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
  // beta = 0 ignores the input, NaN included, and gives it a zero gradient (as PyTorch).
  TD nan_in = full<double>({2, 2}, std::numeric_limits<double>::quiet_NaN());
  CHECK(baddbmm(nan_in, ones<double>({1, 2, 3}), ones<double>({1, 3, 2}), 0.0).to_vector() ==
        std::vector<double>{3, 3, 3, 3});
  check_case("baddbmm0", 3, [](const Inputs& v) { return baddbmm(v[0], v[1], v[2], 0.0, 1.5); }, true, pfx());
  check_case("baddbmm0.broadcast", 3, [](const Inputs& v) { return baddbmm(v[0], v[1], v[2], 0.0); }, true, pfx());
  EXPECT_ERROR([] { (void)einsum("ii->i", ones<double>({2, 3})); }, {"einsum", "subscript i is repeated in operand 0",
               "sizes differ (2 and 3"});
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
  // An output size beyond any int64 is refused before it is converted (the conversion would be undefined).
  for (const double factor : {1e30, 1e300}) {
    INFO("scale_factor " << factor);
    std::string msg;
    try {
      (void)F::interpolate(ones<double>({1, 1, 2, 2}), {{}, {factor}, M::nearest, false});
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK(msg.find("interpolate") != std::string::npos);
    CHECK(msg.find("scale_factor") != std::string::npos);
    CHECK(msg.find("too large") != std::string::npos);
    CHECK(msg.find("-9223372036854775808") == std::string::npos);
  }
}

TEST_CASE("einsum: three and more operands, diagonals and traces match PyTorch, gradients included") {
  const std::vector<std::tuple<std::string, std::string, std::size_t>> cases = {
      {"three", "ij,jk,kl->il", 3},      {"three_implicit", "ij,jk,kl", 3}, {"three_batch", "bij,bjk,bkl->bil", 3},
      {"outer3", "i,j,k->ijk", 3},       {"dot3", "i,i,i->", 3},            {"four", "ab,bc,cd,de->ae", 4},
      {"shared", "bi,bj,bi->bj", 3},     {"ellipsis3", "...ij,...jk,kl->...il", 3},
      {"diag", "ii->i", 1},              {"trace", "ii->", 1},              {"trace_implicit", "ii", 1},
      {"diag_batch", "bii->bi", 1},      {"diag_keep", "iji->ij", 1},       {"diag_pair", "iij,jk->ik", 2},
      {"diag_three", "ii,ij,jj->j", 3}};
  for (const auto& [name, eq, n] : cases) {
    const std::string e = eq;
    check_case("einsum." + name, n, [e](const Inputs& v) { return einsum(e, v); }, true, pfx());
  }
  // A diagonal of a non-contiguous operand reads through its strides.
  const TD x = ember_test::normal({3, 3}, 11);
  CHECK(einsum("ii->i", x.t()).to_vector() == einsum("ii->i", x).to_vector());
  EXPECT_ERROR([] { (void)einsum("ij,jk,kl->il", std::vector<TD>{ones<double>({2, 3}), ones<double>({3, 4})}); },
               {"einsum", "names 3 operands, 2 given"});
  EXPECT_ERROR([] { (void)einsum("", std::vector<TD>{}); }, {"einsum", "at least one operand"});
  EXPECT_ERROR([] { (void)einsum("ij,jk,kl->il", ones<double>({2, 3}), ones<double>({3, 4}), ones<double>({5, 2})); },
               {"einsum", "subscript 0 of operand 2", "has size 5 where another operand has 4"});
}

TEST_CASE("interpolate: bicubic, area, nearest-exact, trilinear and 5-D nearest match PyTorch, gradients included") {
  using M = F::InterpolateMode;
  const std::vector<std::pair<std::string, F::InterpolateOptions>> cases = {
      {"bicubic.size", {{7, 8}, {}, M::bicubic, false}},
      {"bicubic.corners", {{7, 8}, {}, M::bicubic, true}},
      {"bicubic.scale", {{}, {1.7}, M::bicubic, false}},
      {"bicubic.scale2", {{}, {0.6, 2.0}, M::bicubic, false}},
      {"bicubic.down", {{3, 2}, {}, M::bicubic, false}},
      {"bicubic.down_corners", {{2, 3}, {}, M::bicubic, true}},
      {"bicubic.one", {{1, 3}, {}, M::bicubic, true}},
      {"area.1d", {{3}, {}, M::area, false}},
      {"area.2d", {{3, 4}, {}, M::area, false}},
      {"area.3d", {{2, 3, 4}, {}, M::area, false}},
      {"area.up", {{9, 8}, {}, M::area, false}},
      {"area.scale", {{}, {0.5}, M::area, false}},
      {"nearest_exact.1d", {{7}, {}, M::nearest_exact, false}},
      {"nearest_exact.2d", {{7, 3}, {}, M::nearest_exact, false}},
      {"nearest_exact.3d", {{}, {1.5}, M::nearest_exact, false}},
      {"nearest_exact.scale", {{}, {0.7}, M::nearest_exact, false}},
      {"nearest.3d", {{3, 5, 7}, {}, M::nearest, false}},
      {"nearest.twice2d", {{}, {2.3, 1.1}, M::nearest, false}},
      {"trilinear.size", {{5, 6, 4}, {}, M::trilinear, false}},
      {"trilinear.corners", {{5, 6, 4}, {}, M::trilinear, true}},
      {"trilinear.scale", {{}, {1.5, 0.5, 2.0}, M::trilinear, false}}};
  for (const auto& [name, o] : cases) {
    const F::InterpolateOptions opt = o;
    check_case("interp." + name, 1, [opt](const Inputs& v) { return F::interpolate(v[0], opt); }, true, pfx());
  }
  // A 1-D input whose output is twice as long: PyTorch's forward reads floor(j / 2.3), not j / 2 as for 2-D
  // inputs; its backward takes the j / 2 shortcut all the same, so only the value is PyTorch's, and ember's gradient
  // is the adjoint of its forward (README, differences from PyTorch).
  const F::InterpolateOptions twice{{}, {2.3}, M::nearest, false};
  check_case("interp.nearest.twice", 1, [twice](const Inputs& v) { return F::interpolate(v[0], twice); }, false,
             pfx());
  ember_test::check_grad("interp.nearest.twice", [twice](const Inputs& v) { return F::interpolate(v[0], twice); },
                         {pfx()["interp.nearest.twice.in0"].requires_grad_(true)});
  // float and bfloat16 follow double (the passes compute in fp32).
  const TD xd = ember_test::normal({2, 3, 5, 6}, 12);
  const F::InterpolateOptions bic{{7, 4}, {}, M::bicubic, false};
  const TD want = F::interpolate(xd, bic);
  ember_test::check_close(F::interpolate(Tensor<float>(cast<float>(xd)), bic), want, 1e-5, 1e-5);
  ember_test::check_close(F::interpolate(Tensor<bfloat16>(cast<bfloat16>(xd)), bic), want, 0.05, 0.05);
  // Area bins of different widths: a bin that does not cover an inf stays finite (unused taps read nothing).
  TD xi = ones<double>({1, 1, 5});
  xi.at(0, 0, 0) = std::numeric_limits<double>::infinity();
  const TD ya = F::interpolate(xi, {{3}, {}, M::area, false});  // bins [0, 2), [1, 4), [3, 5)
  CHECK(std::isinf(ya.at(0, 0, 0)));
  CHECK(ya.at(0, 0, 2) == 1.0);
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3}), {{4}, {}, M::bicubic, false}); },
               {"interpolate", "bicubic needs a 4-D input"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3, 3}), {{4, 4}, {}, M::trilinear, false}); },
               {"interpolate", "trilinear needs a 5-D input"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3, 3}), {{4, 4}, {}, M::area, true}); },
               {"interpolate", "align_corners", "not mode area"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 1, 2, 2, 2, 2}), {{3}, {}, M::nearest, false}); },
               {"interpolate", "5-D", "[1, 1, 2, 2, 2, 2]"});
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


// ============================================================================================= attention

namespace {

const Fixtures& afx() {
  static const Fixtures f("attention.txt");
  return f;
}

/// Copies a module's parameters from the fixture records `<prefix>.param.<name>` (PyTorch's names) through
/// load_state_dict, so a parameter PyTorch does not have fails the lookup.
void load_params(nn::Module& m, const std::string& prefix, const Fixtures& src = afx()) {
  StateDict sd;
  for (auto& [n, p] : m.named_parameters<double>()) sd.emplace(n, src[prefix + ".param." + n]);
  m.load_state_dict(sd);
}

/// The blocked kernel and the unfused composition on the same inputs: values and gradients.
void compare_with_math(const TD& q0, const TD& k0, const TD& v0, const SdpaOptions<double>& o, double tol) {
  TD q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
  TD q2 = q0.clone().requires_grad_(true), k2 = k0.clone().requires_grad_(true), v2 = v0.clone().requires_grad_(true);
  TD y = scaled_dot_product_attention(q, k, v, o);
  TD y2 = ember::detail::sdpa_math(q2, k2, v2, o);
  ember_test::check_close(y, y2.detach(), tol, tol);
  TD g = ember_test::normal(y.shape(), 99);
  y.backward(g);
  y2.backward(g);
  ember_test::check_close(q.grad(), q2.grad().detach(), tol, tol);
  ember_test::check_close(k.grad(), k2.grad().detach(), tol, tol);
  ember_test::check_close(v.grad(), v2.grad().detach(), tol, tol);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention matches PyTorch: plain, causal with L != S, boolean and additive masks, scale") {
  for (const std::string c : {"plain", "causal", "bool", "float", "scale"}) {
    INFO("case " << c);
    const std::string pre = "sdpa." + c + ".";
    SdpaOptions<double> o;
    if (c == "causal") o.is_causal = true;
    if (c == "bool") o.attn_mask = mask_of(afx()[pre + "mask"]);
    if (c == "float") o.attn_mask = afx()[pre + "mask"];
    if (c == "scale") o.scale = 0.3;
    TD q = afx()[pre + "q"].requires_grad_(true), k = afx()[pre + "k"].requires_grad_(true),
       v = afx()[pre + "v"].requires_grad_(true);
    TD y = scaled_dot_product_attention(q, k, v, o);
    ember_test::check_close(y, afx()[pre + "y"], 1e-12, 1e-12);
    y.backward(afx()[pre + "g"]);
    ember_test::check_close(q.grad(), afx()[pre + "dq"], 1e-11, 1e-12);
    ember_test::check_close(k.grad(), afx()[pre + "dk"], 1e-11, 1e-12);
    ember_test::check_close(v.grad(), afx()[pre + "dv"], 1e-11, 1e-12);
    ember_test::check_grad("sdpa " + c, [o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o); },
                           {afx()[pre + "q"].requires_grad_(true), afx()[pre + "k"].requires_grad_(true),
                            afx()[pre + "v"].requires_grad_(true)});
  }
}

TEST_CASE("scaled_dot_product_attention: the blocked kernel equals the unfused composition across block edges") {
  // Sizes that straddle the 64-row and 64-column blocks, a batch of two dims, Ev != E.
  const TD q = ember_test::normal({2, 3, 130, 16}, 1), k = ember_test::normal({2, 3, 70, 16}, 2),
           v = ember_test::normal({2, 3, 70, 8}, 3);
  compare_with_math(q, k, v, {}, 1e-11);
  SdpaOptions<double> causal;
  causal.is_causal = true;
  compare_with_math(q, k, v, causal, 1e-11);
  const TD qs = ember_test::normal({1, 2, 70, 16}, 4);  // causal with L == S: whole blocks skipped
  compare_with_math(qs, k.narrow(0, 0, 1).narrow(1, 0, 2), v.narrow(0, 0, 1).narrow(1, 0, 2), causal, 1e-11);
  Tensor<bool> keep = empty<bool>({2, 1, 130, 70});
  for (std::int64_t i = 0; i < keep.numel(); ++i) keep.data()[i] = (i * 7919) % 5 != 0 || i % 70 == 0;
  SdpaOptions<double> masked;
  masked.attn_mask = keep;
  compare_with_math(q, k, v, masked, 1e-11);
  // Non-contiguous inputs (a transposed view, as attention heads are) give the same result.
  SdpaOptions<double> scaled;
  scaled.scale = 0.05;
  compare_with_math(ember_test::normal({2, 40, 3, 16}, 5).transpose(1, 2), k, v, scaled, 1e-11);
}

TEST_CASE("scaled_dot_product_attention with enable_gqa matches PyTorch; grouped heads are read in place") {
  for (const std::string c : {"plain", "causal", "bool", "mixed", "three_d"}) {
    INFO("case " << c);
    const std::string pre = "gqa." + c + ".";
    SdpaOptions<double> o;
    o.enable_gqa = true;
    if (c == "causal") o.is_causal = true;
    if (c == "bool") o.attn_mask = mask_of(pfx()[pre + "mask"]);
    TD q = pfx()[pre + "q"].requires_grad_(true), k = pfx()[pre + "k"].requires_grad_(true),
       v = pfx()[pre + "v"].requires_grad_(true);
    TD y = scaled_dot_product_attention(q, k, v, o);
    ember_test::check_close(y, pfx()[pre + "y"], 1e-12, 1e-12);
    y.backward(pfx()[pre + "g"]);
    ember_test::check_close(q.grad(), pfx()[pre + "dq"], 1e-11, 1e-12);
    ember_test::check_close(k.grad(), pfx()[pre + "dk"], 1e-11, 1e-12);
    ember_test::check_close(v.grad(), pfx()[pre + "dv"], 1e-11, 1e-12);
    ember_test::check_grad("sdpa gqa " + c,
                           [o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o); },
                           {pfx()[pre + "q"].requires_grad_(true), pfx()[pre + "k"].requires_grad_(true),
                            pfx()[pre + "v"].requires_grad_(true)});
  }
  // Across block edges, with dropout (one mask per query head), against the composition with repeated heads.
  const TD q = ember_test::normal({2, 6, 130, 8}, 21), k = ember_test::normal({2, 2, 70, 8}, 22),
           v = ember_test::normal({2, 2, 70, 4}, 23);
  SdpaOptions<double> g;
  g.enable_gqa = true;
  compare_with_math(q, k, v, g, 1e-11);
  g.is_causal = true;
  compare_with_math(q, k, v, g, 1e-11);
  SdpaOptions<double> d;
  d.enable_gqa = true;
  d.dropout_p = 0.3;
  Generator g1(5), g2(5);
  d.generator = &g1;
  TD qd = q.clone().requires_grad_(true), kd = k.clone().requires_grad_(true), vd = v.clone().requires_grad_(true);
  TD yd = scaled_dot_product_attention(qd, kd, vd, d);
  // The same draws on repeated heads without enable_gqa: the kernel's mask depends on (query head, query, key).
  SdpaOptions<double> r;
  r.dropout_p = 0.3;
  r.generator = &g2;
  TD kr = ember::detail::repeat_heads(k, 3).contiguous().requires_grad_(true),
     vr = ember::detail::repeat_heads(v, 3).contiguous().requires_grad_(true), qr = q.clone().requires_grad_(true);
  TD yr = scaled_dot_product_attention(qr, kr, vr, r);
  ember_test::check_close(yd, yr.detach(), 1e-12, 1e-12);
  const TD up = ember_test::normal(yd.shape(), 24);
  yd.backward(up);
  yr.backward(up);
  ember_test::check_close(qd.grad(), qr.grad().detach(), 1e-11, 1e-12);
  // A key/value head's gradient is the sum over the query heads it serves.
  ember_test::check_close(kd.grad(), TD(sum(kr.grad().reshape({2, 2, 3, 70, 8}), 2)).detach(), 1e-11, 1e-12);
  ember_test::check_close(vd.grad(), TD(sum(vr.grad().reshape({2, 2, 3, 70, 4}), 2)).detach(), 1e-11, 1e-12);
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({1, 3, 2, 4}), ones<double>({1, 2, 5, 4}),
                                                       ones<double>({1, 2, 5, 4}), {.enable_gqa = true}); },
               {"scaled_dot_product_attention", "key (2) and value (2) must divide the number of heads in query (3)"});
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({2, 4}), ones<double>({5, 4}), ones<double>({5, 4}),
                                                       {.enable_gqa = true}); },
               {"scaled_dot_product_attention", "enable_gqa needs a head dim"});
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({1, 4, 2, 4}), ones<double>({1, 2, 5, 4}),
                                                       ones<double>({1, 2, 5, 4})); },
               {"scaled_dot_product_attention", "batch dims"});
}

TEST_CASE("MultiheadAttention with kdim/vdim and add_bias_kv matches PyTorch, masks and gradients included") {
  using MHA = nn::MultiheadAttentionT<amp::fp64>;
  auto names = [](const nn::Module& m) {
    std::set<std::string> r;
    for (const auto& [n, p] : m.named_parameters<double>()) r.insert(n);
    return r;
  };
  {
    MHA mha(8, 2, {.kdim = 5, .vdim = 6, .batch_first = true});
    CHECK(names(mha) == std::set<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                             "out_proj.weight", "out_proj.bias"});
    CHECK(double(names(mha).size()) == pfx()["mha.kv.nparams"].item());
    CHECK(!mha.in_proj_weight.defined());
    load_params(mha, "mha.kv", pfx());
    TD q = pfx()["mha.kv.q"].requires_grad_(true), k = pfx()["mha.kv.k"].requires_grad_(true),
       v = pfx()["mha.kv.v"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.key_padding_mask = mask_of(pfx()["mha.kv.kpm"]);
    auto [y, w] = mha(q, k, v, o);
    ember_test::check_close(y, pfx()["mha.kv.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.kv.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.kv.g"]);
    ember_test::check_close(q.grad(), pfx()["mha.kv.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), pfx()["mha.kv.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), pfx()["mha.kv.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.q_proj_weight.grad(), pfx()["mha.kv.d_q_proj_weight"], 1e-10, 1e-12);
    ember_test::check_close(mha.k_proj_weight.grad(), pfx()["mha.kv.d_k_proj_weight"], 1e-10, 1e-12);
    ember_test::check_close(mha.v_proj_weight.grad(), pfx()["mha.kv.d_v_proj_weight"], 1e-10, 1e-12);
    EXPECT_ERROR([&] { (void)mha(q, q, v); }, {"MultiheadAttention", "kdim = 5 (key)"});
  }
  {
    MHA mha(8, 2, {.add_bias_kv = true});
    CHECK(names(mha) == std::set<std::string>{"in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                             "out_proj.bias"});
    CHECK(mha.bias_k.shape() == Shape{1, 1, 8});
    load_params(mha, "mha.bkv", pfx());
    TD x = pfx()["mha.bkv.x"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.attn_mask = mask_of(pfx()["mha.bkv.am"]);
    o.key_padding_mask = mask_of(pfx()["mha.bkv.kpm"]);
    o.average_attn_weights = false;
    auto [y, w] = mha(x, x, x, o);
    CHECK(w.shape() == Shape{2, 2, 5, 6});  // one more key: the appended bias
    ember_test::check_close(y, pfx()["mha.bkv.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.bkv.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.bkv.g"]);
    ember_test::check_close(x.grad(), pfx()["mha.bkv.dx"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_k.grad(), pfx()["mha.bkv.d_bias_k"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_v.grad(), pfx()["mha.bkv.d_bias_v"], 1e-10, 1e-12);
    // Without weights (the blocked kernel), an additive mask.
    x.grad() = TD();
    mha.zero_grad();
    nn::MhaForwardOptions<double> f;
    f.attn_mask = pfx()["mha.bkv.fm"];
    f.need_weights = false;
    TD y2 = mha(x, x, x, f).output;
    ember_test::check_close(y2, pfx()["mha.bkv.y2"], 1e-11, 1e-12);
    y2.backward(pfx()["mha.bkv.g2"]);
    ember_test::check_close(x.grad(), pfx()["mha.bkv.dx2"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_k.grad(), pfx()["mha.bkv.d2_bias_k"], 1e-10, 1e-12);
    // is_causal equals the explicit causal mask, which keeps the appended position for every query.
    nn::MhaForwardOptions<double> c, m;
    c.is_causal = true;
    m.attn_mask = mask_of(pfx()["mha.bkv.am"]);
    ember_test::check_close(mha(x, x, x, c).output, mha(x, x, x, m).output.detach(), 1e-12, 1e-12);
  }
  {
    MHA mha(8, 4, {.bias = false, .add_bias_kv = true, .kdim = 3, .vdim = 5, .batch_first = true});
    CHECK(names(mha) == std::set<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v",
                                             "out_proj.weight"});
    load_params(mha, "mha.both", pfx());
    TD q = pfx()["mha.both.q"].requires_grad_(true), k = pfx()["mha.both.k"].requires_grad_(true),
       v = pfx()["mha.both.v"].requires_grad_(true);
    auto [y, w] = mha(q, k, v);
    ember_test::check_close(y, pfx()["mha.both.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.both.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.both.g"]);
    ember_test::check_close(q.grad(), pfx()["mha.both.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), pfx()["mha.both.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), pfx()["mha.both.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_v.grad(), pfx()["mha.both.d_bias_v"], 1e-10, 1e-12);
  }
  EXPECT_ERROR([] { (void)nn::MultiheadAttention(8, 2, {.kdim = -1}); }, {"MultiheadAttention", "kdim (-1)"});
}

TEST_CASE("scaled_dot_product_attention: fully masked rows give zeros, dropout is reproducible and differentiable") {
  const TD q = ember_test::normal({1, 1, 4, 3}, 6), k = ember_test::normal({1, 1, 5, 3}, 7),
           v = ember_test::normal({1, 1, 5, 2}, 8);
  Tensor<bool> keep = ones<bool>({4, 5});
  for (std::int64_t j = 0; j < 5; ++j) keep.at(2, j) = false;  // query 2 sees nothing
  SdpaOptions<double> o;
  o.attn_mask = keep;
  TD ql = q.clone().requires_grad_(true);
  TD y = scaled_dot_product_attention(ql, k, v, o);
  CHECK(y.at(0, 0, 2, 0) == 0.0);
  CHECK(y.at(0, 0, 2, 1) == 0.0);
  sum(y).backward();
  CHECK(ql.grad().at(0, 0, 2, 0) == 0.0);
  for (double x : ql.grad().to_vector()) CHECK(std::isfinite(x));

  // Dropout: the mask comes from the generator's stream, the same for the same seed, and the backward
  // regenerates it (gradcheck re-seeds for every evaluation).
  SdpaOptions<double> d;
  d.dropout_p = 0.4;
  Generator g1(11), g2(11), g3(12);
  d.generator = &g1;
  const TD a = scaled_dot_product_attention(q, k, v, d);
  d.generator = &g2;
  CHECK(scaled_dot_product_attention(q, k, v, d).to_vector() == a.to_vector());
  d.generator = &g3;
  CHECK(scaled_dot_product_attention(q, k, v, d).to_vector() != a.to_vector());
  CHECK(scaled_dot_product_attention(q, k, v).to_vector() != a.to_vector());
  ember_test::check_grad("sdpa dropout", [](const Inputs& in) {
    Generator g(5);
    SdpaOptions<double> od;
    od.dropout_p = 0.3;
    od.is_causal = true;
    od.generator = &g;
    return scaled_dot_product_attention(in[0], in[1], in[2], od);
  }, {q.clone().requires_grad_(true), ember_test::normal({1, 1, 4, 3}, 9).requires_grad_(true), v.narrow(2, 0, 4).clone().requires_grad_(true)});
  // Averaged over many seeds the dropped-out output is unbiased.
  TD mean_out = zeros<double>(a.shape());
  for (int s = 0; s < 400; ++s) {
    Generator g(1000 + s);
    d.generator = &g;
    mean_out = TD(mean_out + scaled_dot_product_attention(q, k, v, d) * (1.0 / 400));
  }
  ember_test::check_close(mean_out, scaled_dot_product_attention(q, k, v), 0.15, 0.15);

  EXPECT_ERROR([&] { (void)scaled_dot_product_attention(q, k.narrow(3, 0, 2), v); }, {"scaled_dot_product_attention",
               "last dim (3) and k's (2)"});
  EXPECT_ERROR([&] { (void)scaled_dot_product_attention(q, k, v.narrow(2, 0, 4)); }, {"5 keys but v has 4"});
  EXPECT_ERROR([&] {
    SdpaOptions<double> bad;
    bad.is_causal = true;
    bad.attn_mask = keep;
    (void)scaled_dot_product_attention(q, k, v, bad);
  }, {"either attn_mask or is_causal"});
  EXPECT_ERROR([&] {
    SdpaOptions<double> bad;
    bad.attn_mask = ones<bool>({3, 5});
    (void)scaled_dot_product_attention(q, k, v, bad);
  }, {"attn_mask of shape [3, 5]", "[1, 1, 4, 5]"});
}

TEST_CASE("scaled_dot_product_attention: the CPU kernel's memory grows with L, the unfused one's with L^2") {
  // One head of 1024 queries: the L x L float scores alone are 4 MiB; the blocked kernel's forward and backward
  // allocate the inputs' size (256 KiB per tensor) plus O(L).
  auto& alloc = CpuCachingAllocator::instance();
  const std::int64_t l = 1024;
  Tensor<float> q = randn<float>({1, 1, l, 64}), k = randn<float>({1, 1, l, 64}), v = randn<float>({1, 1, l, 64});
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  auto peak_of = [&](auto&& run) {
    const std::size_t before = alloc.stats().bytes_in_use;
    alloc.reset_peak();
    run();
    return alloc.stats().peak_in_use - before;
  };
  SdpaOptions<float> o;
  o.is_causal = true;
  const std::size_t blocked = peak_of([&] { sum(scaled_dot_product_attention(q, k, v, o)).backward(); });
  const std::size_t unfused = peak_of([&] { sum(ember::detail::sdpa_math(q, k, v, o)).backward(); });
  INFO("blocked peak " << blocked << " B, unfused " << unfused << " B");
  CHECK(blocked < std::size_t(2) << 20);
  CHECK(unfused > std::size_t(4) << 20);
}

TEST_CASE("MultiheadAttention matches PyTorch: cross-attention with key padding and weights, masked self-attention") {
  using MHA = nn::MultiheadAttentionT<amp::fp64>;
  {
    MHA mha(8, 2, 0.0, true, true);
    load_params(mha, "mha.cross");
    TD q = afx()["mha.cross.q"].requires_grad_(true), k = afx()["mha.cross.k"].requires_grad_(true),
       v = afx()["mha.cross.v"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.key_padding_mask = mask_of(afx()["mha.cross.kpm"]);
    auto [y, w] = mha(q, k, v, o);
    ember_test::check_close(y, afx()["mha.cross.y"], 1e-11, 1e-12);
    ember_test::check_close(w, afx()["mha.cross.w"], 1e-11, 1e-12);
    y.backward(afx()["mha.cross.g"]);
    ember_test::check_close(q.grad(), afx()["mha.cross.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), afx()["mha.cross.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), afx()["mha.cross.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.in_proj_weight.grad(), afx()["mha.cross.d_in_proj_weight"], 1e-10, 1e-12);
    // Without weights the heads go through the blocked kernel: the same output.
    o.need_weights = false;
    auto r = mha(q, k, v, o);
    CHECK(!r.weights.defined());
    ember_test::check_close(r.output, afx()["mha.cross.y"], 1e-11, 1e-12);
  }
  {
    MHA mha(8, 4);
    load_params(mha, "mha.self");
    TD x = afx()["mha.self.x"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.attn_mask = Tensor<bool>(triu(ones<double>({5, 5}), 1) > 0.5);
    o.need_weights = false;
    TD y = mha(x, x, x, o).output;
    ember_test::check_close(y, afx()["mha.self.y"], 1e-11, 1e-12);
    y.backward(afx()["mha.self.g"]);
    ember_test::check_close(x.grad(), afx()["mha.self.dx"], 1e-10, 1e-12);
    ember_test::check_close(mha.out_proj.weight.grad(), afx()["mha.self.d_out_proj_weight"], 1e-10, 1e-12);
    // is_causal gives the same as the explicit causal mask.
    nn::MhaForwardOptions<double> c;
    c.is_causal = true;
    c.need_weights = false;
    ember_test::check_close(mha(x, x, x, c).output, afx()["mha.self.y"], 1e-11, 1e-12);
  }
  EXPECT_ERROR([] { (void)nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "multiple of num_heads"});
}

TEST_CASE("TransformerEncoderLayer matches PyTorch: post-norm ReLU and pre-norm GELU with key padding") {
  for (const std::string c : {"post_relu", "pre_gelu"}) {
    INFO("case " << c);
    nn::TransformerEncoderLayerOptions o;
    o.dim_feedforward = 16;
    o.dropout = 0;
    o.batch_first = true;
    o.norm_first = c == "pre_gelu";
    o.activation = c == "pre_gelu" ? nn::TransformerActivation::gelu : nn::TransformerActivation::relu;
    nn::TransformerEncoderLayerT<amp::fp64> layer(8, 2, o);
    load_params(layer, "enc." + c);
    CHECK(layer.num_parameters() == 4 * 8 * 8 + 3 * 8 + 8 + 2 * 8 * 16 + 16 + 8 + 4 * 8);
    const std::string pre = "enc." + c + ".";
    TD x = afx()[pre + "x"].requires_grad_(true);
    TD y = layer(x, {}, mask_of(afx()[pre + "kpm"]));
    ember_test::check_close(y, afx()[pre + "y"], 1e-10, 1e-12);
    y.backward(afx()[pre + "g"]);
    ember_test::check_close(x.grad(), afx()[pre + "dx"], 1e-9, 1e-11);
    ember_test::check_close(layer.linear1.weight.grad(), afx()[pre + "d_linear1_weight"], 1e-9, 1e-11);
    ember_test::check_close(layer.self_attn.in_proj_weight.grad(), afx()[pre + "d_in_proj_weight"], 1e-9, 1e-11);
  }
}

TEST_CASE("TransformerEncoderLayer without bias: no bias anywhere, LayerNorms included; PyTorch's state dict loads") {
  nn::TransformerEncoderLayerOptions o;
  o.dim_feedforward = 16;
  o.dropout = 0;
  o.batch_first = true;
  o.bias = false;
  nn::TransformerEncoderLayerT<amp::fp64> layer(8, 2, o);
  // torch.nn.TransformerEncoderLayer(bias=False)'s keys, exactly.
  std::set<std::string> keys;
  for (const auto& [k, v] : layer.state_dict()) keys.insert(k);
  CHECK(keys == std::set<std::string>{"self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                      "linear2.weight", "norm1.weight", "norm2.weight"});
  CHECK(double(keys.size()) == pfx()["enc.nobias.nstate"].item());
  CHECK(!layer.norm1.bias.defined());
  CHECK(!layer.norm2.bias.defined());
  load_params(layer, "enc.nobias", pfx());
  TD x = pfx()["enc.nobias.x"].requires_grad_(true);
  TD y = layer(x);
  ember_test::check_close(y, pfx()["enc.nobias.y"], 1e-10, 1e-12);
  y.backward(pfx()["enc.nobias.g"]);
  ember_test::check_close(x.grad(), pfx()["enc.nobias.dx"], 1e-9, 1e-11);
  ember_test::check_close(layer.norm1.weight.grad(), pfx()["enc.nobias.d_norm1_weight"], 1e-9, 1e-11);
}

TEST_CASE("attention in bf16 and fp16: the layers under the mixed policies follow fp32, dropout included") {
  manual_seed(8);
  nn::TransformerEncoderLayerOptions o;
  o.dim_feedforward = 32;
  o.dropout = 0;
  o.batch_first = true;
  o.norm_first = true;
  o.activation = nn::TransformerActivation::gelu;
  nn::TransformerEncoderLayer f32(16, 2, o);
  nn::TransformerEncoderLayerT<amp::bf16_mixed> b16(16, 2, o);
  b16.load_state_dict(f32.state_dict());
  const Tensor<float> x = randn<float>({2, 6, 16});
  Tensor<bool> kpm = zeros<bool>({2, 6});
  kpm.at(1, 5) = true;
  const Tensor<float> want = f32(x, {}, kpm, true);
  const Tensor<float> got = cast<float>(b16(Tensor<bfloat16>(cast<bfloat16>(x)), {}, kpm, true));
  ember_test::check_close(got, Tensor<double>(cast<double>(want)), 0.05, 0.05);
  // SDPA on half tensors computes in float: the float result rounded.
  const Tensor<float> q = randn<float>({1, 2, 5, 8}), k = randn<float>({1, 2, 7, 8}), v = randn<float>({1, 2, 7, 4});
  SdpaOptions<half> oh;
  oh.is_causal = true;
  SdpaOptions<float> of;
  of.is_causal = true;
  const Tensor<half> yh = scaled_dot_product_attention(Tensor<half>(cast<half>(q)), Tensor<half>(cast<half>(k)),
                                                       Tensor<half>(cast<half>(v)), oh);
  ember_test::check_close(Tensor<float>(cast<float>(yh)),
                          Tensor<double>(cast<double>(scaled_dot_product_attention(q, k, v, of))), 0.01, 0.01);
  // nn::Dropout on 16-bit tensors: zeros or the value scaled by 1 / (1 - p).
  nn::Dropout drop(0.5);
  const Tensor<bfloat16> ones16 = ones<bfloat16>({256});
  for (bfloat16 y : drop(ones16).to_vector()) CHECK((float(y) == 0.0f || float(y) == 2.0f));
}
