// A user's program: the README's example, built against an installed or vendored ember.
#include <ember/ember.hpp>
#include <iostream>
using namespace ember;

int main() {
  Tensor<float> x = randn<float>({64, 784});
  Tensor<float> w = randn<float>({256, 784}) * 0.05f;
  Tensor<float> b = zeros<float>({256});
  w.requires_grad_();
  b.requires_grad_();

  Tensor<float> h = relu(matmul(x, w.t()) + b);  // one GEMM + one fused pass (bias broadcast + ReLU)
  Tensor<float> loss = mean(square(h - 1.f));     // the element-wise part runs inside the reduction
  loss.backward();                                // w.grad(), b.grad() are ready
  std::cout << loss << "\n" << b.grad().sizes() << "\n";
  return w.grad().shape() == w.shape() && b.grad().shape() == b.shape() ? 0 : 1;
}
