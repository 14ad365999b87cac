// The index ops (ops/indexing.hpp, their loops in cpu/index.hpp; the differentiable ops in autograd/manip.hpp and
// autograd/shape_ops.hpp): tril/triu (the triangle masks) and masked_fill, gather, scatter, scatter_add and index_add,
// and index_select's errors. Values and gradients against PyTorch (fixtures written by tests/fixtures/gen_manip.py with
// the PyPI wheel), gradcheck in double, and the errors bad arguments get. CUDA twin: test_index_cuda.cu.
//
// Compile time: every op is called through one std::function type over double tensors, so each op is
// instantiated once, for double, whatever the number of cases.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
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

using ember_test::mask_of;

using ember_test::check_case;

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

TEST_CASE("index_select and its backward: negative indices are an error, as torch.index_select") {
  const TD x = randn<double>({4, 3});
  EXPECT_ERROR([&] { (void)index_select(x, 0, tensor<std::int64_t>({0, -1})); },
               {"index_select", "index -1", "position 1", "[0, 4)", "[4, 3]"});
  EXPECT_ERROR([&] { (void)index_select(x, 1, tensor<std::int64_t>({3})); }, {"index_select", "index 3", "[0, 3)"});
  EXPECT_ERROR([&] { (void)ops::index_add(Shape{4, 3}, 0, tensor<std::int64_t>({-1}), randn<double>({1, 3})); },
               {"index_add", "index -1", "[0, 4)"});
  CHECK(index_select(x, 0, tensor<std::int64_t>({3})).to_vector() == x[3].contiguous().to_vector());
}
