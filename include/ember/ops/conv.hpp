// ember — 2-D convolution without autograd: shape checks (errors name the op, the shapes and what was expected),
// then dispatch to the device's kernels (cpu/conv.hpp). half and bfloat16 accumulate in fp32.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/expr/activation.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/window.hpp"

#include "ember/cuda/cudnn.hpp"
#include "ember/cuda/device.hpp"
#include "ember/profile/range.hpp"

namespace ember::ops {

namespace detail {

inline void check_window_arg(const char* op, const char* what, Size2 v, std::int64_t min) {
  EMBER_CHECK(v.h >= min && v.w >= min, op, ": ", what, " must be ", min == 0 ? "non-negative" : "positive",
              ", got ", v.str());
}

}  // namespace detail

/// Checks conv2d's arguments (x is 4-D here) and returns the geometry of the call.
template <class T>
cpu::ConvGeometry conv2d_geometry(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b,
                                  const Conv2dOptions& o) {
  const char* op = "conv2d";
  EMBER_CHECK(x.dim() == 4, op, ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ", x.shape().str());
  EMBER_CHECK(w.dim() == 4, op, ": expected a 4-D weight (out_channels, in_channels/groups, kh, kw), got shape ",
              w.shape().str());
  EMBER_CHECK(x.device() == w.device(), op, ": input and weight are on different devices (", x.device().str(),
              " and ", w.device().str(), ")");
  detail::check_window_arg(op, "stride", o.stride, 1);
  detail::check_window_arg(op, "dilation", o.dilation, 1);
  detail::check_window_arg(op, "padding", o.padding, 0);
  EMBER_CHECK(o.groups >= 1, op, ": groups must be positive, got ", o.groups);
  const std::int64_t O = w.size(0), C = x.size(1);
  EMBER_CHECK(O % o.groups == 0, op, ": weight of shape ", w.shape().str(), " has ", O,
              " output channels, not divisible by groups=", o.groups);
  EMBER_CHECK(C == w.size(1) * o.groups, op, ": input of shape ", x.shape().str(), " has ", C,
              " channels, but weight of shape ", w.shape().str(), " with groups=", o.groups, " expects ",
              w.size(1) * o.groups);
  EMBER_CHECK(w.size(2) > 0 && w.size(3) > 0, op, ": weight of shape ", w.shape().str(), " has an empty kernel");
  if (b.defined()) {
    EMBER_CHECK(b.dim() == 1 && b.size(0) == O, op, ": bias of shape ", b.shape().str(), " does not match ", O,
                " output channels (weight of shape ", w.shape().str(), "); expected shape [", O, "]");
    EMBER_CHECK(b.device() == x.device(), op, ": bias is on ", b.device().str(), " but the input is on ",
                x.device().str());
  }
  cpu::ConvGeometry g;
  g.n = x.size(0);
  g.c = C;
  g.h = x.size(2);
  g.w = x.size(3);
  g.o = O;
  static_cast<Window2d&>(g) = window2d(Size2(w.size(2), w.size(3)), o.stride, o.padding, o.dilation);
  g.groups = o.groups;
  const std::int64_t eh = g.dh * (g.kh - 1) + 1, ew = g.dw * (g.kw - 1) + 1;
  EMBER_CHECK(eh <= g.h + 2 * g.ph && ew <= g.w + 2 * g.pw, op, ": kernel ", Size2(g.kh, g.kw).str(),
              (g.dh > 1 || g.dw > 1 ? " (dilated to " + Size2(eh, ew).str() + ")" : std::string()),
              " is larger than the padded input ", Size2(g.h + 2 * g.ph, g.w + 2 * g.pw).str(), " (input shape ",
              x.shape().str(), ", weight shape ", w.shape().str(), ", padding ", o.padding.str(), ")");
  g.oh = ember::detail::window_out_size(g.h, g.kh, g.sh, g.ph, g.dh, false);
  g.ow = ember::detail::window_out_size(g.w, g.kw, g.sw, g.pw, g.dw, false);
  return g;
}

namespace detail {
template <class T>
void check_conv_device(const Tensor<T>& x) {
  EMBER_CHECK(x.device().is_cpu(), "conv2d: no kernel for tensors on ", x.device().str(), " in this build");
}

/// Whether this build runs CUDA tensors through cuDNN (EMBER_WITH_CUDA and cuDNN's headers found).
#if EMBER_USE_CUDNN
inline constexpr bool kCudnn = true;
/// Checks that t's device exists and makes it current for the scope of the returned guard.
inline cuda::DeviceGuard cuda_scope(Device d, const char* op) {
  cuda::check_device(d, op);
  return cuda::DeviceGuard(d);
}
inline cuda::ConvParams cudnn_conv_params(const cpu::ConvGeometry& g) {
  cuda::ConvParams p;
  static_cast<Window2d&>(p) = g;
  p.groups = g.groups;
  return p;
}
#else
inline constexpr bool kCudnn = false;
#endif

template <class T>
Tensor<T> conv2d_cuda(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, const cpu::ConvGeometry& g) {
#if EMBER_USE_CUDNN
  auto guard = cuda_scope(x.device(), "conv2d");
  const Tensor<T> xc = dense(x), wc = dense(w), bc = b.defined() ? dense(b) : b;
  Tensor<T> y = empty<T>(Shape{g.n, g.o, g.oh, g.ow}, x.device());
  if (y.numel() > 0) cuda::conv2d_forward<T>(xc, wc, bc, y, cudnn_conv_params(g));
  return y;
#else
  (void)w, (void)b, (void)g;
  EMBER_CHECK(false, "conv2d: no kernel for tensors on ", x.device().str(),
              " in this build (CUDA tensors need EMBER_WITH_CUDA and cuDNN: link ember::cudnn)");
  return {};
#endif
}
}  // namespace detail

namespace detail {
/// The body of ops::conv2d (below) for callers whose activation's CPU loops are enabled already: none or relu, or
/// one that nn::fuse_conv_bn moved into a layer (its fold enables GELU's and SiLU's). A layer's forward calls this,
/// so a program that fuses nothing does not compile the GELU and SiLU loops.
template <class T>
Tensor<T> conv2d_enabled(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, const Conv2dOptions& o,
                         Activation act, bool pool2) {
  EMBER_PROFILE_RANGE("conv2d");
  static_assert(is_floating_v<T>, "conv2d: floating-point tensors only");
  const cpu::ConvGeometry g = conv2d_geometry(x, w, b, o);
  EMBER_CHECK(!pool2 || x.device().is_cpu(), "conv2d: a fused max pool runs on the CPU only; the input is on ",
              x.device().str());
  EMBER_CHECK(!pool2 || (g.oh >= 2 && g.ow >= 2), "conv2d: a fused 2x2 max pool needs an output of at least 2x2, got ",
              g.oh, "x", g.ow);
  if (x.device().is_cuda()) {
    Tensor<T> y = detail::conv2d_cuda(x, w, b, g);
#if defined(__CUDACC__)
    visit_activation(act, [&](auto op) {
      if constexpr (!std::is_same_v<decltype(op), ops_table::Identity>)
        ops::assign(y, expr::make_unary(op, y), "conv2d");
    });
#else
    EMBER_CHECK(act == Activation::none, "conv2d: a fused ", activation_name(act), " on ", x.device().str(),
                " tensors runs as a kernel, which needs a translation unit compiled by nvcc");
#endif
    return y;
  }
  detail::check_conv_device(x);
  // half and bfloat16 run the same kernels: operands converted while the GEMM packs them, fp32 accumulation.
  const Tensor<T> xc = detail::dense(x), wc = detail::dense(w), bc = b.defined() ? detail::dense(b) : b;
  Tensor<T> y = empty<T>(pool2 ? Shape{g.n, g.o, g.oh / 2, g.ow / 2} : Shape{g.n, g.o, g.oh, g.ow}, x.device());
  if (y.numel() > 0)
    cpu::conv2d_forward<T>(g, xc.data(), wc.data(), bc.defined() ? bc.data() : nullptr, y.data(), act, pool2);
  return y;
}
}  // namespace detail

/// y (N, O, oh, ow) = act(conv2d(x (N, C, H, W), w (O, C/groups, kh, kw)) + b (O; may be undefined)), without
/// autograd. On the CPU the activation is applied to each image's output right after its GEMM, while it is in
/// cache (no separate pass over y); on CUDA, one fused element-wise pass after cuDNN's convolution. pool2 (CPU
/// only) also takes a 2x2 max pool (stride 2, floor) of each image's output there: y is (N, O, oh/2, ow/2).
template <class T>
Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b = Tensor<T>(),
                 const Conv2dOptions& o = {}, Activation act = Activation::none, bool pool2 = false) {
  if (cpu::is_heavy_act(act)) cpu::enable_act_epilogues<T>();
  return detail::conv2d_enabled(x, w, b, o, act, pool2);
}

/// The gradients of conv2d; each is undefined when not asked for.
template <class T>
struct Conv2dGrads {
  Tensor<T> input;   ///< (N, C, H, W).
  Tensor<T> weight;  ///< (O, C/groups, kh, kw).
  Tensor<T> bias;    ///< (O).
};

/// Gradients of y = conv2d(x, w, b) given gy (N, O, oh, ow). x is read only for the weight gradient and w only
/// for the input gradient.
template <class T>
Conv2dGrads<T> conv2d_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& w, const Conv2dOptions& o,
                               bool need_input, bool need_weight, bool need_bias) {
  const cpu::ConvGeometry g = conv2d_geometry(x, w, Tensor<T>(), o);
  EMBER_CHECK(gy.shape() == Shape({g.n, g.o, g.oh, g.ow}), "conv2d_backward: gradient of shape ", gy.shape().str(),
              " does not match the output shape ", Shape({g.n, g.o, g.oh, g.ow}).str());
  Conv2dGrads<T> r;
  if (x.device().is_cuda()) {
#if EMBER_USE_CUDNN
    auto guard = detail::cuda_scope(x.device(), "conv2d_backward");
    EMBER_CHECK(gy.device() == x.device(), "conv2d_backward: the gradient is on ", gy.device().str(),
                " but the input is on ", x.device().str());
    if (need_input) r.input = empty<T>(x.shape(), x.device());
    if (need_weight) r.weight = empty<T>(w.shape(), w.device());
    if (need_bias) r.bias = empty<T>(Shape{g.o}, w.device());
    if (gy.numel() == 0) {
      for (Tensor<T>* t : {&r.input, &r.weight, &r.bias})
        if (t->defined()) cuda::fill(*t, 0.0);
      return r;
    }
    const Tensor<T> gyc = detail::dense(gy);
    const cuda::ConvParams p = detail::cudnn_conv_params(g);
    if (need_input && r.input.numel() > 0) cuda::conv2d_backward_data<T>(gyc, detail::dense(w), r.input, p);
    if (need_weight) cuda::conv2d_backward_filter<T>(gyc, detail::dense(x), r.weight, p);
    if (need_bias) {
#if defined(__CUDACC__)
      // cuDNN's bias-gradient call has no bfloat16 kernel (CUDNN_STATUS_NOT_SUPPORTED, cuDNN 9 on an H200):
      // bfloat16 sums on ember's reduction kernel, accumulated in double and rounded once.
      if constexpr (std::is_same_v<T, bfloat16>) {
        ops::reduce<expr::SumR<double>>(r.bias.reshape({1, g.o, 1, 1}), expr::TensorLeaf<T, false>{&gyc},
                                        "conv2d_backward (bias)");
        return r;
      }
#endif
      cuda::conv2d_backward_bias<T>(gyc, r.bias);
    }
    return r;
#else
    EMBER_CHECK(false, "conv2d_backward: no kernel for tensors on ", x.device().str(),
              " in this build (CUDA tensors need EMBER_WITH_CUDA and cuDNN: link ember::cudnn)");
#endif
  }
  detail::check_conv_device(x);
  const Tensor<T> gyc = detail::dense(gy);
  const Tensor<T> xc = need_weight ? detail::dense(x) : x, wc = need_input ? detail::dense(w) : w;
  if (need_input) r.input = empty<T>(x.shape(), x.device());
  if (need_weight) r.weight = empty<T>(w.shape(), w.device());
  if (need_bias) r.bias = empty<T>(Shape{g.o}, w.device());
  if (!(need_input || need_weight || need_bias)) return r;
  if (gy.numel() == 0) {  // nothing flows back
    for (Tensor<T>* t : {&r.input, &r.weight, &r.bias})
      if (t->defined()) t->zero_();
    return r;
  }
  cpu::conv2d_backward<T>(g, xc.data(), wc.data(), gyc.data(), need_input ? r.input.data() : nullptr,
                          need_weight ? r.weight.data() : nullptr, need_bias ? r.bias.data() : nullptr);
  return r;
}

}  // namespace ember::ops
