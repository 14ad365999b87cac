// CUDA twin of test_norm.cpp's layer norm cases: layer_norm forward and backward on the device (cuda/norm.cuh) equal
// the CPU kernel (cpu/norm.hpp) on the same inputs of the same dtype, through ops and through autograd, for every
// dtype: odd row lengths on both sides of the warp-per-row / block-per-row switch, with and without weight and bias,
// data far from zero, non-contiguous inputs, empty inputs, and enough rows for many weight-gradient blocks. Every
// device case skips itself when no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_compare.hpp"

namespace {

/// The tolerance of one CPU-vs-CUDA comparison relative to the reference's largest magnitude: each side rounds
/// once into T from sums taken in different orders (fp32 or fp64 accumulation on both).
template <class T>
double ln_tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-11;
  else if constexpr (std::is_same_v<T, float>) return 2e-5;
  else if constexpr (std::is_same_v<T, ember::half>) return 4e-3;
  else return 3e-2;
}

struct LnCase {
  Shape x, ns;
  bool weight, bias;
  double shift;  // the data's offset from zero
};

std::vector<LnCase> ln_cases() {
  return {
      {Shape{5, 1}, Shape{1}, true, true, 0},             // one element per row: y = bias
      {Shape{3, 7}, Shape{7}, true, true, 0},             // shorter than a warp
      {Shape{130, 33}, Shape{33}, false, false, 0},       // a warp and one, more rows than one block
      {Shape{9, 1024}, Shape{1024}, true, false, 0},      // the longest warp-per-row row
      {Shape{4, 1025}, Shape{1025}, false, true, 0},      // the shortest block-per-row row
      {Shape{3, 4099}, Shape{4099}, true, true, 0},       // block per row with a tail
      {Shape{2, 3, 4, 5}, Shape{4, 5}, true, true, 0},    // two normalised dims
      {Shape{17, 300}, Shape{300}, true, true, 1000.0},   // far from zero: the split mean keeps its digits
      {Shape{20000, 8}, Shape{8}, true, true, 0},         // many rows: the weight gradient in 256 blocks
  };
}

template <class T>
void check_ln_case(const LnCase& c, std::uint64_t seed) {
  CAPTURE(c.x.str());
  CAPTURE(c.ns.str());
  CAPTURE(c.weight);
  CAPTURE(c.bias);
  // bfloat16 keeps 8 bits: data around 1000 would keep none of its spread.
  const double shift = std::is_same_v<T, ember::bfloat16> || std::is_same_v<T, ember::half> ? 0.0 : c.shift;
  const Tensor<T> x = seeded_randn<T>(c.x, seed, 1.0, shift), g = seeded_randn<T>(c.x, seed + 3);
  const Tensor<T> w = c.weight ? seeded_randn<T>(c.ns, seed + 1, 0.5, 1.0) : Tensor<T>();
  const Tensor<T> b = c.bias ? seeded_randn<T>(c.ns, seed + 2) : Tensor<T>();
  const auto ref = ops::layer_norm_forward(x, c.ns, w, b, 1e-5);
  const Tensor<T> X = to_dev(x), W = c.weight ? to_dev(w) : Tensor<T>(), B = c.bias ? to_dev(b) : Tensor<T>();
  const auto got = ops::layer_norm_forward(X, c.ns, W, B, 1e-5);
  expect_close_scaled(ref.y, got.y, ln_tol<T>(), "layer_norm forward");
  const i64 R = x.numel() / c.ns.numel();
  REQUIRE(got.save_mean.numel() == R);
  REQUIRE(got.save_rstd.numel() == R);
  expect_close_scaled(from_vector<double>(ref.mean, {R}), got.save_mean, 1e-6, "layer_norm per-row mean");
  expect_close_scaled(from_vector<double>(ref.rstd, {R}), got.save_rstd, 1e-5, "layer_norm per-row rstd");
  for (int need = 1; need < 8; ++need) {  // every subset of (dx, dweight, dbias)
    const bool ndx = need & 1, ndw = (need & 2) && c.weight, ndb = (need & 4) && c.bias;
    CAPTURE(need);
    const auto gr = ops::layer_norm_backward(g, x, c.ns, w, ref.mean, ref.rstd, ndx, ndw, ndb);
    const auto gd = ops::layer_norm_backward(to_dev(g), X, c.ns, W, {}, {}, ndx, ndw, ndb, got.save_mean,
                                             got.save_rstd);
    CHECK(gd.dx.defined() == ndx);
    CHECK(gd.dweight.defined() == ndw);
    CHECK(gd.dbias.defined() == ndb);
    if (ndx) expect_close_scaled(gr.dx, gd.dx, ln_tol<T>(), "layer_norm backward (input)");
    if (ndw) expect_close_scaled(gr.dweight, gd.dweight, ln_tol<T>(), "layer_norm backward (weight)");
    if (ndb) expect_close_scaled(gr.dbias, gd.dbias, ln_tol<T>(), "layer_norm backward (bias)");
  }
}

}  // namespace

TEST_CASE_TEMPLATE("cuda layer_norm forward and backward equal the CPU", T, float, double, ember::half,
                   ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  std::uint64_t seed = 700;
  for (const LnCase& c : ln_cases()) check_ln_case<T>(c, seed += 10);
}

TEST_CASE_TEMPLATE("cuda layer_norm through autograd: gradients of input, weight and bias equal the CPU", T, float,
                   double, ember::half, ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  const Shape xs{6, 5, 40}, ns{40};
  const Tensor<T> x = seeded_randn<T>(xs, 81), w = seeded_randn<T>(ns, 82, 0.5, 1.0), b = seeded_randn<T>(ns, 83);
  const Tensor<T> g = seeded_randn<T>(xs, 84);
  Tensor<T> xc = x.clone(), wc = w.clone(), bc = b.clone();
  Tensor<T> xd = to_dev(x), wd = to_dev(w), bd = to_dev(b);
  for (Tensor<T>* t : {&xc, &wc, &bc, &xd, &wd, &bd}) t->requires_grad_();
  Tensor<T> yc = ember::layer_norm(xc, ns, wc, bc, 1e-5), yd = ember::layer_norm(xd, ns, wd, bd, 1e-5);
  expect_close_scaled(yc, yd, ln_tol<T>(), "layer_norm forward");
  yc.backward(g);
  yd.backward(to_dev(g));
  expect_close_scaled(xc.grad(), xd.grad(), ln_tol<T>(), "x.grad");
  expect_close_scaled(wc.grad(), wd.grad(), ln_tol<T>(), "weight.grad");
  expect_close_scaled(bc.grad(), bd.grad(), ln_tol<T>(), "bias.grad");

  // nn::LayerNorm moved to the device trains there too.
  if constexpr (std::is_same_v<T, float>) {
    nn::LayerNorm lc(ns), ld(ns);
    ld.to(kDev);
    Tensor<float> xin = seeded_randn<float>(xs, 85);
    Tensor<float> oc = lc(xin), od = ld(to_dev(xin));
    expect_close_scaled(oc, od, ln_tol<float>(), "nn::LayerNorm forward");
    oc.backward(g);
    od.backward(to_dev(g));
    expect_close_scaled(lc.weight.grad(), ld.weight.grad(), ln_tol<float>(), "nn::LayerNorm weight.grad");
    expect_close_scaled(lc.bias.grad(), ld.bias.grad(), ln_tol<float>(), "nn::LayerNorm bias.grad");
  }
}

TEST_CASE("cuda layer_norm: non-contiguous inputs, empty inputs, and the errors") {
  SKIP_WITHOUT_CUDA();
  // A transposed view: the rows are not contiguous in memory.
  const Tensor<float> base = seeded_randn<float>({24, 10}, 91), w = seeded_randn<float>({24}, 92);
  const Tensor<float> b = seeded_randn<float>({24}, 93);
  const Tensor<float> xt = base.transpose(0, 1);  // (10, 24), strided
  const auto ref = ops::layer_norm_forward(xt, Shape{24}, w, b, 1e-5);
  const Tensor<float> Xt = to_dev(base).transpose(0, 1);
  REQUIRE_FALSE(Xt.is_contiguous());
  const auto got = ops::layer_norm_forward(Xt, Shape{24}, to_dev(w), to_dev(b), 1e-5);
  expect_close_scaled(ref.y, got.y, ln_tol<float>(), "layer_norm of a transposed view");
  const Tensor<float> g = seeded_randn<float>({24, 10}, 94).transpose(0, 1);
  const auto gr = ops::layer_norm_backward(g, xt, Shape{24}, w, ref.mean, ref.rstd, true, true, true);
  const auto gd = ops::layer_norm_backward(to_dev(seeded_randn<float>({24, 10}, 94)).transpose(0, 1), Xt, Shape{24},
                                           to_dev(w),
                                           {}, {}, true, true, true, got.save_mean, got.save_rstd);
  expect_close_scaled(gr.dx, gd.dx, ln_tol<float>(), "layer_norm backward of a transposed view (input)");
  expect_close_scaled(gr.dweight, gd.dweight, ln_tol<float>(), "layer_norm backward of a transposed view (weight)");
  expect_close_scaled(gr.dbias, gd.dbias, ln_tol<float>(), "layer_norm backward of a transposed view (bias)");

  // No rows: an empty output, zero weight and bias gradients.
  const Tensor<float> e = empty<float>({0, 6}, kDev), we = to_dev(ones<float>({6}));
  const auto ye = ops::layer_norm_forward(e, Shape{6}, we, we, 1e-5);
  CHECK(ye.y.shape() == Shape{0, 6});
  CHECK(ye.y.device() == kDev);
  const auto ge = ops::layer_norm_backward(e, e, Shape{6}, we, {}, {}, true, true, true, ye.save_mean, ye.save_rstd);
  CHECK(ge.dx.shape() == Shape{0, 6});
  expect_close_scaled(zeros<float>({6}), ge.dweight, 0.0, "dweight of no rows");
  expect_close_scaled(zeros<float>({6}), ge.dbias, 0.0, "dbias of no rows");

  // The backward on CUDA needs the device statistics of the forward.
  const Tensor<float> X = to_dev(seeded_randn<float>({3, 8}, 95));
  CHECK_THROWS_WITH_AS((void)ops::layer_norm_backward(X, X, Shape{8}, Tensor<float>(), {}, {}, true, false, false),
                       doctest::Contains("layer_norm_backward: on CUDA the forward's per-row statistics are needed"),
                       Error);
  // A gradient on another device than the input is named.
  CHECK_THROWS_WITH_AS(
      (void)ops::layer_norm_backward(seeded_randn<float>({3, 8}, 96), X, Shape{8}, Tensor<float>(), {}, {}, true, false,
                                     false),
      doctest::Contains("layer_norm_backward: the gradient is on cpu but the input of shape [3, 8] is on cuda:0"),
      Error);
}
