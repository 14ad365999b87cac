// User errors: every misuse below throws ember::Error (never crashes, never returns garbage) whose message names
// the op and the shapes (or dtypes/devices) involved, as DESIGN.md asks ("Errors are exceptions ... whose message
// names the op, the shapes/devices/dtypes involved and what was expected").
//
// Not tested here because they do not compile, by design (dtype is a template parameter, so these are
// static_asserts with a message that says what to do):
//   Tensor<float>  + Tensor<double>         "element-wise operands have different dtypes; convert one with cast<T>(x)"
//   Tensor<float> t = double_expression;     "the expression's dtype differs from the tensor's; wrap it in cast<T>"
//   Tensor<int32_t> * 0.5                    "a floating-point scalar with an integer tensor would truncate"
//   where(float_condition, a, b)             "where: the condition must be bool"
//   mean / var / norm of an integer tensor   "mean: needs a floating-point argument; use cast<float>(x)"
//   Tensor<std::string>                      "T must be one of float, double, half, bfloat16, int32_t, ..."
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;

namespace {

using ember_test::error_of;

using TF = Tensor<float>;


TF arange_f(const Shape& s) { return arange<float>(double(s.numel())).reshape(s); }
TF leaf_f(const Shape& s) {
  TF t = arange_f(s);
  t.requires_grad_();
  return t;
}

}  // namespace

TEST_CASE("errors: numbers from the environment are whole integers in range, never atoi's reading") {
  using ember::detail::parse_int;
  long long v = 7;
  const std::pair<const char*, long long> good[] = {{"0", 0},
                                                    {"-0", 0},
                                                    {"+5", 5},
                                                    {"4096", 4096},
                                                    {"9223372036854775807", std::numeric_limits<long long>::max()},
                                                    {"-9223372036854775808", std::numeric_limits<long long>::min()}};
  for (const auto& g : good) {
    INFO(g.first);
    CHECK((parse_int(g.first, v) && v == g.second));
  }
  for (const char* text : {"", "-", "+", " 1", "1 ", "8x", "0x10", "1e3", "1.5", "--1", "\xff" "1",
                           "9223372036854775808", "-9223372036854775809", "99999999999999999999999"}) {
    INFO(text);
    v = 7;
    CHECK_FALSE(parse_int(text, v));
    CHECK(v == 7);  // untouched
  }
  // Unsigned: digits only, up to a maximum (2^64 - 1 by default).
  using ember::detail::parse_uint;
  unsigned long long u = 7;
  CHECK((parse_uint("18446744073709551615", u) && u == std::numeric_limits<unsigned long long>::max()));
  CHECK((parse_uint("0", u) && u == 0));
  CHECK((parse_uint("900", u, 900) && u == 900));
  for (const char* text : {"", "+1", "-1", " 1", "1 ", "8x", "18446744073709551616", "1e3"}) {
    INFO(text);
    u = 7;
    CHECK_FALSE(parse_uint(text, u));
    CHECK(u == 7);
  }
  CHECK_FALSE(parse_uint("901", u, 900));
  // An unset or empty variable gives the default; anything else must be an integer in the range.
  {
    ember_test::EnvGuard e("EMBER_NUM_THREADS", nullptr);
    CHECK(cpu::ThreadPool::default_threads() >= 1);
  }
  {
    ember_test::EnvGuard e("EMBER_NUM_THREADS", "3");
    CHECK(cpu::ThreadPool::default_threads() == 3);
  }
  // atoi read these as 1 ("abc", "0"), 8 ("8x") and -1 (a pool of one); one was a pool of 10^9 threads.
  for (const char* bad : {"abc", "0", "8x", "-1", "1000000000", "4097"}) {
    ember_test::EnvGuard e("EMBER_NUM_THREADS", bad);
    EXPECT_ERROR([] { (void)cpu::ThreadPool::default_threads(); },
                 {"cpu::ThreadPool: environment variable EMBER_NUM_THREADS is \"", bad,
                  "\", not an integer in [1, 4096]"});
  }
  {
    ember_test::EnvGuard e("EMBER_SPIN_US", "50");
    CHECK(cpu::ThreadPool::default_spin_ns() == 50000);
  }
  {
    ember_test::EnvGuard e("EMBER_SPIN_US", "200us");
    EXPECT_ERROR([] { (void)cpu::ThreadPool::default_spin_ns(); },
                 {"EMBER_SPIN_US is \"200us\", not an integer in [0, 100000]"});
  }
  {
    // What a terminal would act on is escaped in the message.
    ember_test::EnvGuard e("EMBER_TEST_NUMBER", "1\x1b[2J");
    EXPECT_ERROR([] { (void)ember::detail::env_int("test", "EMBER_TEST_NUMBER", 0, 0, 9); }, {"is \"1\\x1b[2J\""});
  }
}

TEST_CASE("errors: element-wise shapes that do not broadcast") {
  const TF a = arange_f({2, 3}), b = arange_f({4}), c = arange_f({3, 2});
  EXPECT_ERROR([&] { TF r = a + b; }, {"Add", "[2, 3]", "[4]", "broadcast"});
  EXPECT_ERROR([&] { TF r = a * c; }, {"Mul", "[2, 3]", "[3, 2]"});
  EXPECT_ERROR([&] { TF r = sum(a * c); }, {"Mul", "[2, 3]", "[3, 2]"});  // inside a reduction
  EXPECT_ERROR([&] { TF r = (a + 1.f) * c; }, {"Mul", "[2, 3]", "[3, 2]"});  // deeper in an expression
  EXPECT_ERROR([&] { TF r = where(a > 1.f, a, c); }, {"where", "[2, 3]", "[3, 2]"});
  TF t = arange_f({2, 3});
  EXPECT_ERROR([&] { t += c; }, {"Add", "[2, 3]", "[3, 2]"});
  // An in-place target must already have the broadcast shape of the result.
  TF small = arange_f({3});
  EXPECT_ERROR([&] { small += a; }, {"[2, 3]", "[3]"});
  EXPECT_ERROR([&] { small.copy_(a); }, {"[2, 3]", "[3]"});
}

TEST_CASE("errors: the element-wise executor names the op for an undefined operand or output") {
  // The strided output takes the planned path (not the dense one), whose checks run before anything reads a leaf.
  const TF out = zeros<float>({4, 3}).t(), undefined;
  EXPECT_ERROR([&] { cpu::assign(out, expr::TensorLeaf<float, false>{&undefined}, "myop"); },
               {"myop", "an operand is an undefined tensor"});
  EXPECT_ERROR([&] { cpu::assign(undefined, expr::TensorLeaf<float, false>{&out}, "myop"); }, {"undefined tensor"});
  // Broadcasting into the output is checked there too, and an output with a stride-0 dim is refused.
  const TF wide = arange_f({2, 3, 4});
  EXPECT_ERROR([&] { cpu::assign(out, expr::TensorLeaf<float, false>{&wide}, "myop"); },
               {"myop", "cannot write a result of shape [2, 3, 4] into a tensor of shape [3, 4]"});
  const TF row = arange_f({1, 4}).expand({3, 4});
  EXPECT_ERROR([&] { cpu::assign(row, expr::TensorLeaf<float, false>{&out}, "myop"); },
               {"myop", "broadcast (stride 0) dim", "clone() it first"});
}

TEST_CASE("errors: matrix products with mismatched inner dims") {
  const TF a23 = arange_f({2, 3}), b45 = arange_f({4, 5}), v4 = arange_f({4}), v3 = arange_f({3});
  EXPECT_ERROR([&] { TF r = matmul(a23, b45); }, {"matmul", "[2, 3]", "[4, 5]"});
  EXPECT_ERROR([&] { TF r = matmul(a23, v4); }, {"matmul", "[2, 3]", "[4]"});
  EXPECT_ERROR([&] { TF r = matmul(v4, a23); }, {"matmul", "[4]", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = matmul(v3, v4); }, {"matmul", "[3]", "[4]"});
  const TF a234 = arange_f({2, 3, 4}), b256 = arange_f({2, 5, 6}), b345 = arange_f({3, 4, 5});
  EXPECT_ERROR([&] { TF r = matmul(a234, b256); }, {"matmul", "[2, 3, 4]", "[2, 5, 6]"});
  EXPECT_ERROR([&] { TF r = matmul(a234, arange_f({5, 6})); }, {"matmul", "[2, 3, 4]", "[5, 6]"});
  EXPECT_ERROR([&] { TF r = matmul(a234, b345); }, {"matmul", "[2, 3, 4]", "[3, 4, 5]"});  // batch 2 vs 3
  EXPECT_ERROR([&] { TF r = matmul(scalar_tensor(1.f), a23); }, {"matmul", "[]", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = mm(a23, b45); }, {"mm", "[2, 3]", "[4, 5]"});
  EXPECT_ERROR([&] { TF r = mm(a23, v3); }, {"mm", "[2, 3]", "[3]"});
  EXPECT_ERROR([&] { TF r = bmm(a234, b256); }, {"bmm", "[2, 3, 4]", "[2, 5, 6]"});
  EXPECT_ERROR([&] { TF r = bmm(a234, arange_f({3, 4, 5})); }, {"bmm", "[2, 3, 4]", "[3, 4, 5]"});
  EXPECT_ERROR([&] { TF r = bmm(a23, b45); }, {"bmm", "[2, 3]", "[4, 5]"});
  EXPECT_ERROR([&] { TF r = dot(v3, v4); }, {"dot", "[3]", "[4]"});
  EXPECT_ERROR([&] { TF r = linear(a23, arange_f({5, 4})); }, {"linear", "[2, 3]", "[5, 4]"});
  EXPECT_ERROR([&] { TF r = linear(a23, arange_f({5, 3}), arange_f({4})); }, {"linear", "[4]"});
}

TEST_CASE("errors: cat and stack") {
  const TF a = arange_f({2, 3}), b = arange_f({2, 4}), c = arange_f({3});
  EXPECT_ERROR([&] { TF r = cat(std::vector<TF>{a, b}, 0); }, {"cat", "[2, 3]", "[2, 4]"});
  EXPECT_ERROR([&] { TF r = cat(std::vector<TF>{a, c}, 0); }, {"cat", "[2, 3]", "[3]"});
  EXPECT_ERROR([&] { TF r = cat(std::vector<TF>{a, a}, 2); }, {"cat", "dim 2"});
  EXPECT_ERROR([&] { TF r = cat(std::vector<TF>{}, 0); }, {"cat", "empty"});
  EXPECT_ERROR([&] { TF r = stack(std::vector<TF>{a, b}); }, {"stack", "[2, 3]", "[2, 4]"});
  EXPECT_ERROR([&] { TF r = stack(std::vector<TF>{a, a.t()}, 1); }, {"stack", "[2, 3]", "[3, 2]"});
  EXPECT_ERROR([&] { TF r = stack(std::vector<TF>{}); }, {"stack", "empty"});
}

TEST_CASE("errors: out-of-range indices") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { (void)a.at(2, 0); }, {"at", "index 2", "[2, 3]"});
  EXPECT_ERROR([&] { (void)a.at(0, -4); }, {"at", "index -4", "[2, 3]"});
  EXPECT_ERROR([&] { (void)a.at(1); }, {"at", "[2, 3]"});  // wrong number of indices
  EXPECT_ERROR([&] { TF r = a.select(1, 3); }, {"select", "index 3", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a[2]; }, {"select", "index 2", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(1, 2, 2); }, {"narrow", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(0, 1, 2); }, {"narrow", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = index_select(a, 1, from_vector<std::int64_t>({0, 5})); },
               {"index_select", "index 5", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = index_select(a, 0, from_vector<std::int64_t>({-3})); },
               {"index_select", "index -3", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = index_select(a, 0, from_vector<std::int64_t>({0, 1, 0, 1}, {2, 2})); },
               {"index_select", "1-D", "[2, 2]"});
  EXPECT_ERROR([&] { TF r = a.slice(1, 0, 2, 0); }, {"slice", "step"});
}

TEST_CASE("errors: out-of-range dims") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { TF r = a.transpose(0, 5); }, {"transpose", "dim 5", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.transpose(-3, 0); }, {"transpose", "dim -3"});
  EXPECT_ERROR([&] { TF r = sum(a, 5); }, {"sum", "dim 5", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = mean(a, {0, -3}); }, {"mean", "dim -3", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = max(a, 2); }, {"max", "dim 2", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = norm(a, 2, 4); }, {"norm", "dim 4", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = sum(a, {1, 1}); }, {"sum", "dim 1", "more than once"});
  EXPECT_ERROR([&] { TF r = a.permute({0}); }, {"permute", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.permute({0, 0}); }, {"permute", "twice"});
  EXPECT_ERROR([&] { TF r = a.unsqueeze(4); }, {"unsqueeze", "dim 4"});
  EXPECT_ERROR([&] { (void)a.size(2); }, {"size", "dim 2"});
  EXPECT_ERROR([&] { TF r = arange_f({2, 3, 4}).t(); }, {"t", "[2, 3, 4]"});
  EXPECT_ERROR([&] { TF r = arange_f({2, 3, 4}).flatten(2, 1); }, {"flatten"});
}

TEST_CASE("errors: out-of-range dims name the shape") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { TF r = a.transpose(0, 5); }, {"transpose", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.unsqueeze(4); }, {"unsqueeze", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.select(2, 0); }, {"select", "[2, 3]"});
}

TEST_CASE("errors: views and reshapes") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { TF r = a.t().view({6}); }, {"view", "[3, 2]", "[6]"});
  EXPECT_ERROR([&] { TF r = a.view({4, 2}); }, {"view", "[4, 2]", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.reshape({4, 2}); }, {"reshape", "[4, 2]", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.reshape({-1, 4}); }, {"reshape", "[-1, 4]", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = a.reshape({-1, -1}); }, {"reshape", "[-1, -1]"});
  EXPECT_ERROR([&] { TF r = a.reshape({-2, -3}); }, {"reshape", "[-2, -3]"});
  EXPECT_ERROR([&] { TF r = a.expand({4, 3}); }, {"expand", "[2, 3]", "[4, 3]"});
  EXPECT_ERROR([&] { TF r = a.expand({3}); }, {"expand", "[2, 3]", "[3]"});
  EXPECT_ERROR([&] { TF r = a.expand({-1, 2, 3}); }, {"expand", "[-1, 2, 3]"});
}

TEST_CASE("errors: backward misuse") {
  const TF x = leaf_f({2, 3});
  TF y = x * 2.f;
  EXPECT_ERROR([&] { y.backward(); }, {"backward", "[2, 3]"});  // non-scalar without a gradient
  EXPECT_ERROR([&] { y.backward(ones<float>({3, 2})); }, {"backward", "[3, 2]", "[2, 3]"});
  const TF plain = arange_f({2, 3});
  EXPECT_ERROR([&] { plain.backward(ones<float>({2, 3})); }, {"backward", "[2, 3]", "require"});
  TF s = sum(plain);
  EXPECT_ERROR([&] { s.backward(); }, {"backward", "[]", "require"});
  {
    NoGradGuard ng;
    TF z = sum(x);
    EXPECT_ERROR([&] { z.backward(); }, {"backward", "NoGradGuard"});
  }
  Tensor<std::int32_t> iz = zeros<std::int32_t>({2});
  EXPECT_ERROR([&] { iz.backward(); }, {"backward", "int32"});

  // Through a graph that a first backward freed.
  TF e = exp(x);
  TF l = sum(e);
  l.backward();
  EXPECT_ERROR([&] { l.backward(); }, {"backward", "retain_graph"});

  // A saved tensor changed in place (version counter).
  TF a = exp(x);
  TF b = a * a;
  {
    NoGradGuard ng;
    a.fill_(1.f);
  }
  TF sb = sum(b);
  EXPECT_ERROR([&] { sb.backward(); }, {"in-place", "[2, 3]", "version"});
  TF w = leaf_f({3, 3});
  TF m = mm(x, w);
  {
    NoGradGuard ng;
    w.fill_(0.f);
  }
  TF sm = sum(m);
  EXPECT_ERROR([&] { sm.backward(); }, {"MmBackward", "in-place", "[3, 3]"});

  TF u = arange_f({2});
  EXPECT_ERROR([&] { u.register_hook([](const TF&) {}); }, {"register_hook", "require"});
}

TEST_CASE("errors: requires_grad_ on an integer tensor and on a non-leaf") {
  Tensor<std::int32_t> i = zeros<std::int32_t>({2});
  EXPECT_ERROR([&] { i.requires_grad_(); }, {"requires_grad_", "int32"});
  Tensor<std::int64_t> l = zeros<std::int64_t>({2});
  EXPECT_ERROR([&] { l.requires_grad_(); }, {"requires_grad_", "int64"});
  const TF x = leaf_f({2, 3});
  TF y = x * 2.f;
  EXPECT_ERROR([&] { y.requires_grad_(false); }, {"requires_grad_", "leaf"});
}

TEST_CASE("errors: in-place writes that autograd cannot allow") {
  TF x = leaf_f({2, 3});
  const TF p = arange_f({2, 3});
  EXPECT_ERROR([&] { x = x * 2.f; }, {"in-place", "[2, 3]", "leaf"});
  EXPECT_ERROR([&] { x += 1.f; }, {"in-place", "[2, 3]", "leaf"});
  EXPECT_ERROR([&] { x.fill_(0.f); }, {"fill_", "leaf"});
  EXPECT_ERROR([&] { x.zero_(); }, {"fill_", "leaf"});
  // Also when the right-hand side needs no gradient: the leaf's value would change under the optimizer's feet.
  EXPECT_ERROR([&] { x = p * 2.f; }, {"in-place", "[2, 3]", "leaf"});
  EXPECT_ERROR([&] { x.copy_(p); }, {"in-place", "[2, 3]", "leaf"});
  {
    NoGradGuard ng;  // allowed under NoGradGuard (optimizer steps, initialisation)
    x.fill_(1.f);
    x += 1.f;
    x.copy_(p);
  }
  CHECK(x.to_vector() == p.to_vector());
  // A differentiable result written into a view of another tensor is not supported.
  TF base = arange_f({2, 3});
  TF row = base.select(0, 1);
  EXPECT_ERROR([&] { row = x.select(0, 0) * 2.f; }, {"in-place", "view", "[3]"});
}

TEST_CASE("errors: writing into an expanded (stride 0) tensor") {
  const TF a = arange_f({1, 3});
  TF e = a.expand({4, 3});
  EXPECT_ERROR([&] { e.fill_(1.f); }, {"fill_", "[4, 3]", "stride"});
  EXPECT_ERROR([&] { e.copy_(arange_f({4, 3})); }, {"[4, 3]", "stride"});
  EXPECT_ERROR([&] { e += 1.f; }, {"[4, 3]", "stride"});
  EXPECT_ERROR([&] { e = a * 2.f; }, {"[4, 3]", "stride"});
}

TEST_CASE("errors: creation and scalar access") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { (void)a.item(); }, {"item", "[2, 3]"});
  EXPECT_ERROR([&] { (void)arange_f({0}).item(); }, {"item", "[0]"});
  EXPECT_ERROR([&] { TF r = empty<float>({2, -1}); }, {"empty", "[2, -1]"});
  EXPECT_ERROR([&] { TF r = zeros<float>({-3}); }, {"[-3]"});
  EXPECT_ERROR([&] { TF r = ones<float>({1, -2}); }, {"[1, -2]"});
  EXPECT_ERROR([&] { TF r = arange<float>(0, 5, 0); }, {"arange", "step"});
  EXPECT_ERROR([&] { TF r = arange<float>(0, 5, -1); }, {"arange"});
  EXPECT_ERROR([&] { TF r = linspace<float>(0, 1, -1); }, {"linspace", "-1"});
  EXPECT_ERROR([&] { TF r = from_vector<float>({1, 2, 3, 4, 5}, {2, 3}); }, {"from_vector", "[2, 3]"});
  EXPECT_ERROR([&] { TF r = tensor<float>({{1, 2}, {3}}); }, {"tensor", "ragged"});
  EXPECT_ERROR([&] { Tensor<std::int64_t> r = randint(5, 5, {3}); }, {"randint", "5"});
  EXPECT_ERROR([&] { Tensor<std::int64_t> r = randint(6, 2, {3}); }, {"randint", "6", "2"});
  EXPECT_ERROR([&] { TF r = bernoulli<float>({3}, 1.5); }, {"bernoulli", "1.5"});
  TF u;  // undefined
  EXPECT_ERROR([&] { (void)u.shape(); }, {"undefined"});
  EXPECT_ERROR([&] { TF r = u + a; }, {"undefined"});
  EXPECT_ERROR([&] { u += a; }, {"undefined"});
}

TEST_CASE("errors: invalid arguments of element-wise ops and reductions") {
  const TF a = arange_f({2, 3});
  EXPECT_ERROR([&] { TF r = clamp(a, 2.0, 1.0); }, {"clamp", "2", "1"});
  EXPECT_ERROR([&] { TF r = norm(a, 0.0); }, {"norm", "p"});
  EXPECT_ERROR([&] { TF r = norm(a, -1.0); }, {"norm", "-1"});
  const TF e = empty<float>({0, 3});
  EXPECT_ERROR([&] { TF r = max(e); }, {"max", "empty", "[0, 3]"});
  EXPECT_ERROR([&] { TF r = min(e); }, {"min", "empty", "[0, 3]"});
  EXPECT_ERROR([&] { TF r = max(e, 0); }, {"max", "empty", "[0, 3]"});
  EXPECT_ERROR([&] { Tensor<std::int64_t> r = argmax(e); }, {"argmax", "empty", "[0, 3]"});
  EXPECT_ERROR([&] { Tensor<std::int64_t> r = argmin(e, 1); }, {"argmin", "empty", "[0, 3]"});
}

TEST_CASE("errors: creating tensors") {
  EXPECT_ERROR([] { TF r = empty<float>({2, -1}); }, {"empty", "negative", "[2, -1]"});
  // A byte count that would not fit (and would wrap around to a small allocation) is refused up front.
  EXPECT_ERROR([] { TF r = empty<float>({std::int64_t(1) << 61}); }, {"empty", "too many elements", "float32"});
  EXPECT_ERROR([] { Tensor<double> r = zeros<double>({std::int64_t(1) << 30, std::int64_t(1) << 30}); }, {"zeros", "too many", "float64"});
}

// Shape arithmetic (issue 10, item 8): every element count, stride, offset and size formed from user input is
// checked; a result that does not fit in int64 is an error naming the op and the shape, never a wrapped value.
namespace {
constexpr std::int64_t k32 = std::int64_t(1) << 32, k61 = std::int64_t(1) << 61, k62 = std::int64_t(1) << 62;
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();
}  // namespace

TEST_CASE("errors: creating a tensor whose element count overflows int64") {
  const char* huge = "[4294967296, 4294967296, 4294967296]";
  // 2^96 elements used to wrap to numel 0: accepted, and at(1, 2, 3) then wrote outside the allocation.
  EXPECT_ERROR([&] { TF r = empty<float>({k32, k32, k32}); }, {"empty", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = empty<float>({k32, k32, k32}); r.at(1, 2, 3) = 1.f; }, {"empty", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = zeros<float>({k32, k32, k32}); }, {"zeros", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = ones<float>({k32, k32, k32}); }, {"ones", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = full<float>({k32, k32, k32}, 2.f); }, {"full", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = rand<float>({k32, k32, k32}); }, {"rand", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = randn<float>({k32, k32, k32}); }, {"randn", huge, "too many elements"});
  EXPECT_ERROR([] { Tensor<std::int64_t> r = randint(0, 5, {k32, k32, k32}); }, {"randint", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = bernoulli<float>({k32, k32, k32}, 0.5); }, {"bernoulli", huge, "too many elements"});
  EXPECT_ERROR([] { TF r = from_vector<float>({}, {k32, k32, k32}); }, {"from_vector", huge, "too many elements"});
  float buf[4] = {};
  EXPECT_ERROR([&] { TF r = from_blob(buf, {k32, k32, k32}); }, {"from_blob", huge, "too many elements"});
  // A zero size does not excuse the others: their product must still fit (the strides are formed from it), in
  // either order; and so must the bytes they would span.
  EXPECT_ERROR([] { TF r = empty<float>({0, k62, k62}); },
               {"empty", "[0, 4611686018427387904, 4611686018427387904]", "too many elements"});
  EXPECT_ERROR([] { TF r = empty<float>({k62, k62, 0}); }, {"empty", "[4611686018427387904, 4611686018427387904, 0]"});
  EXPECT_ERROR([] { TF r = empty<float>({0, k61}); }, {"empty", "[0, 2305843009213693952]", "float32"});
  EXPECT_ERROR([] { TF r = empty<float>({k32, -k32}); }, {"empty", "negative size", "[4294967296, -4294967296]"});
  EXPECT_ERROR([] { TF r = linspace<float>(0, 1, k62); }, {"linspace", "too many elements", "float32"});
  EXPECT_ERROR([] { TF r = eye<float>(k32, k32); }, {"eye", "[4294967296, 4294967296]", "too many elements"});
  EXPECT_ERROR([] { TF r = eye<float>(-2); }, {"eye", "-2"});
  EXPECT_ERROR([] { TF r = eye<float>(2, -3); }, {"eye", "-3"});
}

TEST_CASE("errors: arange sizes beyond int64 and non-finite bounds") {
  // 1e30 elements: the double used to be converted to int64 out of range (undefined; a negative size).
  EXPECT_ERROR([] { TF r = arange<float>(0, 1e30, 1); }, {"arange", "1e+30", "int64"});
  EXPECT_ERROR([] { TF r = arange<float>(-1e308, 1e308, 1); }, {"arange", "int64"});
  EXPECT_ERROR([] { TF r = arange<float>(0, 2e18, 1); }, {"arange", "[2000000000000000000]", "too many elements"});
  EXPECT_ERROR([] { TF r = arange<float>(0, std::numeric_limits<double>::infinity()); }, {"arange", "inf", "finite"});
  EXPECT_ERROR([] { TF r = arange<float>(std::numeric_limits<double>::quiet_NaN(), 1); }, {"arange", "nan"});
  EXPECT_ERROR([] { TF r = arange<float>(0, 1, std::numeric_limits<double>::quiet_NaN()); }, {"arange", "step", "nan"});
}

TEST_CASE("errors: randint ranges that do not fit the dtype") {
  EXPECT_ERROR([] { Tensor<std::int32_t> r = randint<std::int32_t>(0, k32 + 5, {3}); },
               {"randint", "4294967301", "int32"});
  EXPECT_ERROR([] { Tensor<std::uint8_t> r = randint<std::uint8_t>(-1, 10, {3}); }, {"randint", "-1", "uint8"});
}

TEST_CASE("errors: from_blob strides that overflow or point backwards") {
  float buf[4] = {};
  EXPECT_ERROR([&] { TF r = from_blob(buf, {2, 2}, {-1, 1}); }, {"from_blob", "negative stride", "[-1, 1]"});
  EXPECT_ERROR([&] { TF r = from_blob(buf, {2, 2}, {k62, 1}); }, {"from_blob", "[4611686018427387904, 1]", "spans"});
  EXPECT_ERROR([&] { TF r = from_blob(buf, {3, 2}, {kI64Max / 2, 1}); }, {"from_blob", "[3, 2]", "spans"});
  // Empty, but a view of it (unsqueeze, slice) would form size * stride.
  EXPECT_ERROR([&] { TF r = from_blob(buf, {2, 0}, {kI64Max, 1}); }, {"from_blob", "[2, 0]", "spans"});
}

TEST_CASE("errors: narrow bounds that overflow int64") {
  const TF a = arange_f({3, 3});
  // start + length used to wrap: narrow(1, INT64_MAX, 2) returned a [3, 0] tensor.
  EXPECT_ERROR([&] { TF r = a.narrow(1, kI64Max, 2); }, {"narrow", "start 9223372036854775807", "[3, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(1, 2, kI64Max); }, {"narrow", "length 9223372036854775807", "[3, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(1, kI64Min, 1); }, {"narrow", "start -9223372036854775808", "[3, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(0, 4, 0); }, {"narrow", "start 4", "[3, 3]"});
  EXPECT_ERROR([&] { TF r = a.narrow(0, 1, -1); }, {"narrow", "length -1", "[3, 3]"});
}

TEST_CASE("errors: expand, view and reshape to a shape whose element count overflows int64") {
  const TF one = arange_f({1, 1});
  // A view of 2^124 elements: numel wrapped to 0 and sum() returned 0.
  EXPECT_ERROR([&] { TF r = one.expand({k62, k62}); },
               {"expand", "[4611686018427387904, 4611686018427387904]", "too many elements"});
  EXPECT_ERROR([&] { TF r = sum(one.expand({k62, k62})); }, {"expand", "too many elements"});
  EXPECT_ERROR([&] { TF r = one.expand({0, k62, k62}); }, {"expand", "too many elements"});
  EXPECT_ERROR([&] { TF r = arange_f({1}).expand({2, -2}); }, {"expand", "-2", "[2, -2]"});
  EXPECT_ERROR([&] { TF r = arange_f({1}).expand({-2, 3, 1}); }, {"expand", "-2", "[-2, 3, 1]"});
  const TF z = arange_f({0});
  EXPECT_ERROR([&] { TF r = z.reshape({k62, 4, 0}); }, {"reshape", "[4611686018427387904, 4, 0]", "too many elements"});
  EXPECT_ERROR([&] { TF r = z.view({k32, k32, k32}); }, {"view", "[4294967296, 4294967296, 4294967296]", "too many"});
  EXPECT_ERROR([&] { TF r = arange_f({6}).reshape({-1, k62, 4}); }, {"reshape", "[-1, 4611686018427387904, 4]", "too many"});
  EXPECT_ERROR([&] { TF r = z.reshape({-1, k62, k62, 0}); }, {"reshape", "too many elements"});
}

TEST_CASE("errors: broadcasting two valid shapes into one whose element count overflows int64") {
  const TF col = arange_f({1, 1}).expand({k32, 1}), row = arange_f({1, 1}).expand({1, k32});
  EXPECT_ERROR([&] { TF r = col + row; }, {"Add", "[4294967296, 1]", "[1, 4294967296]", "too many elements"});
  EXPECT_ERROR([&] { TF r = sum(col * row); }, {"Mul", "[4294967296, 4294967296]", "too many elements"});
  const TF zc = arange_f({1, 0, 1}).expand({k62, 0, 1}), zr = arange_f({1, 0, 1}).expand({1, 0, k62});
  EXPECT_ERROR([&] { TF r = zc - zr; }, {"Sub", "[4611686018427387904, 0, 4611686018427387904]"});
}

TEST_CASE("errors: cat whose size along dim overflows int64, and of 0-d tensors") {
  const TF big = arange_f({1}).expand({k62});
  EXPECT_ERROR([&] { TF r = cat<float>({big, big}, 0); }, {"cat", "int64", "[4611686018427387904]"});
  EXPECT_ERROR([&] { TF r = cat<float>({scalar_tensor(1.f), scalar_tensor(2.f)}); }, {"cat", "zero-dimensional"});
  // The kernel entry point (no autograd) checks the same on its own.
  EXPECT_ERROR([&] { TF r = ops::cat(std::vector<TF>{big, big}, 0); }, {"cat", "overflows int64"});
  EXPECT_ERROR([&] { TF r = ops::cat(std::vector<TF>{scalar_tensor(1.f)}, 0); }, {"cat", "zero-dimensional"});
}

TEST_CASE("errors: devices") {
  // No CUDA backend in this build: allocating on a GPU says so instead of crashing.
  EXPECT_ERROR([] { TF r = empty<float>({2}, Device::cuda()); }, {"cuda:0", "built without"});
  EXPECT_ERROR([] { TF r = zeros<float>({2}, Device::cuda(1)); }, {"cuda:1", "built without"});
  EXPECT_ERROR([] { TF r = full<float>({2}, 1.f, Device::cuda()); }, {"cuda:0", "built without"});

  // Memory labelled as a CUDA tensor (from_blob does not allocate) reaches the device checks of the ops.
  std::vector<float> mem(6, 1.f);
  const TF g = from_blob(mem.data(), {2, 3}, std::function<void(void*)>{}, Device::cuda());
  const TF c = arange_f({2, 3});
  CHECK(g.device() == Device::cuda());
  EXPECT_ERROR([&] { TF r = c + g; }, {"different devices", "cpu", "cuda:0"});
  EXPECT_ERROR([&] { TF r = sum(c * g); }, {"different devices", "cpu", "cuda:0"});
  EXPECT_ERROR([&] { TF r = mm(c, g.t()); }, {"mm", "different devices", "cpu", "cuda:0"});
  EXPECT_ERROR([&] { TF r = cat(std::vector<TF>{c, g}); }, {"cat", "cpu", "cuda:0"});
  EXPECT_ERROR([&] { (void)g.item(); }, {"item", "[2, 3]"});
  EXPECT_ERROR([&] { (void)g.at(0, 0); }, {"at", "cuda:0"});
  EXPECT_ERROR([&] { (void)g.to_vector(); }, {"to_vector", "cuda:0"});

#if !EMBER_WITH_CUDA
  // Copies between devices and pinned memory need the CUDA backend; host-only moves are no-ops.
  EXPECT_ERROR([&] { (void)c.to(Device::cuda()); }, {"to", "[2, 3]", "float32", "cpu", "cuda:0", "built without"});
  EXPECT_ERROR([&] { (void)c.cuda(1); }, {"to", "cuda:1", "built without"});
  EXPECT_ERROR([&] { (void)g.cpu(); }, {"to", "cuda:0", "cpu", "built without"});
  EXPECT_ERROR([&] { (void)c.pin_memory(); }, {"pin_memory", "built without"});
  EXPECT_ERROR([&] { TF r = empty<float>({2, 3}); r.copy_(g); }, {"copy from cuda:0 to cpu", "built without"});
  EXPECT_ERROR([&] { (void)g[1][2].item(); }, {"item", "cuda:0", "built without"});
  EXPECT_ERROR([&] { (void)to_string(g); }, {"printing", "cuda:0", "built without"});
  CHECK_FALSE(c.is_pinned());
  CHECK(c.to(Device::cpu()).same_impl(c));
  CHECK(c.cpu().same_impl(c));
  nn::Linear lin(2, 3);
  EXPECT_ERROR([&] { lin.to(Device::cuda()); }, {"Module::to", "weight", "float32 [3, 2]", "cuda:0", "built without"});
  lin.to(Device::cpu());  // already there: nothing to do
  CHECK(lin.weight.device().is_cpu());
#endif
}

TEST_CASE("errors: CUDA tensors in a translation unit that nvcc did not compile") {
  // Tensors that claim to live on cuda:0; their memory is never touched (every use below must throw first).
  static float buf[64] = {};
  const Device cu = Device::cuda(0);
  TF x = from_blob(buf, {4, 4}, {}, cu), y = from_blob(buf + 16, {4, 4}, {}, cu), s = from_blob(buf + 32, {1}, {}, cu);
  EXPECT_ERROR([&] { y = x * 2.f; }, {"assign", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { y += x; }, {"assign", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { y.fill_(1.f); }, {"fill_", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { ops::reduce<expr::SumR<double>>(s, expr::TensorLeaf<float, false>{&x}, "sum"); },
               {"sum", "cuda:0", "nvcc"});
  // Element access and printing need CPU tensors.
  EXPECT_ERROR([&] { (void)s.item(); }, {"item", "cuda:0"});
  EXPECT_ERROR([&] { (void)x.at(0, 0); }, {"at", "cuda:0"});
  EXPECT_ERROR([&] { (void)x.to_vector(); }, {"to_vector", "cuda:0"});
  // Mixing devices is an error naming both.
  TF c = arange_f({4, 4});
  EXPECT_ERROR([&] { c += x; }, {"different devices", "cpu", "cuda:0"});
  // Optimizers and gradient clipping do not read device memory on the host.
  TF p = from_blob(buf + 48, {4, 4}, {}, cu);
  p.requires_grad_();
  p.grad() = y;
  optim::SGD<float> sgd({p}, optim::SGDOptions{.lr = 0.1});
  EXPECT_ERROR([&] { sgd.step(); }, {"optim::SGD", "cuda:0", "nvcc"});
  optim::Adam<float> adam({p}, optim::AdamOptions{.lr = 0.1});
  EXPECT_ERROR([&] { adam.step(); }, {"optim::Adam", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { optim::clip_grad_norm_<float>({p}, 1.0); }, {"clip_grad_norm_", "cuda:0"});
  TF q = arange_f({4, 4});
  q.requires_grad_();
  q.grad() = y;
  optim::SGD<float> mixed({q}, optim::SGDOptions{.lr = 0.1});
  EXPECT_ERROR([&] { mixed.step(); }, {"optim::SGD", "cpu", "cuda:0"});
  // The loss scaler's unscale kernel and the class-index loss kernels for CUDA tensors are nvcc-only too.
  amp::GradScaler scaler;
  EXPECT_ERROR([&] { scaler.unscale_(sgd); }, {"amp::GradScaler::unscale_", "cuda:0", "nvcc"});
  static std::int64_t labels[4] = {};
  const Tensor<std::int64_t> tc = from_blob(labels, {4}, {}, cu), th = zeros<std::int64_t>({4});
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, tc); }, {"cross_entropy", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { (void)nn::nll_loss<float, false>(x, tc); }, {"nll_loss", "cuda:0", "nvcc"});
  // layer_norm's kernels for CUDA tensors are nvcc-only too.
  EXPECT_ERROR([&] { (void)layer_norm(x, Shape{4}); }, {"layer_norm", "cuda:0", "nvcc", "layer norm kernels"});
  EXPECT_ERROR([&] { (void)ops::layer_norm_backward(y, x, Shape{4}, TF(), {}, {}, true, false, false); },
               {"layer_norm_backward", "cuda:0", "nvcc"});
  // So are the index kernels; an index on another device than the data is named.
  const Tensor<std::int64_t> t2 = from_blob(labels, {2, 2}, {}, cu), h2 = zeros<std::int64_t>({2, 2});
  EXPECT_ERROR([&] { (void)index_select(x, 0, tc); }, {"index_select", "cuda:0", "nvcc", "index kernels"});
  EXPECT_ERROR([&] { (void)gather(x, 1, t2); }, {"gather", "cuda:0", "nvcc", "index kernels"});
  EXPECT_ERROR([&] { (void)scatter_add(x, 1, t2, x); }, {"scatter_add", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { (void)index_add(x, 0, tc, x); }, {"index_add", "cuda:0", "nvcc"});
  EXPECT_ERROR([&] { (void)index_select(c, 0, tc); }, {"index_select", "the index is on cuda:0", "is on cpu"});
  EXPECT_ERROR([&] { (void)gather(x, 1, h2); }, {"gather", "the index is on cpu", "is on cuda:0"});
  // Targets on another device than the input: named, before any kernel runs.
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, th); }, {"cross_entropy", "target", "cpu", "cuda:0"});
  EXPECT_ERROR([&] { (void)nn::nll_loss<float, false>(c, tc); }, {"nll_loss", "target", "cpu", "cuda:0"});
}
