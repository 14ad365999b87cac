// ember — CUDA kernels of the class-index losses (cross_entropy with class indices, nll_loss), forward and
// backward, on raw device pointers; ops/loss.hpp dispatches to them and owns the tensors. The scores are read in
// place from the contiguous (N, C, D) input (class c of position (n, k) at (n * C + c) * D + k): no transpose.
// cross_entropy gives one warp to each position (max, Σ exp and the smoothing sum by shuffles, in compute type
// C); nll_loss one thread. Per-position losses are reduced by one block in double, in a fixed order (the result
// does not depend on scheduling). A target outside [0, C) that is not ignore_index records the smallest such
// position in `bad` (atomicMin) and its loss is NaN; the caller reads `bad` back and raises the error.
// This header needs nvcc; ops/loss.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/loss.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

/// The sizes and scalar options of one class-loss call.
struct ClassLossDims {
  std::int64_t P = 0, C = 0, D = 1;  // positions, classes, trailing extent
  std::int64_t ignore_index = -100;
  double smoothing = 0;
  int reduction = 1;  // 0 None, 1 Mean, 2 Sum
};

namespace loss_detail {

inline constexpr int kThreads = 256;
inline constexpr unsigned kMask = 0xffffffffu;

__device__ EMBER_INLINE float dexp(float v) { return ::expf(v); }
__device__ EMBER_INLINE double dexp(double v) { return ::exp(v); }
__device__ EMBER_INLINE float dlog(float v) { return ::logf(v); }
__device__ EMBER_INLINE double dlog(double v) { return ::log(v); }

template <class C>
__device__ EMBER_INLINE C warp_sum(C v) {
  EMBER_UNROLL for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kMask, v, o);
  return v;
}
template <class C>
__device__ EMBER_INLINE C warp_max(C v) {
  EMBER_UNROLL for (int o = 16; o > 0; o /= 2) {
    const C u = __shfl_xor_sync(kMask, v, o);
    v = (v < u || u != u) ? u : v;  // NaN wins, so every lane agrees on a NaN max
  }
  return v;
}

__device__ EMBER_INLINE bool bad_target(std::int64_t t, const ClassLossDims& d) {
  return t != d.ignore_index && (t < 0 || t >= d.C);
}

/// One warp per position: stats = (max, log Σ exp(x - max)), li = the loss, wt = w[t] (0 when ignored); with
/// reduction None, out[p] = li in T.
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const std::int64_t* __restrict__ tgt,
                      ClassLossDims d, C* __restrict__ stats, C* __restrict__ li, C* __restrict__ wt,
                      T* __restrict__ out, unsigned long long* bad) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  const C eps = C(d.smoothing), uni = C(d.smoothing / double(d.C));
  for (std::int64_t p = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < d.P; p += warps) {
    const std::int64_t t = tgt[p];
    const T* row = x + (p / d.D) * d.C * d.D + p % d.D;
    C loss = 0, w_t = 0, m = 0, ls = 0;
    if (bad_target(t, d)) {
      if (lane == 0) atomicMin(bad, static_cast<unsigned long long>(p));
      loss = C(NAN);
    } else if (t != d.ignore_index && d.C > 0) {
      C mv = -C(INFINITY);
      for (std::int64_t c = lane; c < d.C; c += 32) {
        const C v = convert<C>(row[c * d.D]);
        mv = mv < v || v != v ? v : mv;
      }
      m = warp_max(mv);
      C s = 0, sh = 0, ws = 0;
      for (std::int64_t c = lane; c < d.C; c += 32) {
        const C v = convert<C>(row[c * d.D]) - m;
        s += dexp(v);
        const C wc = w ? convert<C>(w[c]) : C(1);
        sh += wc * v;
        ws += wc;
      }
      s = warp_sum(s);
      ls = dlog(s);
      w_t = w ? convert<C>(w[t]) : C(1);
      loss = -(C(1) - eps) * w_t * ((convert<C>(row[t * d.D]) - m) - ls);
      if (d.smoothing > 0) {
        sh = warp_sum(sh);
        ws = warp_sum(ws);
        loss -= uni * (sh - ws * ls);
      }
    }
    if (lane == 0) {
      stats[2 * p] = m;
      stats[2 * p + 1] = ls;
      li[p] = loss;
      wt[p] = w_t;
      if (d.reduction == 0) out[p] = convert<T>(loss);
    }
  }
}

/// One thread per position: li = -w[t] x[t], wt = w[t]; with reduction None, out[p] = li in T.
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    nll_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const std::int64_t* __restrict__ tgt,
                       ClassLossDims d, C* __restrict__ li, C* __restrict__ wt, T* __restrict__ out,
                       unsigned long long* bad) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < d.P; p += stride) {
    const std::int64_t t = tgt[p];
    C loss = 0, w_t = 0;
    if (bad_target(t, d)) {
      atomicMin(bad, static_cast<unsigned long long>(p));
      loss = C(NAN);
    } else if (t != d.ignore_index) {
      w_t = w ? convert<C>(w[t]) : C(1);
      loss = -w_t * convert<C>(x[(p / d.D) * d.C * d.D + t * d.D + p % d.D]);
    }
    li[p] = loss;
    wt[p] = w_t;
    if (d.reduction == 0) out[p] = convert<T>(loss);
  }
}

/// One block: total_weight = Σ wt; out[0] = Σ li / Σ wt (Mean) or Σ li (Sum), accumulated in double.
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    class_loss_reduce_kernel(const C* __restrict__ li, const C* __restrict__ wt, std::int64_t P, int reduction,
                             T* __restrict__ out, C* __restrict__ total_weight) {
  __shared__ double sl[kThreads / 32], sw[kThreads / 32];
  double a = 0, b = 0;
  for (std::int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    a += double(li[p]);
    b += double(wt[p]);
  }
  a = warp_sum(a);
  b = warp_sum(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    sl[warp] = a;
    sw[warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a = b = 0;
    for (int k = 0; k < int(blockDim.x / 32); ++k) {
      a += sl[k];
      b += sw[k];
    }
    *total_weight = C(b);
    if (reduction == 1) *out = convert<T>(a / b);  // 0 / 0 = NaN when every target is ignored, as in PyTorch
    else if (reduction == 2) *out = convert<T>(a);
  }
}

/// The scale of position p's gradient: grad[p] (None), grad[0] / total weight (Mean), grad[0] (Sum).
template <class T, class C>
__device__ EMBER_INLINE C grad_scale(const T* g, const C* total_weight, const ClassLossDims& d, std::int64_t p) {
  if (d.reduction == 0) return convert<C>(g[p]);
  const C g0 = convert<C>(g[0]);
  return d.reduction == 1 ? g0 / *total_weight : g0;
}

/// One warp per position: dx_c = exp(x_c - max - ls) a - (s ε / C) w_c, minus s (1 - ε) w_t at the target, where
/// a = s ((1 - ε) w_t + (ε / C) Σ w); zeros at ignored positions.
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(const T* __restrict__ x, const T* __restrict__ w, const std::int64_t* __restrict__ tgt,
                       const C* __restrict__ stats, const T* __restrict__ g, const C* __restrict__ total_weight,
                       ClassLossDims d, T* __restrict__ dx) {
  const int lane = threadIdx.x & 31;
  const std::int64_t warps = std::int64_t(gridDim.x) * (blockDim.x / 32);
  const C eps = C(d.smoothing), uni = C(d.smoothing / double(d.C));
  for (std::int64_t p = (std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; p < d.P; p += warps) {
    const std::int64_t t = tgt[p], off = (p / d.D) * d.C * d.D + p % d.D;
    T* out = dx + off;
    if (t == d.ignore_index) {
      for (std::int64_t c = lane; c < d.C; c += 32) out[c * d.D] = T(0);
      continue;
    }
    const T* row = x + off;
    const C s = grad_scale(g, total_weight, d, p);
    C ws = C(d.C);
    if (w && d.smoothing > 0) {
      ws = 0;
      for (std::int64_t c = lane; c < d.C; c += 32) ws += convert<C>(w[c]);
      ws = warp_sum(ws);
    }
    const C w_t = w ? convert<C>(w[t]) : C(1);
    const C a = s * ((C(1) - eps) * w_t + uni * ws), b = s * uni, m = stats[2 * p], ls = stats[2 * p + 1];
    for (std::int64_t c = lane; c < d.C; c += 32) {
      C v = dexp((convert<C>(row[c * d.D]) - m) - ls) * a - b * (w ? convert<C>(w[c]) : C(1));
      if (c == t) v -= s * (C(1) - eps) * w_t;
      out[c * d.D] = convert<T>(v);
    }
  }
}

/// One thread per position: dx[t] = -s w_t (dx is zeroed before).
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    nll_backward_kernel(const T* __restrict__ w, const std::int64_t* __restrict__ tgt, const T* __restrict__ g,
                        const C* __restrict__ total_weight, ClassLossDims d, T* __restrict__ dx) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t p = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < d.P; p += stride) {
    const std::int64_t t = tgt[p];
    if (t == d.ignore_index) continue;
    const C w_t = w ? convert<C>(w[t]) : C(1);
    dx[(p / d.D) * d.C * d.D + t * d.D + p % d.D] = convert<T>(-grad_scale(g, total_weight, d, p) * w_t);
  }
}

inline unsigned blocks_for(std::int64_t work, int per_block) {
  const std::int64_t b = (work + per_block - 1) / per_block;
  return unsigned(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

}  // namespace loss_detail

/// cross_entropy forward on the current stream of device `dev`: see ce_forward_kernel and the reduce kernel.
/// `bad` is set to all ones here and holds the smallest bad position afterwards (all ones when none).
template <class T, class C>
void cross_entropy_forward(const T* x, const T* w, const std::int64_t* tgt, const ClassLossDims& d, C* stats, C* li,
                           C* wt, T* out, C* total_weight, unsigned long long* bad, int dev) {
  using namespace loss_detail;
  const cudaStream_t s = current_stream(dev).handle();
  EMBER_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), s));
  ce_forward_kernel<T, C><<<blocks_for(d.P, kThreads / 32), kThreads, 0, s>>>(x, w, tgt, d, stats, li, wt, out, bad);
  EMBER_CUDA_CHECK(cudaGetLastError());
  class_loss_reduce_kernel<T, C><<<1, kThreads, 0, s>>>(li, wt, d.P, d.reduction, out, total_weight);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

template <class T, class C>
void cross_entropy_backward(const T* x, const T* w, const std::int64_t* tgt, const C* stats, const T* g,
                            const C* total_weight, const ClassLossDims& d, T* dx, int dev) {
  using namespace loss_detail;
  const cudaStream_t s = current_stream(dev).handle();
  ce_backward_kernel<T, C><<<blocks_for(d.P, kThreads / 32), kThreads, 0, s>>>(x, w, tgt, stats, g, total_weight, d,
                                                                              dx);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

template <class T, class C>
void nll_loss_forward(const T* x, const T* w, const std::int64_t* tgt, const ClassLossDims& d, C* li, C* wt, T* out,
                      C* total_weight, unsigned long long* bad, int dev) {
  using namespace loss_detail;
  const cudaStream_t s = current_stream(dev).handle();
  EMBER_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), s));
  nll_forward_kernel<T, C><<<blocks_for(d.P, kThreads), kThreads, 0, s>>>(x, w, tgt, d, li, wt, out, bad);
  EMBER_CUDA_CHECK(cudaGetLastError());
  class_loss_reduce_kernel<T, C><<<1, kThreads, 0, s>>>(li, wt, d.P, d.reduction, out, total_weight);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// dx must be zeroed by the caller (on the same stream).
template <class T, class C>
void nll_loss_backward(const T* w, const std::int64_t* tgt, const T* g, const C* total_weight,
                       const ClassLossDims& d, T* dx, int dev) {
  using namespace loss_detail;
  const cudaStream_t s = current_stream(dev).handle();
  nll_backward_kernel<T, C><<<blocks_for(d.P, kThreads), kThreads, 0, s>>>(w, tgt, g, total_weight, d, dx);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
