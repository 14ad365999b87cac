// ember — pooling layers: nn::MaxPool2d, nn::AvgPool2d, nn::AdaptiveAvgPool2d (no parameters; any floating dtype).
#pragma once

#include <string>

#include "ember/autograd/pool.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/window.hpp"

namespace ember::nn {

namespace detail {
inline std::string pair_str(Size2 s) { return s.str(); }
}  // namespace detail

/// torch.nn.MaxPool2d: the maximum of each (dilated) kernel window of an (N, C, H, W) or (C, H, W) input.
class MaxPool2d : public Module {
 public:
  /// nn.MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode); the stride defaults to the kernel size.
  explicit MaxPool2d(Size2 kernel_size, const Pool2dOptions& o = {}) : Module("MaxPool2d"), kernel_size(kernel_size), options(o) {
    // Read by nn::fuse_conv_bn, which can move a 2x2 pool (stride 2, no padding) into the Conv2d before it.
    const Size2 st = o.stride.h == 0 && o.stride.w == 0 ? kernel_size : o.stride;
    set_setting("pool2x2", kernel_size.h == 2 && kernel_size.w == 2 && st.h == 2 && st.w == 2 && o.padding.h == 0 &&
                               o.padding.w == 0 && o.dilation.h == 1 && o.dilation.w == 1 && !o.ceil_mode
                           ? 1.0
                           : 0.0);
    set_extra_repr([=]() EMBER_COLD {
      const Size2 st = o.stride.h == 0 && o.stride.w == 0 ? kernel_size : o.stride;
      return "kernel_size=" + detail::pair_str(kernel_size) + ", stride=" + detail::pair_str(st) +
             ", padding=" + detail::pair_str(o.padding);
    });
  }
  /// max_pool2d(x, kernel_size, options); the identity when nn::fuse_conv_bn moved the pool into the convolution
  /// before it and that convolution already pooled x.
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    if (nn::folded(*this) && detail::applied_by_layer(x)) return x;  // taken by the convolution it was fused into
    return max_pool2d(x, kernel_size, options);
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  Size2 kernel_size;      ///< The window's (height, width).
  Pool2dOptions options;  ///< Stride, padding, dilation and ceil_mode.
};

/// torch.nn.AvgPool2d: the mean of each kernel window of an (N, C, H, W) or (C, H, W) input.
class AvgPool2d : public Module {
 public:
  /// nn.AvgPool2d(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override); the stride defaults
  /// to the kernel size.
  explicit AvgPool2d(Size2 kernel_size, const Pool2dOptions& o = {}) : Module("AvgPool2d"), kernel_size(kernel_size), options(o) {
    set_extra_repr([=]() EMBER_COLD { return "kernel_size=" + detail::pair_str(kernel_size); });
  }
  /// avg_pool2d(x, kernel_size, options).
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    return avg_pool2d(x, kernel_size, options);
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  Size2 kernel_size;      ///< The window's (height, width).
  Pool2dOptions options;  ///< Stride, padding, ceil_mode, count_include_pad and divisor_override.
};

/// torch.nn.AdaptiveAvgPool2d: averages an (N, C, H, W) or (C, H, W) input over windows chosen so that the output
/// is (output_size.h, output_size.w) whatever H and W; AdaptiveAvgPool2d(1) is global average pooling.
class AdaptiveAvgPool2d : public Module {
 public:
  /// nn.AdaptiveAvgPool2d(output_size).
  explicit AdaptiveAvgPool2d(Size2 output_size) : Module("AdaptiveAvgPool2d"), output_size(output_size) {
    set_extra_repr([=]() EMBER_COLD { return "output_size=" + detail::pair_str(output_size); });
  }
  /// adaptive_avg_pool2d(x, output_size).
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    return adaptive_avg_pool2d(x, output_size);
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  Size2 output_size;  ///< The output's (height, width).
};

}  // namespace ember::nn
