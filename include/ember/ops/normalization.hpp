// ember — batch norm and layer norm, forward and backward, without autograd: the argument checks and the dispatch
// to the CPU kernels of cpu/norm.hpp (their numerics are described there), to cuDNN (cuda/cudnn.hpp, batch norm) or
// to cuda/norm.cuh (layer norm, when the translation unit is compiled by nvcc, like the element-wise executor).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/norm.hpp"
#include "ember/cpu/thread_pool.hpp"

#include "ember/cuda/cudnn.hpp"
#include "ember/cuda/device.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/profile/range.hpp"

#if EMBER_WITH_CUDA && defined(__CUDACC__)
#include "ember/cuda/norm.cuh"
#define EMBER_CUDA_NORM 1
#else
#define EMBER_CUDA_NORM 0
#endif

namespace ember::ops {

/// The dtype of batch norm's per-channel statistics on CUDA (cuDNN's parameter type): double for double data,
/// float otherwise.
template <class T>
using bn_param_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// The dtypes batch norm's statistics and parameters (running_mean, running_var, weight, bias) may have for data of
/// dtype T: T itself, or float for half / bfloat16 data (mixed precision: fp32 parameters, 16-bit activations, as
/// PyTorch's mixed-type batch norm).
template <class P, class T>
concept BatchNormParam = std::is_same_v<P, T> ||
                         (std::is_same_v<P, float> && (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>));

namespace detail {
template <class T>
void check_channel_vec(const Tensor<T>& t, std::int64_t C, const char* what, const Shape& xs, Device dev) {
  if (!t.defined()) return;
  EMBER_CHECK(t.dim() == 1 && t.numel() == C, "batch_norm: ", what, " has shape ", t.shape().str(),
              " but the input of shape ", xs.str(), " has ", C, " channels (expected shape [", C, "])");
  EMBER_CHECK(t.device() == dev, "batch_norm: ", what, " is on ", t.device().str(), " but the input is on ",
              dev.str());
}

}  // namespace detail

/// What batch_norm's forward computed and its backward needs: the output, and per channel the mean and
/// 1/sqrt(var + eps) it normalised with (the batch's in training, the running statistics' in eval): on the host
/// for CPU tensors, on the device (save_mean, save_invstd; training only) for CUDA tensors.
template <class T>
struct BatchNormResult {
  Tensor<T> y;  ///< The output, x's shape.
  ///@{
  /// (C) on the host: the mean and 1/sqrt(var + eps) used (CPU tensors).
  std::vector<double> mean, invstd;  // (C), CPU
  ///@}
  ///@{
  /// (C) on the device: the same, for CUDA tensors in training.
  Tensor<bn_param_t<T>> save_mean, save_invstd;  // (C), CUDA
  ///@}
};

namespace detail {
template <class T, class Q>
BatchNormResult<T> batch_norm_forward_cuda(const Tensor<T>& x, const Tensor<Q>& running_mean,
                                           const Tensor<Q>& running_var, const Tensor<Q>& weight,
                                           const Tensor<Q>& bias, bool training, double momentum, double eps) {
#if EMBER_USE_CUDNN
  using P = bn_param_t<T>;
  cuda::check_device(x.device(), "batch_norm");
  cuda::DeviceGuard guard(x.device());
  const std::int64_t C = x.size(1);
  for (const Tensor<Q>* t : {&running_mean, &running_var})
    EMBER_CHECK(!t->defined() || t->is_contiguous(), "batch_norm: running statistics on CUDA must be contiguous");
  BatchNormResult<T> r;
  r.y = empty<T>(x.shape(), x.device());
  if (x.numel() == 0) return r;
  const Tensor<T> xc = x.is_contiguous() ? x : x.detach().contiguous();
  cuda::BatchNormParams<P> p;
  auto param = [&](const Tensor<Q>& t, double fill) {
    if (t.defined()) return cuda::cast_params<P>(t.is_contiguous() ? t : t.detach().contiguous());
    Tensor<P> c = empty<P>(Shape{C}, x.device());
    cuda::fill(c, fill);
    return c;
  };
  p.weight = param(weight, 1.0);
  p.bias = param(bias, 0.0);
  if (running_mean.defined()) {
    p.running_mean = cuda::cast_params<P>(running_mean);
    p.running_var = cuda::cast_params<P>(running_var);
  }
  if (training) {
    p.save_mean = empty<P>(Shape{C}, x.device());
    p.save_invstd = empty<P>(Shape{C}, x.device());
    cuda::batch_norm_forward_training<T, P>(xc, r.y, p, momentum, eps);
    if (running_mean.defined()) {
      cuda::store_params(p.running_mean, running_mean);
      cuda::store_params(p.running_var, running_var);
      running_mean.bump_version();
      running_var.bump_version();
    }
    r.save_mean = p.save_mean;
    r.save_invstd = p.save_invstd;
  } else {
    cuda::batch_norm_forward_inference<T, P>(xc, r.y, p, eps);
  }
  return r;
#else
  (void)running_mean, (void)running_var, (void)weight, (void)bias, (void)training, (void)momentum, (void)eps;
  EMBER_CHECK(false, "batch_norm: no kernel for tensors on ", x.device().str(),
              " in this build (CUDA tensors need EMBER_WITH_CUDA and cuDNN: link ember::cudnn)");
  return {};
#endif
}
}  // namespace detail

/// F.batch_norm's forward. x is (N, C) or (N, C, *). In training, normalises with the batch statistics over N and
/// the spatial dims (biased variance) and, when running_mean / running_var are defined, updates them in place:
/// r = (1 - momentum) r + momentum * batch_stat, with the unbiased variance for running_var. In eval, normalises
/// with the running statistics. weight and bias (C) are optional. The statistics and parameters may be float for
/// half / bfloat16 data (BatchNormParam); the output has x's dtype.
template <class T, BatchNormParam<T> P = T>
BatchNormResult<T> batch_norm_forward(const Tensor<T>& x, const Tensor<P>& running_mean,
                                      const Tensor<P>& running_var, const Tensor<P>& weight, const Tensor<P>& bias,
                                      bool training, double momentum, double eps) {
  EMBER_PROFILE_RANGE("batch_norm");
  static_assert(is_floating_v<T>, "batch_norm: needs a floating-point tensor");
  EMBER_CHECK(x.dim() >= 2, "batch_norm: expected an input of shape (N, C) or (N, C, *), got shape ",
              x.shape().str());
  const std::int64_t N = x.size(0), C = x.size(1), S = x.numel() / std::max<std::int64_t>(1, N * C);
  detail::check_channel_vec(running_mean, C, "running_mean", x.shape(), x.device());
  detail::check_channel_vec(running_var, C, "running_var", x.shape(), x.device());
  detail::check_channel_vec(weight, C, "weight", x.shape(), x.device());
  detail::check_channel_vec(bias, C, "bias", x.shape(), x.device());
  EMBER_CHECK(running_mean.defined() == running_var.defined(), "batch_norm: running_mean and running_var must be "
              "both defined or both undefined");
  EMBER_CHECK(training || running_mean.defined(), "batch_norm: running_mean and running_var must be defined in "
              "evaluation mode (training = false), input shape ", x.shape().str());
  const std::int64_t M = N * S;
  EMBER_CHECK(!training || M > 1, "batch_norm: expected more than 1 value per channel when training, got input of "
              "shape ", x.shape().str());
  EMBER_CHECK(eps >= 0, "batch_norm: eps must be non-negative, got ", eps);

  BatchNormResult<T> r;
  if (x.device().is_cuda()) return detail::batch_norm_forward_cuda(x, running_mean, running_var, weight, bias, training,
                                                                   momentum, eps);
  x.check_cpu("batch_norm");
  r.y = empty<T>(x.shape(), x.device());
  r.mean.assign(std::size_t(C), 0.0);
  r.invstd.assign(std::size_t(C), 0.0);
  if (x.numel() == 0) return r;
  const Tensor<T> xc = x.contiguous();
  cpu::batch_norm_forward(xc.data(), r.y.data(), N, C, S, running_mean, running_var, weight, bias, training, momentum,
                          eps, r.mean, r.invstd);
  if (training && running_mean.defined()) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  return r;
}

/// Gradients of batch_norm: dx (shape of x), dweight and dbias (C); each only when its flag is set (the others
/// are left undefined). `training` selects the batch-statistics gradient (the mean and variance depend on x) or
/// the eval one (they are constants). mean / invstd are what the forward returned. The weight's and bias's
/// gradients have the weight's dtype P.
template <class T, class P = T>
struct BatchNormGrads {
  Tensor<T> dx;       ///< The gradient of x.
  Tensor<P> dweight;  ///< The gradient of the weight.
  Tensor<P> dbias;    ///< The gradient of the bias.
};

namespace detail {
template <class T, class Q>
BatchNormGrads<T, Q> batch_norm_backward_cuda(const Tensor<T>& grad, const Tensor<T>& x, const Tensor<Q>& weight,
                                              const Tensor<bn_param_t<T>>& save_mean,
                                              const Tensor<bn_param_t<T>>& save_invstd, bool training, bool need_dx,
                                              bool need_dweight, bool need_dbias, double eps) {
#if EMBER_USE_CUDNN
  using P = bn_param_t<T>;
  EMBER_CHECK(grad.device() == x.device(), "batch_norm_backward: the gradient is on ", grad.device().str(),
              " but the input is on ", x.device().str());
  EMBER_CHECK(training, "batch_norm_backward: evaluation mode (running statistics) has no CUDA backward yet, input "
              "shape ", x.shape().str(), "; run it in training mode or on the CPU");
  EMBER_CHECK(save_mean.defined() && save_invstd.defined(), "batch_norm_backward: on CUDA the saved batch mean and "
              "inverse std of the forward pass are needed (BatchNormResult::save_mean / save_invstd)");
  cuda::check_device(x.device(), "batch_norm_backward");
  cuda::DeviceGuard guard(x.device());
  const std::int64_t C = x.size(1);
  BatchNormGrads<T, Q> r;
  const Tensor<T> xc = x.is_contiguous() ? x : x.detach().contiguous();
  const Tensor<T> gc = grad.is_contiguous() ? grad : grad.detach().contiguous();
  cuda::BatchNormParams<P> p;
  if (weight.defined()) {
    p.weight = cuda::cast_params<P>(weight.is_contiguous() ? weight : weight.detach().contiguous());
  } else {
    p.weight = empty<P>(Shape{C}, x.device());
    cuda::fill(p.weight, 1.0);
  }
  p.save_mean = save_mean;
  p.save_invstd = save_invstd;
  Tensor<T> dx = empty<T>(x.shape(), x.device());
  Tensor<P> dw = empty<P>(Shape{C}, x.device()), db = empty<P>(Shape{C}, x.device());
  if (x.numel() > 0) {
    cuda::batch_norm_backward_training<T, P>(gc, xc, p, dx, dw, db, eps);
  } else {
    cuda::fill(dw, 0.0);
    cuda::fill(db, 0.0);
  }
  if (need_dx) r.dx = dx;
  if (need_dweight) r.dweight = cuda::cast_params<Q>(dw);
  if (need_dbias) r.dbias = cuda::cast_params<Q>(db);
  return r;
#else
  (void)grad, (void)weight, (void)save_mean, (void)save_invstd, (void)training, (void)need_dx, (void)need_dweight,
      (void)need_dbias, (void)eps;
  EMBER_CHECK(false, "batch_norm_backward: no kernel for tensors on ", x.device().str(),
              " in this build (CUDA tensors need EMBER_WITH_CUDA and cuDNN: link ember::cudnn)");
  return {};
#endif
}
}  // namespace detail

/// On CUDA the statistics come from save_mean / save_invstd (device tensors from the forward's BatchNormResult) and
/// eps must be the forward's; on the CPU from mean / invstd. The weight (undefined without one) may be float for
/// half / bfloat16 data, as in batch_norm_forward; its dtype P is the dtype of dweight and dbias.
template <class T, BatchNormParam<T> P = T>
BatchNormGrads<T, P> batch_norm_backward(const Tensor<T>& grad, const Tensor<T>& x, const Tensor<P>& weight,
                                         const std::vector<double>& mean, const std::vector<double>& invstd,
                                         bool training, bool need_dx, bool need_dweight, bool need_dbias,
                                         const Tensor<bn_param_t<T>>& save_mean = Tensor<bn_param_t<T>>(),
                                         const Tensor<bn_param_t<T>>& save_invstd = Tensor<bn_param_t<T>>(),
                                         double eps = 1e-5) {
  EMBER_PROFILE_RANGE("batch_norm_backward");
  EMBER_CHECK(grad.shape() == x.shape(), "batch_norm_backward: the gradient has shape ", grad.shape().str(),
              " but the input has ", x.shape().str());
  if (x.device().is_cuda())
    return detail::batch_norm_backward_cuda(grad, x, weight, save_mean, save_invstd, training, need_dx, need_dweight,
                                            need_dbias, eps);
  x.check_cpu("batch_norm_backward");
  grad.check_cpu("batch_norm_backward");
  const std::int64_t N = x.size(0), C = x.size(1), S = x.numel() / std::max<std::int64_t>(1, N * C);
  BatchNormGrads<T, P> r;
  if (need_dx) r.dx = empty<T>(x.shape(), x.device());
  if (need_dweight) r.dweight = empty<P>(Shape{C}, x.device());
  if (need_dbias) r.dbias = empty<P>(Shape{C}, x.device());
  const Tensor<T> xc = x.contiguous(), gc = grad.contiguous();
  cpu::batch_norm_backward(gc.data(), xc.data(), need_dx ? r.dx.data() : nullptr,
                           need_dweight ? r.dweight.data() : nullptr, need_dbias ? r.dbias.data() : nullptr, N, C, S,
                           weight, mean, invstd, training);
  return r;
}

// ---- layer norm -------------------------------------------------------------------------------------------------

/// layer_norm's forward output and, per row, the mean and 1/sqrt(var + eps) (rows: x.numel() / D): on the host for
/// CPU tensors, on the device (save_mean, save_rstd) for CUDA tensors.
template <class T>
struct LayerNormResult {
  Tensor<T> y;  ///< The output, x's shape.
  ///@{
  /// Per row (R rows), the mean and 1/sqrt(var + eps): on the host for CPU tensors.
  std::vector<double> mean, rstd;
  ///@}
  ///@{
  /// Per row, the mean and 1/sqrt(var + eps) on the device, for CUDA tensors.
  Tensor<double> save_mean, save_rstd;
  ///@}
};

/// The gradients layer_norm_backward computes (undefined where not asked for).
template <class T>
struct LayerNormGrads {
  ///@{
  /// The gradients of x, the weight and the bias.
  Tensor<T> dx, dweight, dbias;
  ///@}
};

namespace detail {
/// Checks layer_norm's arguments; returns D = numel(normalized_shape).
template <class T>
std::int64_t check_layer_norm(const Tensor<T>& x, const Shape& ns, const Tensor<T>& w, const Tensor<T>& b) {
  EMBER_CHECK(ns.n >= 1, "layer_norm: normalized_shape must have at least one dim, got ", ns.str());
  bool match = x.dim() >= ns.n;
  for (int i = 0; match && i < ns.n; ++i) match = x.shape()[x.dim() - ns.n + i] == ns[i];
  EMBER_CHECK(match, "layer_norm: normalized_shape ", ns.str(), " does not match the trailing dims of the input of "
              "shape ", x.shape().str());
  EMBER_CHECK(!w.defined() || w.shape() == ns, "layer_norm: weight has shape ", w.shape().str(),
              " but normalized_shape is ", ns.str());
  EMBER_CHECK(!b.defined() || b.shape() == ns, "layer_norm: bias has shape ", b.shape().str(),
              " but normalized_shape is ", ns.str());
  EMBER_CHECK(!w.defined() || w.device() == x.device(), "layer_norm: weight is on ", w.device().str(),
              " but the input of shape ", x.shape().str(), " is on ", x.device().str());
  EMBER_CHECK(!b.defined() || b.device() == x.device(), "layer_norm: bias is on ", b.device().str(),
              " but the input of shape ", x.shape().str(), " is on ", x.device().str());
  return ns.numel();
}

#if EMBER_CUDA_NORM
template <class T>
void layer_norm_forward_cuda(const Tensor<T>& x, const Tensor<T>& weight, const Tensor<T>& bias, double eps,
                             std::int64_t R, std::int64_t D, LayerNormResult<T>& r) {
  cuda::check_device(x.device(), "layer_norm");
  cuda::DeviceGuard guard(x.device());
  r.save_mean = empty<double>(Shape{R}, x.device());
  r.save_rstd = empty<double>(Shape{R}, x.device());
  if (x.numel() == 0) return;
  const Tensor<T> xc = dense(x), wc = weight.defined() ? dense(weight) : weight;
  const Tensor<T> bc = bias.defined() ? dense(bias) : bias;
  cuda::layer_norm_forward(xc.data(), wc.defined() ? wc.data() : nullptr, bc.defined() ? bc.data() : nullptr,
                           r.y.data(), r.save_mean.data(), r.save_rstd.data(), R, D, eps, x.device().index);
}

template <class T>
void layer_norm_backward_cuda(const Tensor<T>& grad, const Tensor<T>& x, const Tensor<T>& weight,
                              const Tensor<double>& save_mean, const Tensor<double>& save_rstd, std::int64_t R,
                              std::int64_t D, LayerNormGrads<T>& r) {
  cuda::check_device(x.device(), "layer_norm_backward");
  cuda::DeviceGuard guard(x.device());
  if (x.numel() == 0) {
    if (r.dweight.defined()) r.dweight = zeros<T>(r.dweight.shape(), x.device());
    if (r.dbias.defined()) r.dbias = zeros<T>(r.dbias.shape(), x.device());
    return;
  }
  const Tensor<T> xc = dense(x), gc = dense(grad), wc = weight.defined() ? dense(weight) : weight;
  Tensor<double> part;
  if (r.dweight.defined() || r.dbias.defined())
    part = empty<double>(Shape{2 * cuda::layer_norm_param_blocks(R) * D}, x.device());
  cuda::layer_norm_backward(gc.data(), xc.data(), wc.defined() ? wc.data() : nullptr, save_mean.data(),
                            save_rstd.data(), r.dx.defined() ? r.dx.data() : nullptr,
                            r.dweight.defined() ? r.dweight.data() : nullptr,
                            r.dbias.defined() ? r.dbias.data() : nullptr, part.defined() ? part.data() : nullptr, R, D,
                            x.device().index);
}
#endif
}  // namespace detail

/// F.layer_norm's forward: each row of the last D = numel(normalized_shape) elements is normalised with its own
/// mean and biased variance, then scaled by weight and shifted by bias (both of normalized_shape, optional).
template <class T>
LayerNormResult<T> layer_norm_forward(const Tensor<T>& x, const Shape& normalized_shape, const Tensor<T>& weight,
                                      const Tensor<T>& bias, double eps) {
  EMBER_PROFILE_RANGE("layer_norm");
  static_assert(is_floating_v<T>, "layer_norm: needs a floating-point tensor");
  const std::int64_t D = detail::check_layer_norm(x, normalized_shape, weight, bias);
  EMBER_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  LayerNormResult<T> r;
  const std::int64_t R = D > 0 ? x.numel() / D : 0;
  if (x.device().is_cuda()) {
#if EMBER_CUDA_NORM
    r.y = empty<T>(x.shape(), x.device());
    detail::layer_norm_forward_cuda(x, weight, bias, eps, R, D, r);
    return r;
#else
    detail::no_cuda_kernel("layer_norm", x.device(), "the layer norm kernels");
#endif
  }
  x.check_cpu("layer_norm");
  r.y = empty<T>(x.shape(), x.device());
  r.mean.assign(std::size_t(R), 0.0);
  r.rstd.assign(std::size_t(R), 0.0);
  if (x.numel() == 0) return r;
  const Tensor<T> xc = x.contiguous(), wc = weight.defined() ? weight.contiguous() : Tensor<T>(),
                  bc = bias.defined() ? bias.contiguous() : Tensor<T>();
  cpu::layer_norm_forward(xc.data(), wc.defined() ? wc.data() : nullptr, bc.defined() ? bc.data() : nullptr, r.y.data(),
                          R, D, eps, r.mean, r.rstd);
  return r;
}

/// Gradients of layer_norm (each only when its flag is set), from the forward's per-row statistics: mean and rstd on
/// the CPU, save_mean and save_rstd (the forward's LayerNormResult) on CUDA.
template <class T>
LayerNormGrads<T> layer_norm_backward(const Tensor<T>& grad, const Tensor<T>& x, const Shape& normalized_shape,
                                      const Tensor<T>& weight, const std::vector<double>& mean,
                                      const std::vector<double>& rstd, bool need_dx, bool need_dweight,
                                      bool need_dbias, const Tensor<double>& save_mean = Tensor<double>(),
                                      const Tensor<double>& save_rstd = Tensor<double>()) {
  EMBER_PROFILE_RANGE("layer_norm_backward");
  EMBER_CHECK(grad.shape() == x.shape(), "layer_norm_backward: the gradient has shape ", grad.shape().str(),
              " but the input has ", x.shape().str());
  EMBER_CHECK(grad.device() == x.device(), "layer_norm_backward: the gradient is on ", grad.device().str(),
              " but the input of shape ", x.shape().str(), " is on ", x.device().str());
  EMBER_CHECK(!weight.defined() || weight.device() == x.device(), "layer_norm_backward: weight is on ",
              weight.device().str(), " but the input of shape ", x.shape().str(), " is on ", x.device().str());
  const std::int64_t D = normalized_shape.numel();
  const std::int64_t R = D > 0 ? x.numel() / D : 0;
  LayerNormGrads<T> r;
  auto allocate = [&] {
    if (need_dx) r.dx = empty<T>(x.shape(), x.device());
    if (need_dweight) r.dweight = empty<T>(normalized_shape, x.device());
    if (need_dbias) r.dbias = empty<T>(normalized_shape, x.device());
  };
  if (x.device().is_cuda()) {
#if EMBER_CUDA_NORM
    EMBER_CHECK(save_mean.defined() && save_rstd.defined() && save_mean.numel() == R && save_rstd.numel() == R &&
                    save_mean.device() == x.device() && save_rstd.device() == x.device(),
                "layer_norm_backward: on CUDA the forward's per-row statistics are needed (LayerNormResult::"
                "save_mean / save_rstd: ", R, " values on ", x.device().str(), "), input shape ", x.shape().str());
    allocate();
    detail::layer_norm_backward_cuda(grad, x, weight, save_mean, save_rstd, R, D, r);
    return r;
#else
    (void)save_mean, (void)save_rstd;
    detail::no_cuda_kernel("layer_norm_backward", x.device(), "the layer norm kernels");
#endif
  }
  x.check_cpu("layer_norm_backward");
  allocate();
  EMBER_CHECK(std::int64_t(mean.size()) == R && std::int64_t(rstd.size()) == R, "layer_norm_backward: expected the "
              "forward's ", R, " per-row statistics, got ", mean.size(), " means and ", rstd.size(), " rstds");
  const Tensor<T> xc = x.contiguous(), gc = grad.contiguous(), wc = weight.defined() ? weight.contiguous() : Tensor<T>();
  cpu::layer_norm_backward(gc.data(), xc.data(), wc.defined() ? wc.data() : nullptr, need_dx ? r.dx.data() : nullptr,
                           need_dweight ? r.dweight.data() : nullptr, need_dbias ? r.dbias.data() : nullptr, R, D, mean,
                           rstd);
  return r;
}

}  // namespace ember::ops
