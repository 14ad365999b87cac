// CUDA twins of the matmul / conv / pooling / batch-norm / softmax tests: each runs the op on the device (cuBLAS,
// cuBLASLt, cuDNN) and compares it with the CPU path in double on the same random inputs, forward and backward, for
// every dtype. Every device case skips itself when no CUDA device is present; the host-only cases (the convolution
// algorithm cache's keys, errors raised before any device work) always run.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using ember_test::error_of;
using i64 = std::int64_t;

namespace {

#define SKIP_WITHOUT_DEVICE()                  \
  if (!ember::cuda::is_available()) {          \
    MESSAGE("skipped: no CUDA device");        \
    return;                                    \
  }

/// A host tensor copied to device 0, and a device tensor copied back (Tensor::to).
template <class T>
Tensor<T> to_dev(const Tensor<T>& h) {
  return h.to(Device::cuda(0));
}
template <class T>
Tensor<T> to_host(const Tensor<T>& d) {
  REQUIRE(d.device().is_cuda());
  return d.to(Device::cpu());
}

/// Random normal values rounded to T (on the host).
template <class T>
Tensor<T> rnd(const Shape& s, std::uint64_t seed, double scale = 1.0) {
  Generator g(seed);
  Tensor<double> x = randn<double>(s, g);
  Tensor<T> r = cast<T>(x * scale);
  return r;
}

template <class T>
Tensor<double> dbl(const Tensor<T>& t) {
  Tensor<double> r = cast<double>(t);
  return r;
}

/// Relative tolerance per dtype, against the largest magnitude of the reference (fp32 with fp32 accumulation,
/// fp16/bf16 rounding of the output, fp64).
template <class T>
double rtol() {
  if constexpr (std::is_same_v<T, double>) return 1e-11;
  else if constexpr (std::is_same_v<T, float>) return 2e-5;
  else if constexpr (std::is_same_v<T, ember::half>) return 4e-3;
  else return 3e-2;
}

/// |got - ref| <= tol * max(1, max|ref|) everywhere (got from the device, ref in double on the host); NaN only where
/// the reference is NaN (the mean of an empty batch, as PyTorch's).
template <class T>
void expect_close(const Tensor<T>& got_dev, const Tensor<double>& ref, double tol, const std::string& what) {
  const Tensor<double> g = dbl(to_host(got_dev));
  REQUIRE_MESSAGE(g.shape() == ref.shape(), what, ": shape ", g.shape().str(), " vs ", ref.shape().str());
  const Tensor<double> r = ref.contiguous();
  double scale = 1, worst = 0;
  i64 at = -1;
  for (i64 i = 0; i < r.numel(); ++i)
    if (!std::isnan(r.data()[i])) scale = std::max(scale, std::abs(r.data()[i]));
  for (i64 i = 0; i < r.numel(); ++i) {
    const bool both_nan = std::isnan(g.data()[i]) && std::isnan(r.data()[i]);
    const double e = both_nan ? 0.0 : std::abs(g.data()[i] - r.data()[i]);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
    }
  }
  CHECK_MESSAGE(worst <= tol * scale, what, ": max error ", worst, " at ", at, " (tolerance ", tol * scale,
                ", dtype ", std::string(dtype_name<T>()), ")");
}

template <class T>
Tensor<T> fake_cuda(const Shape& s, std::vector<T>& backing) {
  backing.assign(std::size_t(s.numel()), T(0));
  return from_blob(backing.data(), s, {}, Device::cuda(0));
}

}  // namespace

// ---- host-only: the convolution algorithm cache ---------------------------------------------------------------

TEST_CASE("cuda conv algo cache: different problems get different keys, equal problems hit") {
  cuda::ConvProblem p;
  p.pass = cuda::ConvPass::forward;
  p.device = Device::cuda(0);
  p.dtype = 0;
  p.compute_dtype = 0;
  p.x_shape = Shape{8, 16, 32, 32};
  p.x_strides = contiguous_strides(p.x_shape);
  p.w_shape = Shape{32, 16, 3, 3};
  p.y_shape = Shape{8, 32, 32, 32};
  p.y_strides = contiguous_strides(p.y_shape);
  p.window.ph = p.window.pw = 1;
  const cuda::ConvKey k = cuda::make_conv_key(p);
  CHECK(k == cuda::make_conv_key(p));
  CHECK(cuda::ConvKeyHash{}(k) == cuda::ConvKeyHash{}(cuda::make_conv_key(p)));

  // Every field matters.
  std::vector<cuda::ConvProblem> variants;
  auto vary = [&](auto f) {
    cuda::ConvProblem q = p;
    f(q);
    variants.push_back(q);
  };
  vary([](auto& q) { q.pass = cuda::ConvPass::backward_data; });
  vary([](auto& q) { q.pass = cuda::ConvPass::backward_filter; });
  vary([](auto& q) { q.device = Device::cuda(1); });
  vary([](auto& q) { q.dtype = 2; });
  vary([](auto& q) { q.compute_dtype = 1; });
  vary([](auto& q) { q.x_shape = Shape{4, 16, 32, 32}; });
  vary([](auto& q) { q.x_strides = Shape{16 * 32 * 32, 1, 32 * 16, 16}; });  // NHWC strides
  vary([](auto& q) { q.w_shape = Shape{32, 16, 5, 5}; });
  vary([](auto& q) { q.y_shape = Shape{8, 32, 16, 16}; });
  vary([](auto& q) { q.y_strides = Shape{1, 2, 3, 4}; });
  vary([](auto& q) { q.window.ph = 0; });
  vary([](auto& q) { q.window.pw = 2; });
  vary([](auto& q) { q.window.sh = 2; });
  vary([](auto& q) { q.window.sw = 2; });
  vary([](auto& q) { q.window.dh = 2; });
  vary([](auto& q) { q.window.dw = 2; });
  vary([](auto& q) { q.groups = 2; });
  vary([](auto& q) { q.allow_tf32 = true; });
  vary([](auto& q) { q.layout = 1; });
  vary([](auto& q) { q.x_shape = Shape{8, 16, 32}; });  // fewer dims is another problem
  for (std::size_t i = 0; i < variants.size(); ++i) {
    CAPTURE(i);
    CHECK(cuda::make_conv_key(variants[i]) != k);
    for (std::size_t j = 0; j < i; ++j) CHECK(cuda::make_conv_key(variants[i]) != cuda::make_conv_key(variants[j]));
  }

  // get_or_choose chooses once per problem.
  cuda::ConvAlgoCache cache;
  int chosen = 0;
  auto choose = [&] {
    ++chosen;
    return cuda::ConvAlgo{chosen, 0, std::size_t(64 * chosen)};
  };
  const cuda::ConvAlgo a1 = cache.get_or_choose(k, choose);
  const cuda::ConvAlgo a2 = cache.get_or_choose(cuda::make_conv_key(p), choose);
  CHECK(chosen == 1);
  CHECK(a1.algo == a2.algo);
  CHECK(a2.workspace == 64);
  const cuda::ConvAlgo b = cache.get_or_choose(cuda::make_conv_key(variants[0]), choose);
  CHECK(chosen == 2);
  CHECK(b.algo == 2);
  CHECK(cache.size() == 2);
  CHECK(cache.find(k).has_value());
  cache.clear();
  CHECK_FALSE(cache.find(k).has_value());
}

// ---- host-only: errors raised before any device work ----------------------------------------------------------

TEST_CASE("cuda libs: mixed devices and unsupported options are errors naming both") {
  std::vector<float> hb, hc;
  Tensor<float> a = ones<float>({3, 4});
  Tensor<float> bc = fake_cuda<float>({4, 5}, hb);
  std::string m = error_of([&] { (void)ops::mm(a, bc); });
  CHECK(m.find("mm") != std::string::npos);
  CHECK(m.find("cpu") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  Tensor<float> a3 = ones<float>({2, 3, 4});
  Tensor<float> b3 = fake_cuda<float>({2, 4, 5}, hb);
  m = error_of([&] { (void)ops::bmm(a3, b3); });
  CHECK(m.find("bmm") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  Tensor<float> w = fake_cuda<float>({5, 4}, hc);
  m = error_of([&] { (void)ops::linear(a, w); });
  CHECK(m.find("linear") != std::string::npos);
  CHECK(m.find("cpu") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);
  Tensor<float> x = ones<float>({1, 2, 5, 5});
  Tensor<float> wc = fake_cuda<float>({3, 2, 3, 3}, hc);
  m = error_of([&] { (void)ops::conv2d(x, wc); });
  CHECK(m.find("conv2d") != std::string::npos);
  CHECK(m.find("cuda:0") != std::string::npos);

  std::vector<float> hx;
  Tensor<float> xc = fake_cuda<float>({1, 2, 7, 7}, hx);
  m = error_of([&] { (void)ops::max_pool2d_with_indices(xc, Size2(2), {}, true); });
  CHECK(m.find("indices are not computed on CUDA") != std::string::npos);
  Pool2dOptions dil;
  dil.dilation = Size2(2);
  m = error_of([&] { (void)ops::max_pool2d_with_indices(xc, Size2(2), dil, false); });
  CHECK(m.find("dilation") != std::string::npos);
  Pool2dOptions ceil;
  ceil.ceil_mode = true;
  m = error_of([&] { (void)ops::avg_pool2d(xc, Size2(2), ceil); });  // 7 -> 3 (floor) or 4 (ceil)
  CHECK(m.find("ceil_mode") != std::string::npos);
  m = error_of([&] { (void)ops::adaptive_avg_pool2d(xc, Size2(3, 3)); });  // 7 is not a multiple of 3
  CHECK(m.find("must divide") != std::string::npos);
  std::vector<float> hg;
  Tensor<float> g = fake_cuda<float>({1, 2, 7, 7}, hg);
  m = error_of([&] {
    (void)ops::batch_norm_backward(g, xc, Tensor<float>(), {}, {}, /*training=*/false, true, false, false);
  });
  CHECK(m.find("evaluation mode") != std::string::npos);
}

// ---- matmul / bmm / linear --------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cuda mm equals the CPU: plain, transposed and strided operands, accumulate", T, float, double,
                   ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  const i64 m = 33, k = 64, n = 17;
  const Tensor<T> a = rnd<T>({m, k}, 1), b = rnd<T>({k, n}, 2);
  const Tensor<T> at = rnd<T>({k, m}, 3), bt = rnd<T>({n, k}, 4);
  const Tensor<double> ad = dbl(a), bd = dbl(b), atd = dbl(at), btd = dbl(bt);
  const Tensor<T> A = to_dev(a), B = to_dev(b), AT = to_dev(at), BT = to_dev(bt);
  expect_close(ops::mm(A, B), ops::mm(ad, bd), rtol<T>(), "a @ b");
  expect_close(ops::mm(AT.t(), B), ops::mm(atd.t(), bd), rtol<T>(), "a^T @ b");
  expect_close(ops::mm(A, BT.t()), ops::mm(ad, btd.t()), rtol<T>(), "a @ b^T");
  expect_close(ops::mm(AT.t(), BT.t()), ops::mm(atd.t(), btd.t()), rtol<T>(), "a^T @ b^T");
  // Every other column: no unit stride, copied first.
  const Tensor<T> wide = rnd<T>({m, 2 * k}, 5);
  expect_close(ops::mm(to_dev(wide).slice(1, 0, 2 * k, 2), B), ops::mm(dbl(wide).slice(1, 0, 2 * k, 2), bd),
               rtol<T>(), "strided a @ b");
  // Accumulate: c += a @ b.
  const Tensor<T> c0 = rnd<T>({m, n}, 6);
  Tensor<T> C = to_dev(c0);
  ops::mm_into(C, A, B, /*accumulate=*/true);
  Tensor<double> ref = ops::mm(ad, bd);
  Tensor<double> c0d = dbl(c0);
  Tensor<double> acc = ref + c0d;
  expect_close(C, acc, rtol<T>(), "c += a @ b");
  // Empty inner dimension: zeros.
  const Tensor<T> e1 = to_dev(rnd<T>({m, 0}, 7)), e2 = to_dev(rnd<T>({0, n}, 8));
  expect_close(ops::mm(e1, e2), zeros<double>({m, n}), rtol<T>(), "k = 0");
}

TEST_CASE_TEMPLATE("cuda bmm equals the CPU: plain, transposed and broadcast batches", T, float, double,
                   ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  const i64 B = 3, m = 9, k = 24, n = 11;
  const Tensor<T> a = rnd<T>({B, m, k}, 11), b = rnd<T>({B, k, n}, 12), bt = rnd<T>({B, n, k}, 13);
  const Tensor<double> ad = dbl(a), bd = dbl(b), btd = dbl(bt);
  expect_close(ops::bmm(to_dev(a), to_dev(b)), ops::bmm(ad, bd), rtol<T>(), "bmm");
  expect_close(ops::bmm(to_dev(a), to_dev(bt).transpose(1, 2)), ops::bmm(ad, btd.transpose(1, 2)), rtol<T>(),
               "bmm a @ b^T");
  const Tensor<T> b1 = rnd<T>({1, k, n}, 14);
  expect_close(ops::bmm(to_dev(a), to_dev(b1).expand({B, k, n})), ops::bmm(ad, dbl(b1).expand({B, k, n})),
               rtol<T>(), "bmm with a broadcast batch (stride 0)");
}

TEST_CASE_TEMPLATE("cuda linear with cuBLASLt epilogues equals the CPU", T, float, double, ember::half,
                   ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  const i64 K = 40, N = 24;
  const Tensor<T> x = rnd<T>({2, 7, K}, 21), w = rnd<T>({N, K}, 22), wt = rnd<T>({K, N}, 23), b = rnd<T>({N}, 24);
  const Tensor<double> xd = dbl(x), wd = dbl(w), wtd = dbl(wt), bd = dbl(b);
  const Tensor<T> X = to_dev(x), W = to_dev(w), WT = to_dev(wt), Bv = to_dev(b);
  for (auto act : {Activation::none, Activation::relu, Activation::gelu_tanh, Activation::gelu,
                   Activation::silu}) {
    CAPTURE(int(act));
    expect_close(ops::linear(X, W, Bv, act), ops::linear(xd, wd, bd, act), rtol<T>(), "linear + bias (+ act)");
    expect_close(ops::linear(X, WT.t(), Bv, act), ops::linear(xd, wtd.t(), bd, act), rtol<T>(),
                 "linear with a transposed weight");
    expect_close(ops::linear(X, W, Tensor<T>(), act), ops::linear(xd, wd, Tensor<double>(), act), rtol<T>(),
                 "linear without bias");
  }
  // The autograd entry point takes the fused path when nothing needs a gradient.
  expect_close(ember::linear(X, W, Bv), ops::linear(xd, wd, bd), rtol<T>(), "ember::linear");
}

TEST_CASE("cuda mm: TF32 is opt-in and stays close") {
  SKIP_WITHOUT_DEVICE();
  CHECK_FALSE(cuda::allow_tf32());
  const Tensor<float> a = rnd<float>({64, 256}, 31), b = rnd<float>({256, 48}, 32);
  cuda::set_allow_tf32(true);
  CHECK(cuda::allow_tf32());
  Tensor<float> c = ops::mm(to_dev(a), to_dev(b));
  cuda::set_allow_tf32(false);
  expect_close(c, ops::mm(dbl(a), dbl(b)), 5e-3, "TF32 mm");
}

TEST_CASE("cuda mm and bmm: autograd backward equals the CPU") {
  SKIP_WITHOUT_DEVICE();
  const Tensor<double> a = rnd<double>({5, 6}, 41), b = rnd<double>({6, 4}, 42), g = rnd<double>({5, 4}, 43);
  Tensor<double> A = to_dev(a), B = to_dev(b);
  A.requires_grad_();
  B.requires_grad_();
  Tensor<double> y = ember::mm(A, B);
  y.backward(to_dev(g));
  expect_close(A.grad(), ops::mm(g, b.t()), 1e-11, "d a");
  expect_close(B.grad(), ops::mm(a.t(), g), 1e-11, "d b");
}

// ---- conv2d -------------------------------------------------------------------------------------------------------

namespace {
struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
  const char* name;
};
std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cs;
  cs.push_back({Shape{2, 4, 9, 8}, Shape{6, 4, 3, 3}, Conv2dOptions{}, "3x3"});
  Conv2dOptions pad;
  pad.padding = Size2(1);
  cs.push_back({Shape{2, 4, 9, 8}, Shape{6, 4, 3, 3}, pad, "3x3 pad 1"});
  Conv2dOptions sd;
  sd.stride = Size2(2);
  sd.dilation = Size2(2);
  sd.padding = Size2(2, 1);
  cs.push_back({Shape{3, 3, 11, 10}, Shape{5, 3, 3, 2}, sd, "stride 2 dilation 2"});
  Conv2dOptions gr;
  gr.groups = 2;
  gr.stride = Size2(2, 1);
  gr.padding = Size2(1, 2);
  cs.push_back({Shape{2, 6, 8, 7}, Shape{4, 3, 3, 3}, gr, "groups 2"});
  Conv2dOptions dw;
  dw.groups = 4;
  dw.padding = Size2(1);
  cs.push_back({Shape{2, 4, 6, 6}, Shape{8, 1, 3, 3}, dw, "depthwise x2"});
  return cs;
}

/// cuDNN may pick FFT or Winograd algorithms, whose fp32 rounding is coarser than a direct sum's.
template <class T>
double conv_tol() {
  return std::is_same_v<T, float> ? 2e-4 : rtol<T>();
}

template <class T>
void check_conv_case(const ConvCase& c, std::uint64_t seed) {
  CAPTURE(c.name);
  const Tensor<T> x = rnd<T>(c.x, seed), w = rnd<T>(c.w, seed + 1), b = rnd<T>({c.w[0]}, seed + 2);
  const Tensor<double> xd = dbl(x), wd = dbl(w), bd = dbl(b);
  const Tensor<double> yd = ops::conv2d(xd, wd, bd, c.o);
  const Tensor<T> X = to_dev(x), W = to_dev(w), Bv = to_dev(b);
  expect_close(ops::conv2d(X, W, Bv, c.o), yd, conv_tol<T>(), "conv2d forward");
  const Tensor<T> g = rnd<T>(yd.shape(), seed + 3);
  const auto ref = ops::conv2d_backward(dbl(g), xd, wd, c.o, true, true, true);
  const auto got = ops::conv2d_backward(to_dev(g), X, W, c.o, true, true, true);
  expect_close(got.input, ref.input, conv_tol<T>(), "conv2d backward (input)");
  expect_close(got.weight, ref.weight, conv_tol<T>(), "conv2d backward (weight)");
  expect_close(got.bias, ref.bias, conv_tol<T>(), "conv2d backward (bias)");
}
}  // namespace

TEST_CASE_TEMPLATE("cuda conv2d forward and backward equal the CPU, benchmark mode off and on", T, float, double,
                   ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  for (bool bench : {false, true}) {
    CAPTURE(bench);
    cuda::set_benchmark(bench);
    std::uint64_t seed = 100;
    for (const ConvCase& c : conv_cases()) check_conv_case<T>(c, seed += 10);
    CHECK(cuda::conv_algo_cache(bench).size() > 0);
  }
  cuda::set_benchmark(false);
}

TEST_CASE("cuda conv2d with a fused activation equals the CPU epilogue") {
  SKIP_WITHOUT_DEVICE();
  const Tensor<float> x = rnd<float>({2, 3, 9, 8}, 31), w = rnd<float>({5, 3, 3, 3}, 32), b = rnd<float>({5}, 33);
  const Conv2dOptions co{.padding = 1};
  for (auto act : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    CAPTURE(int(act));
    expect_close(ops::conv2d(to_dev(x), to_dev(w), to_dev(b), co, act), dbl(ops::conv2d(x, w, b, co, act)),
                 rtol<float>(), "conv2d + bias + act");
  }
}

TEST_CASE("cuda conv2d: the algorithm cache is filled once per problem") {
  SKIP_WITHOUT_DEVICE();
  cuda::set_benchmark(true);
  cuda::conv_algo_cache(true).clear();
  const Tensor<float> X = to_dev(rnd<float>({2, 8, 12, 12}, 51)), W = to_dev(rnd<float>({8, 8, 3, 3}, 52));
  Conv2dOptions o;
  o.padding = Size2(1);
  const Tensor<float> y1 = ops::conv2d(X, W, Tensor<float>(), o);
  CHECK(cuda::conv_algo_cache(true).size() == 1);
  const Tensor<float> y2 = ops::conv2d(X, W, Tensor<float>(), o);
  CHECK(cuda::conv_algo_cache(true).size() == 1);  // same problem: a hit
  o.stride = Size2(2);
  (void)ops::conv2d(X, W, Tensor<float>(), o);
  CHECK(cuda::conv_algo_cache(true).size() == 2);  // a new problem
  cuda::set_benchmark(false);
  expect_close(y2, dbl(to_host(y1)), 0.0, "the cached algorithm gives the same result");
}

TEST_CASE("cuda conv2d: autograd backward equals the CPU") {
  SKIP_WITHOUT_DEVICE();
  Conv2dOptions o;
  o.padding = Size2(1);
  o.groups = 2;
  const Tensor<double> x = rnd<double>({2, 4, 7, 6}, 61), w = rnd<double>({6, 2, 3, 3}, 62), b = rnd<double>({6}, 63);
  Tensor<double> X = to_dev(x), W = to_dev(w), Bv = to_dev(b);
  for (Tensor<double>* t : {&X, &W, &Bv}) t->requires_grad_();
  Tensor<double> y = ember::conv2d(X, W, Bv, o);
  const Tensor<double> g = rnd<double>(y.shape(), 64);
  y.backward(to_dev(g));
  const auto ref = ops::conv2d_backward(g, x, w, o, true, true, true);
  expect_close(X.grad(), ref.input, 1e-11, "d x");
  expect_close(W.grad(), ref.weight, 1e-11, "d w");
  expect_close(Bv.grad(), ref.bias, 1e-11, "d b");
}

// ---- pooling ------------------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cuda max_pool2d forward and backward equal the CPU", T, float, double) {
  SKIP_WITHOUT_DEVICE();
  Pool2dOptions o;
  o.stride = Size2(2);
  o.padding = Size2(1);
  const Tensor<T> x = rnd<T>({2, 3, 9, 8}, 71);
  const Tensor<double> xd = dbl(x);
  auto [yd, idx] = ops::max_pool2d_with_indices(xd, Size2(3), o, true);
  const Tensor<T> X = to_dev(x);
  const Tensor<T> Y = ops::max_pool2d_with_indices(X, Size2(3), o, false).first;
  expect_close(Y, yd, 0.0, "max_pool2d forward (exact)");
  const Tensor<T> g = rnd<T>(yd.shape(), 72);
  expect_close(ops::max_pool2d_backward(to_dev(g), X, Y, Size2(3), o),
               ops::max_pool2d_backward(dbl(g), idx, xd.shape()), rtol<T>(), "max_pool2d backward");
  // The same through autograd.
  Tensor<T> Xg = to_dev(x);
  Xg.requires_grad_();
  Tensor<T> y = ember::max_pool2d(Xg, Size2(3), o);
  y.backward(to_dev(g));
  expect_close(Xg.grad(), ops::max_pool2d_backward(dbl(g), idx, xd.shape()), rtol<T>(), "max_pool2d autograd");
}

TEST_CASE_TEMPLATE("cuda avg_pool2d and adaptive_avg_pool2d equal the CPU", T, float, double, ember::half,
                   ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  const Tensor<T> x = rnd<T>({2, 3, 8, 8}, 81);
  const Tensor<double> xd = dbl(x);
  const Tensor<T> X = to_dev(x);
  for (bool include : {true, false}) {
    CAPTURE(include);
    Pool2dOptions o;
    o.stride = Size2(2);
    o.padding = Size2(1);
    o.count_include_pad = include;
    const Tensor<double> yd = ops::avg_pool2d(xd, Size2(3), o);
    expect_close(ops::avg_pool2d(X, Size2(3), o), yd, rtol<T>(), "avg_pool2d forward");
    const Tensor<T> g = rnd<T>(yd.shape(), 82);
    expect_close(ops::avg_pool2d_backward(to_dev(g), x.shape(), Size2(3), o),
                 ops::avg_pool2d_backward(dbl(g), xd.shape(), Size2(3), o), rtol<T>(), "avg_pool2d backward");
  }
  const Tensor<double> ad = ops::adaptive_avg_pool2d(xd, Size2(2, 4));
  expect_close(ops::adaptive_avg_pool2d(X, Size2(2, 4)), ad, rtol<T>(), "adaptive_avg_pool2d forward");
  const Tensor<T> g = rnd<T>(ad.shape(), 83);
  expect_close(ops::adaptive_avg_pool2d_backward(to_dev(g), x.shape()),
               ops::adaptive_avg_pool2d_backward(dbl(g), xd.shape()), rtol<T>(), "adaptive_avg_pool2d backward");
}

// ---- batch norm ---------------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cuda batch_norm training, running statistics, eval and backward equal the CPU", T, float, double,
                   ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{8, 5}, Shape{2, 3, 4, 2, 3}}) {
    CAPTURE(s.str());
    const i64 C = s[1];
    const Tensor<T> x = rnd<T>(s, 91, 2.0), w = rnd<T>({C}, 92), b = rnd<T>({C}, 93);
    const Tensor<T> rm0 = rnd<T>({C}, 94, 0.1);
    Tensor<T> rv0 = rnd<T>({C}, 95, 0.1);
    rv0 = cast<T>(abs(cast<double>(rv0)) + 1.0);
    // CPU reference in double.
    Tensor<double> rmd = dbl(rm0), rvd = dbl(rv0);
    const auto ref = ops::batch_norm_forward(dbl(x), rmd, rvd, dbl(w), dbl(b), true, 0.1, 1e-5);
    // Device.
    Tensor<T> RM = to_dev(rm0), RV = to_dev(rv0);
    const Tensor<T> X = to_dev(x), W = to_dev(w), Bv = to_dev(b);
    const auto got = ops::batch_norm_forward(X, RM, RV, W, Bv, true, 0.1, 1e-5);
    expect_close(got.y, ref.y, rtol<T>() * 4, "batch_norm training forward");
    expect_close(RM, rmd, rtol<T>(), "running_mean after one step");
    expect_close(RV, rvd, rtol<T>(), "running_var after one step (unbiased)");
    // Backward.
    const Tensor<T> g = rnd<T>(s, 96);
    const auto gref = ops::batch_norm_backward(dbl(g), dbl(x), dbl(w), ref.mean, ref.invstd, true, true, true, true);
    const auto ggot = ops::batch_norm_backward(to_dev(g), X, W, {}, {}, true, true, true, true, got.save_mean,
                                               got.save_invstd, 1e-5);
    expect_close(ggot.dx, gref.dx, rtol<T>() * 4, "batch_norm backward (input)");
    expect_close(ggot.dweight, gref.dweight, rtol<T>() * 4, "batch_norm backward (weight)");
    expect_close(ggot.dbias, gref.dbias, rtol<T>() * 4, "batch_norm backward (bias)");
    // Eval with the updated running statistics; without weight and bias.
    const auto eref = ops::batch_norm_forward(dbl(x), dbl(to_host(RM)), dbl(to_host(RV)), Tensor<double>(),
                                              Tensor<double>(), false, 0.1, 1e-5);
    const auto egot = ops::batch_norm_forward(X, RM, RV, Tensor<T>(), Tensor<T>(), false, 0.1, 1e-5);
    expect_close(egot.y, eref.y, rtol<T>() * 4, "batch_norm eval forward");
  }
}

TEST_CASE("cuda batch_norm: autograd backward equals the CPU") {
  SKIP_WITHOUT_DEVICE();
  const Tensor<double> x = rnd<double>({4, 3, 5, 5}, 101), w = rnd<double>({3}, 102), b = rnd<double>({3}, 103);
  const Tensor<double> g = rnd<double>(x.shape(), 104);
  Tensor<double> X = to_dev(x), W = to_dev(w), Bv = to_dev(b);
  for (Tensor<double>* t : {&X, &W, &Bv}) t->requires_grad_();
  Tensor<double> y = ember::batch_norm(X, Tensor<double>(), Tensor<double>(), W, Bv, true);
  y.backward(to_dev(g));
  const auto f = ops::batch_norm_forward(x, Tensor<double>(), Tensor<double>(), w, b, true, 0.1, 1e-5);
  const auto ref = ops::batch_norm_backward(g, x, w, f.mean, f.invstd, true, true, true, true);
  expect_close(X.grad(), ref.dx, 1e-10, "d x");
  expect_close(W.grad(), ref.dweight, 1e-10, "d w");
  expect_close(Bv.grad(), ref.dbias, 1e-10, "d b");
}

TEST_CASE("cuda BatchNorm2d module moved with to(): batches counted, running statistics and eval equal the CPU") {
  SKIP_WITHOUT_DEVICE();
  for (const std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    CAPTURE(momentum.has_value());
    nn::BatchNormT<2, amp::Policy<double, double, double>> cpu_bn(3, {.momentum = momentum}),
        dev_bn(3, {.momentum = momentum});
    dev_bn.to(Device::cuda());
    REQUIRE(dev_bn.num_batches_tracked.device().is_cuda());
    for (int step = 0; step < 3; ++step) {
      const Tensor<double> x = rnd<double>({4, 3, 5, 5}, 200 + std::uint64_t(step));
      expect_close(dev_bn(to_dev(x)), cpu_bn(x), 1e-10, "training output");
    }
    CHECK(dev_bn.num_batches_tracked.item() == 3);
    CHECK(cpu_bn.num_batches_tracked.item() == 3);
    expect_close(dev_bn.running_mean, cpu_bn.running_mean, 1e-12, "running_mean");
    expect_close(dev_bn.running_var, cpu_bn.running_var, 1e-12, "running_var");
    cpu_bn.eval();
    dev_bn.eval();
    const Tensor<double> x = rnd<double>({2, 3, 4, 4}, 300);
    expect_close(dev_bn(to_dev(x)), cpu_bn(x), 1e-12, "eval output");
    CHECK(dev_bn.num_batches_tracked.item() == 3);
  }
}

TEST_CASE("cuda dropout and nn::init on device tensors draw what the CPU draws; layer_norm across devices is an error") {
  SKIP_WITHOUT_DEVICE();
  const Tensor<float> x = randn<float>({64, 33});
  Generator gc(5), gd(5);
  expect_close(nn::functional::dropout(to_dev(x), 0.3, true, gd), dbl(nn::functional::dropout(x, 0.3, true, gc)),
               1e-6, "dropout");
  Tensor<float> wc = empty<float>({20, 7}), wd = empty<float>({20, 7}, Device::cuda());
  Generator g1(6), g2(6);
  nn::init::normal_(wc, 0.5, 2.0, g1);
  nn::init::normal_(wd, 0.5, 2.0, g2);
  expect_close(wd, dbl(wc), 1e-6, "init::normal_");
  nn::init::uniform_(wc, -1.0, 3.0, g1);
  nn::init::uniform_(wd, -1.0, 3.0, g2);
  expect_close(wd, dbl(wc), 1e-6, "init::uniform_");
  nn::LayerNorm ln(Shape{33});
  ln.to(Device::cuda());
  CHECK_THROWS_WITH_AS(ln(x), doctest::Contains("layer_norm: weight is on cuda:0 but the input of shape [64, 33] is on cpu"),
                       Error);
}

// ---- softmax ------------------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cuda softmax and log_softmax along every dim equal the CPU, forward and backward", T, float,
                   double, ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  const Tensor<T> x = rnd<T>({4, 7, 5}, 111, 3.0), g = rnd<T>({4, 7, 5}, 112);
  const Tensor<double> xd = dbl(x), gd = dbl(g);
  const Tensor<T> X = to_dev(x), G = to_dev(g);
  for (i64 dim : {0, 1, 2, -1}) {
    CAPTURE(dim);
    const Tensor<double> s = ops::softmax(xd, dim), ls = ops::log_softmax(xd, dim);
    const Tensor<T> S = ops::softmax(X, dim), LS = ops::log_softmax(X, dim);
    expect_close(S, s, rtol<T>(), "softmax");
    expect_close(LS, ls, rtol<T>(), "log_softmax");
    // Backward from the device's own outputs (rounded to T), against the CPU on those same outputs.
    const Tensor<double> sd = dbl(to_host(S)), lsd = dbl(to_host(LS));
    expect_close(ops::softmax_backward(S, G, dim), ops::softmax_backward(sd, gd, dim), rtol<T>(), "softmax backward");
    expect_close(ops::log_softmax_backward(LS, G, dim), ops::log_softmax_backward(lsd, gd, dim), rtol<T>(),
                 "log_softmax backward");
  }
  // Through autograd.
  Tensor<T> Xg = to_dev(x);
  Xg.requires_grad_();
  Tensor<T> y = ember::log_softmax(Xg, 1);
  y.backward(G);
  expect_close(Xg.grad(), ops::log_softmax_backward(dbl(to_host(y)), gd, 1), rtol<T>(), "log_softmax autograd");
}

// ---- class-index losses, gradient clipping and loss scaling on CUDA ------------------------------------------------

TEST_CASE_TEMPLATE("cuda cross_entropy and nll_loss equal the CPU: weights, ignore_index, smoothing, (N, C, d)", T,
                   float, double, ember::half, ember::bfloat16) {
  SKIP_WITHOUT_DEVICE();
  // (N, C) with C above a warp and (N, C, d1, d2) with the class dim strided; some targets ignored.
  for (const Shape& s : {Shape{9, 45}, Shape{3, 5, 4, 3}, Shape{0, 6}, Shape{7}}) {
    const i64 C = s.n == 1 ? s[0] : s[1];
    Shape ts;
    if (s.n > 1) {
      ts.push_back(s[0]);
      for (int i = 2; i < s.n; ++i) ts.push_back(s[i]);
    }
    Tensor<i64> t = empty<i64>(ts);
    for (i64 i = 0; i < t.numel(); ++i) t.data()[i] = i % 5 == 3 ? -100 : (i * 7 + 3) % C;
    const Tensor<T> x = rnd<T>(s, 200, 4.0), w = cast<T>(rnd<double>({C}, 201) * 0.3 + 1.0);
    const Tensor<double> xd = dbl(x), wd = dbl(w);
    for (const bool weighted : {false, true})
      for (const double eps : {0.0, 0.2})
        for (const auto r : {nn::Reduction::Mean, nn::Reduction::Sum, nn::Reduction::None}) {
          CAPTURE(s.str());
          CAPTURE(weighted);
          CAPTURE(eps);
          CAPTURE(int(r));
          nn::CrossEntropyOptions<double> od;
          nn::CrossEntropyOptions<T> o;
          od.label_smoothing = o.label_smoothing = eps;
          od.reduction = o.reduction = r;
          if (weighted) {
            od.weight = wd;
            o.weight = to_dev(w);
          }
          Tensor<double> xr = xd.clone();
          xr.requires_grad_();
          const Tensor<double> ref = nn::cross_entropy(xr, t, od);
          Tensor<T> X = to_dev(x);
          X.requires_grad_();
          const Tensor<T> got = nn::cross_entropy(X, to_dev(t), o);
          expect_close(got, ref, rtol<T>(), "cross_entropy");
          const Tensor<double> gd = r == nn::Reduction::None ? dbl(rnd<T>(ref.shape(), 202)) : full<double>({}, 0.75);
          ref.backward(gd);
          got.backward(to_dev(Tensor<T>(cast<T>(gd))));
          expect_close(X.grad(), xr.grad(), rtol<T>(), "cross_entropy backward");
          if (eps > 0) continue;
          // nll_loss on log-probabilities (the CPU's own log_softmax, rounded to T).
          const int cdim = s.n == 1 ? 0 : 1;
          const Tensor<T> lp = cast<T>(ops::log_softmax(xd, cdim));
          nn::NllLossOptions<double> nd;
          nn::NllLossOptions<T> n;
          nd.reduction = n.reduction = r;
          if (weighted) {
            nd.weight = wd;
            n.weight = to_dev(w);
          }
          Tensor<double> lr = dbl(lp);
          lr.requires_grad_();
          const Tensor<double> nref = nn::nll_loss<double, false>(lr, t, nd);
          Tensor<T> L = to_dev(lp);
          L.requires_grad_();
          const Tensor<T> ngot = nn::nll_loss<T, false>(L, to_dev(t), n);
          expect_close(ngot, nref, rtol<T>(), "nll_loss");
          nref.backward(gd);
          ngot.backward(to_dev(Tensor<T>(cast<T>(gd))));
          expect_close(L.grad(), lr.grad(), rtol<T>(), "nll_loss backward");
        }
  }
}

TEST_CASE("cuda cross_entropy and nll_loss: a target out of range is an error naming its position") {
  SKIP_WITHOUT_DEVICE();
  const Tensor<float> X = to_dev(rnd<float>({4, 3}, 210));
  const Tensor<i64> t = to_dev(from_vector<i64>({0, 2, 3, 1}, {4}));
  EXPECT_ERROR([&] { (void)nn::cross_entropy(X, t); }, {"cross_entropy", "target 3", "position 2", "3 classes"});
  EXPECT_ERROR([&] { (void)nn::nll_loss<float, false>(X, t); }, {"nll_loss", "target 3", "position 2"});
  // ignore_index is not out of range; all ignored gives NaN under Mean, as in PyTorch.
  const Tensor<i64> ig = to_dev(from_vector<i64>({-100, -100, -100, -100}, {4}));
  CHECK(std::isnan(nn::cross_entropy(X, ig).item()));
  // Large logits stay finite (the max is subtracted before exp).
  const Tensor<float> big = to_dev(Tensor<float>(cast<float>(rnd<double>({4, 3}, 211) * 1e4)));
  CHECK(std::isfinite(nn::cross_entropy(big, to_dev(from_vector<i64>({0, 2, 1, 1}, {4}))).item()));
}

TEST_CASE("cuda clip_grad_norm_ equals the CPU for norms 2, 1, 3 and infinity") {
  SKIP_WITHOUT_DEVICE();
  for (const double p : {2.0, 1.0, 3.0, double(INFINITY)}) {
    CAPTURE(p);
    std::vector<Tensor<float>> hp, dp;
    for (int i = 0; i < 3; ++i) {
      Tensor<float> a = zeros<float>({5 + i, 3}), b = to_dev(a);
      a.requires_grad_();
      b.requires_grad_();
      a.grad() = rnd<float>({5 + i, 3}, 220 + std::uint64_t(i), 2.0);
      b.grad() = to_dev(a.grad());
      hp.push_back(a);
      dp.push_back(b);
    }
    const double nh = optim::clip_grad_norm_(hp, 0.5, p), nd = optim::clip_grad_norm_(dp, 0.5, p);
    CHECK(nd == doctest::Approx(nh).epsilon(1e-5));
    for (int i = 0; i < 3; ++i) expect_close(dp[std::size_t(i)].grad(), dbl(hp[std::size_t(i)].grad()), 2e-5, "clipped");
  }
}

TEST_CASE("cuda GradScaler: unscale_ on device gradients, an injected inf skips the step and halves the scale") {
  SKIP_WITHOUT_DEVICE();
  Tensor<float> a = to_dev(full<float>({3, 4}, 1.0f)), b = to_dev(full<float>({5}, 2.0f));
  a.requires_grad_();
  b.requires_grad_();
  optim::SGD<float> opt({a, b}, optim::SGDOptions{.lr = 0.5});
  amp::GradScaler scaler({.init_scale = 1024.0});
  a.grad() = to_dev(full<float>({3, 4}, 2048.0f));
  b.grad() = to_dev(full<float>({5}, 512.0f));
  CHECK(scaler.step(opt));
  scaler.update();
  expect_close(a, full<double>({3, 4}, 0.0), 0, "a stepped by the unscaled gradient 2");
  expect_close(b, full<double>({5}, 1.75), 0, "b stepped by 0.5");
  // inf in one element of one gradient: no step, scale halves.
  Tensor<float> gb = full<float>({5}, 1.0f);
  gb.data()[3] = INFINITY;
  a.grad() = to_dev(full<float>({3, 4}, 1.0f));
  b.grad() = to_dev(gb);
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 512.0);
  expect_close(a, full<double>({3, 4}, 0.0), 0, "a untouched");
  // A NaN is caught as well, and unscale_ then step does not unscale twice.
  Tensor<float> ga = full<float>({3, 4}, 512.0f);
  ga.data()[5] = NAN;
  a.grad() = to_dev(ga);
  b.grad() = to_dev(full<float>({5}, 512.0f));
  scaler.unscale_(opt);
  CHECK(scaler.found_inf(opt));
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 256.0);
  expect_close(b, full<double>({5}, 1.75), 0, "b untouched");
}

#undef SKIP_WITHOUT_DEVICE  // (the CUDA files are compiled several to a TU: tests/unity.cmake)
