// ember — nn::Dropout and nn::functional::dropout: in training, zero each element with probability p and scale the
// rest by 1/(1-p); in evaluation, the identity. The masks come from the default generator, as in PyTorch:
// ember::manual_seed makes a run reproducible, every layer and every call draws a fresh mask (the generator's
// counter advances with each draw, so two Dropout layers of one model never share a mask), and checkpoints that save
// the generator (train::Trainer's, io::Checkpoint's rng) resume with the same masks an uninterrupted run draws.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

namespace functional {
/// torch.nn.functional.dropout: the mask from `gen` (the default generator unless given).
template <class T>
Tensor<T> dropout(const Tensor<T>& x, double p = 0.5, bool training = true, Generator& gen = default_generator()) {
  EMBER_CHECK(p >= 0 && p <= 1, "nn::functional::dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  // (double scalars: half and bfloat16 tensors take arithmetic scalars, not their own type)
  if (p == 1) return x * 0.0;
  Tensor<T> keep = bernoulli<T>(x.shape(), 1.0 - p, gen);  // 1 = kept; drawn on the host on every device
  if (!x.device().is_cpu()) keep = keep.to(x.device());
  return x * keep * (1.0 / (1.0 - p));
}
}  // namespace functional

/// torch.nn.Dropout: in training, zeroes each element with probability p and scales the rest by 1 / (1 - p); in
/// eval, the identity.
class Dropout : public Module {
 public:
  /// Masks from the default generator (see above).
  explicit Dropout(double p = 0.5) : Module("Dropout"), p(p) {
    EMBER_CHECK(p >= 0 && p <= 1, "nn::Dropout: probability must be in [0, 1], got ", p);
    set_extra_repr([p]() EMBER_COLD { return "p=" + std::to_string(p); });
  }
  /// Masks from a generator of the layer's own, seeded with `seed` (copies of the layer share it): reproducible
  /// by itself, but not part of the state checkpoints save.
  Dropout(double p, std::uint64_t seed) : Dropout(p) { gen = std::make_shared<Generator>(seed); }

  /// functional::dropout(x, p, is_training()), with the layer's generator when it has one.
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    return functional::dropout(x, p, is_training(), gen ? *gen : default_generator());
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  double p;  ///< The probability of zeroing an element, in [0, 1].
  std::shared_ptr<Generator> gen;  ///< null: the default generator
};

}  // namespace ember::nn
