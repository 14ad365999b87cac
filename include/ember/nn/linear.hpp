// ember — nn::Linear: y = x @ weightᵀ + bias, as torch.nn.Linear (same parameter layout and initialisation).
#pragma once

#include <cstdint>
#include <string>

#include "ember/amp/policy.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/core/creation.hpp"
#include "ember/ops/matmul.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/detail/policy_cast.hpp"
#include "ember/nn/detail/quant_hook.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

/// A fully connected layer. Parameters are stored in the policy's param_t and cast to its compute_t in forward.
template <amp::PrecisionPolicy P = amp::fp32>
class LinearT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' dtype (the precision policy's master weights).
  using compute_t = typename P::compute_t;  ///< The input's and output's dtype.

  // (The constructor and the forwards are defined below the class, not inline: with ember::precompiled a TU then
  // compiles none of them for the layers the library holds, not even to inline them.)
  /// nn.Linear(in_features, out_features, bias): y = x weight^T + bias, both initialised as PyTorch's
  /// (uniform in +-1/sqrt(in_features)).
  LinearT(std::int64_t in_features, std::int64_t out_features, bool with_bias = true);

  /// x (..., in_features) -> (..., out_features)
  Tensor<compute_t> forward(const Tensor<compute_t>& x) const;
  /// forward(x).
  Tensor<compute_t> operator()(const Tensor<compute_t>& x) const { return forward(x); }

  /// act(forward(x)) for act none, relu, gelu, gelu_tanh or silu, with the activation applied in the GEMM's
  /// write-back where ember::linear does so (ReLU in training too, on the CPU: one node on the tape). nn::Sequential
  /// runs each Linear -> ReLU pair of its float32 modules through it.
  Tensor<compute_t> forward(const Tensor<compute_t>& x, Activation act) const;
  /// forward(x, Activation::relu), without compiling GELU and SiLU (nn::Sequential runs its Linear -> ReLU
  /// pairs through it, so a Sequential of ReLUs pays for no other activation).
  Tensor<compute_t> forward_relu(const Tensor<compute_t>& x) const;

  ///@{
  /// The input's and output's features.
  std::int64_t in_features, out_features;
  ///@}
  Tensor<param_t> weight;  ///< (out_features, in_features).
  Tensor<param_t> bias;    ///< (out_features); undefined without bias.
};

template <amp::PrecisionPolicy P>
EMBER_COLD LinearT<P>::LinearT(std::int64_t in_features, std::int64_t out_features, bool with_bias)
    : Module("Linear"), in_features(in_features), out_features(out_features) {
  EMBER_CHECK(in_features > 0 && out_features > 0, "nn::Linear: features must be positive, got in_features=",
              in_features, ", out_features=", out_features);
  weight = empty<param_t>(Shape{out_features, in_features});
  if (with_bias) bias = empty<param_t>(Shape{out_features});
  init::default_weight_and_bias_(weight, &bias);
  register_parameter("weight", weight);
  if (with_bias) register_parameter("bias", bias);
  set_extra_repr([in_features, out_features, with_bias]() EMBER_COLD {
    return "in_features=" + std::to_string(in_features) + ", out_features=" + std::to_string(out_features) +
           ", bias=" + (with_bias ? "True" : "False");
  });
}

template <amp::PrecisionPolicy P>
auto LinearT<P>::forward(const Tensor<compute_t>& x) const -> Tensor<compute_t> {
  if (Tensor<compute_t> q; detail::quant_forward(*this, x, q)) return q;  // int8 after quant::convert
  // A layer built without bias has one after nn::fuse_conv_bn folded a BatchNorm1d into it.
  const Tensor<param_t> b = bias.defined() ? bias : own_parameter<param_t>("bias");
  const Tensor<compute_t> wc = detail::to_compute<compute_t>(weight), bc = detail::to_compute<compute_t>(b);
  // An activation moved into this layer runs in the GEMM's epilogue when nothing needs a gradient (see
  // nn/detail/fused_act.hpp for the other case).
  const auto act = nn::fused_activation(*this);
  if (act != Activation::none && detail::epilogue_on_device(x) && !detail::records_grad(x, wc, bc))
    return ops::detail::linear_enabled(x, wc, bc, act);
  return ember::linear(x, wc, bc);
}

template <amp::PrecisionPolicy P>
auto LinearT<P>::forward(const Tensor<compute_t>& x, Activation act) const -> Tensor<compute_t> {
  if (act == Activation::none || nn::quantized(*this) || nn::fused_activation(*this) != Activation::none)
    return ember::detail::apply_linear_act(forward(x), act);
  const Tensor<param_t> b = bias.defined() ? bias : own_parameter<param_t>("bias");
  return ember::linear(x, detail::to_compute<compute_t>(weight), detail::to_compute<compute_t>(b), act);
}

template <amp::PrecisionPolicy P>
auto LinearT<P>::forward_relu(const Tensor<compute_t>& x) const -> Tensor<compute_t> {
  if (nn::quantized(*this) || nn::fused_activation(*this) != Activation::none)
    return Tensor<compute_t>(relu(forward(x)));
  const Tensor<param_t> b = bias.defined() ? bias : own_parameter<param_t>("bias");
  return ember::detail::linear_none_or_relu(x, detail::to_compute<compute_t>(weight),
                                            detail::to_compute<compute_t>(b), Activation::relu);
}

using Linear = LinearT<>;

}  // namespace ember::nn
