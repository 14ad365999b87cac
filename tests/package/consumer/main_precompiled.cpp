// A user's program linked against ember::precompiled (README's fast-build path): its kernels must be this CPU's
// tier, never the portable ones because the library was built without the CPU's instruction set.
#include <ember/ember.hpp>
#include <iostream>
using namespace ember;

int main() {
  std::cout << "consumer_precompiled: " << cpu::describe() << "\n";
  if (int(cpu::precompiled_isa()) < int(cpu::machine_isa())) {
    std::cerr << "consumer_precompiled: ember::precompiled holds " << cpu::isa_name(cpu::precompiled_isa())
              << " kernels on a CPU that runs " << cpu::isa_name(cpu::machine_isa()) << "\n";
    return 1;
  }
  if (cpu::compiled_isa() != cpu::precompiled_isa()) {  // the library's -march reaches the targets that link it
    std::cerr << "consumer_precompiled: this TU is compiled for " << cpu::isa_name(cpu::compiled_isa())
              << ", the library for " << cpu::isa_name(cpu::precompiled_isa()) << "\n";
    return 1;
  }
  nn::Linear fc(64, 32);  // a layer whose forward comes from the library
  Tensor<float> y = fc(randn<float>({8, 64}));
  return y.shape() == Shape{8, 32} ? 0 : 1;
}
