// ember — CUDA layer norm kernels, forward and backward, on contiguous rows of D values (ops/normalization.hpp checks
// the shapes, owns the tensors and dispatches; cpu/norm.hpp is the CPU twin, cuda/cudnn.hpp holds batch norm).
//
// The numerics follow the CPU kernel's: per row, the mean is pivot + Σ (x - pivot) / D (the pivot is the row's first
// element, so float partial sums stay near the data's spread), carried as hi + lo in the compute type C (float for
// half, bfloat16 and float; double for double) so that x - mean keeps its digits; the variance is Σ (x - mean)² / D
// (biased). Each thread sums its elements in C; the threads' partials meet in double (warp shuffles, then shared
// memory). Rows of up to kWarpRowMax values get one warp each (8 rows per block), longer rows one block of 8 warps.
// The per-row mean and 1/sqrt(var + eps) are stored in double for the backward.
//
// The backward's dx is per row as well (Σ g w and Σ g w xhat, then dx = rstd (g w - mean(g w) - xhat mean(g w
// xhat))). The weight and bias gradients sum over rows without atomics: the rows are cut into a fixed number of
// blocks (layer_norm_param_blocks(R), a function of R only), each thread sums one column over one block of rows in
// double, and a second kernel adds the blocks' partials in block order: the result does not depend on scheduling.
// This header needs nvcc; ops/normalization.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/norm.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace norm_detail {

inline constexpr int kThreads = 256;             // threads per block, every kernel here
inline constexpr int kWarps = kThreads / 32;     // warps per block
inline constexpr std::int64_t kWarpRowMax = 1024;  // rows up to this long get one warp each
inline constexpr unsigned kMask = 0xffffffffu;

__device__ EMBER_INLINE double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kMask, v, o);
  return v;
}

/// The sum of v over the W warps that share a row (W = 1: the warp; W = kWarps: the block). Every thread of the
/// group gets the result. `sh` holds kWarps doubles; every thread of the block must call it when W > 1.
template <int W>
__device__ EMBER_INLINE double row_sum(double v, double* sh) {
  v = warp_sum(v);
  if constexpr (W == 1) {
    return v;
  } else {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double t = 0;
    for (int k = 0; k < W; ++k) t += sh[k];  // the same order in every thread
    __syncthreads();  // sh is reused by the next call
    return t;
  }
}

/// The mean as hi + lo in the compute type (cpu::detail::SplitMean's device form).
template <class C>
struct DevSplitMean {
  C hi, lo;
  __device__ EMBER_INLINE explicit DevSplitMean(double m) : hi(C(m)), lo(C(m - double(C(m)))) {}
  __device__ EMBER_INLINE C dev(C v) const { return (v - hi) - lo; }
};

/// A block's rows in groups of W warps: the block's first row, the stride between its rows, the group's index in
/// the block, and the thread's index in its group (of n threads). Every thread of a block runs the same loop over
/// `base` (row_sum synchronises the block when W > 1); its row is base + group, live while below R.
template <int W>
struct RowGroup {
  static constexpr int per_block = kWarps / W;
  std::int64_t first, step;
  int group, t, n;
  __device__ EMBER_INLINE RowGroup() {
    first = std::int64_t(blockIdx.x) * per_block;
    step = std::int64_t(gridDim.x) * per_block;
    group = int(threadIdx.x) / (32 * W);
    t = int(threadIdx.x) % (32 * W);
    n = 32 * W;
  }
};

/// y = (x - mean) * rstd [* w] [+ b] per row; mean and rstd (R values) receive the row's statistics.
template <int W, class T, class C>
__global__ void __launch_bounds__(kThreads)
    ln_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b, T* __restrict__ y,
                      double* __restrict__ mean, double* __restrict__ rstd, std::int64_t R, std::int64_t D,
                      double eps) {
  __shared__ double sh[kWarps];
  const RowGroup<W> g;
  for (std::int64_t base = g.first; base < R; base += g.step) {
    const std::int64_t r = base + g.group;
    const bool live = r < R;
    const T* xr = x + (live ? r : 0) * D;
    const C pivot = live ? convert<C>(xr[0]) : C(0);
    C s = 0;
    if (live)
      for (std::int64_t j = g.t; j < D; j += g.n) s += convert<C>(xr[j]) - pivot;
    const double m = double(pivot) + row_sum<W>(double(s), sh) / double(D);
    const DevSplitMean<C> ms(m);
    C q = 0;
    if (live)
      for (std::int64_t j = g.t; j < D; j += g.n) {
        const C d = ms.dev(convert<C>(xr[j]));
        q += d * d;
      }
    const double var = row_sum<W>(double(q), sh) / double(D);
    if (!live) continue;
    const double rs = 1.0 / ::sqrt(var + eps);
    const C rsc = C(rs);
    T* yr = y + r * D;
    for (std::int64_t j = g.t; j < D; j += g.n) {
      C v = ms.dev(convert<C>(xr[j])) * rsc;
      if (w) v *= convert<C>(w[j]);
      if (b) v += convert<C>(b[j]);
      yr[j] = convert<T>(v);
    }
    if (g.t == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

/// dx per row: rstd (g w - mean(g w) - xhat mean(g w xhat)), with the forward's mean and rstd.
template <int W, class T, class C>
__global__ void __launch_bounds__(kThreads)
    ln_backward_dx_kernel(const T* __restrict__ gr, const T* __restrict__ x, const T* __restrict__ w,
                          const double* __restrict__ mean, const double* __restrict__ rstd, T* __restrict__ dx,
                          std::int64_t R, std::int64_t D) {
  __shared__ double sh[kWarps];
  const RowGroup<W> g;
  for (std::int64_t base = g.first; base < R; base += g.step) {
    const std::int64_t r = base + g.group;
    const bool live = r < R;
    const std::int64_t off = (live ? r : 0) * D;
    const DevSplitMean<C> ms(live ? mean[r] : 0.0);
    const C rs = live ? C(rstd[r]) : C(0);
    C sa = 0, sb = 0;
    if (live)
      for (std::int64_t j = g.t; j < D; j += g.n) {
        const C gw = convert<C>(gr[off + j]) * (w ? convert<C>(w[j]) : C(1));
        sa += gw;
        sb += gw * (ms.dev(convert<C>(x[off + j])) * rs);
      }
    const double a = row_sum<W>(double(sa), sh), b = row_sum<W>(double(sb), sh);
    if (!live) continue;
    const C ma = C(a / double(D)), mb = C(b / double(D));
    for (std::int64_t j = g.t; j < D; j += g.n) {
      const C gw = convert<C>(gr[off + j]) * (w ? convert<C>(w[j]) : C(1));
      const C xh = ms.dev(convert<C>(x[off + j])) * rs;
      dx[off + j] = convert<T>(rs * (gw - ma - xh * mb));
    }
  }
}

/// Block blockIdx.y of rows, one column per thread: pw[blk * D + j] = Σ g xhat, pb[blk * D + j] = Σ g over the
/// block's rows, in double (pw or pb null: not wanted).
template <class T, class C>
__global__ void __launch_bounds__(kThreads)
    ln_param_partials_kernel(const T* __restrict__ gr, const T* __restrict__ x, const double* __restrict__ mean,
                             const double* __restrict__ rstd, double* __restrict__ pw, double* __restrict__ pb,
                             std::int64_t R, std::int64_t D, std::int64_t nblk) {
  const std::int64_t blk = blockIdx.y, ra = R * blk / nblk, rb = R * (blk + 1) / nblk;
  for (std::int64_t j = std::int64_t(blockIdx.x) * kThreads + threadIdx.x; j < D;
       j += std::int64_t(gridDim.x) * kThreads) {
    double sw = 0, sb = 0;
    for (std::int64_t r = ra; r < rb; ++r) {
      const C gv = convert<C>(gr[r * D + j]);
      if (pw) sw += double(gv * (DevSplitMean<C>(mean[r]).dev(convert<C>(x[r * D + j])) * C(rstd[r])));
      sb += double(gv);
    }
    if (pw) pw[blk * D + j] = sw;
    if (pb) pb[blk * D + j] = sb;
  }
}

/// out[j] = Σ over the blocks, in block order, of part[blk * D + j].
template <class T>
__global__ void __launch_bounds__(kThreads)
    ln_param_finish_kernel(const double* __restrict__ part, T* __restrict__ out, std::int64_t D, std::int64_t nblk) {
  for (std::int64_t j = std::int64_t(blockIdx.x) * kThreads + threadIdx.x; j < D;
       j += std::int64_t(gridDim.x) * kThreads) {
    double s = 0;
    for (std::int64_t k = 0; k < nblk; ++k) s += part[k * D + j];
    out[j] = convert<T>(s);
  }
}

inline unsigned grid_for(std::int64_t work, std::int64_t per_block) {
  const std::int64_t b = (work + per_block - 1) / per_block;
  return unsigned(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

}  // namespace norm_detail

/// The number of row blocks layer_norm_backward's weight and bias gradients are summed in (a function of R only,
/// so the result does not depend on the device): its `part` buffer holds 2 * layer_norm_param_blocks(R) * D doubles.
inline std::int64_t layer_norm_param_blocks(std::int64_t R) {
  const std::int64_t b = R / 64;
  return b < 1 ? 1 : b > 256 ? 256 : b;
}

/// layer_norm's forward over R contiguous rows of D values on device `dev`'s current stream: y, and per row the
/// mean and 1/sqrt(biased var + eps) (R doubles each). w and b (D values) may be null. R, D > 0.
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, double* mean, double* rstd, std::int64_t R,
                        std::int64_t D, double eps, int dev) {
  using namespace norm_detail;
  using C = compute_t<T>;
  const cudaStream_t s = current_stream(dev).handle();
  if (D <= kWarpRowMax)
    ln_forward_kernel<1, T, C><<<grid_for(R, kWarps), kThreads, 0, s>>>(x, w, b, y, mean, rstd, R, D, eps);
  else
    ln_forward_kernel<kWarps, T, C><<<grid_for(R, 1), kThreads, 0, s>>>(x, w, b, y, mean, rstd, R, D, eps);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// layer_norm's gradients over R contiguous rows of D values on device `dev`'s current stream, from the forward's
/// mean and rstd: dx (when not null), dw and db (D values each, when not null). w (D values) may be null. `part`
/// holds 2 * layer_norm_param_blocks(R) * D doubles when dw or db is wanted. R, D > 0.
template <class T>
void layer_norm_backward(const T* g, const T* x, const T* w, const double* mean, const double* rstd, T* dx, T* dw,
                         T* db, double* part, std::int64_t R, std::int64_t D, int dev) {
  using namespace norm_detail;
  using C = compute_t<T>;
  const cudaStream_t s = current_stream(dev).handle();
  if (dx) {
    if (D <= kWarpRowMax)
      ln_backward_dx_kernel<1, T, C><<<grid_for(R, kWarps), kThreads, 0, s>>>(g, x, w, mean, rstd, dx, R, D);
    else
      ln_backward_dx_kernel<kWarps, T, C><<<grid_for(R, 1), kThreads, 0, s>>>(g, x, w, mean, rstd, dx, R, D);
    EMBER_CUDA_CHECK(cudaGetLastError());
  }
  if (!dw && !db) return;
  const std::int64_t nblk = layer_norm_param_blocks(R);
  double* pw = dw ? part : nullptr;
  double* pb = db ? part + nblk * D : nullptr;
  const dim3 grid(grid_for(D, kThreads), unsigned(nblk));
  ln_param_partials_kernel<T, C><<<grid, kThreads, 0, s>>>(g, x, mean, rstd, pw, pb, R, D, nblk);
  EMBER_CUDA_CHECK(cudaGetLastError());
  if (dw) ln_param_finish_kernel<T><<<grid_for(D, kThreads), kThreads, 0, s>>>(pw, dw, D, nblk);
  if (db) ln_param_finish_kernel<T><<<grid_for(D, kThreads), kThreads, 0, s>>>(pb, db, D, nblk);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
