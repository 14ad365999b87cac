// ember — CUDA index kernels: the index range check, index_select and its adjoint index_add, gather, scatter and
// scatter_add along a dim; the CUDA twin of cpu/index.hpp (ops/indexing.hpp checks the shapes, owns the tensors and
// dispatches).
//
// Deterministic by default: no result depends on the order atomics land in. The reductions (index_add, scatter_add,
// and so the backward passes of index_select, nn::Embedding and gather) sort the positions by their target with
// cuda/sort.cuh's radix sort, which is stable, so each target's contributions sit side by side in increasing position order
// (the CPU loop's order); one thread per target and column then sums them in double and rounds once into T. scatter
// writes, for each target, the last position that names it (the CPU's "last write wins"), found the same way. The
// range check records the smallest bad position with atomicMin (a minimum does not depend on the order) and reads
// it and its value back to the host, so the error names what the CPU's names.
// This header needs nvcc; ops/indexing.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/index.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/allocator.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/sort.cuh"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

/// The positions of an index tensor (its shape, walked in row-major order) and the strides at which the index, the
/// indexed tensor x (gather reads it, the scatters write it) and src (the scatters read it) are read at the
/// position's coordinates; along `dim` x is read at the index's value instead.
struct IndexWalk {
  Shape shape, idx_strides, x_strides, src_strides;
  int dim = 0;
};

/// The first index value outside the allowed range: its row-major position (-1 when none) and its value.
struct BadIndex {
  std::int64_t position = -1, value = 0;
};

namespace index_detail {

inline constexpr int kThreads = 256;

inline unsigned grid_for(std::int64_t work) {
  const std::int64_t b = (work + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

/// The offset of row-major position p of `shape` in a tensor of `strides`; along `dim` (when >= 0) at `at` instead.
__device__ EMBER_INLINE std::int64_t offset_at(std::int64_t p, const Shape& shape, const Shape& strides, int dim = -1,
                                               std::int64_t at = 0) {
  std::int64_t o = 0;
  for (int d = shape.n - 1; d >= 0; --d) {
    const std::int64_t c = p % shape[d];
    p /= shape[d];
    o += (d == dim ? at : c) * strides[d];
  }
  return o;
}

#define EMBER_INDEX_LOOP(i, n)                                                                   \
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);             \
       i += std::int64_t(gridDim.x) * blockDim.x)

/// bad[0] = the smallest position whose index value lies outside [lo, hi).
// (The kernels that are not templates are static: defined in a header, each translation unit keeps its own copy.)
static __global__ void __launch_bounds__(kThreads)
    bad_index_kernel(const std::int64_t* __restrict__ idx, Shape shape, Shape strides, std::int64_t count,
                     std::int64_t lo, std::int64_t hi, unsigned long long* bad) {
  EMBER_INDEX_LOOP(p, count) {
    const std::int64_t v = idx[offset_at(p, shape, strides)];
    if (!(v >= lo && v < hi)) atomicMin(bad, static_cast<unsigned long long>(p));
  }
}

/// bad[1] = the index value at position bad[0] (when there is one).
static __global__ void bad_value_kernel(const std::int64_t* __restrict__ idx, Shape shape, Shape strides,
                                 unsigned long long* bad) {
  if (bad[0] != ~0ull) bad[1] = static_cast<unsigned long long>(idx[offset_at(std::int64_t(bad[0]), shape, strides)]);
}

/// out[(a * m + i) * inner + k] = x[(a * n + ix[i]) * inner + k] (x and out contiguous).
template <class T>
__global__ void __launch_bounds__(kThreads)
    index_select_kernel(const T* __restrict__ x, const std::int64_t* __restrict__ ix, T* __restrict__ out,
                        std::int64_t outer, std::int64_t n, std::int64_t m, std::int64_t inner) {
  EMBER_INDEX_LOOP(t, outer * m * inner) {
    const std::int64_t k = t % inner, i = (t / inner) % m, a = t / (inner * m);
    out[t] = x[(a * n + ix[i]) * inner + k];
  }
}

/// out[p] = x at position p's coordinates, with index[p] along dim (out contiguous in the index's shape).
template <class T>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const T* __restrict__ x, const std::int64_t* __restrict__ idx, IndexWalk w, std::int64_t count,
                  T* __restrict__ out) {
  EMBER_INDEX_LOOP(p, count) {
    const std::int64_t v = idx[offset_at(p, w.shape, w.idx_strides)];
    out[p] = x[offset_at(p, w.shape, w.x_strides, w.dim, v)];
  }
}

/// keys[p] = the offset in x that position p targets; perm[p] = p.
static __global__ void __launch_bounds__(kThreads)
    scatter_keys_kernel(const std::int64_t* __restrict__ idx, IndexWalk w, std::int64_t count,
                        std::int64_t* __restrict__ keys, std::int64_t* __restrict__ perm) {
  EMBER_INDEX_LOOP(p, count) {
    const std::int64_t v = idx[offset_at(p, w.shape, w.idx_strides)];
    keys[p] = offset_at(p, w.shape, w.x_strides, w.dim, v);
    perm[p] = p;
  }
}

/// keys[i] = ix[i] (any stride); perm[i] = i.
static __global__ void __launch_bounds__(kThreads)
    row_keys_kernel(const std::int64_t* __restrict__ ix, std::int64_t stride, std::int64_t m,
                    std::int64_t* __restrict__ keys, std::int64_t* __restrict__ perm) {
  EMBER_INDEX_LOOP(i, m) {
    keys[i] = ix[i * stride];
    perm[i] = i;
  }
}

/// For each run of equal sorted keys (started at p): x[key] += Σ src at the run's positions, in position order, in
/// double for floating types (in T for integers, as the CPU), rounded once.
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_add_sorted_kernel(const std::int64_t* __restrict__ keys, const std::int64_t* __restrict__ perm,
                              std::int64_t count, const T* __restrict__ src, IndexWalk w, T* __restrict__ x) {
  using Acc = std::conditional_t<is_floating_v<T>, double, T>;
  EMBER_INDEX_LOOP(p, count) {
    const std::int64_t key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;
    Acc acc = convert<Acc>(x[key]);
    for (std::int64_t q = p; q < count && keys[q] == key; ++q)
      acc = Acc(acc + convert<Acc>(src[offset_at(perm[q], w.shape, w.src_strides)]));
    x[key] = convert<T>(acc);
  }
}

/// For each run of equal sorted keys (ended at p): x[key] = src (or value) at the run's last position.
template <class T>
__global__ void __launch_bounds__(kThreads)
    scatter_sorted_kernel(const std::int64_t* __restrict__ keys, const std::int64_t* __restrict__ perm,
                          std::int64_t count, const T* __restrict__ src, T value, IndexWalk w, T* __restrict__ x) {
  EMBER_INDEX_LOOP(p, count) {
    const std::int64_t key = keys[p];
    if (p + 1 < count && keys[p + 1] == key) continue;
    x[key] = src ? src[offset_at(perm[p], w.shape, w.src_strides)] : value;
  }
}

/// For each run of equal sorted row keys (started at sorted position i) and each (a, k): out[(a * n + key) * inner
/// + k] += alpha Σ src[(a * m + perm[q]) * inner + k] over the run, in position order, in double, rounded once.
template <class T>
__global__ void __launch_bounds__(kThreads)
    index_add_sorted_kernel(const std::int64_t* __restrict__ keys, const std::int64_t* __restrict__ perm,
                            const T* __restrict__ src, T* __restrict__ out, std::int64_t outer, std::int64_t n,
                            std::int64_t m, std::int64_t inner, double alpha) {
  EMBER_INDEX_LOOP(t, outer * m * inner) {
    const std::int64_t k = t % inner, i = (t / inner) % m, a = t / (inner * m);
    const std::int64_t key = keys[i];
    if (i > 0 && keys[i - 1] == key) continue;
    double acc = 0;
    for (std::int64_t q = i; q < m && keys[q] == key; ++q) acc += convert<double>(src[(a * m + perm[q]) * inner + k]);
    T& o = out[(a * n + key) * inner + k];
    o = convert<T>(convert<double>(o) + alpha * acc);
  }
}

#undef EMBER_INDEX_LOOP

/// Sorts keys[0, m) (each in [0, bound)) with perm[0, m) as values, stably: keys and perm are replaced by the sorted
/// keys and the positions in key order (equal keys keep position order).
inline void sort_by_key(Tensor<std::int64_t>& keys, Tensor<std::int64_t>& perm, std::int64_t m, std::int64_t bound,
                        Device dev, cudaStream_t s) {
  stable_radix_sort_pairs(keys, perm, m, sort_detail::bits_for(bound), dev, s);
}

}  // namespace index_detail

/// The first (row-major) entry of idx (shape, strides; on device dev) outside [lo, hi). Waits for the device.
inline BadIndex first_bad_index(const std::int64_t* idx, const Shape& shape, const Shape& strides, std::int64_t lo,
                                std::int64_t hi, int dev) {
  using namespace index_detail;
  BadIndex r;
  const std::int64_t count = shape.numel();
  if (count == 0) return r;
  const Stream stream = current_stream(dev);
  const cudaStream_t s = stream.handle();
  Tensor<std::int64_t> bad = empty<std::int64_t>(Shape{2}, Device::cuda(dev));
  auto* b = reinterpret_cast<unsigned long long*>(bad.data());
  EMBER_CUDA_CHECK(cudaMemsetAsync(b, 0xff, 2 * sizeof(unsigned long long), s));
  bad_index_kernel<<<grid_for(count), kThreads, 0, s>>>(idx, shape, strides, count, lo, hi, b);
  EMBER_CUDA_CHECK(cudaGetLastError());
  bad_value_kernel<<<1, 1, 0, s>>>(idx, shape, strides, b);
  EMBER_CUDA_CHECK(cudaGetLastError());
  unsigned long long host[2] = {};
  EMBER_CUDA_CHECK(cudaMemcpyAsync(host, b, sizeof(host), cudaMemcpyDeviceToHost, s));
  stream.synchronize();
  if (host[0] != ~0ull) {
    r.position = std::int64_t(host[0]);
    r.value = std::int64_t(host[1]);
  }
  return r;
}

/// index_select on contiguous x viewed as (outer, n, inner) into contiguous out (outer, m, inner) with the m rows
/// ix (contiguous, checked in [0, n)).
template <class T>
void index_select(const T* x, const std::int64_t* ix, T* out, std::int64_t outer, std::int64_t n, std::int64_t m,
                  std::int64_t inner, int dev) {
  using namespace index_detail;
  const std::int64_t count = outer * m * inner;
  if (count == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  index_select_kernel<T><<<grid_for(count), kThreads, 0, s>>>(x, ix, out, outer, n, m, inner);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// out (contiguous (outer, n, inner)) += alpha * src (contiguous (outer, m, inner)) at the rows ix names (m entries
/// at stride ix_stride, checked in [0, n)); repeated rows accumulate, in position order, deterministically.
template <class T>
void index_add(T* out, const std::int64_t* ix, std::int64_t ix_stride, const T* src, std::int64_t outer,
               std::int64_t n, std::int64_t m, std::int64_t inner, double alpha, int dev) {
  using namespace index_detail;
  if (outer * m * inner == 0) return;
  const Device d = Device::cuda(dev);
  const cudaStream_t s = current_stream(dev).handle();
  Tensor<std::int64_t> keys = empty<std::int64_t>(Shape{m}, d), perm = empty<std::int64_t>(Shape{m}, d);
  row_keys_kernel<<<grid_for(m), kThreads, 0, s>>>(ix, ix_stride, m, keys.data(), perm.data());
  EMBER_CUDA_CHECK(cudaGetLastError());
  sort_by_key(keys, perm, m, n, d, s);
  index_add_sorted_kernel<T><<<grid_for(outer * m * inner), kThreads, 0, s>>>(keys.data(), perm.data(), src, out,
                                                                             outer, n, m, inner, alpha);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// out (contiguous, the index's shape) = x gathered along w.dim (indices checked).
template <class T>
void gather(const T* x, const std::int64_t* idx, const IndexWalk& w, T* out, int dev) {
  using namespace index_detail;
  const std::int64_t count = w.shape.numel();
  if (count == 0) return;
  const cudaStream_t s = current_stream(dev).handle();
  gather_kernel<T><<<grid_for(count), kThreads, 0, s>>>(x, idx, w, count, out);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

/// x (x_numel elements at w.x_strides, targets distinct per offset) gets src (add: added; else written, src null:
/// `value`) at the positions idx names along w.dim; indices checked. Deterministic: see the header comment.
template <class T>
void scatter(T* x, std::int64_t x_numel, const std::int64_t* idx, const IndexWalk& w, const T* src, T value, bool add,
             int dev) {
  using namespace index_detail;
  const std::int64_t count = w.shape.numel();
  if (count == 0) return;
  const Device d = Device::cuda(dev);
  const cudaStream_t s = current_stream(dev).handle();
  Tensor<std::int64_t> keys = empty<std::int64_t>(Shape{count}, d), perm = empty<std::int64_t>(Shape{count}, d);
  scatter_keys_kernel<<<grid_for(count), kThreads, 0, s>>>(idx, w, count, keys.data(), perm.data());
  EMBER_CUDA_CHECK(cudaGetLastError());
  sort_by_key(keys, perm, count, x_numel, d, s);
  if (add)
    scatter_add_sorted_kernel<T><<<grid_for(count), kThreads, 0, s>>>(keys.data(), perm.data(), count, src, w, x);
  else
    scatter_sorted_kernel<T><<<grid_for(count), kThreads, 0, s>>>(keys.data(), perm.data(), count, src, value, w, x);
  EMBER_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
