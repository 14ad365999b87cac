// ember — what every cuDNN call of ember shares: EMBER_USE_CUDNN, the cuDNN handle per thread and device (created
// on first use and bound to ember's current stream before every call), cuDNN's dtype and scaling-factor types, RAII
// descriptors, and fill (cudnnSetTensor). The operations are in cudnn_conv.hpp, cudnn_pool.hpp,
// cudnn_batch_norm.hpp and cudnn_softmax.hpp; <ember/cuda/cudnn.hpp> includes them all.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include "ember/cuda/check.hpp"
#endif

/// 1 when CUDA tensors run through cuDNN: a CUDA build (EMBER_WITH_CUDA) whose target links cuDNN (ember::cudnn
/// defines EMBER_WITH_CUDNN=1; without CMake, define it and link -lcudnn) and finds cudnn.h. Otherwise conv2d,
/// pooling, batch norm and softmax on CUDA tensors are errors that say so.
#if EMBER_WITH_CUDA && EMBER_HAVE_CUDNN && defined(EMBER_WITH_CUDNN) && EMBER_WITH_CUDNN
#define EMBER_USE_CUDNN 1
#else
#define EMBER_USE_CUDNN 0
#endif

#if EMBER_USE_CUDNN
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "ember/core/dtype.hpp"
#include "ember/core/float16.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace detail {

struct CudnnHandle {
  cudnnHandle_t h = nullptr;
  int device = -1;
  CudnnHandle() = default;
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  ~CudnnHandle() {
    if (!h) return;
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    EMBER_CUDA_WARN(cudaSetDevice(device));
    if (cudnnDestroy(h) != CUDNN_STATUS_SUCCESS) std::fprintf(stderr, "ember: cudnnDestroy failed\n");
    EMBER_CUDA_WARN(cudaSetDevice(prev));
  }
};

template <class T>
constexpr cudnnDataType_t cudnn_dtype() {
  if constexpr (std::is_same_v<T, float>) return CUDNN_DATA_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return CUDNN_DATA_DOUBLE;
  else if constexpr (std::is_same_v<T, half>) return CUDNN_DATA_HALF;
  else if constexpr (std::is_same_v<T, bfloat16>) return CUDNN_DATA_BFLOAT16;
  else static_assert(!sizeof(T*), "cuDNN: float, double, half or bfloat16 only");
}

/// The type of cuDNN's alpha/beta scaling factors and of batch norm's parameters: double for double data,
/// float otherwise.
template <class T>
using cudnn_scale_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

inline int to_int(std::int64_t v, const char* op) {
  EMBER_CHECK(v >= 0 && v <= INT_MAX, op, ": size ", v, " exceeds cuDNN's 32-bit int limit");
  return int(v);
}

/// RAII for cuDNN descriptors.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc() { EMBER_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d)); }
  /// A dense (n, c, h, w) tensor.
  TensorDesc(cudnnDataType_t t, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w, const char* op)
      : TensorDesc() {
    EMBER_CHECK(n * c * h * w <= INT_MAX, op, ": a tensor of ", n * c * h * w, " elements exceeds cuDNN's limit");
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d, t, to_int(n, op), to_int(c, op), to_int(h, op), to_int(w, op),
                                                   to_int(c * h * w, op), to_int(h * w, op), to_int(w, op), 1));
  }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  ~TensorDesc() {
    if (d) (void)cudnnDestroyTensorDescriptor(d);
  }
};
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(cudnnDataType_t t, std::int64_t o, std::int64_t c, std::int64_t kh, std::int64_t kw, const char* op) {
    EMBER_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    EMBER_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, t, CUDNN_TENSOR_NCHW, to_int(o, op), to_int(c, op),
                                                 to_int(kh, op), to_int(kw, op)));
  }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  ~FilterDesc() {
    if (d) (void)cudnnDestroyFilterDescriptor(d);
  }
};
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc() { EMBER_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d)); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  ~ConvDesc() {
    if (d) (void)cudnnDestroyConvolutionDescriptor(d);
  }
};
struct PoolDesc {
  cudnnPoolingDescriptor_t d = nullptr;
  PoolDesc() { EMBER_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d)); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  ~PoolDesc() {
    if (d) (void)cudnnDestroyPoolingDescriptor(d);
  }
};

template <class T>
const void* data_of(const Tensor<T>& t) {
  return t.defined() ? static_cast<const void*>(t.data()) : nullptr;
}
template <class T>
void* mut_data_of(const Tensor<T>& t) {
  return t.defined() ? static_cast<void*>(t.data()) : nullptr;
}

}  // namespace detail

/// This thread's cuDNN handle for device `index` (the current one by default), bound to the current stream. The
/// caller must have made `index` the current device.
inline cudnnHandle_t cudnn_handle(int index = -1) {
  if (index < 0) index = current_device();
  EMBER_CHECK(index >= 0 && index < kMaxDevices, "cuDNN: device index ", index, " out of range");
  thread_local std::array<detail::CudnnHandle, kMaxDevices> hs;
  detail::CudnnHandle& h = hs[std::size_t(index)];
  if (!h.h) {
    EMBER_CUDNN_CHECK(cudnnCreate(&h.h));
    h.device = index;
  }
  EMBER_CUDNN_CHECK(cudnnSetStream(h.h, current_stream(index).handle()));
  return h.h;
}

/// Fills a dense tensor with one value (cudnnSetTensor).
template <class T>
void fill(const Tensor<T>& t, double v) {
  if (t.numel() == 0) return;
  cudnnHandle_t h = cudnn_handle(t.device().index);
  detail::TensorDesc d(detail::cudnn_dtype<T>(), 1, t.numel(), 1, 1, "fill");
  const T value = convert<T>(v);
  EMBER_CUDNN_CHECK(cudnnSetTensor(h, d.d, t.data(), &value));
}

}  // namespace ember::cuda

#endif  // EMBER_USE_CUDNN
