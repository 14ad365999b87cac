// ember — conv2d on CUDA through cuDNN: forward, and the backward passes for the input, the weight and the bias. The
// algorithm of each problem is chosen once and cached (cuda/algo_cache.hpp): by timing every candidate when
// set_benchmark(true) (torch.backends.cudnn.benchmark), by cuDNN's heuristics otherwise; fp32 convolutions use TF32
// only when set_cudnn_allow_tf32(true). Workspace from the caching allocator (an ember tensor).
#pragma once

#include "ember/cuda/cudnn_handle.hpp"  // EMBER_USE_CUDNN

#if EMBER_USE_CUDNN
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/core/window.hpp"
#include "ember/cuda/algo_cache.hpp"
#include "ember/cuda/allocator.hpp"  // registers the device allocator: workspaces are ember tensors

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

/// The algorithm one convolution pass runs, and a workspace for it from the caching allocator.
struct ConvPlan {
  ConvAlgo algo;
  Tensor<std::uint8_t> work;
};

/// The algorithm of one pass of the problem `key` (chosen once: the cache keeps it) with its math type set on d, and
/// its workspace. The three passes differ only in cuDNN's functions, given here, and in which of the problem's
/// tensors are their inputs a and b and their output c: y = forward(x, w), gx = backward_data(w, gy),
/// gw = backward_filter(x, gy). Each function takes (handle, a, b, conv, c, ...) by descriptor, Find*Ex each
/// descriptor followed by its data.
template <int Count, class T, class ADesc, class BDesc, class CDesc, class Algo, class Perf>
ConvPlan plan_conv(cudnnHandle_t h, const ConvDescs<T>& d, const ConvKey& key, Device dev, const char* op, ADesc ad,
                   const void* a, BDesc bd, const void* b, CDesc cd, void* c,
                   cudnnStatus_t (*ws_size)(cudnnHandle_t, ADesc, BDesc, cudnnConvolutionDescriptor_t, CDesc, Algo,
                                            std::size_t*),
                   cudnnStatus_t (*heur)(cudnnHandle_t, ADesc, BDesc, cudnnConvolutionDescriptor_t, CDesc, int, int*,
                                         Perf*),
                   cudnnStatus_t (*find)(cudnnHandle_t, ADesc, const void*, BDesc, const void*,
                                         cudnnConvolutionDescriptor_t, CDesc, void*, int, int*, Perf*, void*,
                                         std::size_t)) {
  const ConvAlgo algo = conv_algo_cache(benchmark()).get_or_choose(key, [&] {
    return choose_algo<T, Perf, Count>(
        dev, op, [&](int al, std::size_t* s) { return ws_size(h, ad, bd, d.conv.d, cd, Algo(al), s); },
        [&](int req, int* n, Perf* perf) { return heur(h, ad, bd, d.conv.d, cd, req, n, perf); },
        [&](int req, int* n, Perf* perf, void* ws, std::size_t wsz) {
          return find(h, ad, a, bd, b, d.conv.d, cd, c, req, n, perf, ws, wsz);
        });
  });
  set_algo_math(d, algo);
  return {algo, workspace(algo.workspace, dev)};
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
  const auto [a, work] = detail::plan_conv<CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
      h, d, key, dev, op, d.x.d, x.data(), d.w.d, w.data(), d.y.d, y.data(), cudnnGetConvolutionForwardWorkspaceSize,
      cudnnGetConvolutionForwardAlgorithm_v7, cudnnFindConvolutionForwardAlgorithmEx);
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
  const auto [a, work] = detail::plan_conv<CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
      h, d, key, dev, op, d.w.d, w.data(), d.y.d, gy.data(), d.x.d, gx.data(),
      cudnnGetConvolutionBackwardDataWorkspaceSize, cudnnGetConvolutionBackwardDataAlgorithm_v7,
      cudnnFindConvolutionBackwardDataAlgorithmEx);
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
  const auto [a, work] = detail::plan_conv<CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
      h, d, key, dev, op, d.x.d, x.data(), d.y.d, gy.data(), d.w.d, gw.data(),
      cudnnGetConvolutionBackwardFilterWorkspaceSize, cudnnGetConvolutionBackwardFilterAlgorithm_v7,
      cudnnFindConvolutionBackwardFilterAlgorithmEx);
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

}  // namespace ember::cuda

#endif  // EMBER_USE_CUDNN
