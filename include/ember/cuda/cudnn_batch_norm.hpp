// ember — batch norm on CUDA through cuDNN (spatial mode: per channel over N and the spatial dims): training and
// inference forward, training backward, and its per-channel parameters in cuDNN's parameter type.
#pragma once

#include "ember/cuda/cudnn_handle.hpp"  // EMBER_USE_CUDNN

#if EMBER_USE_CUDNN
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/allocator.hpp"  // registers the device allocator: cast_params's tensors are ember tensors

namespace ember::cuda {

// ---- batch norm ---------------------------------------------------------------------------------------------------

/// Batch norm's per-channel tensors in cuDNN's parameter type P (float, or double for double data).
template <class P>
struct BatchNormParams {
  Tensor<P> weight, bias;                 // (C) never undefined: ones / zeros when the layer has none
  Tensor<P> running_mean, running_var;    // (C) or undefined
  Tensor<P> save_mean, save_invstd;       // (C) written by training forward, read by backward
};

namespace detail {
/// x (N, C, *) as the 4-D (N, C, S, 1) cuDNN normalises per channel over N and S.
template <class T>
TensorDesc bn_desc(const Tensor<T>& x, const char* op) {
  const std::int64_t N = x.size(0), C = x.size(1), S = x.numel() / std::max<std::int64_t>(1, N * C);
  return TensorDesc(cudnn_dtype<T>(), N, C, S, 1, op);
}
template <class P>
TensorDesc bn_param_desc(std::int64_t C, const char* op) {
  return TensorDesc(cudnn_dtype<P>(), 1, C, 1, 1, op);
}
}  // namespace detail


/// A small dense tensor (batch norm's (C) parameters) converted to dtype P on the same device. The same dtype
/// returns t itself; another goes through the host (C values, synchronous), since cuDNN wants fp32 parameters for
/// 16-bit data and this layer has no element-wise kernel of its own.
template <class P, class T>
Tensor<P> cast_params(const Tensor<T>& t) {
  if constexpr (std::is_same_v<P, T>) {
    return t;
  } else {
    const std::int64_t n = t.numel();
    std::vector<T> h(static_cast<std::size_t>(n));
    std::vector<P> hp(static_cast<std::size_t>(n));
    const cudaStream_t s = current_stream(t.device().index).handle();
    Tensor<P> r = empty<P>(t.shape(), t.device());
    if (n == 0) return r;
    EMBER_CUDA_CHECK(cudaMemcpyAsync(h.data(), t.data(), std::size_t(n) * sizeof(T), cudaMemcpyDeviceToHost, s));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(s));
    for (std::size_t i = 0; i < h.size(); ++i) hp[i] = convert<P>(static_cast<compute_t<T>>(h[i]));
    EMBER_CUDA_CHECK(cudaMemcpyAsync(r.data(), hp.data(), std::size_t(n) * sizeof(P), cudaMemcpyHostToDevice, s));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(s));  // hp dies with this scope
    return r;
  }
}

/// Writes the values of a small dense tensor `src` into the dense tensor `dst` (same numel), converting the dtype.
template <class T, class P>
void store_params(const Tensor<P>& src, const Tensor<T>& dst) {
  if constexpr (std::is_same_v<P, T>) {
    if (src.data() == dst.data()) return;
  }
  const Tensor<T> c = cast_params<T>(src);
  const cudaStream_t s = current_stream(dst.device().index).handle();
  EMBER_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), c.data(), std::size_t(dst.numel()) * sizeof(T), cudaMemcpyDeviceToDevice, s));
}

/// Training forward: y = batch-normalised x with the batch statistics (biased variance); updates the running
/// statistics (when defined) with `momentum` and the unbiased variance, and saves the batch mean and 1/sqrt(var +
/// eps) for backward. x, y dense (N, C, *).
template <class T, class P>
void batch_norm_forward_training(const Tensor<T>& x, const Tensor<T>& y, BatchNormParams<P>& p, double momentum,
                                 double eps) {
  const char* op = "batch_norm";
  cudnnHandle_t h = cudnn_handle(x.device().index);
  detail::TensorDesc xd = detail::bn_desc(x, op);
  detail::TensorDesc pd = detail::bn_param_desc<P>(x.size(1), op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.data(), xd.d, y.data(), pd.d, p.weight.data(), p.bias.data(),
      momentum, detail::mut_data_of(p.running_mean), detail::mut_data_of(p.running_var), eps, p.save_mean.data(),
      p.save_invstd.data()));
}

/// Inference forward: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias.
template <class T, class P>
void batch_norm_forward_inference(const Tensor<T>& x, const Tensor<T>& y, const BatchNormParams<P>& p, double eps) {
  const char* op = "batch_norm";
  cudnnHandle_t h = cudnn_handle(x.device().index);
  detail::TensorDesc xd = detail::bn_desc(x, op);
  detail::TensorDesc pd = detail::bn_param_desc<P>(x.size(1), op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd.d, x.data(),
                                                            xd.d, y.data(), pd.d, p.weight.data(), p.bias.data(),
                                                            p.running_mean.data(), p.running_var.data(), eps));
}

/// Training backward from the saved batch statistics: gx (shape of x), gweight and gbias (C, type P).
template <class T, class P>
void batch_norm_backward_training(const Tensor<T>& gy, const Tensor<T>& x, const BatchNormParams<P>& p,
                                  const Tensor<T>& gx, const Tensor<P>& gweight, const Tensor<P>& gbias, double eps) {
  const char* op = "batch_norm_backward";
  cudnnHandle_t h = cudnn_handle(x.device().index);
  detail::TensorDesc xd = detail::bn_desc(x, op);
  detail::TensorDesc pd = detail::bn_param_desc<P>(x.size(1), op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnBatchNormalizationBackward(h, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd.d,
                                                    x.data(), xd.d, gy.data(), xd.d, gx.data(), pd.d, p.weight.data(),
                                                    gweight.data(), gbias.data(), eps, p.save_mean.data(),
                                                    p.save_invstd.data()));
}

}  // namespace ember::cuda

#endif  // EMBER_USE_CUDNN
