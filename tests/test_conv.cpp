// Convolution and pooling: forward and backward against PyTorch (fixtures from tests/fixtures/gen_conv.py),
// gradcheck in double for every option that changes the index arithmetic (stride, padding, dilation, groups,
// ceil_mode, count_include_pad, non-divisible adaptive bins, non-contiguous inputs), the max-pool conventions
// finite differences cannot see (ties, NaN), the threading paths, 16-bit dtypes, and one test per user error.
//
// Not tested here because it does not compile, by design (dtype is a template parameter): conv2d of a
// Tensor<float> input with a Tensor<double> weight is a static_assert, "conv2d: input and weight have different
// dtypes; convert one with cast<T>(x)".
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using ember_test::ThreadsGuard;

namespace {

using ember_test::error_of;

using TD = Tensor<double>;
using TF = Tensor<float>;
using Inputs = std::vector<TD>;
using Fn = std::function<TD(const Inputs&)>;
using i64 = std::int64_t;

TD normal(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn<double>(s, g);
}
TF normal_f(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  return randn<float>(s, g);
}

/// Distinct values (a shuffled arange with mixed signs): max pooling has no ties, so finite differences see
/// the same argmax on both sides of the step.
TD distinct(const Shape& s, std::uint64_t seed) {
  Generator g(seed);
  TD u = rand<double>(s, g);
  const i64 n = u.numel();
  std::vector<i64> order(static_cast<std::size_t>(n));
  for (i64 i = 0; i < n; ++i) order[std::size_t(i)] = i;
  for (i64 i = n - 1; i > 0; --i) {
    const auto j = std::min(i64(u.data()[i] * double(i + 1)), i);
    std::swap(order[std::size_t(i)], order[std::size_t(j)]);
  }
  TD t = empty<double>(s);
  for (i64 i = 0; i < n; ++i) t.data()[i] = (i % 3 == 1 ? -1.0 : 1.0) * (0.1 + 0.01 * double(order[std::size_t(i)]));
  return t;
}

void check_grad(const std::string& what, const Fn& f, const Inputs& in) {
  INFO(what);
  GradcheckResult r = gradcheck(f, in, 1e-6, 1e-6, 1e-5);
  CHECK_MESSAGE(r.ok, r.message);
}

/// max |a - b| over all elements (shapes must match).
template <class A, class B>
double max_diff(const Tensor<A>& a, const Tensor<B>& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (i64 i = 0; i < a.numel(); ++i) {
    const double d = std::fabs(double(ember_test::rd(a, i)) - double(ember_test::rd(b, i)));
    m = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(m, d);
  }
  return m;
}

// ---- fixtures -------------------------------------------------------------------------------------------------

struct FixtureCase {
  std::string name;
  std::map<std::string, i64> opt;
  std::string op;
  std::map<std::string, TD> t;
};

std::vector<FixtureCase> load_fixtures() {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "fixtures" / "conv.txt";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot open ", path.string());
  std::vector<FixtureCase> cases;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "case") {
      cases.emplace_back();
      ls >> cases.back().name;
      std::string kv;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        if (kv.substr(0, eq) == "op") cases.back().op = kv.substr(eq + 1);
        else cases.back().opt[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
      }
    } else if (kind == "tensor") {
      std::string name, dims;
      ls >> name >> dims;
      Shape s;
      std::istringstream ds(dims);
      for (std::string d; std::getline(ds, d, ',');) s.push_back(std::stoll(d));
      std::vector<double> v;
      for (double x; ls >> x;) v.push_back(x);
      REQUIRE(i64(v.size()) == s.numel());
      cases.back().t[name] = from_vector<double>(v, s);
    }
  }
  return cases;
}

void expect_close(const char* what, const TD& got, const TD& want, double tol = 1e-10) {
  INFO(what);
  REQUIRE(got.defined());
  CHECK(got.shape() == want.shape());
  if (got.shape() == want.shape()) CHECK(max_diff(got, want) <= tol);
}

// ---- errors ---------------------------------------------------------------------------------------------------


}  // namespace

TEST_CASE("conv and pooling match PyTorch forward and backward (fixtures)") {
  const auto cases = load_fixtures();
  REQUIRE(cases.size() >= 18);
  for (const auto& c : cases) {
    INFO("case " << c.name);
    const auto& t = c.t;
    auto o = [&](const char* k) { return c.opt.at(k); };
    TD x = t.at("x").detach().clone();
    x.requires_grad_(true);
    if (c.op == "conv2d") {
      TD w = t.at("w").detach().clone(), b;
      w.requires_grad_(true);
      if (t.count("b")) {
        b = t.at("b").detach().clone();
        b.requires_grad_(true);
      }
      const Conv2dOptions opt{{o("sh"), o("sw")}, {o("ph"), o("pw")}, {o("dh"), o("dw")}, o("groups")};
      TD y = conv2d(x, w, b, opt);
      expect_close("y", y, t.at("y"));
      y.backward(t.at("gy"));
      expect_close("gx", x.grad(), t.at("gx"));
      expect_close("gw", w.grad(), t.at("gw"));
      if (b.defined()) expect_close("gb", b.grad(), t.at("gb"));
      // The float path agrees too.
      const TF yf = conv2d(TF(cast<float>(t.at("x"))), TF(cast<float>(t.at("w"))),
                           b.defined() ? TF(cast<float>(t.at("b"))) : TF(), opt);
      CHECK(max_diff(yf, t.at("y")) <= 1e-4);
    } else {
      TD y;
      if (c.op == "adaptive_avg_pool2d") {
        y = adaptive_avg_pool2d(x, {o("oh"), o("ow")});
      } else {
        Pool2dOptions opt;
        opt.stride = {o("sh"), o("sw")};
        opt.padding = {o("ph"), o("pw")};
        opt.dilation = {o("dh"), o("dw")};
        opt.ceil_mode = o("ceil") != 0;
        opt.count_include_pad = o("cip") != 0;
        y = c.op == "max_pool2d" ? max_pool2d(x, {o("kh"), o("kw")}, opt) : avg_pool2d(x, {o("kh"), o("kw")}, opt);
      }
      expect_close("y", y, t.at("y"));
      y.backward(t.at("gy"));
      expect_close("gx", x.grad(), t.at("gx"));
    }
  }
}

TEST_CASE("conv2d gradcheck: stride, padding, dilation, groups, bias, non-contiguous input") {
  struct C {
    const char* what;
    Shape x, w;
    bool bias;
    Conv2dOptions o;
  };
  const C cases[] = {
      {"3x3 pad 1 + bias", {2, 2, 5, 4}, {3, 2, 3, 3}, true, {1, 1, 1, 1}},
      {"stride (2,1), pad (0,1)", {2, 2, 6, 5}, {2, 2, 3, 2}, false, {{2, 1}, {0, 1}, 1, 1}},
      {"dilation (1,2), pad 2", {1, 2, 5, 6}, {2, 2, 2, 3}, true, {1, 2, {1, 2}, 1}},
      {"groups 2", {2, 4, 4, 4}, {4, 2, 3, 3}, true, {1, 1, 1, 2}},
      {"depthwise, stride 2", {1, 3, 5, 5}, {6, 1, 3, 3}, false, {2, 1, 1, 3}},
      {"pointwise 1x1", {3, 3, 3, 2}, {2, 3, 1, 1}, true, {}},
      {"1x1 stride 2 (not pointwise)", {2, 2, 5, 5}, {2, 2, 1, 1}, false, {2, 0, 1, 1}},
      {"kernel = padded input", {1, 1, 3, 3}, {2, 1, 5, 5}, true, {1, 1, 1, 1}},
  };
  std::uint64_t seed = 100;
  for (const auto& c : cases) {
    const Conv2dOptions o = c.o;
    Inputs in{normal(c.x, ++seed), normal(c.w, ++seed)};
    if (c.bias) in.push_back(normal({c.w[0]}, ++seed));
    check_grad(c.what, [o](const Inputs& v) { return conv2d(v[0], v[1], v.size() > 2 ? v[2] : TD(), o); }, in);
  }
  // Non-contiguous input and weight (transposed views of the leaves).
  check_grad("transposed input and weight",
             [](const Inputs& v) { return conv2d(v[0].transpose(2, 3), v[1].transpose(2, 3), v[2], {1, 1, 1, 1}); },
             {normal({2, 2, 4, 5}, 7), normal({3, 2, 2, 3}, 8), normal({3}, 9)});
  // A strided slice of the batch and channels.
  check_grad("sliced input",
             [](const Inputs& v) { return conv2d(v[0].slice(0, 0, 4, 2).slice(1, 1, 3), v[1], TD(), {2, 1}); },
             {normal({4, 3, 5, 5}, 10), normal({2, 2, 3, 3}, 11)});
  // Unbatched (C, H, W) input.
  check_grad("unbatched", [](const Inputs& v) { return conv2d(v[0], v[1], v[2], {1, 1}); },
             {normal({2, 4, 4}, 12), normal({3, 2, 3, 3}, 13), normal({3}, 14)});
}

TEST_CASE("conv2d: only the gradients that are needed, and unbatched shapes") {
  TD x = normal({2, 3, 5, 5}, 1), w = normal({4, 3, 3, 3}, 2), b = normal({4}, 3);
  w.requires_grad_(true);
  TD y = conv2d(x, w, b, {1, 1});
  CHECK(y.shape() == Shape({2, 4, 5, 5}));
  sum(y).backward();
  CHECK(w.grad().defined());
  CHECK(!x.grad().defined());
  const TD yu = conv2d(x[1], w.detach(), b, {1, 1});
  CHECK(yu.shape() == Shape({4, 5, 5}));
  CHECK(max_diff(yu, y.detach()[1]) == 0);
  // Only the input's gradient (a frozen layer), over enough images for several runs of the batch: the same values
  // as when the weight's gradient is computed beside it.
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  TD xi = normal({9, 3, 5, 5}, 5), wf = w.detach(), wg = w.detach().clone();
  xi.requires_grad_(true);
  sum(conv2d(xi, wf, b, {1, 1})).backward();
  TD xj = xi.detach().clone();
  xj.requires_grad_(true);
  wg.requires_grad_(true);
  sum(conv2d(xj, wg, b, {1, 1})).backward();
  CHECK(max_diff(xi.grad(), xj.grad()) == 0);
  NoGradGuard ng;
  TD x2 = normal({1, 3, 5, 5}, 4);
  x2.requires_grad_(true);
  CHECK(!conv2d(x2, w, b).requires_grad());
}

TEST_CASE("conv2d: batch-parallel and GEMM-parallel paths agree with one thread") {
  ThreadsGuard guard;
  // 5 images (batch-parallel path with 2 threads) and 1 image (parallel GEMM path); big enough for the GEMM to
  // split.
  for (i64 n : {5, 1}) {
    INFO("batch " << n);
    TF x = normal_f({n, 16, 20, 20}, 21), w = normal_f({32, 16, 3, 3}, 22), b = normal_f({32}, 23);
    TF gy = normal_f({n, 32, 20, 20}, 24);
    Tensor<float> out[2][4];
    for (int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      TF xl = x.detach().clone(), wl = w.detach().clone(), bl = b.detach().clone();
      xl.requires_grad_(true);
      wl.requires_grad_(true);
      bl.requires_grad_(true);
      TF y = conv2d(xl, wl, bl, {1, 1});
      y.backward(gy);
      out[threads - 1][0] = y;
      out[threads - 1][1] = xl.grad();
      out[threads - 1][2] = wl.grad();
      out[threads - 1][3] = bl.grad();
    }
    for (int k = 0; k < 4; ++k) {
      INFO("output " << k);
      CHECK(max_diff(out[0][k], out[1][k]) <= 1e-3);
    }
  }
  // The float result matches the double one.
  TD xd = normal({3, 4, 9, 9}, 31), wd = normal({5, 4, 3, 3}, 32);
  const TF yf = conv2d(TF(cast<float>(xd)), TF(cast<float>(wd)), TF(), {2, 1});
  CHECK(max_diff(yf, conv2d(xd, wd, TD(), {2, 1})) <= 1e-4);
}

// The direct float forward (cpu/conv_direct.hpp, AVX-512 and AVX2 builds; ember_tests_conv_avx2 is this file built
// for x86-64-v3) against im2col + GEMM and the double result, over the index arithmetic (stride, padding, dilation,
// groups, output channels that fill 1 to 5 blocks of 16, 2 to 9 of 8: each register tile of either width), the fused activations and 2x2 pool (odd sizes), NaN and -0; one input channel stays on im2col.
// Switches the Winograd path off for a scope (tests of the kernels it would take over).
struct NoWinograd {
  bool saved = cpu::conv_winograd_enabled().exchange(false);
  ~NoWinograd() { cpu::conv_winograd_enabled() = saved; }
};

TEST_CASE("cpu epilogues: GELU's and SiLU's loops come from a table; one never enabled is an error, not a crash") {
  // What a program sees before anything enabled them (nothing fused, no ops::linear/conv2d with an activation).
  auto& table = cpu::detail::heavy_acts<float>;
  for (int k = 0; k < 3; ++k) {
    table.bias[k].store(nullptr);
    table.nobias[k].store(nullptr);
  }
  const TF x = normal_f({5, 37}, 81), b = normal_f({37}, 82);
  TF y = x.clone();
  CHECK_THROWS_WITH_AS(cpu::act_(y.data(), y.numel(), Activation::gelu),
                       doctest::Contains("the gelu epilogue for float32 was never enabled"), Error);
  CHECK_THROWS_WITH_AS(cpu::bias_act_rows_(y.data(), 5, 37, 37, b.data(), Activation::silu),
                       doctest::Contains("the silu epilogue for float32 was never enabled"), Error);
  CHECK_THROWS_WITH_AS(cpu::act_(y.data(), y.numel(), Activation(9)), doctest::Contains("unknown activation 9"), Error);
  cpu::act_(y.data(), y.numel(), Activation::relu);  // ReLU needs no table
  CHECK(ember_test::bitwise_equal(y, TF(relu(x))));
  // ops::linear with an activation enables them itself, and the epilogue equals the element-wise op bit for bit.
  const TF w = normal_f({37, 37}, 83);
  const TF plain = ops::linear(x, w, b);
  CHECK(ember_test::bitwise_equal(ops::linear(x, w, b, Activation::gelu), TF(gelu(plain))));
  CHECK(ember_test::bitwise_equal(ops::linear(x, w, b, Activation::gelu_tanh), TF(gelu_tanh(plain))));
  CHECK(ember_test::bitwise_equal(ops::linear(x, w, b, Activation::silu), TF(silu(plain))));
  y = x.clone();
  cpu::act_(y.data(), y.numel(), Activation::silu);
  CHECK(ember_test::bitwise_equal(y, TF(silu(x))));
}

TEST_CASE("conv2d float: the direct forward agrees with im2col + GEMM and with double") {
  ThreadsGuard guard;
  NoWinograd no_winograd;
  cpu::enable_act_epilogues<float>();  // cpu::conv2d_forward reads GELU's loop from the table
  struct Case {
    i64 n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  };
  const Case cases[] = {{3, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1},  {2, 32, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                        {1, 12, 9, 11, 20, 3, 2, 2, 1, 1, 2, 1, 2, 2}, {2, 8, 7, 7, 70, 3, 3, 1, 1, 0, 0, 1, 1, 1},
                        {1, 6, 12, 10, 40, 5, 5, 1, 1, 2, 2, 1, 1, 1},  {2, 4, 9, 9, 18, 3, 3, 1, 1, 1, 1, 2, 2, 1}};
  for (const Case& k : cases) {
    cpu::ConvGeometry g;
    g.n = k.n, g.c = k.c, g.h = k.h, g.w = k.w, g.o = k.o, g.kh = k.kh, g.kw = k.kw, g.sh = k.sh, g.sw = k.sw;
    g.ph = k.ph, g.pw = k.pw, g.dh = k.dh, g.dw = k.dw, g.groups = k.groups;
    g.oh = (g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
    g.ow = (g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
    INFO("input " << Shape{g.n, g.c, g.h, g.w}.str() << " weight " << Shape{g.o, g.cg(), g.kh, g.kw}.str()
                  << " groups " << g.groups << " output " << g.oh << "x" << g.ow);
    // (a depth under 32, the first case, keeps im2col + GEMM)
    REQUIRE(cpu::conv_direct_applies<float>(g) == (bool(EMBER_CONV_DIRECT) && g.cg() * g.kh * g.kw >= 32));
    TF x = normal_f({g.n, g.c, g.h, g.w}, 41), w = normal_f({g.o, g.cg(), g.kh, g.kw}, 42), b = normal_f({g.o}, 43);
    x.data()[5] = -0.0f;
    // |direct - reference| <= 2 (depth + 2) eps mag, mag the convolution of |x| and |w| plus |b|
    const TD xd = TD(cast<double>(x)), wd = TD(cast<double>(w)), bd = TD(cast<double>(b));
    const TD want = conv2d(xd, wd, bd, {.stride = {g.sh, g.sw}, .padding = {g.ph, g.pw}, .dilation = {g.dh, g.dw},
                                        .groups = g.groups});
    const TD mag = conv2d(TD(abs(xd)), TD(abs(wd)), TD(abs(bd)),
                          {.stride = {g.sh, g.sw}, .padding = {g.ph, g.pw}, .dilation = {g.dh, g.dw}, .groups = g.groups});
    const double eps = double(std::numeric_limits<float>::epsilon()), depth = double(g.cg() * g.kh * g.kw);
    for (const Activation act : {Activation::none, Activation::relu, Activation::gelu})
      for (const bool pool : {false, true})
        for (const int threads : {1, 2}) {
          INFO("act " << std::string(activation_name(act)) << " pool " << pool << " threads " << threads);
          cpu::set_num_threads(threads);
          const Shape ys = pool ? Shape{g.n, g.o, g.oh / 2, g.ow / 2} : Shape{g.n, g.o, g.oh, g.ow};
          TF direct = empty<float>(ys), im2col = empty<float>(ys);
          cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), direct.data(), act, pool);
          cpu::conv_direct_enabled() = false;
          cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), im2col.data(), act, pool);
          cpu::conv_direct_enabled() = true;
          // the reference: act, then pool, of the double result; the bound is the largest in each window
          TD ref = act == Activation::relu ? TD(relu(want)) : act == Activation::gelu ? TD(gelu(want)) : want;
          TD bound = mag;
          if (pool) {
            ref = max_pool2d(ref, 2);
            bound = max_pool2d(bound, 2);
          }
          int wrong_ref = 0, wrong_paths = 0;
          for (i64 i = 0; i < direct.numel(); ++i) {
            const double tol = 2 * (depth + 2) * eps * bound.data()[i];
            wrong_ref += !(std::abs(double(direct.data()[i]) - ref.data()[i]) <= tol);
            wrong_paths += !(std::abs(double(direct.data()[i]) - double(im2col.data()[i])) <= 2 * tol);
          }
          CHECK(wrong_ref == 0);
          CHECK(wrong_paths == 0);
        }
    // A NaN in the input reaches the same outputs on both paths (ReLU and the pool keep it).
    TF xn = x.clone();
    xn.data()[xn.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
    const Shape ys{g.n, g.o, g.oh / 2, g.ow / 2};
    TF direct = empty<float>(ys), im2col = empty<float>(ys);
    cpu::conv2d_forward<float>(g, xn.data(), w.data(), b.data(), direct.data(), Activation::relu, true);
    cpu::conv_direct_enabled() = false;
    cpu::conv2d_forward<float>(g, xn.data(), w.data(), b.data(), im2col.data(), Activation::relu, true);
    cpu::conv_direct_enabled() = true;
    int nan_direct = 0, nan_mismatch = 0;
    for (i64 i = 0; i < direct.numel(); ++i) {
      nan_direct += std::isnan(direct.data()[i]);
      nan_mismatch += std::isnan(direct.data()[i]) != std::isnan(im2col.data()[i]);
    }
    CHECK(nan_direct > 0);
    CHECK(nan_mismatch == 0);
  }
}

// The Winograd F(4x4, 3x3) path (AVX-512 and AVX2 builds): the forward and both gradients against double, over
// channel counts that are and are not multiples of 16 and of 8, paddings 0-2 (the gradient's convolution is padded by
// 2 - padding), sizes that do and do not divide into 4x4 tiles, bands of several tile rows, and small images
// grouped several to a task (differently at one and two threads; the last group short). The bound is the
// direct kernel's, 2 (depth + 2) eps mag, mag the same convolution of absolute values; the transforms' rounding
// (their entries reach 5, 1/4 and 8) stays well inside it (the largest error / ((depth + 2) eps mag) over the cases
// is printed: 0.35). The weight gradient, depth N · oh · ow, gets twice that bound: where the depth is small
// (9 positions) the transforms' rounding is most of its error, measured at up to 1.8 (depth + 2) eps mag. A wrong
// transform entry gives errors of the order of mag itself, 10^4 times either bound.
// Thread counts give identical bits (each tile's sums do not depend on how tiles are grouped).
TEST_CASE("conv2d float: the Winograd forward and both gradients agree with double") {
  ThreadsGuard guard;
  cpu::enable_act_epilogues<float>();  // cpu::conv2d_forward reads GELU's loop from the table
  // The kernels are compiled wherever the tier has them, at the tier's width (no silent fallback to im2col + GEMM, nor
  // to another width): 16 lanes in AVX-512 builds, 8 in AVX2 builds.
  if (cpu::compiled_isa() != cpu::Isa::portable) {
    REQUIRE(EMBER_CONV_DIRECT);
    CHECK(cpu::detail::direct::W == (cpu::compiled_isa() == cpu::Isa::avx2 ? 8 : 16));
  }
  if (!EMBER_CONV_DIRECT) return;
  constexpr double wino_bound = 2, gw_bound = 4;
  struct Case {
    i64 n, c, h, w, o, ph, pw;
  };
  const Case cases[] = {{2, 16, 8, 8, 16, 1, 1},   {1, 17, 9, 11, 33, 1, 1}, {2, 32, 14, 14, 64, 1, 1},
                        {1, 20, 7, 5, 18, 0, 0},   {1, 16, 6, 6, 24, 2, 2},  {1, 16, 10, 13, 16, 0, 2},
                        {1, 64, 30, 30, 64, 1, 1}, {3, 24, 3, 3, 40, 1, 0},  {21, 16, 6, 7, 20, 1, 1}};
  double worst = 0, worst_gw = 0;
  for (const Case& k : cases) {
    cpu::ConvGeometry g;
    g.n = k.n, g.c = k.c, g.h = k.h, g.w = k.w, g.o = k.o, g.kh = 3, g.kw = 3, g.ph = k.ph, g.pw = k.pw;
    g.oh = g.h + 2 * g.ph - 2;
    g.ow = g.w + 2 * g.pw - 2;
    INFO("input " << Shape{g.n, g.c, g.h, g.w}.str() << " output channels " << g.o << " padding " << g.ph << ","
                  << g.pw);
    REQUIRE(cpu::conv_winograd_applies<float>(g));
    TF x = normal_f({g.n, g.c, g.h, g.w}, 61), w = normal_f({g.o, g.c, 3, 3}, 62), b = normal_f({g.o}, 63);
    const TF gy = normal_f({g.n, g.o, g.oh, g.ow}, 64);
    const Conv2dOptions co{.padding = {g.ph, g.pw}};
    // double references: y, its magnitude, and the input and weight gradients and their magnitudes (autograd)
    TD xd = TD(cast<double>(x)), xa = TD(abs(xd)), wd = TD(cast<double>(w)), wa = TD(abs(wd));
    const TD bd = TD(cast<double>(b)), gyd = TD(cast<double>(gy));
    for (TD* t : {&xd, &xa, &wd, &wa}) t->requires_grad_(true);
    const TD want = conv2d(xd, wd, bd, co), mag = conv2d(xa, wa, TD(abs(bd)), co);
    TD(want).backward(gyd);
    TD(mag).backward(TD(abs(gyd)));
    const TD gx_want = xd.grad(), gx_mag = xa.grad(), gw_want = wd.grad(), gw_mag = wa.grad();
    const double eps = double(std::numeric_limits<float>::epsilon());
    auto count_wrong = [&](const TF& got, const TD& ref, const TD& bound, double depth, double factor,
                           double* largest = nullptr) {
      int wrong = 0;
      for (i64 i = 0; i < got.numel(); ++i) {
        const double err = std::abs(double(got.data()[i]) - ref.data()[i]), unit = (depth + 2) * eps * bound.data()[i];
        double& top = largest ? *largest : worst;
        top = std::max(top, err / unit);
        wrong += !(err <= factor * unit);
      }
      return wrong;
    };
    TF first_y, first_gx;
    for (const int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      for (const Activation act : {Activation::none, Activation::relu, Activation::gelu}) {
        INFO("act " << std::string(activation_name(act)) << " threads " << threads);
        TF y = empty<float>({g.n, g.o, g.oh, g.ow});
        cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), y.data(), act);
        const TD ref = act == Activation::relu ? TD(relu(want)) : act == Activation::gelu ? TD(gelu(want)) : want;
        CHECK(count_wrong(y, ref, mag, double(g.c * 9), wino_bound) == 0);
        if (act == Activation::none) {
          if (threads == 1) first_y = y;
          else CHECK(ember_test::bitwise_equal(y, first_y));
        }
        if (g.oh >= 2 && g.ow >= 2) {  // the fused 2x2 max pool equals max_pool2d of the output
          TF yp = empty<float>({g.n, g.o, g.oh / 2, g.ow / 2});
          cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), yp.data(), act, true);
          CHECK(ember_test::bitwise_equal(yp, max_pool2d(y, 2)));
        }
      }
      // A per-image callback (the fused conv + batch norm's statistics) sees each image's final output once, from
      // the task that computed it or after the convolution when images span several tasks.
      {
        TF y = empty<float>({g.n, g.o, g.oh, g.ow});
        std::vector<int> calls(std::size_t(g.n), 0);
        std::vector<std::vector<float>> seen(std::size_t(g.n));
        std::vector<const float*> where(std::size_t(g.n));
        cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), y.data(), Activation::none, false,
                                   [&](i64 i, const float* yi) {  // (no doctest assertions on the workers)
                                     ++calls[std::size_t(i)];
                                     where[std::size_t(i)] = yi;
                                     seen[std::size_t(i)].assign(yi, yi + g.o * g.oh * g.ow);
                                   });
        CHECK(ember_test::bitwise_equal(y, first_y));
        for (i64 i = 0; i < g.n; ++i) {
          CHECK(calls[std::size_t(i)] == 1);
          CHECK(where[std::size_t(i)] == y.data() + i * g.o * g.oh * g.ow);
          CHECK(std::equal(seen[std::size_t(i)].begin(), seen[std::size_t(i)].end(), y.data() + i * g.o * g.oh * g.ow));
        }
      }
      TF gx = empty<float>({g.n, g.c, g.h, g.w});
      cpu::conv2d_backward<float>(g, x.data(), w.data(), gy.data(), gx.data(), nullptr, nullptr);
      INFO("input gradient, threads " << threads);
      CHECK(count_wrong(gx, gx_want, gx_mag, double(g.o * 9), wino_bound) == 0);
      if (threads == 1) first_gx = gx;
      else CHECK(ember_test::bitwise_equal(gx, first_gx));
      // The weight gradient sums over N · oh · ow positions; its error is measured separately (below).
      TF gw = empty<float>({g.o, g.c, 3, 3});
      cpu::conv2d_backward<float>(g, x.data(), w.data(), gy.data(), nullptr, gw.data(), nullptr);
      CHECK(count_wrong(gw, gw_want, gw_mag, double(g.n * g.oh * g.ow), gw_bound, &worst_gw) == 0);
    }
    // Through the op and autograd too (the bias gradient is a plain sum).
    TF xf = x.clone(), wf = w.clone(), bf = b.clone();
    for (TF* t : {&xf, &wf, &bf}) t->requires_grad_(true);
    conv2d(xf, wf, bf, co).backward(gy);
    CHECK(count_wrong(xf.grad(), gx_want, gx_mag, double(g.o * 9), wino_bound) == 0);
    CHECK(count_wrong(wf.grad(), gw_want, gw_mag, double(g.n * g.oh * g.ow), gw_bound, &worst_gw) == 0);
    // A NaN in the input reaches outputs (the transforms do not hide it).
    TF xn = x.clone();
    xn.data()[xn.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
    TF yn = empty<float>({g.n, g.o, g.oh, g.ow});
    cpu::conv2d_forward<float>(g, xn.data(), w.data(), b.data(), yn.data());
    int nan_out = 0;
    for (i64 i = 0; i < yn.numel(); ++i) nan_out += std::isnan(yn.data()[i]);
    CHECK(nan_out > 0);
  }
  MESSAGE("Winograd: largest error / ((depth + 2) eps mag) over the cases: " << worst << " (forward, input gradient), "
                                                                                << worst_gw << " (weight gradient)");
  // Not taken: a 3x3 stride-2, dilated, grouped or 5x5 convolution, fewer than 16 channels in or out.
  cpu::ConvGeometry g;
  g.n = 1, g.c = 16, g.h = 8, g.w = 8, g.o = 16, g.kh = 3, g.kw = 3, g.ph = 1, g.pw = 1, g.oh = 8, g.ow = 8;
  CHECK(cpu::conv_winograd_applies<float>(g));
  {  // an empty batch: nothing written by the forward, zero weight gradient (there are no runs to sum)
    cpu::ConvGeometry e = g;
    e.n = 0;
    const TF w = normal_f({16, 16, 3, 3}, 65);
    TF gw = full<float>({16, 16, 3, 3}, 1.f), y = full<float>({1}, 7.f);
    cpu::conv2d_forward<float>(e, nullptr, w.data(), nullptr, y.data());
    cpu::conv2d_backward<float>(e, nullptr, w.data(), nullptr, nullptr, gw.data(), nullptr);
    CHECK(y.data()[0] == 7.f);
    CHECK(max_diff(gw, zeros<float>({16, 16, 3, 3})) == 0);
  }
  CHECK_FALSE(cpu::conv_winograd_applies<double>(g));
  for (auto change : std::vector<std::function<void(cpu::ConvGeometry&)>>{
           [](cpu::ConvGeometry& h) { h.sh = 2; }, [](cpu::ConvGeometry& h) { h.dw = 2; },
           [](cpu::ConvGeometry& h) { h.groups = 2; }, [](cpu::ConvGeometry& h) { h.kh = h.kw = 5; },
           [](cpu::ConvGeometry& h) { h.c = 15; }, [](cpu::ConvGeometry& h) { h.o = 8; },
           [](cpu::ConvGeometry& h) { h.ph = 3; }}) {
    cpu::ConvGeometry h = g;
    change(h);
    CHECK_FALSE(cpu::conv_winograd_applies<float>(h));
  }
}

// Benchmark mode on for a test, its cache empty before and after.
struct ConvBenchmarkOn {
  bool saved = cpu::conv_benchmark();
  ConvBenchmarkOn() {
    cpu::clear_conv_benchmark_cache();
    cpu::set_conv_benchmark(true);
  }
  ~ConvBenchmarkOn() {
    cpu::set_conv_benchmark(saved);
    cpu::clear_conv_benchmark_cache();
  }
};

TEST_CASE("conv benchmark mode: each problem timed once among the algorithms that apply, with that one's result") {
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  cpu::ConvGeometry g;
  g.n = 3, g.c = 16, g.h = 10, g.w = 9, g.o = 24, g.kh = 3, g.kw = 3, g.ph = 1, g.pw = 1, g.oh = 10, g.ow = 9;
  const TF x = normal_f({g.n, g.c, g.h, g.w}, 71), w = normal_f({g.o, g.c, 3, 3}, 72), b = normal_f({g.o}, 73);
  const TF gy = normal_f({g.n, g.o, g.oh, g.ow}, 74);
  auto forward = [&](Activation act = Activation::none) {
    TF y = empty<float>({g.n, g.o, g.oh, g.ow});
    cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), y.data(), act);
    return y;
  };
  auto grads = [&] {
    std::pair<TF, TF> r{empty<float>({g.n, g.c, g.h, g.w}), empty<float>({g.o, g.c, 3, 3})};
    cpu::conv2d_backward<float>(g, x.data(), w.data(), gy.data(), r.first.data(), r.second.data(), nullptr);
    return r;
  };
  // Each algorithm's own results, with the mode off: Winograd (the default here), direct, im2col + GEMM.
  std::vector<TF> ys;
  std::vector<std::pair<TF, TF>> gs;
  ys.push_back(forward());
  gs.push_back(grads());
  {
    NoWinograd no_winograd;
    ys.push_back(forward());
    gs.push_back(grads());
    const bool saved = cpu::conv_direct_enabled().exchange(false);
    ys.push_back(forward());
    cpu::conv_direct_enabled() = saved;
  }
  auto one_of = [](const TF& t, const auto& list, auto get) {
    int same = 0;
    for (const auto& c : list) same += ember_test::bitwise_equal(t, get(c));
    return same > 0;
  };
  auto self = [](const TF& t) { return t; };
  const std::size_t fast = EMBER_CONV_DIRECT ? 1 : 0;  // problems with more than one algorithm (AVX-512, AVX2)
  ConvBenchmarkOn on;
  const TF y1 = forward();
  CHECK(cpu::conv_benchmark_cache_size() == fast);
  CHECK(one_of(y1, ys, self));
  CHECK(ember_test::bitwise_equal(forward(), y1));  // the cached choice again, not timed again
  CHECK(cpu::conv_benchmark_cache_size() == fast);
  (void)forward(Activation::relu);  // another epilogue is another problem
  CHECK(cpu::conv_benchmark_cache_size() == 2 * fast);
  const std::pair<TF, TF> gg = grads();  // two more problems: the input's and the weight's gradients
  CHECK(cpu::conv_benchmark_cache_size() == 4 * fast);
  CHECK(one_of(gg.first, gs, [](const auto& p) { return p.first; }));
  CHECK(one_of(gg.second, gs, [](const auto& p) { return p.second; }));
  cpu::set_num_threads(1);  // another thread count is another problem
  (void)forward();
  CHECK(cpu::conv_benchmark_cache_size() == 5 * fast);
  cpu::set_num_threads(2);

  // A per-image callback sees each image once: the candidates are timed without it.
  {
    std::vector<int> calls(std::size_t(g.n), 0);
    TF y = empty<float>({g.n, g.o, g.oh, g.ow});
    cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), y.data(), Activation::none, false,
                               [&](i64 i, const float*) { ++calls[std::size_t(i)]; });
    CHECK(cpu::conv_benchmark_cache_size() == 6 * fast);
    CHECK(one_of(y, ys, self));
    for (int c : calls) CHECK(c == 1);
    // With the pool as well only im2col + GEMM takes a callback: nothing to time.
    TF yp = empty<float>({g.n, g.o, g.oh / 2, g.ow / 2});
    std::fill(calls.begin(), calls.end(), 0);
    cpu::conv2d_forward<float>(g, x.data(), w.data(), b.data(), yp.data(), Activation::none, true,
                               [&](i64 i, const float*) { ++calls[std::size_t(i)]; });
    CHECK(cpu::conv_benchmark_cache_size() == 6 * fast);
    CHECK(ember_test::bitwise_equal(yp, max_pool2d(ys.back(), 2)));
    for (int c : calls) CHECK(c == 1);
  }
  // One algorithm only (a single input channel: neither Winograd nor the direct kernel), or double: nothing timed.
  {
    cpu::ConvGeometry h = g;
    h.c = 1;
    const TF x1 = normal_f({h.n, 1, h.h, h.w}, 75), w1 = normal_f({h.o, 1, 3, 3}, 76);
    TF y = empty<float>({h.n, h.o, h.oh, h.ow});
    cpu::conv2d_forward<float>(h, x1.data(), w1.data(), nullptr, y.data());
    const TD xd = TD(cast<double>(x)), wd = TD(cast<double>(w));
    TD yd = empty<double>({g.n, g.o, g.oh, g.ow});
    cpu::conv2d_forward<double>(g, xd.data(), wd.data(), nullptr, yd.data());
    CHECK(cpu::conv_benchmark_cache_size() == 6 * fast);
  }
  cpu::clear_conv_benchmark_cache();
  CHECK(cpu::conv_benchmark_cache_size() == 0);
}

// Elements of got (16-bit H) farther from ref than one rounding into H plus fp32 accumulation over `depth` terms:
// u_H |ref| + (depth + 2) eps_f32 mag (mag: the same computation on absolute values) + half H's smallest
// subnormal, where u_H = eps_H / 2 is the unit roundoff of rounding to nearest.
template <class H>
int out_of_bound(const Tensor<H>& got, const TD& ref, const TD& mag, double depth) {
  const TD g = TD(cast<double>(got)).contiguous(), r = ref.contiguous(), m = mag.contiguous();
  const double eh = 0.5 * double(std::numeric_limits<H>::epsilon()), ef = double(std::numeric_limits<float>::epsilon());
  int wrong = 0;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double acc = (depth + 2) * ef * m.data()[i];
    if (!(std::abs(g.data()[i] - r.data()[i]) <=
          eh * (std::abs(r.data()[i]) + acc) + acc + 0.5 * double(std::numeric_limits<H>::denorm_min())))
      ++wrong;
  }
  return wrong;
}

// conv2d in half and bfloat16 runs the fp32 kernels on operands converted while packed, accumulates in fp32 (the
// batch sums of the weight and bias gradients and the folded input gradient included) and rounds each output once:
// every element, forward and backward, is within one rounding of the double result on the same 16-bit inputs.
TEST_CASE_TEMPLATE("conv2d in half and bfloat16: fp32 accumulation, one rounding, forward and backward", H, half,
                   bfloat16) {
  ThreadsGuard guard;
  struct Conv {
    Shape x, w;
    Conv2dOptions o;
  };
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    std::uint64_t seed = 41;
    for (const Conv& c : {Conv{{2, 3, 6, 6}, {4, 3, 3, 3}, {.padding = 1}},
                          Conv{{5, 4, 9, 7}, {6, 2, 3, 2}, {.stride = {2, 1}, .padding = {1, 0}, .groups = 2}},
                          Conv{{3, 8, 5, 5}, {5, 8, 1, 1}, {}},  // pointwise: no column buffer
                          Conv{{8, 16, 12, 12}, {32, 16, 3, 3}, {.padding = 1, .dilation = 2}}}) {
      CAPTURE(threads);
      CAPTURE(c.x.str());
      const std::int64_t O = c.w[0], N = c.x[0];
      const TD x = normal(c.x, seed++), w = normal(c.w, seed++), b = normal({O}, seed++);
      const Tensor<H> xh = cast<H>(x), wh = cast<H>(w), bh = cast<H>(b);
      const TD xd = cast<double>(xh), wd = cast<double>(wh), bd = cast<double>(bh);
      const TD xa = abs(xd), wa = abs(wd), ba = abs(bd);
      const Tensor<H> y = ops::conv2d(xh, wh, bh, c.o);
      const double k = double(c.w[1] * c.w[2] * c.w[3]);
      CHECK(out_of_bound(y, ops::conv2d(xd, wd, bd, c.o), ops::conv2d(xa, wa, ba, c.o), k + 1) == 0);

      const Tensor<H> gy = cast<H>(normal(y.shape(), seed++));
      const TD gyd = cast<double>(gy), gya = abs(gyd);
      const auto g = ops::conv2d_backward(gy, xh, wh, c.o, true, true, true);
      const auto r = ops::conv2d_backward(gyd, xd, wd, c.o, true, true, true);
      const auto m = ops::conv2d_backward(gya, xa, wa, c.o, true, true, true);
      const double L = double(y.size(2) * y.size(3));
      CHECK(out_of_bound(g.input, r.input, m.input, double(O / c.o.groups) * k + k) == 0);
      CHECK(out_of_bound(g.weight, r.weight, m.weight, double(N) * L + double(N)) == 0);
      CHECK(out_of_bound(g.bias, r.bias, m.bias, double(N) * L + double(N)) == 0);
    }
  }
}

// Where Winograd (or, forward, the direct kernel) applies and the 16-bit GEMM is no faster than fp32's (half always;
// bfloat16 without AMX or AVX512-BF16 dot products on), 16-bit convolutions run the float kernels on widened operands:
// the same bits as widening, convolving in float and rounding each result once, forward (with the activation, the
// pool and the per-image callback) and both gradients.
TEST_CASE_TEMPLATE("conv2d in half and bfloat16 through the float Winograd and direct kernels: widened, rounded once",
                   H, half, bfloat16) {
  if (!EMBER_CONV_DIRECT) {
    MESSAGE("a build without the Winograd and direct kernels: 16-bit convolutions take im2col + GEMM");
    return;
  }
  ThreadsGuard guard;
  struct FastGemmOff {  // the fp32-speed 16-bit GEMM, so that widening is chosen for bfloat16 too
    bool dot = cpu::bf16_dot_active(), amx = cpu::amx_active();
    FastGemmOff() { cpu::set_bf16_dot(false), cpu::set_amx(false); }
    ~FastGemmOff() { cpu::set_bf16_dot(dot), cpu::set_amx(amx); }
  } fast_off;
  cpu::enable_act_epilogues<float>();
  auto same = [](const Tensor<H>& a, const Tensor<H>& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), std::size_t(a.numel()) * sizeof(H)) == 0;
  };
  struct Case {
    i64 n, c, h, w, o, s;
  };
  for (const Case& k : {Case{3, 16, 10, 9, 24, 1}, Case{2, 8, 11, 11, 16, 2}}) {  // Winograd; direct (stride 2)
    cpu::ConvGeometry g;
    g.n = k.n, g.c = k.c, g.h = k.h, g.w = k.w, g.o = k.o, g.kh = g.kw = 3, g.sh = g.sw = k.s, g.ph = g.pw = 1;
    g.oh = (g.h + 2 - 3) / k.s + 1, g.ow = (g.w + 2 - 3) / k.s + 1;
    const bool winograd = k.s == 1;
    REQUIRE(cpu::conv_winograd_applies<float>(g) == winograd);
    REQUIRE(cpu::conv_direct_applies<float>(g));
    INFO("input " << Shape{g.n, g.c, g.h, g.w}.str() << " stride " << k.s);
    const Tensor<H> x = cast<H>(normal_f({g.n, g.c, g.h, g.w}, 81)), w = cast<H>(normal_f({g.o, g.c, 3, 3}, 82)),
                    b = cast<H>(normal_f({g.o}, 83));
    const TF xf = TF(cast<float>(x)), wf = TF(cast<float>(w)), bf = TF(cast<float>(b));
    for (const int threads : {1, 2}) {
      cpu::set_num_threads(threads);
      for (const Activation act : {Activation::none, Activation::relu})
        for (const bool pool : {false, true}) {
          INFO("threads " << threads << " act " << std::string(activation_name(act)) << " pool " << pool);
          const Shape ys = pool ? Shape{g.n, g.o, g.oh / 2, g.ow / 2} : Shape{g.n, g.o, g.oh, g.ow};
          TF want = empty<float>(ys);
          cpu::conv2d_forward<float>(g, xf.data(), wf.data(), bf.data(), want.data(), act, pool);
          Tensor<H> got = empty<H>(ys);
          cpu::conv2d_forward<H>(g, x.data(), w.data(), b.data(), got.data(), act, pool);
          CHECK(same(got, cast<H>(want)));
        }
      if (!winograd) continue;  // (the direct kernel takes no callback)
      // The per-image callback (the fused batch norm's statistics) sees each image's rounded output once.
      Tensor<H> got = empty<H>({g.n, g.o, g.oh, g.ow}), seen = zeros<H>({g.n, g.o, g.oh, g.ow});
      std::vector<int> calls(std::size_t(g.n), 0);
      const i64 L = g.o * g.oh * g.ow;
      cpu::conv2d_forward<H>(g, x.data(), w.data(), nullptr, got.data(), Activation::relu, false,
                             [&](i64 i, const H* yi) {
                               ++calls[std::size_t(i)];
                               std::memcpy(seen.data() + i * L, yi, std::size_t(L) * sizeof(H));
                             });
      TF want = empty<float>({g.n, g.o, g.oh, g.ow});
      cpu::conv2d_forward<float>(g, xf.data(), wf.data(), nullptr, want.data(), Activation::relu);
      CHECK(same(got, cast<H>(want)));
      CHECK(same(seen, got));
      CHECK(calls == std::vector<int>(std::size_t(g.n), 1));
      // Both gradients and the bias's.
      const Tensor<H> gy = cast<H>(normal_f({g.n, g.o, g.oh, g.ow}, 84));
      const TF gyf = TF(cast<float>(gy));
      TF gxf = empty<float>(xf.shape()), gwf = empty<float>(wf.shape()), gbf = empty<float>({g.o});
      cpu::conv2d_backward<float>(g, xf.data(), wf.data(), gyf.data(), gxf.data(), gwf.data(), gbf.data());
      Tensor<H> gx = empty<H>(x.shape()), gw = empty<H>(w.shape()), gb = empty<H>({g.o});
      cpu::conv2d_backward<H>(g, x.data(), w.data(), gy.data(), gx.data(), gw.data(), gb.data());
      CHECK(same(gx, cast<H>(gxf)));
      CHECK(same(gw, cast<H>(gwf)));
      CHECK(same(gb, cast<H>(gbf)));
      Tensor<H> gw_only = empty<H>(w.shape());  // the weight's gradient alone (no input gradient, no weight read)
      cpu::conv2d_backward<H>(g, x.data(), nullptr, gy.data(), nullptr, gw_only.data(), nullptr);
      CHECK(same(gw_only, gw));
    }
  }
}

// Pooling in half and bfloat16 reads and writes the 16-bit planes in place and computes in fp32: averages sum in
// fp32, and the gradients that overlapping windows send onto one input element add up in an fp32 plane, each
// rounded once. So every element is within one rounding of the double result on the same 16-bit inputs (rounding
// the running sums in the 16-bit type, as a 16-bit accumulator would, fails the backward checks).
TEST_CASE_TEMPLATE("pooling in half and bfloat16: fp32 inside, one rounding, forward and backward", H, half, bfloat16) {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    const Tensor<H> x = cast<H>(normal({2, 3, 9, 7}, 61));
    const TD xd = cast<double>(x), xa = abs(xd);
    const Shape is = x.shape();
    // avg: 3x3 windows at stride 1 with padding overlap 9 deep; adaptive 9x7 -> 4x3 bins overlap too.
    const Pool2dOptions ao{.stride = 1, .padding = 1};
    const Tensor<H> ya = ops::avg_pool2d(x, 3, ao);
    CHECK(out_of_bound(ya, ops::avg_pool2d(xd, 3, ao), ops::avg_pool2d(xa, 3, ao), 9) == 0);
    const Tensor<H> gy = cast<H>(normal(ya.shape(), 62));
    const TD gyd = cast<double>(gy), gya = abs(gyd);
    CHECK(out_of_bound(ops::avg_pool2d_backward(gy, is, 3, ao), ops::avg_pool2d_backward(gyd, is, 3, ao),
                       ops::avg_pool2d_backward(gya, is, 3, ao), 9) == 0);
    const Tensor<H> yd = ops::adaptive_avg_pool2d(x, Size2(4, 3));
    CHECK(out_of_bound(yd, ops::adaptive_avg_pool2d(xd, Size2(4, 3)), ops::adaptive_avg_pool2d(xa, Size2(4, 3)), 9) ==
          0);
    const Tensor<H> gq = cast<H>(normal(yd.shape(), 63));
    const TD gqd = cast<double>(gq), gqa = abs(gqd);
    CHECK(out_of_bound(ops::adaptive_avg_pool2d_backward(gq, is), ops::adaptive_avg_pool2d_backward(gqd, is),
                       ops::adaptive_avg_pool2d_backward(gqa, is), 9) == 0);
    // max: the values are copied exactly; overlapping 3x3 windows at stride 1 send several gradients to one input.
    const auto [ym, idx] = ops::max_pool2d_with_indices(x, 3, {.stride = 1}, true);
    CHECK(max_diff(ym, std::get<0>(ops::max_pool2d_with_indices(xd, 3, {.stride = 1}, false))) == 0);
    const Tensor<H> gm = cast<H>(normal(ym.shape(), 64));
    const TD gmd = cast<double>(gm), gma = abs(gmd);
    CHECK(out_of_bound(ops::max_pool2d_backward(gm, idx, is), ops::max_pool2d_backward(gmd, idx, is),
                       ops::max_pool2d_backward(gma, idx, is), 9) == 0);
  }
}

TEST_CASE("pooling in half and bfloat16 compute in fp32") {
  TD x = normal({2, 3, 6, 6}, 41), w = normal({4, 3, 3, 3}, 42);
  auto check16 = [&](auto tag) {
    using H = decltype(tag);
    const Tensor<H> xh = cast<H>(x), wh = cast<H>(w);
    const double tol = std::is_same_v<H, half> ? 2e-2 : 1.5e-1;
    CHECK(max_diff(max_pool2d(xh, 2), max_pool2d(TD(cast<double>(xh)), 2)) == 0);
    CHECK(max_diff(avg_pool2d(xh, 3, {.stride = 1}), avg_pool2d(TD(cast<double>(xh)), 3, {.stride = 1})) <= tol);
    CHECK(max_diff(adaptive_avg_pool2d(xh, 4), adaptive_avg_pool2d(TD(cast<double>(xh)), 4)) <= tol);
    // Backward through conv and pooling.
    Tensor<H> xl = xh.detach().clone(), wl = wh.detach().clone();
    xl.requires_grad_(true);
    wl.requires_grad_(true);
    sum(cast<float>(max_pool2d(conv2d(xl, wl, Tensor<H>(), {1, 1}), 2))).backward();
    CHECK(xl.grad().shape() == xl.shape());
    CHECK(wl.grad().shape() == wl.shape());
  };
  SUBCASE("half") { check16(half{}); }
  SUBCASE("bfloat16") { check16(bfloat16{}); }
}

TEST_CASE("max_pool2d_backward from the input and output equals the indices form") {
  // The form CUDA runs (cuDNN finds each maximum again); on the CPU it recomputes the indices.
  const TD x = distinct({2, 3, 9, 8}, 51);
  for (const Pool2dOptions& o : {Pool2dOptions{}, Pool2dOptions{.stride = 2, .padding = 1},
                                 Pool2dOptions{.stride = 1, .dilation = 2, .ceil_mode = true}}) {
    auto [y, idx] = ops::max_pool2d_with_indices(x, Size2(3), o, true);
    const TD g = normal(y.shape(), 52);
    const TD a = ops::max_pool2d_backward(g, x, y, Size2(3), o), b = ops::max_pool2d_backward(g, idx, x.shape());
    CHECK(max_diff(a, b) == 0);
  }
  EXPECT_ERROR([&] { (void)ops::max_pool2d_backward(normal({1, 1, 2, 2}, 1), x, x, Size2(3)); },
               {"max_pool2d_backward", "gradient of shape [1, 1, 2, 2]"});
}

TEST_CASE("pooling gradcheck: max (dilation, ceil_mode, padding), avg (count_include_pad), adaptive") {
  auto mp = [](Size2 k, Pool2dOptions o) { return [k, o](const Inputs& v) { return max_pool2d(v[0], k, o); }; };
  auto ap = [](Size2 k, Pool2dOptions o) { return [k, o](const Inputs& v) { return avg_pool2d(v[0], k, o); }; };
  auto ad = [](Size2 s) { return [s](const Inputs& v) { return adaptive_avg_pool2d(v[0], s); }; };
  const Shape s{2, 2, 7, 6};
  check_grad("max 2x2", mp(2, {}), {distinct(s, 1)});
  check_grad("max 3x3 s2 p1 ceil", mp(3, {.stride = 2, .padding = 1, .ceil_mode = true}), {distinct(s, 2)});
  check_grad("max (3,2) s(1,2) p(1,1) dil(2,1)", mp({3, 2}, {.stride = {1, 2}, .padding = 1, .dilation = {2, 1}}),
             {distinct(s, 3)});
  check_grad("max overlapping windows (stride 1)", mp(3, {.stride = 1}), {distinct(s, 4)});
  check_grad("max unbatched", mp(2, {.stride = 1}), {distinct({3, 5, 4}, 5)});
  check_grad("max transposed input",
             [](const Inputs& v) { return max_pool2d(v[0].transpose(1, 3), 2, {.ceil_mode = true}); },
             {distinct(s, 6)});
  check_grad("avg 3x3 s2 p1 ceil, count pad", ap(3, {.stride = 2, .padding = 1, .ceil_mode = true}),
             {normal(s, 7)});
  check_grad("avg 3x3 s2 p1 ceil, no pad count",
             ap(3, {.stride = 2, .padding = 1, .ceil_mode = true, .count_include_pad = false}), {normal(s, 8)});
  check_grad("avg (2,3) s(1,2) p(1,0)", ap({2, 3}, {.stride = {1, 2}, .padding = {1, 0}}), {normal(s, 9)});
  check_grad("avg unbatched", ap(2, {}), {normal({3, 5, 4}, 10)});
  check_grad("avg transposed input", [](const Inputs& v) { return avg_pool2d(v[0].transpose(2, 3), 2); },
             {normal(s, 11)});
  check_grad("adaptive 7x6 -> 3x4 (non-divisible)", ad({3, 4}), {normal(s, 12)});
  check_grad("adaptive 7x6 -> 5x5 (overlapping bins)", ad(5), {normal(s, 13)});
  check_grad("adaptive upsampling 7x6 -> 9x8", ad({9, 8}), {normal(s, 14)});
  check_grad("adaptive unbatched", ad({2, 3}), {normal({2, 5, 5}, 15)});
  check_grad("adaptive transposed input", [](const Inputs& v) { return adaptive_avg_pool2d(v[0].transpose(2, 3), 3); },
             {normal(s, 16)});
}

TEST_CASE("pooling: output sizes follow PyTorch's rules") {
  const TD x = normal({1, 1, 5, 5}, 1);
  CHECK(max_pool2d(x, 2).shape() == Shape({1, 1, 2, 2}));
  CHECK(max_pool2d(x, 2, {.ceil_mode = true}).shape() == Shape({1, 1, 3, 3}));
  // ceil_mode: rounding up gives 4 windows, but the last would start in the right padding, so 3.
  CHECK(max_pool2d(x, 2, {.stride = 2, .padding = 1, .ceil_mode = true}).shape() == Shape({1, 1, 3, 3}));
  CHECK(max_pool2d(x, 3, {.stride = 2, .padding = 1, .dilation = 2}).shape() == Shape({1, 1, 2, 2}));
  CHECK(avg_pool2d(x, {2, 3}, {.stride = {2, 1}}).shape() == Shape({1, 1, 2, 3}));
  CHECK(adaptive_avg_pool2d(x, {3, 7}).shape() == Shape({1, 1, 3, 7}));
  CHECK(max_pool2d(x[0], 2).shape() == Shape({1, 2, 2}));
}

TEST_CASE("max_pool2d: ties go to the first maximum, NaN wins, padding never wins") {
  // One 2x2 window of equal values: the gradient goes to the first (top-left) element only.
  TD x = from_vector<double>({1, 1, 1, 1}, {1, 1, 2, 2});
  x.requires_grad_(true);
  TD y = max_pool2d(x, 2);
  y.backward(from_vector<double>({5}, {1, 1, 1, 1}));
  CHECK(x.grad().to_vector() == std::vector<double>{5, 0, 0, 0});
  // Overlapping windows (stride 1) that share their maximum: gradients add up at it.
  TD z = from_vector<double>({0, 9, 0, 0, 0, 0}, {1, 1, 2, 3});
  z.requires_grad_(true);
  max_pool2d(z, 2, {.stride = 1}).backward(from_vector<double>({1, 2}, {1, 1, 1, 2}));
  CHECK(z.grad().to_vector() == std::vector<double>{0, 3, 0, 0, 0, 0});
  // NaN propagates as the maximum.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const TD n = max_pool2d(from_vector<double>({1, nan, 3, 2}, {1, 1, 2, 2}), 2);
  CHECK(std::isnan(n.to_vector()[0]));
  const TD n3 = max_pool2d(from_vector<double>({1, 2, 3, 4, nan, 6, 7, 8, 9}, {1, 1, 3, 3}), 3, {.padding = 1});
  CHECK(std::isnan(n3.to_vector()[0]));
  // Without a gradient the forward skips the indices and gives the same values (2x2 and general kernels).
  const TD r = distinct({2, 3, 8, 9}, 3);
  TD rl = r.detach().clone();
  rl.requires_grad_(true);
  for (const Size2 k : {Size2(2), Size2(3, 2)}) {
    const TD with = max_pool2d(rl, k);
    NoGradGuard ng;
    CHECK(max_diff(max_pool2d(r, k), with.detach()) == 0);
  }
  // All-negative input with padding: -inf padding never wins.
  const TD neg = max_pool2d(from_vector<double>({-5, -4, -3, -2}, {1, 1, 2, 2}), 2, {.stride = 1, .padding = 1});
  CHECK(neg.to_vector() == std::vector<double>{-5, -4, -4, -3, -2, -2, -3, -2, -2});
}

// 2x2 max pooling at stride 2 runs 16 windows of a row at a time for float and bfloat16 (AVX-512 builds), and one
// window at a time for double and half: on the same values (few distinct ones, so ties are common, and NaNs) the
// maxima, their bits and the indices are the double path's, for widths around the 16-window step and odd ones.
TEST_CASE_TEMPLATE("max_pool2d 2x2: values, indices, ties and NaN as the one-window path, every width", T, float,
                   bfloat16, half) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::mt19937 g(91);
  for (std::int64_t w : {2, 3, 5, 15, 16, 17, 30, 31, 32, 33, 34, 35, 64, 67}) {
    for (std::int64_t h : {2, 5}) {
      CAPTURE(w);
      CAPTURE(h);
      std::vector<double> v(std::size_t(2 * 3 * h * w));
      for (double& e : v) e = g() % 23 == 0 ? nan : double(int(g() % 5) - 2) * 0.5;
      const Tensor<T> x = cast<T>(from_vector<double>(v, {2, 3, h, w}));
      const TD xd = cast<double>(x);
      const auto [y, idx] = ops::max_pool2d_with_indices(x, 2, {}, true);
      const auto [yd, idxd] = ops::max_pool2d_with_indices(xd, 2, {}, true);
      CHECK(idx.to_vector() == idxd.to_vector());
      const Tensor<T> yn = ops::max_pool2d_with_indices(x, 2, {}, false).first;
      const std::vector<T> got = y.to_vector(), got_n = yn.to_vector(), want = Tensor<T>(cast<T>(yd)).to_vector();
      REQUIRE(got.size() == want.size());
      std::size_t diffs = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        diffs += std::memcmp(&got[i], &want[i], sizeof(T)) != 0 || std::memcmp(&got_n[i], &want[i], sizeof(T)) != 0;
      CHECK(diffs == 0);
    }
  }
}

TEST_CASE("avg_pool2d: divisors with and without padding") {
  const TD x = ones<double>({1, 1, 3, 3});
  // 3x3 window, padding 1: the corner window covers 4 input elements of 9 padded ones.
  CHECK(avg_pool2d(x, 3, {.stride = 1, .padding = 1}).to_vector()[0] == doctest::Approx(4.0 / 9.0));
  CHECK(avg_pool2d(x, 3, {.stride = 1, .padding = 1, .count_include_pad = false}).to_vector()[0] == 1.0);
  // ceil_mode: a window hanging past the padded input divides by the part inside the padded input.
  const TD y = avg_pool2d(x, 2, {.stride = 2, .ceil_mode = true});
  CHECK(y.shape() == Shape({1, 1, 2, 2}));
  CHECK(y.to_vector() == std::vector<double>{1, 1, 1, 1});
}

TEST_CASE("conv and pooling errors name the op, the shapes and what was expected") {
  const TF x = zeros<float>({2, 4, 8, 8}), w = zeros<float>({6, 4, 3, 3});
  // Ranks.
  EXPECT_ERROR([&] { (void)conv2d(zeros<float>({4, 8}), w); }, {"conv2d", "[4, 8]", "3-D (C, H, W) or 4-D"});
  EXPECT_ERROR([&] { (void)conv2d(x, zeros<float>({6, 4, 3})); }, {"conv2d", "weight", "[6, 4, 3]", "4-D"});
  // Channels and groups.
  EXPECT_ERROR([&] { (void)conv2d(x, zeros<float>({6, 3, 3, 3})); },
               {"conv2d", "[2, 4, 8, 8]", "4 channels", "[6, 3, 3, 3]", "expects 3"});
  EXPECT_ERROR([&] { (void)conv2d(x, zeros<float>({8, 2, 3, 3}), TF(), {.groups = 4}); },
               {"conv2d", "groups=4", "expects 8"});
  EXPECT_ERROR([&] { (void)conv2d(x, zeros<float>({6, 1, 3, 3}), TF(), {.groups = 4}); },
               {"conv2d", "6 output channels", "groups=4"});
  EXPECT_ERROR([&] { (void)conv2d(x, w, TF(), {.groups = 0}); }, {"conv2d", "groups must be positive"});
  // Kernel larger than the padded input.
  EXPECT_ERROR([&] { (void)conv2d(zeros<float>({1, 4, 2, 2}), w); },
               {"conv2d", "kernel (3, 3)", "larger than the padded input (2, 2)", "[1, 4, 2, 2]"});
  EXPECT_ERROR([&] { (void)conv2d(zeros<float>({1, 4, 4, 4}), w, TF(), {.dilation = 2}); },
               {"conv2d", "dilated to (5, 5)", "(4, 4)"});
  // Non-positive stride / dilation, negative padding.
  EXPECT_ERROR([&] { (void)conv2d(x, w, TF(), {.stride = {1, 0}}); }, {"conv2d", "stride", "positive", "(1, 0)"});
  EXPECT_ERROR([&] { (void)conv2d(x, w, TF(), {.stride = -1}); }, {"conv2d", "stride", "(-1, -1)"});
  EXPECT_ERROR([&] { (void)conv2d(x, w, TF(), {.dilation = 0}); }, {"conv2d", "dilation", "positive"});
  EXPECT_ERROR([&] { (void)conv2d(x, w, TF(), {.padding = -1}); }, {"conv2d", "padding", "non-negative"});
  // Bias shape.
  EXPECT_ERROR([&] { (void)conv2d(x, w, zeros<float>({4})); }, {"conv2d", "bias of shape [4]", "6 output channels"});
  EXPECT_ERROR([&] { (void)conv2d(x, w, zeros<float>({6, 1})); }, {"conv2d", "bias of shape [6, 1]", "[6]"});
  // Devices.
  std::vector<float> mem(6 * 6 * 9);
  const TF wg = from_blob(mem.data(), {6, 4, 3, 3}, std::function<void(void*)>{}, Device::cuda());
  EXPECT_ERROR([&] { (void)conv2d(x, wg); }, {"conv2d", "different devices", "cpu", "cuda:0"});
  std::vector<float> bmem(6);
  const TF bg = from_blob(bmem.data(), {6}, std::function<void(void*)>{}, Device::cuda());
  EXPECT_ERROR([&] { (void)conv2d(x, w, bg); }, {"conv2d", "bias", "cuda:0", "cpu"});

  // Pooling.
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<float>({8, 8}), 2); }, {"max_pool2d", "[8, 8]", "3-D (C, H, W) or 4-D"});
  EXPECT_ERROR([&] { (void)avg_pool2d(zeros<float>({1, 1, 1, 8, 8}), 2); }, {"avg_pool2d", "[1, 1, 1, 8, 8]"});
  EXPECT_ERROR([&] { (void)adaptive_avg_pool2d(zeros<float>({8}), 2); }, {"adaptive_avg_pool2d", "[8]"});
  EXPECT_ERROR([&] { (void)max_pool2d(x, 0); }, {"max_pool2d", "kernel size", "positive", "(0, 0)"});
  EXPECT_ERROR([&] { (void)max_pool2d(x, 2, {.stride = -2}); }, {"max_pool2d", "stride", "(-2, -2)"});
  EXPECT_ERROR([&] { (void)avg_pool2d(x, 2, {.stride = {2, 0}}); }, {"avg_pool2d", "stride", "(2, 0)"});
  EXPECT_ERROR([&] { (void)max_pool2d(x, 2, {.padding = 2}); },
               {"max_pool2d", "padding (2, 2)", "at most half the kernel size (2, 2)"});
  EXPECT_ERROR([&] { (void)max_pool2d(x, 2, {.dilation = 0}); }, {"max_pool2d", "dilation", "positive"});
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<float>({1, 1, 3, 3}), 4, {.padding = 0}); },
               {"max_pool2d", "kernel (4, 4)", "larger than the padded input (3, 3)"});
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<float>({1, 1, 5, 5}), 3, {.dilation = 3}); },
               {"max_pool2d", "dilated to (7, 7)", "(5, 5)"});
  EXPECT_ERROR([&] { (void)avg_pool2d(x, 2, {.dilation = 2}); }, {"avg_pool2d", "dilation is not supported"});
  EXPECT_ERROR([&] { (void)avg_pool2d(zeros<float>({1, 0, 4, 4}), 2); }, {"avg_pool2d", "non-zero", "[1, 0, 4, 4]"});
  EXPECT_ERROR([&] { (void)adaptive_avg_pool2d(x, {-1, 2}); }, {"adaptive_avg_pool2d", "non-negative", "(-1, 2)"});
  const TF xg = from_blob(mem.data(), {1, 6, 6, 6}, std::function<void(void*)>{}, Device::cuda());
  EXPECT_ERROR([&] { (void)max_pool2d(xg, 2); }, {"max_pool2d", "cuda:0"});
  const TF wg6 = from_blob(mem.data(), {6, 6, 3, 3}, std::function<void(void*)>{}, Device::cuda());
  EXPECT_ERROR([&] { (void)conv2d(xg, wg6); }, {"conv2d", "no kernel", "cuda:0"});
}

// ---- issue 10: ceil_mode windows past the padded input, empty dilated windows, divisor_override ------------------

namespace {
const ember_test::Fixtures& edges_fx() {
  static const ember_test::Fixtures f("ops_edges.txt");
  return f;
}
struct EdgePool {
  const char* name;
  Size2 k, s, p, d;
};
// The cases of tests/fixtures/gen_ops_edges.py (POOL_CASES), all with ceil_mode.
const EdgePool kEdgePools[] = {{"row", 2, 2, 0, 1},
                               {"wide", {2, 4}, {2, 3}, 0, 1},
                               {"pad", {5, 3}, {3, 2}, 1, 1},
                               {"dil", 3, 2, 1, {2, 1}},
                               {"ref", 3, 2, 1, 1}};
}  // namespace

TEST_CASE("pooling with ceil_mode and a kernel larger than the padded input gives PyTorch's output (fixtures)") {
  // PyTorch: out = floor((in + 2p - d(k-1) - 1 + s - 1) / s) + 1, minus the last window if it would start in the
  // right padding. x (1, 1, 1, 4), kernel 2, ceil_mode: max [[1, 3]] where ember used to raise.
  const auto& fx = edges_fx();
  for (const EdgePool& c : kEdgePools) {
    INFO("case " << c.name);
    const std::string pre = std::string("pool.") + c.name;
    const Pool2dOptions mo{.stride = c.s, .padding = c.p, .dilation = c.d, .ceil_mode = true};
    TD x = fx[pre + ".x"];
    x.requires_grad_(true);
    TD y = max_pool2d(x, c.k, mo);
    expect_close("max y", y, fx[pre + ".max.y"]);
    y.backward(fx[pre + ".g"]);
    expect_close("max dx", x.grad(), fx[pre + ".max.dx"]);
    // The float path and the no-grad path (no indices) agree.
    CHECK(max_diff(max_pool2d(TF(cast<float>(fx[pre + ".x"])), c.k, mo), fx[pre + ".max.y"]) <= 1e-6);
    if (c.d == Size2(1)) {
      for (const bool cip : {true, false}) {
        INFO("count_include_pad " << cip);
        const std::string key = pre + ".avg." + (cip ? "1" : "0") + ".None";
        TD xa = fx[pre + ".x"];
        xa.requires_grad_(true);
        TD ya = avg_pool2d(xa, c.k, {.stride = c.s, .padding = c.p, .ceil_mode = true, .count_include_pad = cip});
        expect_close("avg y", ya, fx[key + ".y"]);
        ya.backward(fx[pre + ".g"]);
        expect_close("avg dx", xa.grad(), fx[key + ".dx"]);
      }
    }
  }
  // The example, by value.
  CHECK(max_pool2d(arange<double>(0, 4).view({1, 1, 1, 4}), 2, {.ceil_mode = true}).to_vector() ==
        std::vector<double>{1, 3});
}

TEST_CASE("pooling gradcheck: ceil_mode windows larger than the padded input") {
  for (const EdgePool& c : kEdgePools) {
    INFO("case " << c.name);
    const TD x = distinct(edges_fx()[std::string("pool.") + c.name + ".x"].shape(), 71);
    const Pool2dOptions mo{.stride = c.s, .padding = c.p, .dilation = c.d, .ceil_mode = true};
    check_grad("max", [&](const Inputs& v) { return max_pool2d(v[0], c.k, mo); }, {x});
    if (c.d == Size2(1))
      for (const bool cip : {true, false})
        check_grad("avg", [&](const Inputs& v) {
          return avg_pool2d(v[0], c.k, {.stride = c.s, .padding = c.p, .ceil_mode = true, .count_include_pad = cip});
        }, {x});
  }
}

TEST_CASE("max_pool2d: a dilated window that only covers padding gives -inf and no gradient (no stray write)") {
  // H = 1, kernel 2, dilation 2, padding 1: rows -1 and 1 of a 1-row input, so the window holds no element.
  // PyTorch outputs -inf there (and an index outside the plane, which its backward would write through).
  // ember records index -1 and sends that output's gradient nowhere. Two planes: a stray write from plane 0
  // would land in plane 1.
  TD x = from_vector<double>({1, 2, 3, 4, 5, 6}, {1, 2, 1, 3});
  x.requires_grad_(true);
  const Pool2dOptions o{.padding = 1, .dilation = 2};
  auto [yv, idx] = ops::max_pool2d_with_indices(x.detach(), 2, o, true);
  CHECK(yv.shape() == Shape({1, 2, 1, 2}));
  for (double v : yv.to_vector()) CHECK(v == -std::numeric_limits<double>::infinity());
  for (i64 i : idx.to_vector()) CHECK(i == -1);
  TD y = max_pool2d(x, 2, o);
  y.backward(ones<double>(y.shape()));
  CHECK(x.grad().to_vector() == std::vector<double>(6, 0.0));
  // The indices form of the backward rejects indices outside the plane instead of writing through them.
  EXPECT_ERROR([&] { (void)ops::max_pool2d_backward(ones<double>({1, 2, 1, 2}), full<i64>({1, 2, 1, 2}, 3), x.shape()); },
               {"max_pool2d_backward", "index 3", "[-1, 3)"});
}

TEST_CASE("avg_pool2d divisor_override matches PyTorch (fixtures), forward and backward, with ceil_mode windows") {
  const auto& fx = edges_fx();
  for (const EdgePool& c : kEdgePools) {
    if (!(c.d == Size2(1))) continue;
    const std::string pre = std::string("pool.") + c.name;
    for (const bool cip : {true, false})
      for (const i64 div : {i64(5), i64(-2)}) {
        const std::string key = pre + ".avg." + (cip ? "1" : "0") + "." + std::to_string(div);
        INFO(key);
        TD x = fx[pre + ".x"];
        x.requires_grad_(true);
        const Pool2dOptions o{.stride = c.s, .padding = c.p, .ceil_mode = true, .count_include_pad = cip,
                              .divisor_override = div};
        TD y = avg_pool2d(x, c.k, o);
        expect_close("y", y, fx[key + ".y"]);
        y.backward(fx[pre + ".g"]);
        expect_close("dx", x.grad(), fx[key + ".dx"]);
        CHECK(max_diff(avg_pool2d(TF(cast<float>(fx[pre + ".x"])), c.k, o), fx[key + ".y"]) <= 1e-5);
      }
  }
  // The layer passes it on.
  nn::AvgPool2d layer(2, {.divisor_override = 3});
  CHECK(layer(ones<double>({1, 1, 2, 2})).to_vector() == std::vector<double>{4.0 / 3.0});
}

TEST_CASE("pooling gradcheck: divisor_override") {
  const Shape s{2, 2, 5, 4};
  for (const Pool2dOptions& o :
       {Pool2dOptions{.divisor_override = 7}, Pool2dOptions{.stride = 2, .padding = 1, .ceil_mode = true,
                                                            .divisor_override = -3},
        Pool2dOptions{.stride = {1, 2}, .padding = 1, .count_include_pad = false, .divisor_override = 2}})
    check_grad("avg divisor_override", [&](const Inputs& v) { return avg_pool2d(v[0], 3, o); }, {normal(s, 81)});
}

TEST_CASE("pooling errors: no window fits, divisor_override zero or on max_pool2d") {
  // Without ceil_mode a kernel larger than the padded input leaves no window (as PyTorch: "Output size is too
  // small"); with ceil_mode PyTorch still needs a window that starts inside the input or the left padding.
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<double>({1, 1, 1, 4}), 3); },
               {"max_pool2d", "kernel (3, 3)", "larger than the padded input (1, 4)", "no window fits", "[1, 1, 1, 4]"});
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<double>({1, 1, 1, 4}), 3, {.stride = 2, .ceil_mode = true}); },
               {"max_pool2d", "kernel (3, 3)", "even with ceil_mode", "stride (2, 2)"});
  EXPECT_ERROR([&] { (void)avg_pool2d(zeros<double>({1, 1, 4, 4}), 2, {.divisor_override = 0}); },
               {"avg_pool2d", "divisor_override must be non-zero"});
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<double>({1, 1, 4, 4}), 2, {.divisor_override = 2}); },
               {"max_pool2d", "divisor_override", "avg_pool2d only"});
  EXPECT_ERROR([&] { (void)max_pool2d(zeros<double>({1, 1, 4, 4}), {2, i64(1) << 40}); },
               {"max_pool2d", "at most 2^31 - 1"});
}

// ---- conv2d -> batch norm (training) -> [relu] -> [2x2 max pool], fused -------------------------------------------

TEST_CASE("conv2d_batch_norm gradcheck: every tail, with and without biases and affine parameters") {
  struct C {
    const char* what;
    Shape x, w;
    bool bias, affine, relu, pool2;
    Conv2dOptions o;
  };
  const C cases[] = {
      {"bn only, conv bias", {3, 2, 5, 4}, {3, 2, 3, 3}, true, true, false, false, {1, 1, 1, 1}},
      {"bn + relu", {2, 2, 5, 5}, {3, 2, 3, 3}, false, true, true, false, {1, 1, 1, 1}},
      {"bn + pool, odd output (last row and column dropped)", {2, 2, 5, 5}, {2, 2, 3, 3}, false, true, false, true,
       {1, 1, 1, 1}},
      {"bn + relu + pool, stride 2, groups 2", {3, 4, 9, 8}, {4, 2, 3, 3}, true, true, true, true, {2, 1, 1, 2}},
      {"no affine, relu + pool", {2, 1, 6, 6}, {3, 1, 3, 3}, false, false, true, true, {1, 1, 1, 1}},
  };
  std::uint64_t seed = 400;
  for (const auto& c : cases) {
    Inputs in{distinct(c.x, ++seed), normal(c.w, ++seed)};
    if (c.bias) in.push_back(normal({c.w[0]}, ++seed));
    if (c.affine) {
      TD gamma = normal({c.w[0]}, ++seed);
      in.push_back(TD(gamma * gamma + 0.5));
      in.push_back(normal({c.w[0]}, ++seed));
    }
    const Conv2dOptions o = c.o;
    ops::ConvBnOptions bo;
    bo.relu = c.relu;
    bo.pool2 = c.pool2;
    const bool bias = c.bias, affine = c.affine;
    check_grad(c.what,
               [=](const Inputs& v) {
                 const std::size_t k = bias ? 3 : 2;
                 return conv2d_batch_norm(v[0], v[1], bias ? v[2] : TD(), TD(), TD(), affine ? v[k] : TD(),
                                          affine ? v[k + 1] : TD(), o, bo);
               },
               in);
  }
}

// The fused operation does batch_norm's, relu's and max_pool2d's arithmetic in their order, so it must equal the
// four ops bit for bit: outputs, every gradient and the running statistics, at one and two threads.
TEST_CASE_TEMPLATE("conv2d_batch_norm equals conv2d -> batch_norm -> relu -> max_pool2d bit for bit, in float and "
                   "in 16-bit data with float batch-norm parameters", T, float, bfloat16, half) {
  // In 16 bits, the mixed-precision block: the convolution in T, the batch norm with float statistics and parameters
  // (its mixed-type form), ReLU and pool in T; the fused kernel runs the same instantiations in the same order.
  ThreadsGuard guard;
  auto wide = [](const Tensor<T>& t) { return TF(cast<float>(t)); };  // exact and one-to-one: same bits <=> same
  // 3 -> 6 channels (im2col + GEMM) and 16 -> 24 (the Winograd kernel in AVX-512 and AVX2 builds, with the statistics' callback)
  // (plain variables, not structured bindings: clang 14 cannot capture those in INFO's lambda)
  for (const auto& channels : {std::pair<i64, i64>{3, 6}, std::pair<i64, i64>{16, 24}})
    for (int threads : {1, 2})
      for (int tail = 0; tail < 4; ++tail) {
        const i64 ci = channels.first, co = channels.second;
        cpu::set_num_threads(threads);
        const bool relu_on = tail & 1, pool_on = tail & 2;
        INFO("channels " << ci << " -> " << co << ", threads " << threads << ", relu " << relu_on << ", pool "
                         << pool_on);
        // 17 images: more than the 16 batch blocks of the statistics; an odd output size for the pool.
        const Tensor<T> x0 = cast<T>(normal_f({17, ci, 11, 11}, 51)), w0 = cast<T>(normal_f({co, ci, 3, 3}, 52));
        const Tensor<T> b0 = cast<T>(normal_f({co}, 53));
        const TF g0 = TF(normal_f({co}, 54) * 0.5f + 1.f), be0 = normal_f({co}, 55);
        Tensor<T> out[2], gx[2], gw[2], gb[2];
        TF gg[2], gbe[2], rm[2], rv[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor<T> x = x0.clone(), w = w0.clone(), b = b0.clone();
          TF gamma = g0.clone(), beta = be0.clone();
          for (Tensor<T>* t : {&x, &w, &b}) t->requires_grad_(true);
          gamma.requires_grad_(true);
          beta.requires_grad_(true);
          rm[fused] = zeros<float>({co});
          rv[fused] = ones<float>({co});
          ops::ConvBnOptions bo;
          bo.relu = relu_on;
          bo.pool2 = pool_on;
          Tensor<T> y;
          if (fused) {
            y = conv2d_batch_norm(x, w, b, rm[1], rv[1], gamma, beta, {1, 1}, bo);
          } else {
            y = batch_norm(conv2d(x, w, b, {1, 1}), rm[0], rv[0], gamma, beta, true, bo.momentum, bo.eps);
            if (relu_on) y = Tensor<T>(relu(y));
            if (pool_on) y = max_pool2d(y, 2);
          }
          y.backward(cast<T>(normal_f(y.shape(), 56)));
          out[fused] = y.detach();
          gx[fused] = x.grad();
          gw[fused] = w.grad();
          gb[fused] = b.grad();
          gg[fused] = gamma.grad();
          gbe[fused] = beta.grad();
        }
        CHECK(ember_test::bitwise_equal(wide(out[0]), wide(out[1])));
        CHECK(ember_test::bitwise_equal(wide(gx[0]), wide(gx[1])));
        CHECK(ember_test::bitwise_equal(wide(gw[0]), wide(gw[1])));
        CHECK(ember_test::bitwise_equal(wide(gb[0]), wide(gb[1])));
        CHECK(ember_test::bitwise_equal(gg[0], gg[1]));
        CHECK(ember_test::bitwise_equal(gbe[0], gbe[1]));
        CHECK(ember_test::bitwise_equal(rm[0], rm[1]));
        CHECK(ember_test::bitwise_equal(rv[0], rv[1]));
      }
}

TEST_CASE_TEMPLATE("nn::conv_bn_forward under the mixed policies equals the modules one after another", T, bfloat16,
                   half) {
  auto wide = [](const Tensor<T>& t) { return TF(cast<float>(t)); };
  // The modules: fp32 masters, their gradients and the batch norm's running statistics the same either way.
  using Policy = std::conditional_t<std::is_same_v<T, bfloat16>, amp::bf16_mixed, amp::fp16_mixed>;
  // 40 columns: the pool's 20 windows per row take a full group of 16 and a partial one in the vectorised paths.
  const Tensor<T> x = cast<T>(normal_f({9, 4, 12, 40}, 67));
  TF y32[2], gw32[2], gbn[2], rmean[2];
  for (int fused = 0; fused < 2; ++fused) {
    manual_seed(68);
    nn::Conv2dT<Policy> conv(4, 8, 3, {.padding = 1});
    nn::BatchNormT<2, Policy> bn(8);
    Tensor<T> y = fused ? nn::conv_bn_forward(conv, bn, x, {.relu = true, .pool2 = true})
                        : max_pool2d(Tensor<T>(relu(bn(conv(x)))), 2);
    CHECK(y.shape() == Shape{9, 8, 6, 20});
    TF(sum(cast<float>(y))).backward();
    y32[fused] = wide(y.detach());
    gw32[fused] = conv.weight.grad();
    gbn[fused] = bn.weight.grad();
    rmean[fused] = bn.running_mean.clone();
  }
  CHECK(ember_test::bitwise_equal(y32[0], y32[1]));
  CHECK(ember_test::bitwise_equal(gw32[0], gw32[1]));
  CHECK(ember_test::bitwise_equal(gbn[0], gbn[1]));
  CHECK(ember_test::bitwise_equal(rmean[0], rmean[1]));
}

// Ties in the pool's windows (few distinct values): the gradient goes to the first maximum, as max_pool2d's.
TEST_CASE("conv2d_batch_norm: ties in the pool go to the first maximum, as max_pool2d") {
  TF x0 = empty<float>({4, 1, 6, 6});
  Generator gen(5);
  const TF u = rand<float>({4, 1, 6, 6}, gen);
  for (i64 i = 0; i < x0.numel(); ++i) x0.data()[i] = float(int(u.data()[i] * 4.f)) - 1.f;  // -1, 0, 1 or 2
  const TF w0 = from_vector<float>({1.f, -1.f}, Shape{2, 1, 1, 1});
  for (bool relu_on : {false, true}) {
    INFO("relu " << relu_on);
    TF gx[2], gw[2], gg[2];
    for (int fused = 0; fused < 2; ++fused) {
      TF x = x0.clone(), w = w0.clone(), gamma = ones<float>({2});
      for (TF* t : {&x, &w, &gamma}) t->requires_grad_(true);
      ops::ConvBnOptions bo;
      bo.relu = relu_on;
      bo.pool2 = true;
      TF y;
      if (fused) {
        y = conv2d_batch_norm(x, w, TF(), TF(), TF(), gamma, TF(), {}, bo);
      } else {
        y = batch_norm(conv2d(x, w), TF(), TF(), gamma, TF(), true);
        if (relu_on) y = TF(relu(y));
        y = max_pool2d(y, 2);
      }
      y.backward(normal_f(y.shape(), 57));
      gx[fused] = x.grad();
      gw[fused] = w.grad();
      gg[fused] = gamma.grad();
    }
    CHECK(ember_test::bitwise_equal(gx[0], gx[1]));
    CHECK(ember_test::bitwise_equal(gw[0], gw[1]));
    CHECK(ember_test::bitwise_equal(gg[0], gg[1]));
  }
}

// nn::Sequential runs Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d(2) fused in training: the model trains exactly as
// the same modules called one by one (values, gradients, running statistics and num_batches_tracked), and in eval
// mode the modules run as before.
TEST_CASE("nn::Sequential fuses conv -> batch norm -> relu -> pool in training, with the modules' results") {
  manual_seed(3);
  nn::Sequential seq(nn::Conv2d(2, 4, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(4), nn::ReLU(),
                     nn::MaxPool2d(2), nn::Conv2d(4, 5, 3, {.padding = 1}), nn::BatchNorm2d(5, {.momentum = std::nullopt}),
                     nn::Flatten());
  nn::Conv2d c1(2, 4, 3, {.padding = 1, .bias = false}), c2(4, 5, 3, {.padding = 1});
  nn::BatchNorm2d b1(4), b2(5, {.momentum = std::nullopt});
  nn::ReLU r;
  nn::MaxPool2d p(2);
  nn::Sequential ref(c1, b1, r, p, c2, b2, nn::Flatten());  // handles: the modules' own forward, unfused below
  ref.load_state_dict(seq.state_dict());
  for (int step = 0; step < 2; ++step) {
    const TF x = normal_f({3, 2, 8, 8}, 60 + std::uint64_t(step));
    const TF gy = normal_f({3, 5 * 4 * 4}, 70 + std::uint64_t(step));
    seq.zero_grad();
    TF y = seq.forward(x);
    y.backward(gy);
    c1.zero_grad(), c2.zero_grad(), b1.zero_grad(), b2.zero_grad();
    TF h = p.forward(r.forward(b1.forward(c1.forward(x))));
    TF y2 = b2.forward(c2.forward(h)).flatten(1);
    y2.backward(gy);
    CHECK(ember_test::bitwise_equal(y.detach(), y2.detach()));
    const auto ps = seq.named_parameters<float>(), pr = ref.named_parameters<float>();
    REQUIRE(ps.size() == pr.size());
    for (std::size_t i = 0; i < ps.size(); ++i) {
      INFO(ps[i].first);
      CHECK(ember_test::bitwise_equal(ps[i].second.grad(), pr[i].second.grad()));
    }
  }
  // Running statistics and batch counts.
  const nn::StateDict sa = seq.state_dict(), sb = ref.state_dict();
  REQUIRE(sa.size() == sb.size());
  for (const auto& entry : sa) {  // not a structured binding: clang 14 cannot capture one in INFO's lambda
    const std::string& name = entry.first;
    INFO(name);
    if (const auto* f = std::get_if<TF>(&entry.second)) CHECK(ember_test::bitwise_equal(*f, std::get<TF>(sb.at(name))));
    else CHECK(std::get<Tensor<std::int64_t>>(entry.second).item() == std::get<Tensor<std::int64_t>>(sb.at(name)).item());
  }
  CHECK(std::get<Tensor<std::int64_t>>(sa.at("1.num_batches_tracked")).item() == 2);
  // The first group did run fused (one node on the tape), and a group without a pool stops at the batch norm's
  // output.
  nn::Sequential head(nn::Conv2d(2, 3, 3), nn::BatchNorm2d(3), nn::ReLU(), nn::MaxPool2d(2));
  const TF yh = head.forward(normal_f({2, 2, 8, 8}, 90));
  CHECK(yh.shape() == Shape({2, 3, 3, 3}));
  REQUIRE(yh.grad_fn());
  CHECK(std::string(yh.grad_fn()->name()) == "ConvBatchNormBackward");
  nn::Sequential nopool(nn::Conv2d(2, 3, 3), nn::BatchNorm2d(3), nn::MaxPool2d(3));
  const TF yn = nopool.forward(normal_f({2, 2, 8, 8}, 91));
  REQUIRE(yn.grad_fn());
  CHECK(std::string(yn.grad_fn()->name()) == "MaxPool2dBackward");
  // Evaluation mode: the modules one by one (running statistics), the same as the reference model.
  seq.eval();
  ref.eval();
  const TF xe = normal_f({2, 2, 8, 8}, 80);
  CHECK(ember_test::bitwise_equal(seq.forward(xe), ref.forward(xe)));
}

TEST_CASE("conv2d_batch_norm errors name the op, the shapes and what was expected") {
  const TF x = normal_f({2, 3, 6, 6}, 1), w = normal_f({4, 3, 3, 3}, 2);
  ember_test::expect_error(__LINE__, [&] { (void)conv2d_batch_norm(x, w, TF(), zeros<float>({3}), ones<float>({4}), TF(), TF()); },
                           {"batch_norm", "running_mean", "[3]", "4 channels"});
  ember_test::expect_error(__LINE__, [&] { (void)conv2d_batch_norm(x, w, TF(), zeros<float>({4}), TF(), TF(), TF()); },
                           {"conv2d_batch_norm", "both defined"});
  ember_test::expect_error(__LINE__,
                           [&] { (void)conv2d_batch_norm(normal_f({1, 3, 3, 3}, 3), w, TF(), TF(), TF(), TF(), TF()); },
                           {"conv2d_batch_norm", "more than 1 value per channel", "[1, 4, 1, 1]"});
  ops::ConvBnOptions pool;
  pool.pool2 = true;
  ember_test::expect_error(
      __LINE__, [&] { (void)conv2d_batch_norm(normal_f({2, 3, 3, 3}, 3), w, TF(), TF(), TF(), TF(), TF(), {}, pool); },
      {"conv2d_batch_norm", "2x2 max pool", "1x1"});
  ember_test::expect_error(__LINE__, [&] { (void)conv2d_batch_norm(x, normal_f({4, 2, 3, 3}, 4), TF(), TF(), TF(), TF(), TF()); },
                           {"conv2d", "channels"});
}
