// ember — 2-D max and average pooling on CUDA through cuDNN, forward and backward.
#pragma once

#include "ember/cuda/cudnn_handle.hpp"  // EMBER_USE_CUDNN

#if EMBER_USE_CUDNN
#include <cstdint>

#include "ember/core/tensor.hpp"
#include "ember/core/window.hpp"

namespace ember::cuda {

// ---- pooling ------------------------------------------------------------------------------------------------------

/// A 2-D max or average pooling window (no dilation: cuDNN has none, dh and dw stay 1; the output size is the floor
/// rule's).
struct PoolParams : Window2d {
  enum Mode { max, avg_include_pad, avg_exclude_pad } mode = max;
};

namespace detail {
inline void set_pool(const PoolDesc& d, const PoolParams& p, const char* op) {
  const cudnnPoolingMode_t m = p.mode == PoolParams::max               ? CUDNN_POOLING_MAX
                               : p.mode == PoolParams::avg_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                                       : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
  EMBER_CUDNN_CHECK(cudnnSetPooling2dDescriptor(d.d, m, CUDNN_PROPAGATE_NAN, to_int(p.kh, op), to_int(p.kw, op),
                                                to_int(p.ph, op), to_int(p.pw, op), to_int(p.sh, op),
                                                to_int(p.sw, op)));
}
template <class T>
TensorDesc nchw_desc(const Tensor<T>& t, const char* op) {
  return TensorDesc(cudnn_dtype<T>(), t.size(0), t.size(1), t.size(2), t.size(3), op);
}
}  // namespace detail

/// y (N, C, oh, ow) = pool(x (N, C, H, W)); dense, y allocated by the caller.
template <class T>
void pool2d_forward(const Tensor<T>& x, const Tensor<T>& y, const PoolParams& p, const char* op) {
  cudnnHandle_t h = cudnn_handle(x.device().index);
  detail::PoolDesc pd;
  detail::set_pool(pd, p, op);
  detail::TensorDesc xd = detail::nchw_desc(x, op), yd = detail::nchw_desc(y, op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnPoolingForward(h, pd.d, &one, xd.d, x.data(), &zero, yd.d, y.data()));
}

/// gx (N, C, H, W) from gy (N, C, oh, ow), the forward's input x and output y (max pooling finds its argmax again
/// from them); gx allocated by the caller.
template <class T>
void pool2d_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& gx,
                     const PoolParams& p, const char* op) {
  cudnnHandle_t h = cudnn_handle(gy.device().index);
  detail::PoolDesc pd;
  detail::set_pool(pd, p, op);
  detail::TensorDesc xd = detail::nchw_desc(gx, op), yd = detail::nchw_desc(gy, op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(
      cudnnPoolingBackward(h, pd.d, &one, yd.d, y.data(), yd.d, gy.data(), xd.d, x.data(), &zero, xd.d, gx.data()));
}

}  // namespace ember::cuda

#endif  // EMBER_USE_CUDNN
