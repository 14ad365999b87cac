// ember — the CUDA kernel of amp::GradScaler::unscale_: every gradient multiplied by 1/scale in place, and a
// device flag set when any result is inf or NaN, in the same pass (one kernel per gradient, one flag for all of
// them, read back once). This header needs nvcc; amp/grad_scaler.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/amp.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>

#include "ember/core/dtype.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/executor.cuh"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace amp_detail {

inline constexpr int kThreads = 256;

template <class T>
__global__ void __launch_bounds__(kThreads)
    unscale_kernel(T* __restrict__ g, std::int64_t n, compute_t<T> inv, std::int32_t* __restrict__ found) {
  using C = compute_t<T>;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const T r = convert<T>(convert<C>(g[i]) * inv);
    g[i] = r;
    const C v = convert<C>(r);
    bad = bad || !(v - v == C(0));  // inf - inf and NaN - NaN are NaN; any finite v gives 0
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;  // every writer writes 1: no atomic needed
}

}  // namespace amp_detail

/// g[i] *= inv for n elements on the current stream of device `dev`; sets *found to 1 when a result is not
/// finite (found is not cleared here).
template <class T>
void unscale_and_check(T* g, std::int64_t n, double inv, std::int32_t* found, int dev) {
  using namespace amp_detail;
  if (n == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  const std::int64_t need = (n + kThreads - 1) / kThreads;
  const std::int64_t cap = std::int64_t(detail::sm_count(dev)) * 8;
  const unsigned blocks = unsigned(need < cap ? need : cap);
  unscale_kernel<T><<<blocks, kThreads, 0, s>>>(g, n, compute_t<T>(inv), found);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
