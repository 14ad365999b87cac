// ember — a Conv2d followed by a BatchNorm2d in training mode, an optional ReLU and an optional 2x2 max pool, run as
// one fused operation (autograd/conv_bn.hpp) on the CPU: the same values and gradients as running the modules one
// after another, with fewer passes over memory. nn::Sequential does this by itself for every such group of its
// modules in training mode; a custom module calls nn::conv_bn_forward:
//
//   Tensor<float> forward(const Tensor<float>& x) const {           // conv1, bn1: members
//     return nn::conv_bn_forward(conv1, bn1, x, {.relu = true, .pool2 = true});
//   }
#pragma once

#include "ember/autograd/conv_bn.hpp"
#include "ember/autograd/pool.hpp"
#include "ember/nn/conv.hpp"
#include "ember/nn/normalization.hpp"

namespace ember::nn {

/// What follows the batch norm in a fused group.
struct ConvBnTail {
  bool relu = false;   ///< A ReLU.
  bool pool2 = false;  ///< Then MaxPool2d(2): kernel 2, stride 2, no padding, floor.
};

/// Whether conv -> bn [-> relu] [-> pool] can run fused on x: bn in training mode, neither module folded or
/// quantized, a 4-D input and parameters on the CPU, and a convolution output of at least 2x2 for the pool. Under a
/// precision policy P, the batch norm's parameters must be of a dtype batch_norm takes with P's compute type (fp32
/// parameters with bf16 or fp16 activations: bf16_mixed, fp16_mixed).
template <class P>
bool conv_bn_fusable(const Conv2dT<P>& conv, const BatchNormT<2, P>& bn, const Tensor<typename P::compute_t>& x,
                     bool pool2) {
  if constexpr (!ops::BatchNormParam<typename P::param_t, typename P::compute_t>) return false;
  if (!bn.is_training() || nn::folded(bn) || nn::quantized(conv) || nn::fused_activation(conv) != Activation::none ||
      nn::fused_pool(conv) ||
      x.dim() != 4 || !x.device().is_cpu() || !conv.weight.device().is_cpu() || x.size(1) != conv.in_channels ||
      bn.num_features != conv.out_channels)
    return false;
  if (!pool2) return true;
  const Conv2dOptions& o = conv.options;
  const std::int64_t oh = ember::detail::window_out_size(x.size(2), conv.kernel_size.h, o.stride.h, o.padding.h,
                                                         o.dilation.h, false);
  const std::int64_t ow = ember::detail::window_out_size(x.size(3), conv.kernel_size.w, o.stride.w, o.padding.w,
                                                         o.dilation.w, false);
  return oh >= 2 && ow >= 2;
}

/// pool2? / relu? of bn(conv(x)): fused when conv_bn_fusable, else the modules (and relu, max_pool2d(2)) one after
/// another. Under a mixed policy (bf16_mixed, fp16_mixed) the convolution's weight and bias are cast to the compute
/// type as Conv2dT::forward casts them, and the batch norm keeps its fp32 parameters and statistics.
template <class P>
Tensor<typename P::compute_t> conv_bn_forward(const Conv2dT<P>& conv, const BatchNormT<2, P>& bn,
                                              const Tensor<typename P::compute_t>& x, const ConvBnTail& tail = {}) {
  using C = typename P::compute_t;
  if (!conv_bn_fusable(conv, bn, x, tail.pool2)) {
    Tensor<C> h = bn.forward(conv.forward(x));
    if (tail.relu) h = Tensor<C>(relu(h));
    if (tail.pool2) h = max_pool2d(h, 2);
    return h;
  }
  const Tensor<C> w = detail::to_compute<C>(conv.weight), b = detail::to_compute<C>(conv.bias);
  const ember::Conv2dOptions co{conv.options.stride, conv.options.padding, conv.options.dilation, conv.options.groups};
  (void)ops::conv2d_geometry(x, w, b, co);  // the convolution's errors before the batch is counted
  const double factor = bn.count_batch();
  ops::ConvBnOptions bo;
  bo.momentum = factor;
  bo.eps = bn.options.eps;
  bo.relu = tail.relu;
  bo.pool2 = tail.pool2;
  if constexpr (ops::BatchNormParam<typename P::param_t, C>)
    return ember::conv2d_batch_norm(x, w, b, bn.running_mean, bn.running_var, bn.weight, bn.bias, co, bo);
  else
    return Tensor<C>();  // not reached: conv_bn_fusable is false for such a policy
}

}  // namespace ember::nn
