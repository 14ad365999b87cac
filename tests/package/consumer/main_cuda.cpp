// A user's CUDA program built with the host compiler against ember::cuda (runtime and library calls only): a tensor
// goes to the GPU and back. Without a device it checks that the backend reports none and exits successfully.
#include <ember/ember.hpp>
#include <iostream>
using namespace ember;

int main() {
  static_assert(EMBER_WITH_CUDA, "ember::cuda defines EMBER_WITH_CUDA=1");
  if (!cuda::is_available()) {
    std::cout << "no CUDA device: ember::cuda linked, device copies skipped\n";
    return 0;
  }
  const Tensor<float> x = arange<float>(12).reshape({3, 4});
  const Tensor<float> y = x.cuda().t().cpu();  // a strided view of device memory, back on the host
  std::cout << x.cuda() << "\n" << cuda::memory_stats().num_cuda_mallocs << " cudaMalloc call(s)\n";
  return y.to_vector() == x.t().contiguous().to_vector() ? 0 : 1;
}
