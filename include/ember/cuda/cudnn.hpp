// ember — convolution, pooling, batch norm and softmax on CUDA through cuDNN's (legacy, still shipped in cuDNN 9)
// API. One cuDNN handle per thread and device, created on first use and bound to ember's current stream before
// every call; RAII descriptors; workspace from the caching allocator (an ember tensor). The convolution algorithm
// of each problem is chosen once and cached (cuda/algo_cache.hpp): by timing every candidate when
// set_benchmark(true) (torch.backends.cudnn.benchmark), by cuDNN's heuristics otherwise.
//
// Tensors here are dense NCHW (ops/ passes contiguous ones). fp16 and bf16 compute in fp32, fp64 in fp64; fp32
// convolutions use TF32 only when set_cudnn_allow_tf32(true).
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
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/float16.hpp"
#include "ember/core/tensor.hpp"
#include "ember/core/window.hpp"
#include "ember/cuda/algo_cache.hpp"
#include "ember/cuda/allocator.hpp"  // registers the device allocator: workspaces are ember tensors
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace detail {
inline std::atomic<bool>& benchmark_flag() {
  static std::atomic<bool> f{false};
  return f;
}
inline std::atomic<bool>& cudnn_tf32_flag() {
  static std::atomic<bool> f{false};
  return f;
}
}  // namespace detail

/// Benchmark mode (torch.backends.cudnn.benchmark): the first convolution of each new problem times every cuDNN
/// algorithm and keeps the fastest; later calls with the same problem reuse it. Off: cuDNN's heuristics choose.
inline void set_benchmark(bool on) { detail::benchmark_flag().store(on, std::memory_order_relaxed); }
inline bool benchmark() { return detail::benchmark_flag().load(std::memory_order_relaxed); }

/// Lets fp32 convolutions use TF32 tensor cores (torch.backends.cudnn.allow_tf32). Off by default here, so fp32
/// convolutions match the CPU to fp32 precision unless asked otherwise.
inline void set_cudnn_allow_tf32(bool on) { detail::cudnn_tf32_flag().store(on, std::memory_order_relaxed); }
inline bool cudnn_allow_tf32() { return detail::cudnn_tf32_flag().load(std::memory_order_relaxed); }

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

// ---- convolution ------------------------------------------------------------------------------------------------

/// The window (padding, stride, dilation; the kernel extent is the weight's) and groups of a 2-D convolution.
struct ConvParams : Window2d {
  std::int64_t groups = 1;
};

namespace detail {

/// The problem of one pass (x (N, C, H, W), w (O, C/groups, kh, kw), y (N, O, oh, ow), all dense).
template <class T>
ConvProblem conv_problem(ConvPass pass, const Shape& xs, const Shape& ws, const Shape& ys, const ConvParams& p,
                         Device dev) {
  ConvProblem q;
  q.pass = pass;
  q.device = dev;
  q.dtype = int(cudnn_dtype<T>());
  q.compute_dtype = int(std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT);
  q.x_shape = xs;
  q.x_strides = contiguous_strides(xs);
  q.w_shape = ws;
  q.y_shape = ys;
  q.y_strides = contiguous_strides(ys);
  q.window = p;
  q.groups = p.groups;
  q.allow_tf32 = std::is_same_v<T, float> && cudnn_allow_tf32();
  q.layout = 0;
  return q;
}

/// The math type a problem is queried with: FMA for fp32 without TF32, tensor ops for 16-bit, default otherwise.
template <class T>
cudnnMathType_t base_math_type() {
  if constexpr (std::is_same_v<T, float>) return cudnn_allow_tf32() ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  else if constexpr (std::is_same_v<T, double>) return CUDNN_DEFAULT_MATH;
  else return CUDNN_TENSOR_OP_MATH;
}

/// The descriptors of one convolution problem.
template <class T>
struct ConvDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  ConvDescs(const Shape& xs, const Shape& ws, const Shape& ys, const ConvParams& p, const char* op)
      : x(cudnn_dtype<T>(), xs[0], xs[1], xs[2], xs[3], op),
        y(cudnn_dtype<T>(), ys[0], ys[1], ys[2], ys[3], op),
        w(cudnn_dtype<T>(), ws[0], ws[1], ws[2], ws[3], op) {
    const cudnnDataType_t compute = std::is_same_v<T, double> ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    EMBER_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.d, to_int(p.ph, op), to_int(p.pw, op),
                                                      to_int(p.sh, op), to_int(p.sw, op), to_int(p.dh, op),
                                                      to_int(p.dw, op), CUDNN_CROSS_CORRELATION, compute));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.d, to_int(p.groups, op)));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.d, base_math_type<T>()));
  }
};

/// A workspace of n bytes from the caching allocator (undefined when n is 0).
inline Tensor<std::uint8_t> workspace(std::size_t n, Device dev) {
  if (n == 0) return Tensor<std::uint8_t>();
  return empty<std::uint8_t>(Shape{std::int64_t(n)}, dev);
}

inline constexpr std::size_t kMaxFindWorkspace = std::size_t(1) << 30;  // 1 GiB for timing the candidates

/// Picks an algorithm from cuDNN's ranked answers (timed or heuristic): the first that succeeded and whose
/// workspace fits `limit`.
template <class Perf>
ConvAlgo pick(const Perf* perf, int n, std::size_t limit, const char* op) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit)
      return {int(perf[i].algo), int(perf[i].mathType), perf[i].memory};
  EMBER_CHECK(false, op, ": cuDNN found no algorithm for this problem (", n, " candidates)");
  return {};
}

/// Runs one pass's algorithm choice: heuristics (Get*_v7) or timing (Find*Ex with a workspace as large as the
/// largest any algorithm asks for, capped at 1 GiB, and halved while the allocator cannot provide it).
template <class T, class Perf, int Count, class WsSize, class Heur, class Find>
ConvAlgo choose_algo(Device dev, const char* op, const WsSize& ws_size, const Heur& heur, const Find& find) {
  std::array<Perf, Count> perf{};
  int n = 0;
  if (!benchmark()) {
    EMBER_CUDNN_CHECK(heur(Count, &n, perf.data()));
    return pick(perf.data(), n, SIZE_MAX, op);
  }
  std::size_t ws = 0;
  for (int a = 0; a < Count; ++a) {
    std::size_t s = 0;
    if (ws_size(a, &s) == CUDNN_STATUS_SUCCESS) ws = std::max(ws, s);
  }
  ws = std::min(ws, kMaxFindWorkspace);
  Tensor<std::uint8_t> work;
  for (;;) {
    try {
      work = workspace(ws, dev);
      break;
    } catch (const Error&) {
      if (ws == 0) throw;
      ws /= 2;
    }
  }
  EMBER_CUDNN_CHECK(find(Count, &n, perf.data(), work.defined() ? work.data() : nullptr, ws));
  return pick(perf.data(), n, ws, op);
}

template <class T>
void set_algo_math(const ConvDescs<T>& d, const ConvAlgo& a) {
  // fp32 without TF32 stays on FMA math whatever the timing preferred.
  if (std::is_same_v<T, float> && !cudnn_allow_tf32()) return;
  EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.d, cudnnMathType_t(a.math_type)));
}

}  // namespace detail

/// y (N, O, oh, ow) = conv2d(x (N, C, H, W), w (O, C/groups, kh, kw)) (+ b (O) when defined); all dense, on the
/// current device, y allocated by the caller.
template <class T>
void conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, const Tensor<T>& y,
                    const ConvParams& p) {
  const char* op = "conv2d";
  const Device dev = x.device();
  cudnnHandle_t h = cudnn_handle(dev.index);
  detail::ConvDescs<T> d(x.shape(), w.shape(), y.shape(), p, op);
  const ConvKey key =
      make_conv_key(detail::conv_problem<T>(ConvPass::forward, x.shape(), w.shape(), y.shape(), p, dev));
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  const ConvAlgo a = conv_algo_cache(benchmark()).get_or_choose(key, [&] {
    return detail::choose_algo<T, Perf, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
        dev, op,
        [&](int algo, std::size_t* s) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, d.x.d, d.w.d, d.conv.d, d.y.d,
                                                         cudnnConvolutionFwdAlgo_t(algo), s);
        },
        [&](int req, int* n, Perf* perf) {
          return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d, req, n, perf);
        },
        [&](int req, int* n, Perf* perf, void* ws, std::size_t wsz) {
          return cudnnFindConvolutionForwardAlgorithmEx(h, d.x.d, x.data(), d.w.d, w.data(), d.conv.d, d.y.d,
                                                        y.data(), req, n, perf, ws, wsz);
        });
  });
  detail::set_algo_math(d, a);
  Tensor<std::uint8_t> work = detail::workspace(a.workspace, dev);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnConvolutionForward(h, &one, d.x.d, x.data(), d.w.d, w.data(), d.conv.d,
                                            cudnnConvolutionFwdAlgo_t(a.algo), detail::mut_data_of(work), a.workspace,
                                            &zero, d.y.d, y.data()));
  if (b.defined()) {
    detail::TensorDesc bd(detail::cudnn_dtype<T>(), 1, b.numel(), 1, 1, op);
    EMBER_CUDNN_CHECK(cudnnAddTensor(h, &one, bd.d, b.data(), &one, d.y.d, y.data()));
  }
}

/// gx (N, C, H, W) = the input gradient of conv2d from gy (N, O, oh, ow) and w; gx allocated by the caller.
template <class T>
void conv2d_backward_data(const Tensor<T>& gy, const Tensor<T>& w, const Tensor<T>& gx, const ConvParams& p) {
  const char* op = "conv2d_backward (input)";
  const Device dev = gy.device();
  cudnnHandle_t h = cudnn_handle(dev.index);
  detail::ConvDescs<T> d(gx.shape(), w.shape(), gy.shape(), p, op);
  const ConvKey key =
      make_conv_key(detail::conv_problem<T>(ConvPass::backward_data, gx.shape(), w.shape(), gy.shape(), p, dev));
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  const ConvAlgo a = conv_algo_cache(benchmark()).get_or_choose(key, [&] {
    return detail::choose_algo<T, Perf, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
        dev, op,
        [&](int algo, std::size_t* s) {
          return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w.d, d.y.d, d.conv.d, d.x.d,
                                                              cudnnConvolutionBwdDataAlgo_t(algo), s);
        },
        [&](int req, int* n, Perf* perf) {
          return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.d, d.y.d, d.conv.d, d.x.d, req, n, perf);
        },
        [&](int req, int* n, Perf* perf, void* ws, std::size_t wsz) {
          return cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w.d, w.data(), d.y.d, gy.data(), d.conv.d, d.x.d,
                                                             gx.data(), req, n, perf, ws, wsz);
        });
  });
  detail::set_algo_math(d, a);
  Tensor<std::uint8_t> work = detail::workspace(a.workspace, dev);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.w.d, w.data(), d.y.d, gy.data(), d.conv.d,
                                                 cudnnConvolutionBwdDataAlgo_t(a.algo), detail::mut_data_of(work),
                                                 a.workspace, &zero, d.x.d, gx.data()));
}

/// gw (O, C/groups, kh, kw) = the weight gradient of conv2d from gy (N, O, oh, ow) and x; gw allocated by the
/// caller.
template <class T>
void conv2d_backward_filter(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& gw, const ConvParams& p) {
  const char* op = "conv2d_backward (weight)";
  const Device dev = gy.device();
  cudnnHandle_t h = cudnn_handle(dev.index);
  detail::ConvDescs<T> d(x.shape(), gw.shape(), gy.shape(), p, op);
  const ConvKey key =
      make_conv_key(detail::conv_problem<T>(ConvPass::backward_filter, x.shape(), gw.shape(), gy.shape(), p, dev));
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  const ConvAlgo a = conv_algo_cache(benchmark()).get_or_choose(key, [&] {
    return detail::choose_algo<T, Perf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
        dev, op,
        [&](int algo, std::size_t* s) {
          return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x.d, d.y.d, d.conv.d, d.w.d,
                                                                cudnnConvolutionBwdFilterAlgo_t(algo), s);
        },
        [&](int req, int* n, Perf* perf) {
          return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x.d, d.y.d, d.conv.d, d.w.d, req, n, perf);
        },
        [&](int req, int* n, Perf* perf, void* ws, std::size_t wsz) {
          return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x.d, x.data(), d.y.d, gy.data(), d.conv.d,
                                                               d.w.d, gw.data(), req, n, perf, ws, wsz);
        });
  });
  detail::set_algo_math(d, a);
  Tensor<std::uint8_t> work = detail::workspace(a.workspace, dev);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x.d, x.data(), d.y.d, gy.data(), d.conv.d,
                                                   cudnnConvolutionBwdFilterAlgo_t(a.algo), detail::mut_data_of(work),
                                                   a.workspace, &zero, d.w.d, gw.data()));
}

/// gb (O) = Σ gy (N, O, oh, ow) over N, oh and ow: the bias gradient of conv2d (and of any per-channel bias).
template <class T>
void conv2d_backward_bias(const Tensor<T>& gy, const Tensor<T>& gb) {
  const char* op = "conv2d_backward (bias)";
  EMBER_CHECK((!std::is_same_v<T, bfloat16>), op, ": cuDNN has no bfloat16 kernel for the bias gradient (gradient of "
              "shape ", gy.shape().str(), " on ", gy.device().str(), "); ember sums it with a reduction kernel, which "
              "needs the convolution's backward in a translation unit compiled by nvcc");
  cudnnHandle_t h = cudnn_handle(gy.device().index);
  detail::TensorDesc yd(detail::cudnn_dtype<T>(), gy.size(0), gy.size(1), gy.size(2), gy.size(3), op);
  detail::TensorDesc bd(detail::cudnn_dtype<T>(), 1, gb.numel(), 1, 1, op);
  using S = detail::cudnn_scale_t<T>;
  const S one = S(1), zero = S(0);
  EMBER_CUDNN_CHECK(cudnnConvolutionBackwardBias(h, &one, yd.d, gy.data(), &zero, bd.d, gb.data()));
}

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

/// Fills a dense tensor with one value (cudnnSetTensor).
template <class T>
void fill(const Tensor<T>& t, double v) {
  if (t.numel() == 0) return;
  cudnnHandle_t h = cudnn_handle(t.device().index);
  detail::TensorDesc d(detail::cudnn_dtype<T>(), 1, t.numel(), 1, 1, "fill");
  const T value = convert<T>(v);
  EMBER_CUDNN_CHECK(cudnnSetTensor(h, d.d, t.data(), &value));
}

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
