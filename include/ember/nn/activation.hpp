// ember — parameter-free layers: activations, Flatten, Identity. Each forwards any floating dtype and returns a
// tensor materialised by one fused pass (write `relu(a * b + c)` in your own forward to fuse more).
#pragma once

#include <cstdint>
#include <string>

#include "ember/autograd/tensor_ops.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

#define EMBER_NN_ACTIVATION(Name, expr_of_x)                              \
  class Name : public Module {                                             \
   public:                                                                 \
    /** The layer (no parameters), named as PyTorch's class. */            \
    Name() : Module(#Name) {}                                              \
    /** The activation of x, element-wise, in one fused pass. */           \
    template <class T>                                                     \
    Tensor<T> forward(const Tensor<T>& x) const {                          \
      if (nn::folded(*this) && detail::applied_by_layer(x)) return x; /* fused */   \
      return expr_of_x;                                                    \
    }                                                                      \
    /** forward(x). */                                                     \
    template <class T>                                                     \
    Tensor<T> operator()(const Tensor<T>& x) const {                       \
      return forward(x);                                                   \
    }                                                                      \
  };

/// torch.nn.ReLU: max(x, 0).
EMBER_NN_ACTIVATION(ReLU, relu(x))
/// torch.nn.SiLU: x * sigmoid(x).
EMBER_NN_ACTIVATION(SiLU, silu(x))
/// torch.nn.Tanh.
EMBER_NN_ACTIVATION(Tanh, tanh(x))
/// torch.nn.Sigmoid: 1 / (1 + e^-x).
EMBER_NN_ACTIVATION(Sigmoid, sigmoid(x))
/// torch.nn.Identity: returns its input.
EMBER_NN_ACTIVATION(Identity, x)
#undef EMBER_NN_ACTIVATION

/// GELU, exact (erf) by default; approximate = true uses the tanh form (PyTorch's approximate='tanh').
class GELU : public Module {
 public:
  /// nn.GELU(approximate='none'), or 'tanh' with approximate = true.
  explicit GELU(bool approximate = false) : Module("GELU"), approximate(approximate) {
    set_setting("approximate", approximate ? 1.0 : 0.0);
    set_extra_repr([approximate]() EMBER_COLD { return std::string("approximate='") + (approximate ? "tanh'" : "none'"); });
  }
  /// gelu(x) or gelu_tanh(x), element-wise.
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    if (nn::folded(*this) && detail::applied_by_layer(x)) return x;  // applied by the layer it was fused into
    return approximate ? Tensor<T>(gelu_tanh(x)) : Tensor<T>(gelu(x));
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  bool approximate;  ///< The tanh approximation instead of the exact erf form.
};

/// torch.nn.LeakyReLU: x for x > 0, negative_slope * x otherwise.
class LeakyReLU : public Module {
 public:
  /// nn.LeakyReLU(negative_slope).
  explicit LeakyReLU(double negative_slope = 0.01) : Module("LeakyReLU"), negative_slope(negative_slope) {
    set_extra_repr([negative_slope]() EMBER_COLD { return "negative_slope=" + std::to_string(negative_slope); });
  }
  /// leaky_relu(x, negative_slope), element-wise.
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    return leaky_relu(x, negative_slope);
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  double negative_slope;  ///< The slope for x < 0.
};

/// Flattens dims start_dim..end_dim (by default everything but the batch dim), a view when the layout allows.
class Flatten : public Module {
 public:
  /// nn.Flatten(start_dim, end_dim).
  explicit Flatten(std::int64_t start_dim = 1, std::int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {
    set_extra_repr([start_dim, end_dim]() EMBER_COLD {
      return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
    });
  }
  /// x.flatten(start_dim, end_dim).
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    return x.flatten(start_dim, end_dim);
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  ///@{
  /// The first and last dims merged (negative ones count from the end).
  std::int64_t start_dim, end_dim;
  ///@}
};

}  // namespace ember::nn
