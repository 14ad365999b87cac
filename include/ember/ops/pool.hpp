// ember — 2-D pooling without autograd (max with argmax indices, average, adaptive average): shape checks with
// PyTorch's rules and messages naming the op and the shapes, then dispatch to cpu/pool.hpp. half and bfloat16
// compute in fp32.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/index.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/window.hpp"
#include "ember/profile/range.hpp"

namespace ember::ops {

namespace detail {
inline void check_pool_input(const char* op, const Shape& x, Device dev) {
  EMBER_CHECK(x.n == 4, op, ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ", x.str());
  EMBER_CHECK(x[1] > 0 && x[2] > 0 && x[3] > 0, op, ": expected non-zero channels, height and width, "
              "got input shape ", x.str());
  EMBER_CHECK(dev.is_cpu() || (dev.is_cuda() && kCudnn), op, ": no kernel for tensors on ", dev.str(),
              " in this build (CUDA tensors need EMBER_WITH_CUDA and cuDNN)");
}

/// Checks a max/avg pool's arguments and returns its geometry (stride 0 means the kernel size).
inline cpu::PoolGeometry pool_geometry(const char* op, const Shape& x, Device dev, Size2 kernel,
                                       const Pool2dOptions& o, bool dilated) {
  check_pool_input(op, x, dev);
  check_window_arg(op, "kernel size", kernel, 1);
  EMBER_CHECK(o.stride.h >= 0 && o.stride.w >= 0 && (o.stride.h > 0) == (o.stride.w > 0), op,
              ": stride must be positive (or 0 for the kernel size), got ", o.stride.str());
  const Size2 stride = o.stride.h == 0 ? kernel : o.stride;
  check_window_arg(op, "padding", o.padding, 0);
  const Size2 dil = dilated ? o.dilation : Size2(1);
  check_window_arg(op, "dilation", dil, 1);
  EMBER_CHECK(2 * o.padding.h <= kernel.h && 2 * o.padding.w <= kernel.w, op, ": padding ", o.padding.str(),
              " must be at most half the kernel size ", kernel.str());
  // PyTorch's pooling arguments are int32 (larger ones are an error there too); this also keeps the window
  // arithmetic below far from int64 overflow.
  constexpr std::int64_t kMaxArg = 0x7fffffff;
  EMBER_CHECK(kernel.h <= kMaxArg && kernel.w <= kMaxArg && stride.h <= kMaxArg && stride.w <= kMaxArg &&
                  dil.h <= kMaxArg && dil.w <= kMaxArg,
              op, ": kernel size ", kernel.str(), ", stride ", stride.str(), " and dilation ", dil.str(),
              " must each be at most 2^31 - 1");
  cpu::PoolGeometry g;
  g.planes = x[0] * x[1];
  g.h = x[2];
  g.w = x[3];
  static_cast<Window2d&>(g) = window2d(kernel, stride, o.padding, dil);
  g.count_include_pad = o.count_include_pad;
  if (o.divisor_override) {
    EMBER_CHECK(!dilated, op, ": divisor_override is an option of avg_pool2d only (got ", *o.divisor_override, ")");
    EMBER_CHECK(*o.divisor_override != 0, op, ": divisor_override must be non-zero (got 0), input shape ", x.str());
    g.divisor_override = *o.divisor_override;
  }
  // PyTorch's output size: with ceil_mode a window may be larger than the padded input, as long as it starts
  // inside the input or the left padding; no window at all is an error.
  g.oh = ember::detail::window_out_size(g.h, g.kh, g.sh, g.ph, g.dh, o.ceil_mode);
  g.ow = ember::detail::window_out_size(g.w, g.kw, g.sw, g.pw, g.dw, o.ceil_mode);
  const std::int64_t eh = g.dh * (g.kh - 1) + 1, ew = g.dw * (g.kw - 1) + 1;
  EMBER_CHECK(g.oh > 0 && g.ow > 0, op, ": kernel ", kernel.str(),
              (dil.h > 1 || dil.w > 1 ? " (dilated to " + Size2(eh, ew).str() + ")" : std::string()),
              " is larger than the padded input ", Size2(g.h + 2 * g.ph, g.w + 2 * g.pw).str(),
              (o.ceil_mode ? " even with ceil_mode" : ""), ": no window fits (input shape ", x.str(), ", padding ",
              o.padding.str(), ", stride ", stride.str(), ")");
  return g;
}

inline Shape pool_out_shape(const Shape& x, const cpu::PoolGeometry& g) { return Shape{x[0], x[1], g.oh, g.ow}; }

template <class T>
void check_pool_grad(const char* op, const Tensor<T>& gy, const Shape& expect) {
  EMBER_CHECK(gy.shape() == expect, op, ": gradient of shape ", gy.shape().str(), " does not match the output shape ",
              expect.str());
}

#if EMBER_USE_CUDNN
/// The cuDNN window of a max/avg pool geometry; cuDNN has no dilation and no ceil_mode, so those are errors unless
/// they change nothing.
inline cuda::PoolParams cudnn_pool(const char* op, const cpu::PoolGeometry& g, cuda::PoolParams::Mode mode,
                                   const Pool2dOptions& o, const Shape& xs) {
  EMBER_CHECK(g.dh == 1 && g.dw == 1, op, ": dilation ", Size2(g.dh, g.dw).str(),
              " is not supported on CUDA (cuDNN pooling has no dilation), input shape ", xs.str());
  EMBER_CHECK(!o.divisor_override, op, ": divisor_override (", o.divisor_override.value_or(0),
              ") is not supported on CUDA (cuDNN pooling has no such option); pool on the CPU, input shape ",
              xs.str());
  if (o.ceil_mode) {
    const std::int64_t fh = ember::detail::window_out_size(g.h, g.kh, g.sh, g.ph, g.dh, false);
    const std::int64_t fw = ember::detail::window_out_size(g.w, g.kw, g.sw, g.pw, g.dw, false);
    EMBER_CHECK(fh == g.oh && fw == g.ow, op, ": ceil_mode that adds a partial window (output ",
                Size2(g.oh, g.ow).str(), " instead of ", Size2(fh, fw).str(),
                ") is not supported on CUDA, input shape ", xs.str());
  }
  cuda::PoolParams p;
  static_cast<Window2d&>(p) = g;  // dilation 1 (checked above)
  p.mode = mode;
  return p;
}
inline cuda::PoolParams::Mode avg_mode(const Pool2dOptions& o) {
  return o.count_include_pad ? cuda::PoolParams::avg_include_pad : cuda::PoolParams::avg_exclude_pad;
}
#endif
}  // namespace detail

/// Max pooling of x (N, C, H, W): the output (N, C, oh, ow) and, per output, the flat index (h * W + w) of the
/// chosen input element in its plane (as PyTorch's return_indices; -1 where a dilated window covers only padding
/// and the output is -inf).
/// With `with_indices` false the indices are left undefined (a forward pass that needs no gradient).
template <class T>
std::pair<Tensor<T>, Tensor<std::int64_t>> max_pool2d_with_indices(const Tensor<T>& x, Size2 kernel,
                                                                   const Pool2dOptions& o = {},
                                                                   bool with_indices = true) {
  EMBER_PROFILE_RANGE("max_pool2d");
  static_assert(is_floating_v<T>, "max_pool2d: floating-point tensors only");
  const cpu::PoolGeometry g = detail::pool_geometry("max_pool2d", x.shape(), x.device(), kernel, o, true);
  const Shape os = detail::pool_out_shape(x.shape(), g);
  if (x.device().is_cuda()) {
#if EMBER_USE_CUDNN
    EMBER_CHECK(!with_indices, "max_pool2d_with_indices: indices are not computed on CUDA (cuDNN finds the maximum "
                "again in backward); use max_pool2d_backward(gy, x, y, kernel, options), input shape ",
                x.shape().str());
    const cuda::PoolParams p = detail::cudnn_pool("max_pool2d", g, cuda::PoolParams::max, o, x.shape());
    auto guard = detail::cuda_scope(x.device(), "max_pool2d");
    Tensor<T> y = empty<T>(os, x.device());
    if (y.numel() > 0) cuda::pool2d_forward<T>(detail::dense(x), y, p, "max_pool2d");
    return {y, Tensor<std::int64_t>()};
#endif
  }
  Tensor<std::int64_t> idx = with_indices ? empty<std::int64_t>(os, x.device()) : Tensor<std::int64_t>();
  const Tensor<T> xc = detail::dense(x);
  Tensor<T> y = empty<T>(os, x.device());
  cpu::max_pool2d_forward<T>(g, xc.data(), y.data(), with_indices ? idx.data() : nullptr);
  return {y, idx};
}

/// The input gradient (shape `input_shape`) of max pooling from gy (N, C, oh, ow) and the recorded indices.
template <class T>
Tensor<T> max_pool2d_backward(const Tensor<T>& gy, const Tensor<std::int64_t>& indices, const Shape& input_shape) {
  EMBER_PROFILE_RANGE("max_pool2d_backward");
  detail::check_pool_grad("max_pool2d_backward", gy, indices.shape());
  EMBER_CHECK(gy.device().is_cpu() && indices.device().is_cpu(), "max_pool2d_backward: the indices form runs on the "
              "CPU only (got the gradient on ", gy.device().str(), "); on CUDA use max_pool2d_backward(gy, x, y, "
              "kernel, options)");
  EMBER_CHECK(input_shape.n == 4 && indices.dim() == 4 && input_shape[0] == indices.size(0) &&
                  input_shape[1] == indices.size(1),
              "max_pool2d_backward: indices of shape ", indices.shape().str(), " do not match input shape ",
              input_shape.str());
  const Tensor<std::int64_t> ic = detail::dense(indices);
  const std::int64_t HW = input_shape[2] * input_shape[3];
  const std::int64_t k = cpu::first_out_of_range(ic.data(), ic.numel(), 1, -1, HW);
  EMBER_CHECK(k < 0, "max_pool2d_backward: index ", ic.data()[k], " at position ", k,
              " is outside the plane of input shape ", input_shape.str(), " (expected [-1, ", HW,
              "), -1 for an empty window)");
  cpu::PoolGeometry g;
  g.planes = input_shape[0] * input_shape[1];
  g.h = input_shape[2];
  g.w = input_shape[3];
  g.oh = gy.size(2);
  g.ow = gy.size(3);
  const Tensor<T> gyc = detail::dense(gy);
  Tensor<T> gx = empty<T>(input_shape, gy.device());
  cpu::max_pool2d_backward<T>(g, gyc.data(), ic.data(), gx.data());
  return gx;
}

/// The input gradient of max pooling from gy (N, C, oh, ow), the forward's input x (N, C, H, W) and output y: the
/// form both devices run (CUDA finds each window's maximum again; the CPU recomputes the argmax indices).
template <class T>
Tensor<T> max_pool2d_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& y, Size2 kernel,
                              const Pool2dOptions& o = {}) {
  EMBER_PROFILE_RANGE("max_pool2d_backward");
  const cpu::PoolGeometry g = detail::pool_geometry("max_pool2d_backward", x.shape(), x.device(), kernel, o, true);
  detail::check_pool_grad("max_pool2d_backward", gy, detail::pool_out_shape(x.shape(), g));
  detail::check_pool_grad("max_pool2d_backward", y, detail::pool_out_shape(x.shape(), g));
  EMBER_CHECK(gy.device() == x.device() && y.device() == x.device(), "max_pool2d_backward: the gradient (",
              gy.device().str(), "), input (", x.device().str(), ") and output (", y.device().str(),
              ") must be on one device");
  if (x.device().is_cuda()) {
#if EMBER_USE_CUDNN
    const cuda::PoolParams p = detail::cudnn_pool("max_pool2d_backward", g, cuda::PoolParams::max, o, x.shape());
    auto guard = detail::cuda_scope(x.device(), "max_pool2d_backward");
    Tensor<T> gx = empty<T>(x.shape(), x.device());
    if (gy.numel() == 0) {
      cuda::fill(gx, 0.0);
      return gx;
    }
    cuda::pool2d_backward<T>(detail::dense(gy), detail::dense(x), detail::dense(y), gx, p, "max_pool2d_backward");
    return gx;
#endif
  }
  auto idx = ops::max_pool2d_with_indices(x, kernel, o, true).second;
  return ops::max_pool2d_backward(gy, idx, x.shape());
}

/// Average pooling of x (N, C, H, W) to (N, C, oh, ow).
template <class T>
Tensor<T> avg_pool2d(const Tensor<T>& x, Size2 kernel, const Pool2dOptions& o = {}) {
  EMBER_PROFILE_RANGE("avg_pool2d");
  static_assert(is_floating_v<T>, "avg_pool2d: floating-point tensors only");
  EMBER_CHECK(o.dilation == Size2(1), "avg_pool2d: dilation is not supported (got ", o.dilation.str(), ")");
  const cpu::PoolGeometry g = detail::pool_geometry("avg_pool2d", x.shape(), x.device(), kernel, o, false);
  if (x.device().is_cuda()) {
#if EMBER_USE_CUDNN
    const cuda::PoolParams p = detail::cudnn_pool("avg_pool2d", g, detail::avg_mode(o), o, x.shape());
    auto guard = detail::cuda_scope(x.device(), "avg_pool2d");
    Tensor<T> y = empty<T>(detail::pool_out_shape(x.shape(), g), x.device());
    if (y.numel() > 0) cuda::pool2d_forward<T>(detail::dense(x), y, p, "avg_pool2d");
    return y;
#endif
  }
  const Tensor<T> xc = detail::dense(x);
  Tensor<T> y = empty<T>(detail::pool_out_shape(x.shape(), g), x.device());
  cpu::avg_pool2d_forward<T>(g, xc.data(), y.data());
  return y;
}

/// The input gradient (shape `input_shape`, (N, C, H, W)) of avg_pool2d(x, kernel, o) from gy (N, C, oh, ow).
template <class T>
Tensor<T> avg_pool2d_backward(const Tensor<T>& gy, const Shape& input_shape, Size2 kernel,
                              const Pool2dOptions& o = {}) {
  EMBER_PROFILE_RANGE("avg_pool2d_backward");
  const cpu::PoolGeometry g = detail::pool_geometry("avg_pool2d", input_shape, gy.device(), kernel, o, false);
  detail::check_pool_grad("avg_pool2d_backward", gy, detail::pool_out_shape(input_shape, g));
  if (gy.device().is_cuda()) {
#if EMBER_USE_CUDNN
    const cuda::PoolParams p = detail::cudnn_pool("avg_pool2d_backward", g, detail::avg_mode(o), o, input_shape);
    auto guard = detail::cuda_scope(gy.device(), "avg_pool2d_backward");
    Tensor<T> gx = empty<T>(input_shape, gy.device());
    if (gy.numel() == 0) {
      cuda::fill(gx, 0.0);
      return gx;
    }
    // Average pooling reads neither x nor y; cuDNN still takes them, so gx and gy stand in (same shapes).
    const Tensor<T> gyc = detail::dense(gy);
    cuda::pool2d_backward<T>(gyc, gx, gyc, gx, p, "avg_pool2d_backward");
    return gx;
#endif
  }
  const Tensor<T> gyc = detail::dense(gy);
  Tensor<T> gx = empty<T>(input_shape, gy.device());
  cpu::avg_pool2d_backward<T>(g, gyc.data(), gx.data());
  return gx;
}

namespace detail {
inline cpu::PoolGeometry adaptive_geometry(const Shape& x, Device dev, Size2 out) {
  check_pool_input("adaptive_avg_pool2d", x, dev);
  EMBER_CHECK(out.h >= 0 && out.w >= 0, "adaptive_avg_pool2d: output size must be non-negative, got ", out.str());
  cpu::PoolGeometry g;
  g.planes = x[0] * x[1];
  g.h = x[2];
  g.w = x[3];
  g.oh = out.h;
  g.ow = out.w;
  return g;
}

/// On CUDA, adaptive average pooling runs as average pooling with kernel = stride = H/oh, W/ow, which is exact
/// when the output size divides the input size; other sizes (overlapping bins) are an error there.
inline Size2 adaptive_as_avg(const cpu::PoolGeometry& g, const Shape& xs) {
  EMBER_CHECK(g.oh > 0 && g.ow > 0 && g.h % g.oh == 0 && g.w % g.ow == 0, "adaptive_avg_pool2d: on CUDA the output "
              "size must divide the input size (got output ", Size2(g.oh, g.ow).str(), " for input shape ", xs.str(),
              "); overlapping bins run on the CPU only");
  return Size2(g.h / g.oh, g.w / g.ow);
}
}  // namespace detail

/// Adaptive average pooling of x (N, C, H, W) to (N, C, out.h, out.w): bin i spans [floor(i*H/oh), ceil((i+1)*H/oh)).
template <class T>
Tensor<T> adaptive_avg_pool2d(const Tensor<T>& x, Size2 output_size) {
  EMBER_PROFILE_RANGE("adaptive_avg_pool2d");
  static_assert(is_floating_v<T>, "adaptive_avg_pool2d: floating-point tensors only");
  const cpu::PoolGeometry g = detail::adaptive_geometry(x.shape(), x.device(), output_size);
  if (x.device().is_cuda()) return ops::avg_pool2d(x, detail::adaptive_as_avg(g, x.shape()), Pool2dOptions{});
  const Tensor<T> xc = detail::dense(x);
  Tensor<T> y = empty<T>(detail::pool_out_shape(x.shape(), g), x.device());
  cpu::adaptive_avg_pool2d_forward<T>(g, xc.data(), y.data());
  return y;
}

/// The input gradient (shape `input_shape`, (N, C, H, W)) of adaptive_avg_pool2d from gy (N, C, oh, ow).
template <class T>
Tensor<T> adaptive_avg_pool2d_backward(const Tensor<T>& gy, const Shape& input_shape) {
  EMBER_CHECK(gy.dim() == 4, "adaptive_avg_pool2d_backward: expected a 4-D gradient, got shape ", gy.shape().str());
  const cpu::PoolGeometry g = detail::adaptive_geometry(input_shape, gy.device(), Size2(gy.size(2), gy.size(3)));
  detail::check_pool_grad("adaptive_avg_pool2d_backward", gy, detail::pool_out_shape(input_shape, g));
  if (gy.device().is_cuda())
    return ops::avg_pool2d_backward(gy, input_shape, detail::adaptive_as_avg(g, input_shape), Pool2dOptions{});
  const Tensor<T> gyc = detail::dense(gy);
  Tensor<T> gx = empty<T>(input_shape, gy.device());
  cpu::adaptive_avg_pool2d_backward<T>(g, gyc.data(), gx.data());
  return gx;
}

}  // namespace ember::ops
