// The tensor ops of autograd/manip.hpp that are compositions of differentiable pieces, and einsum
// (autograd/einsum.hpp): split, chunk and unbind, flip, roll, repeat and tile, outer, baddbmm, einsum with any number
// of operands. Values and gradients against PyTorch (fixtures written by tests/fixtures/gen_manip.py and
// gen_parity.py with the PyPI wheel), gradcheck in double, and the errors bad arguments get. (manip.hpp's ops with
// loops of their own: test_index.cpp and test_sort.cpp.)
//
// Compile time: every op is called through one std::function type over double tensors, so each op is
// instantiated once, for double, whatever the number of cases.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
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

using ember_test::TD;
using ember_test::Inputs;
using Fn = ember_test::GradFn;


constexpr auto pfx = &ember_test::parity_fixtures;

using ember_test::check_case;

}  // namespace

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
