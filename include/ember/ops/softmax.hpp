// ember — softmax and log_softmax along one dim, and their backward passes, without autograd: the checks and the
// dispatch to the CPU kernels of cpu/softmax.hpp (their numerics are described there) or to cuDNN (cuda/cudnn.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/softmax.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/detail/fastmath.hpp"

#include "ember/cuda/cudnn.hpp"
#include "ember/cuda/device.hpp"
#include "ember/profile/range.hpp"

namespace ember::ops {

namespace detail {

/// CUDA: cuDNN's channel-mode softmax over the tensor seen as (outer, n, inner, 1). y is the output when
/// `forward`, else the forward output with g the incoming gradient.
template <bool Log, class T>
Tensor<T> softmax_cuda(const Tensor<T>& a, const Tensor<T>& g, const cpu::SoftmaxGeom& geo, bool forward,
                       const char* op) {
#if EMBER_USE_CUDNN
  cuda::check_device(a.device(), op);
  cuda::DeviceGuard guard(a.device());
  Tensor<T> out = empty<T>(a.shape(), a.device());
  if (a.numel() == 0) return out;
  const Tensor<T> ac = a.is_contiguous() ? a : a.detach().contiguous();
  if (forward) {
    cuda::softmax_forward<T>(ac, out, geo.outer, geo.n, geo.inner, Log);
  } else {
    EMBER_CHECK(g.device() == a.device(), op, ": the gradient is on ", g.device().str(), " but the output is on ",
                a.device().str());
    const Tensor<T> gc = g.is_contiguous() ? g : g.detach().contiguous();
    cuda::softmax_backward<T>(ac, gc, out, geo.outer, geo.n, geo.inner, Log);
  }
  return out;
#else
  (void)g, (void)geo, (void)forward;
  EMBER_CHECK(false, op, ": no kernel for tensors on ", a.device().str(), " in this build (CUDA tensors need "
              "EMBER_WITH_CUDA and cuDNN: link ember::cudnn)");
  return {};
#endif
}

template <bool Log, class T>
Tensor<T> softmax_impl(const Tensor<T>& x, std::int64_t dim, const char* op) {
  EMBER_PROFILE_RANGE(op);
  static_assert(is_floating_v<T>, "softmax/log_softmax: needs a floating-point tensor");
  if (x.device().is_cuda())
    return softmax_cuda<Log>(x, Tensor<T>(), cpu::softmax_geom(x.shape(), wrap_dim(dim, x.shape(), op)), true, op);
  x.check_cpu(op);
  const int d = wrap_dim(dim, x.shape(), op);
  const Tensor<T> xc = x.contiguous();
  Tensor<T> y = empty<T>(x.shape(), x.device());
  if (x.numel() == 0) return y;
  cpu::softmax_forward<Log>(xc.data(), y.data(), cpu::softmax_geom(x.shape(), d));
  return y;
}

template <bool Log, class T>
Tensor<T> softmax_backward_impl(const Tensor<T>& y, const Tensor<T>& grad, std::int64_t dim, const char* op) {
  EMBER_PROFILE_RANGE(op);
  EMBER_CHECK(grad.shape() == y.shape(), op, ": the gradient has shape ", grad.shape().str(), " but the output has ",
              y.shape().str());
  const int d = wrap_dim(dim, y.shape(), op);
  if (y.device().is_cuda()) return softmax_cuda<Log>(y, grad, cpu::softmax_geom(y.shape(), d), false, op);
  y.check_cpu(op);
  grad.check_cpu(op);
  const Tensor<T> yc = y.contiguous(), gc = grad.contiguous();
  Tensor<T> gx = empty<T>(y.shape(), y.device());
  if (y.numel() == 0) return gx;
  cpu::softmax_backward<Log>(yc.data(), gc.data(), gx.data(), cpu::softmax_geom(y.shape(), d));
  return gx;
}

}  // namespace detail

/// exp(x) / Σ exp(x) along dim, computed as exp(x - max) / Σ exp(x - max). Returns a new contiguous tensor.
template <class T>
Tensor<T> softmax(const Tensor<T>& x, std::int64_t dim) {
  return detail::softmax_impl<false>(x, dim, "softmax");
}

/// x - log Σ exp(x) along dim, computed as (x - max) - log Σ exp(x - max).
template <class T>
Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t dim) {
  return detail::softmax_impl<true>(x, dim, "log_softmax");
}

/// Gradient of softmax from its output y: y * (grad - Σ grad * y) along dim.
template <class T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& grad, std::int64_t dim) {
  return detail::softmax_backward_impl<false>(y, grad, dim, "softmax_backward");
}

/// Gradient of log_softmax from its output y: grad - exp(y) * Σ grad along dim.
template <class T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& grad, std::int64_t dim) {
  return detail::softmax_backward_impl<true>(y, grad, dim, "log_softmax_backward");
}

}  // namespace ember::ops
