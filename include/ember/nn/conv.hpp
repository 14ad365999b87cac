// ember — nn::Conv2d, as torch.nn.Conv2d: weight (out, in/groups, kh, kw), optional bias, PyTorch's initialisation.
//   nn::Conv2d(1, 32, 3, {.padding = 1, .bias = false})
#pragma once

#include <cstdint>
#include <string>

#include "ember/amp/policy.hpp"
#include "ember/autograd/conv.hpp"
#include "ember/core/creation.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/detail/policy_cast.hpp"
#include "ember/nn/detail/quant_hook.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/window.hpp"
#include "ember/autograd/pool.hpp"

namespace ember::nn {

/// The options of nn::Conv2d after (in_channels, out_channels, kernel_size), with the names and order of
/// torch.nn.Conv2d. Padding is a number per side (PyTorch's padding="same" / "valid" strings and padding_mode other
/// than "zeros" are not supported); a Size2 is one value for both dims, or {h, w}:
/// ```
/// nn::Conv2d conv(3, 64, 3, {.stride = 2, .padding = {1, 1}, .bias = false});
/// ```
struct Conv2dOptions {
  Size2 stride = 1;         ///< step of the window, in input positions
  Size2 padding = 0;        ///< zeros added on both sides of each spatial dim
  Size2 dilation = 1;       ///< spacing between the kernel's taps (1: adjacent)
  std::int64_t groups = 1;  ///< in and out channels split into this many independent groups (both must divide)
  bool bias = true;         ///< learn a per-output-channel bias
};

/// torch.nn.Conv2d under a precision policy (nn::Conv2d is Conv2dT<amp::fp32>): a 2-D convolution (cross-correlation,
/// as PyTorch's) of (N, C_in, H, W) inputs with learned (C_out, C_in / groups, kh, kw) filters and an optional bias.
template <amp::PrecisionPolicy P = amp::fp32>
class Conv2dT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' dtype (the precision policy's master weights).
  using compute_t = typename P::compute_t;  ///< The input's and output's dtype.

  /// nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias); the weight and bias
  /// are initialised as PyTorch's (uniform in +-1/sqrt(fan_in)).
  Conv2dT(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, const Conv2dOptions& o = {});

  /// x (N, C_in, H, W) -> (N, C_out, H_out, W_out)
  Tensor<compute_t> forward(const Tensor<compute_t>& x) const;
  /// forward(x).
  Tensor<compute_t> operator()(const Tensor<compute_t>& x) const { return forward(x); }

  ///@{
  /// C_in and C_out.
  std::int64_t in_channels, out_channels;
  ///@}
  Size2 kernel_size;       ///< The kernel's (kh, kw).
  Conv2dOptions options;   ///< Stride, padding, dilation, groups and bias.
  Tensor<param_t> weight;  ///< (C_out, C_in / groups, kh, kw).
  Tensor<param_t> bias;    ///< (C_out); undefined without bias.
};

template <amp::PrecisionPolicy P>
EMBER_COLD Conv2dT<P>::Conv2dT(std::int64_t in_channels, std::int64_t out_channels, Size2 kernel_size, const Conv2dOptions& o)
    : Module("Conv2d"), in_channels(in_channels), out_channels(out_channels), kernel_size(kernel_size), options(o) {
  EMBER_CHECK(in_channels > 0 && out_channels > 0 && o.groups > 0 && in_channels % o.groups == 0 &&
                  out_channels % o.groups == 0,
              "nn::Conv2d: in_channels (", in_channels, ") and out_channels (", out_channels,
              ") must be positive multiples of groups (", o.groups, ")");
  EMBER_CHECK(kernel_size.h > 0 && kernel_size.w > 0, "nn::Conv2d: kernel_size must be positive, got (",
              kernel_size.h, ", ", kernel_size.w, ")");
  weight = empty<param_t>(Shape{out_channels, in_channels / o.groups, kernel_size.h, kernel_size.w});
  if (o.bias) bias = empty<param_t>(Shape{out_channels});
  init::default_weight_and_bias_(weight, &bias);
  register_parameter("weight", weight);
  if (o.bias) register_parameter("bias", bias);
  // Read by code that rebuilds the layer from the module tree (quant::convert).
  set_setting("stride_h", double(o.stride.h));
  set_setting("stride_w", double(o.stride.w));
  set_setting("padding_h", double(o.padding.h));
  set_setting("padding_w", double(o.padding.w));
  set_setting("dilation_h", double(o.dilation.h));
  set_setting("dilation_w", double(o.dilation.w));
  set_setting("groups", double(o.groups));
  set_extra_repr([=]() EMBER_COLD {
    auto pair = [](Size2 s) { return s.str(); };
    std::string r = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                    ", kernel_size=" + pair(kernel_size) + ", stride=" + pair(o.stride);
    if (o.padding.h || o.padding.w) r += ", padding=" + pair(o.padding);
    if (o.dilation.h != 1 || o.dilation.w != 1) r += ", dilation=" + pair(o.dilation);
    if (o.groups != 1) r += ", groups=" + std::to_string(o.groups);
    if (!o.bias) r += ", bias=False";
    return r;
  });
}

template <amp::PrecisionPolicy P>
auto Conv2dT<P>::forward(const Tensor<compute_t>& x) const -> Tensor<compute_t> {
  if (Tensor<compute_t> q; detail::quant_forward(*this, x, q)) return q;  // int8 after quant::convert
  // A conv built without bias has one after nn::fuse_conv_bn folded a BatchNorm into it.
  const Tensor<param_t> b = bias.defined() ? bias : own_parameter<param_t>("bias");
  const Tensor<compute_t> wc = detail::to_compute<compute_t>(weight), bc = detail::to_compute<compute_t>(b);
  const ember::Conv2dOptions co{options.stride, options.padding, options.dilation, options.groups};
  // An activation moved into this layer runs in the convolution's epilogue when nothing needs a gradient (see
  // nn/detail/fused_act.hpp for the other case).
  const auto act = nn::fused_activation(*this);
  const bool pool = nn::fused_pool(*this);
  if ((act != Activation::none || pool) && detail::epilogue_on_device(x) && !detail::records_grad(x, wc, bc)) {
    auto run = [&](const Tensor<compute_t>& x4) -> Tensor<compute_t> {
      if (!pool || x4.device().is_cpu()) return ops::detail::conv2d_enabled(x4, wc, bc, co, act, pool);
      return max_pool2d(ops::detail::conv2d_enabled(x4, wc, bc, co, act, false), 2);  // the pool as its own op off the CPU
    };
    if (x.dim() == 3) return run(x.unsqueeze(0)).squeeze(0);  // unbatched
    return run(x);
  }
  return ember::conv2d(x, wc, bc, co);
}

using Conv2d = Conv2dT<>;

}  // namespace ember::nn
