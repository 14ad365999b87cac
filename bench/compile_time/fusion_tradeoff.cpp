// Eight element-wise formulas of the kind research code writes (GELU by hand, SiLU, a residual update, an affine
// normalisation, a softmax numerator, a squared error, a fused ReLU layer, an LSTM-style gate), each run forward
// and backward. With -DEMBER_FUSED=1 (the default) each formula is one expression: one kernel forward and one
// backward, compiled for that expression's own type. With -DEMBER_FUSED=0 every operation is materialised into a
// tensor, so each (operation, dtype) is compiled once and shared by every formula, at the cost of a pass over memory
// per operation. scripts/compile_time.sh times both builds; run, each prints milliseconds per step of all eight.
//
//   fusion_tradeoff [elements] [steps]
#include <ember/ember.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#ifndef EMBER_FUSED
#define EMBER_FUSED 1
#endif

using namespace ember;
using T = Tensor<float>;

// One step: the eight formulas over x, a, b (length n) and the row statistics m, r, g, c (broadcast), then one
// backward through their sum.
static double step(const T& x, const T& a, const T& b, const T& m, const T& r, const T& g, const T& c) {
#if EMBER_FUSED
  T y1 = 0.5f * x * (1.0f + tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
  T y2 = x * sigmoid(x);
  T y3 = a + 0.1f * b;
  T y4 = (x - m) * r * g + c;
  T y5 = exp(x - m);
  T y6 = square(a - b);
  T y7 = relu(a * b + c);
  T y8 = sigmoid(a) * tanh(b);
#else
  T x2 = x * x, x3 = T(x2 * x), k = T(0.044715f * x3), s = T(x + k), t = T(0.7978845608f * s), th = T(tanh(t)),
    p = T(1.0f + th), h = T(0.5f * x);
  T y1 = h * p;
  T sg = sigmoid(x);
  T y2 = x * sg;
  T bb = 0.1f * b;
  T y3 = a + bb;
  T d = x - m, dr = T(d * r), drg = T(dr * g);
  T y4 = drg + c;
  T y5 = exp(d);
  T ab = a - b;
  T y6 = square(ab);
  T mu = a * b, z = T(mu + c);
  T y7 = relu(z);
  T sa = sigmoid(a), tb = T(tanh(b));
  T y8 = sa * tb;
#endif
  T total = sum(y1) + sum(y2) + sum(y3) + sum(y4) + sum(y5) + sum(y6) + sum(y7) + sum(y8);
  total.backward();
  return double(total.item());
}

int main(int argc, char** argv) {
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : 1 << 20;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  const std::int64_t cols = 256, rows = n / cols;
  manual_seed(0);
  T x = randn<float>(Shape{rows, cols}).requires_grad_(true);
  T a = randn<float>(Shape{rows, cols}).requires_grad_(true);
  T b = randn<float>(Shape{rows, cols}).requires_grad_(true);
  T m = randn<float>(Shape{rows, 1}).requires_grad_(true);
  T r = rand<float>(Shape{rows, 1}).requires_grad_(true);
  T g = randn<float>(Shape{cols}).requires_grad_(true);
  T c = randn<float>(Shape{cols}).requires_grad_(true);
  double check = 0;
  std::vector<double> ms;
  for (int s = 0; s < steps + 2; ++s) {
    for (T* p : {&x, &a, &b, &m, &r, &g, &c}) p->grad() = T();
    const auto t0 = std::chrono::steady_clock::now();
    check = step(x, a, b, m, r, g, c);
    const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= 2) ms.push_back(dt);  // two warm-up steps
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s, %lld elements: median %.3f ms per step (sum %.9g, x.grad[0] %.9g)\n",
              EMBER_FUSED ? "fused" : "materialised", static_cast<long long>(rows * cols), ms[ms.size() / 2], check,
              double(x.grad().data()[0]));
}
