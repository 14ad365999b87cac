// ember example 2: reverse-mode autograd. Fits y = w * x + b to noisy data with plain gradient descent, then shows
// the pieces: one backward node per fused expression, gradient hooks, NoGradGuard and gradcheck.
#include <ember/ember.hpp>

#include <cstdio>
#include <iostream>

using namespace ember;

int main() {
  manual_seed(0);
  // Data: y = 3x - 2 plus noise.
  Tensor<float> x = randn<float>({256});
  Tensor<float> y = x * 3.f - 2.f + randn<float>({256}) * 0.1f;

  Tensor<float> w = zeros<float>({1}).requires_grad_();
  Tensor<float> b = zeros<float>({1}).requires_grad_();

  for (int step = 0; step < 100; ++step) {
    // The residual `w * x + b - y` and its square fuse into the mean: one pass forward, one node on the tape.
    Tensor<float> loss = mean(square(w * x + b - y));
    w.grad() = Tensor<float>();  // zero_grad (to none)
    b.grad() = Tensor<float>();
    loss.backward();
    {
      NoGradGuard no_grad;  // the update is not part of the graph
      w -= 0.1f * w.grad();
      b -= 0.1f * b.grad();
    }
    if (step % 20 == 0 || step == 99)
      std::printf("step %3d  loss %.5f  w %.4f  b %.4f\n", step, loss.item(), w.item(), b.item());
  }

  // A gradient-ready hook: called when w's gradient of a backward pass is complete (DDP starts allreduce here).
  w.register_hook([](const Tensor<float>& g) { std::cout << "hook: dloss/dw = " << g << "\n"; });
  Tensor<float> loss = mean(square(w * x + b - y));
  loss.backward();

  // The derivative of every element-wise op is generated at compile time; gradcheck compares it with central
  // differences in double precision.
  Tensor<double> u = randn<double>({3, 4}), v = randn<double>({4});
  auto check = gradcheck([](const std::vector<Tensor<double>>& in) { return Tensor<double>(gelu(in[0] * in[1]) + tanh(in[1])); },
                         {u, v});
  std::cout << "gradcheck gelu(u * v) + tanh(v): " << (check ? "ok" : check.message) << " (max error "
            << check.max_error << ")\n";
  return check ? 0 : 1;
}
