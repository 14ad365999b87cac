// ember — the activation vocabulary: the activations a layer or an op applies in its epilogue (ops::linear,
// ops::conv2d, the GEMM epilogues of cpu/epilogue.hpp, the int8 layers, nn::fuse_conv_bn's folds), and the one visitor
// that maps each to its row of the element-wise table (expr/functors.hpp), so every epilogue computes the same math.
#pragma once

#include "ember/config.hpp"
#include "ember/expr/functors.hpp"

namespace ember {

/// An activation: none, ReLU, GELU (erf form), GELU's tanh form (PyTorch's gelu(approximate='tanh'), the form
/// cuBLASLt's epilogue computes), SiLU.
enum class Activation : unsigned char { none, relu, gelu, gelu_tanh, silu };

/// "none", "relu", "gelu", "gelu_tanh", "silu" (as messages print it).
inline const char* activation_name(Activation a) {
  constexpr const char* kNames[] = {"none", "relu", "gelu", "gelu_tanh", "silu"};
  const unsigned k = unsigned(a);
  return k < sizeof(kNames) / sizeof(kNames[0]) ? kNames[k] : "none";
}

/// f(op) with a's row of the element-wise table: ops_table::Identity for none, Relu, Gelu, GeluTanh, Silu. The one
/// switch over the vocabulary: an epilogue instantiates its loop or expression for each row through it.
template <class F>
decltype(auto) visit_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::relu: return f(ops_table::Relu{});
    case Activation::gelu: return f(ops_table::Gelu{});
    case Activation::gelu_tanh: return f(ops_table::GeluTanh{});
    case Activation::silu: return f(ops_table::Silu{});
    default: return f(ops_table::Identity{});
  }
}

}  // namespace ember
