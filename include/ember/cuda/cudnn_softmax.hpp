// ember — softmax and log_softmax on CUDA through cuDNN (channel mode over the middle dim of (outer, n, inner)),
// forward and backward.
#pragma once

#include "ember/cuda/cudnn_handle.hpp"  // EMBER_USE_CUDNN

#if EMBER_USE_CUDNN
#include <cstdint>

#include "ember/core/tensor.hpp"

namespace ember::cuda {

// ---- softmax ------------------------------------------------------------------------------------------------------

namespace detail {
/// A dense tensor as (outer, n, inner, 1) around the softmax dim: cuDNN's channel mode normalises over "C".
template <class T>
TensorDesc softmax_desc(std::int64_t outer, std::int64_t n, std::int64_t inner, const char* op) {
  return TensorDesc(cudnn_dtype<T>(), outer, n, inner, 1, op);
}
}  // namespace detail

/// y = softmax or log_softmax of x along the middle dim of (outer, n, inner); dense, y allocated by the caller.
template <class T>
void softmax_forward(const Tensor<T>& x, const Tensor<T>& y, std::int64_t outer, std::int64_t n, std::int64_t inner,
                     bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  cudnnHandle_t h = cudnn_handle(x.device().index);
  detail::TensorDesc d = detail::softmax_desc<T>(outer, n, inner, op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnSoftmaxForward(h, log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                        CUDNN_SOFTMAX_MODE_CHANNEL, &one, d.d, x.data(), &zero, d.d, y.data()));
}

/// gx from the forward output y and gy (all dense, viewed as (outer, n, inner)).
template <class T>
void softmax_backward(const Tensor<T>& y, const Tensor<T>& gy, const Tensor<T>& gx, std::int64_t outer,
                      std::int64_t n, std::int64_t inner, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  cudnnHandle_t h = cudnn_handle(y.device().index);
  detail::TensorDesc d = detail::softmax_desc<T>(outer, n, inner, op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnSoftmaxBackward(h, log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                         CUDNN_SOFTMAX_MODE_CHANNEL, &one, d.d, y.data(), d.d, gy.data(), &zero, d.d,
                                         gx.data()));
}

}  // namespace ember::cuda

#endif  // EMBER_USE_CUDNN
