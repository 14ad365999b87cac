// ember example 1: tensors, views and fused element-wise expressions.
#include <ember/ember.hpp>

#include <iostream>

using namespace ember;

int main() {
  // Creation, as in PyTorch.
  Tensor<float> a = arange<float>(12).view({3, 4});
  std::cout << "a = " << a << "\n\n";

  // Views share storage: the transpose and a strided slice read a's memory without copying.
  Tensor<float> at = a.t();
  Tensor<float> every_other = a.slice(1, 0, 4, 2);
  std::cout << "a.t() = " << at << "  contiguous: " << (at.is_contiguous() ? "yes" : "no") << "\n";
  std::cout << "a[:, ::2] = " << every_other << "\n\n";

  // One fused pass: `b * a + 1` broadcasts b over the rows and runs as one loop into a new tensor.
  Tensor<float> b = tensor<float>({1, 10, 100, 1000});
  Tensor<float> y = relu(b * a - 50.f) + 1.f;
  std::cout << "relu(b * a - 50) + 1 = " << y << "\n\n";

  // Writing through a view: zero the first column of a.
  Tensor<float> col = a.select(1, 0);
  col = col * 0.f;
  std::cout << "a after zeroing column 0 = " << a << "\n\n";

  // Reductions fuse the element-wise part: sum of squares reads a once.
  std::cout << "sum(a * a) = " << sum(a * a) << ", mean over rows = " << mean(a, 1) << "\n";
  std::cout << "argmax of each row = " << argmax(a, 1) << "\n\n";

  // Half precision storage, float math inside the loop.
  Tensor<half> h = cast<half>(a * 0.1f);
  Tensor<float> back = cast<float>(h) * 2.f;
  std::cout << "half round trip * 2 = " << back << "\n\n";

  // Matrix product (Eigen, multithreaded).
  std::cout << "a @ a.t() = " << matmul(a, a.t()) << "\n";
  return 0;
}
