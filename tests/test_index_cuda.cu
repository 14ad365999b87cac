// CUDA twins of the index ops (cuda/index.cuh against cpu/index.hpp): index_select and its backward, nn::Embedding
// forward and backward (padding_idx included), gather, scatter, scatter_add and index_add with their gradients, on
// the same inputs on both devices, for float, double, half and bfloat16; strided views, repeated indices (the
// reductions are sorting-based: the same bits on every run), empty indices, and out-of-range indices, whose error
// is the CPU's word for word. Every device case skips itself when no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cuda_compare.hpp"

using ember_test::error_of;

namespace {

/// Indices in [0, n) of shape s, from a fixed pattern with repeats.
Tensor<i64> idx(const Shape& s, i64 n, std::uint64_t seed) {
  Generator g(seed);
  return randint(0, n, s, g);
}

/// One rounding of T, times `terms` (the CPU rounds each partial sum into T, the device once).
template <class T>
double sum_tol(int terms) {
  return tol<T>() * terms;
}

/// The same bits (a deterministic kernel run twice).
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  const Tensor<T> x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), std::size_t(x.numel()) * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("cuda index_select and its backward equal the CPU along every dim", T, float, double, ember::half,
                   ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  const Tensor<T> x = seeded_randn<T>({5, 6, 7}, 11);
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    const Tensor<i64> ix = idx({9}, x.size(d), 20 + d);  // repeats: 9 picks of at most 7 rows
    expect_close_scaled(ops::index_select(x, d, ix), ops::index_select(to_dev(x), d, to_dev(ix)), 0.0, "index_select");
    // A transposed input and a strided index.
    const Tensor<T> xt = x.transpose(0, 2);
    const Tensor<i64> i18 = idx({18}, xt.size(d), 30 + d), is = i18.slice(0, 0, 18, 2);
    expect_close_scaled(ops::index_select(xt, d, is),
                        ops::index_select(to_dev(x).transpose(0, 2), d, to_dev(i18).slice(0, 0, 18, 2)), 0.0,
                        "index_select of views");
    // The adjoint: repeated rows accumulate.
    const Tensor<T> g = seeded_randn<T>(ops::index_select(x, d, ix).shape(), 40 + d);
    expect_close_scaled(ops::index_add(x.shape(), d, ix, g), ops::index_add(x.shape(), d, to_dev(ix), to_dev(g)),
                        sum_tol<T>(9), "index_select backward");
  }
  // Through autograd.
  Tensor<T> xc = x.clone(), xd = to_dev(x);
  xc.requires_grad_();
  xd.requires_grad_();
  const Tensor<i64> ix = idx({12}, 6, 50);
  const Tensor<T> g = seeded_randn<T>({5, 12, 7}, 51);
  index_select(xc, 1, ix).backward(g);
  index_select(xd, 1, to_dev(ix)).backward(to_dev(g));
  expect_close_scaled(xc.grad(), xd.grad(), sum_tol<T>(12), "index_select: x.grad");
  // An empty index: an empty result.
  CHECK(ops::index_select(to_dev(x), 1, to_dev(zeros<i64>({0}))).shape() == Shape{5, 0, 7});
}

TEST_CASE("cuda nn::Embedding forward and backward equal the CPU with and without padding_idx; deterministic backward") {
  SKIP_WITHOUT_CUDA();
  for (bool padding : {false, true}) {
    CAPTURE(padding);
    nn::Embedding ec(50, 24, padding ? std::optional<i64>(3) : std::nullopt);
    nn::Embedding ed(50, 24, padding ? std::optional<i64>(3) : std::nullopt);
    ed.weight.detach().copy_(ec.weight.detach());
    ed.to(kDev);
    // Many more tokens than rows: every row is hit many times (a hot-token distribution).
    const Tensor<i64> tok = idx({8, 500}, 50, 60);
    Tensor<float> yc = ec(tok), yd = ed(to_dev(tok));
    expect_close_scaled(yc, yd, 0.0, "Embedding forward");
    const Tensor<float> g = seeded_randn<float>(yc.shape(), 61);
    yc.backward(g);
    yd.backward(to_dev(g));
    expect_close_scaled(ec.weight.grad(), ed.weight.grad(), sum_tol<float>(200), "Embedding weight.grad");
    // Again: the same bits.
    const Tensor<float> first = ed.weight.grad().clone();
    ed.weight.grad() = Tensor<float>();
    ed(to_dev(tok)).backward(to_dev(g));
    CHECK(same_bits(ed.weight.grad(), first));
  }
}

TEST_CASE_TEMPLATE("cuda gather, scatter, scatter_add and index_add equal the CPU, values and gradients", T, float,
                   double, ember::half, ember::bfloat16) {
  SKIP_WITHOUT_CUDA();
  const Tensor<T> x = seeded_randn<T>({6, 5, 4}, 71);
  for (int d = 0; d < 3; ++d) {
    CAPTURE(d);
    Shape is = x.shape();
    is[d] = 7;                  // longer than x along d: repeats
    is[(d + 1) % 3] -= 1;       // smaller than x elsewhere
    const Tensor<i64> ix = idx(is, x.size(d), 80 + d);
    Shape ss = is;
    ss[(d + 2) % 3] += 1;       // src larger than the index: only its leading corner is read
    const Tensor<T> src = seeded_randn<T>(ss, 90 + d);
    const Tensor<T> X = to_dev(x), S = to_dev(src);
    const Tensor<i64> I = to_dev(ix);
    expect_close_scaled(gather(x, d, ix), gather(X, d, I), 0.0, "gather");
    expect_close_scaled(scatter(x, d, ix, src), scatter(X, d, I, S), 0.0, "scatter (the last write wins)");
    expect_close_scaled(scatter(x, d, ix, 2.5), scatter(X, d, I, 2.5), 0.0, "scatter of a value");
    expect_close_scaled(scatter_add(x, d, ix, src), scatter_add(X, d, I, S), sum_tol<T>(8), "scatter_add");
    // A strided (transposed) input.
    expect_close_scaled(gather(x, d, ix), gather(to_dev(x.transpose(0, 1).contiguous()).transpose(0, 1), d, I), 0.0,
                        "gather of a transposed view");

    // Gradients through autograd.
    Tensor<T> xc = x.clone(), sc = src.clone(), xd = to_dev(x), sd = to_dev(src);
    for (Tensor<T>* t : {&xc, &sc, &xd, &sd}) t->requires_grad_();
    const Tensor<T> g = seeded_randn<T>(x.shape(), 100 + d), gg = seeded_randn<T>(is, 110 + d);
    gather(xc, d, ix).backward(gg);
    gather(xd, d, I).backward(to_dev(gg));
    expect_close_scaled(xc.grad(), xd.grad(), sum_tol<T>(8), "gather: x.grad");
    for (bool add : {false, true}) {
      CAPTURE(add);
      for (Tensor<T>* t : {&xc, &sc, &xd, &sd}) t->grad() = Tensor<T>();
      (add ? scatter_add(xc, d, ix, sc) : scatter(xc, d, ix, sc)).backward(g);
      (add ? scatter_add(xd, d, I, sd) : scatter(xd, d, I, sd)).backward(to_dev(g));
      expect_close_scaled(xc.grad(), xd.grad(), 0.0, "scatter: x.grad");
      expect_close_scaled(sc.grad(), sd.grad(), 0.0, "scatter: src.grad");
    }

    // index_add along d with a 1-D index (repeats accumulate), alpha != 1, and its gradients.
    const Tensor<i64> rows = idx({9}, x.size(d), 120 + d);
    Shape as = x.shape();
    as[d] = 9;
    const Tensor<T> a = seeded_randn<T>(as, 130 + d);
    expect_close_scaled(index_add(x, d, rows, a, 0.5), index_add(X, d, to_dev(rows), to_dev(a), 0.5), sum_tol<T>(9),
                        "index_add");
    Tensor<T> ac = a.clone(), ad = to_dev(a);
    for (Tensor<T>* t : {&xc, &ac, &xd, &ad}) {
      t->grad() = Tensor<T>();
      t->requires_grad_();
    }
    index_add(xc, d, rows, ac, -2.0).backward(g);
    index_add(xd, d, to_dev(rows), ad, -2.0).backward(to_dev(g));
    expect_close_scaled(xc.grad(), xd.grad(), 0.0, "index_add: x.grad");
    expect_close_scaled(ac.grad(), ad.grad(), tol<T>(), "index_add: src.grad");
  }
}

TEST_CASE("cuda scatter_add and index_add are deterministic under heavy collisions") {
  SKIP_WITHOUT_CUDA();
  // 100000 values into 3 targets, twice: the same bits, and the CPU's sum within the accumulated rounding.
  const Tensor<float> src = seeded_randn<float>({100000, 1}, 140);
  const Tensor<i64> ix = idx({100000, 1}, 3, 141);
  const Tensor<float> z = zeros<float>({3, 1});
  const Tensor<float> a = scatter_add(to_dev(z), 0, to_dev(ix), to_dev(src));
  const Tensor<float> b = scatter_add(to_dev(z), 0, to_dev(ix), to_dev(src));
  CHECK(same_bits(a, b));
  expect_close_scaled(scatter_add(z, 0, ix, src), a, 1e-3, "scatter_add of 100000 values into 3 targets");
  const Tensor<i64> rows = idx({100000}, 3, 142);
  const Tensor<float> s2 = seeded_randn<float>({100000, 4}, 143), z2 = zeros<float>({3, 4});
  const Tensor<float> c = index_add(to_dev(z2), 0, to_dev(rows), to_dev(s2));
  CHECK(same_bits(c, index_add(to_dev(z2), 0, to_dev(rows), to_dev(s2))));
  expect_close_scaled(index_add(z2, 0, rows, s2), c, 1e-3, "index_add of 100000 rows into 3");
}

TEST_CASE("cuda index ops: an index out of range is the CPU's error, word for word") {
  SKIP_WITHOUT_CUDA();
  const Tensor<float> x = seeded_randn<float>({4, 5}, 150), X = to_dev(x);
  const Tensor<i64> bad = from_vector<i64>({1, 0, 5, 2, -1, 7}, {6}), B = to_dev(bad);
  auto same = [](const std::function<void()>& cpu, const std::function<void()>& dev, const char* what) {
    const std::string a = error_of(cpu), b = error_of(dev);
    INFO(what);
    CHECK(a.rfind("<", 0) != 0);  // an ember::Error
    CHECK(a == b);
  };
  same([&] { (void)index_select(x, 1, bad); }, [&] { (void)index_select(X, 1, B); }, "index_select");
  same([&] { (void)ops::index_add(x.shape(), 1, bad, seeded_randn<float>({4, 6}, 151)); },
       [&] { (void)ops::index_add(x.shape(), 1, B, to_dev(seeded_randn<float>({4, 6}, 151))); }, "index_add (adjoint)");
  same([&] { (void)index_add(x, 1, bad, seeded_randn<float>({4, 6}, 152)); },
       [&] { (void)index_add(X, 1, B, to_dev(seeded_randn<float>({4, 6}, 152))); }, "index_add");
  const Tensor<i64> g2 = from_vector<i64>({0, 1, 2, 3, 4, 9}, {2, 3}), G2 = to_dev(g2);
  same([&] { (void)gather(x, 1, g2); }, [&] { (void)gather(X, 1, G2); }, "gather");
  same([&] { (void)scatter(x, 1, g2, 1.0); }, [&] { (void)scatter(X, 1, G2, 1.0); }, "scatter");
  same([&] { (void)scatter_add(x, 1, g2, x); }, [&] { (void)scatter_add(X, 1, G2, X); }, "scatter_add");
  nn::Embedding ec(5, 3), ed(5, 3);
  ed.to(kDev);
  same([&] { (void)ec(g2); }, [&] { (void)ed(G2); }, "nn::Embedding");
  CHECK(error_of([&] { (void)ed(G2); }).find("index 9 at position 5") != std::string::npos);
  // Index and data on different devices are named.
  CHECK(error_of([&] { (void)index_select(X, 1, bad); }).find("the index is on cpu") != std::string::npos);
  CHECK(error_of([&] { (void)gather(X, 1, g2); }).find("the index is on cpu") != std::string::npos);
  CHECK(error_of([&] { (void)ed(g2); }).find("the indices are on cpu but the table is on cuda:0") != std::string::npos);
}
