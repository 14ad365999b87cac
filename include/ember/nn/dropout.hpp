// ember — nn::Dropout: in training, zeroes each element with probability p and scales the rest by 1/(1-p); in
// evaluation, the identity. The mask comes from the layer's own seedable generator, so runs are reproducible.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

class Dropout : public Module {
 public:
  /// seed: the generator's seed; copies of the layer share the generator.
  explicit Dropout(double p = 0.5, std::uint64_t seed = 0x5eed)
      : Module("Dropout"), p(p), gen(std::make_shared<Generator>(seed)) {
    EMBER_CHECK(p >= 0 && p <= 1, "nn::Dropout: probability must be in [0, 1], got ", p);
    set_extra_repr([p] { return "p=" + std::to_string(p); });
  }
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    if (!is_training() || p == 0) return x;
    if (p == 1) return x * T(0);
    const Tensor<T> keep = bernoulli<T>(x.shape(), 1.0 - p, *gen);  // 1 = kept
    return x * keep * T(1.0 / (1.0 - p));
  }
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  double p;
  std::shared_ptr<Generator> gen;
};

}  // namespace ember::nn
