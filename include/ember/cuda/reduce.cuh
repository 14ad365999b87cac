// ember — CUDA reductions over expressions, with the same reducers (expr/reducer.hpp) and the same semantics as
// cpu::reduce: the element-wise part runs inside the reduction kernel; over everything, or over the dims where
// `out` (keepdim form) has size 1. Partial results combine by warp shuffles and then across the block's warps in
// shared memory. Sums of float accumulate in float (double for double, int64 for integers); over everything, one
// kernel writes a partial per block and a second reduces the partials (no atomics: the result does not depend
// on scheduling).
// This header needs nvcc; ops/elementwise.hpp includes it only when __CUDACC__ is defined.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA

#if !defined(__CUDACC__)
#error "ember/cuda/reduce.cuh defines CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ember/core/creation.hpp"
#include "ember/core/storage.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/executor.cuh"
#include "ember/cuda/stream.hpp"
#include "ember/expr/evaluator.hpp"
#include "ember/expr/reduce_plan.hpp"
#include "ember/expr/reducer.hpp"

namespace ember::cuda {

namespace detail {

/// The reducer the device folds with: float sums of float values accumulate in float (the CPU's double
/// accumulator is there for its long serial lanes; a tree of partials keeps the error small).
template <class R, class C>
struct device_reducer {
  using type = R;
};
template <class C>
struct device_reducer<expr::SumR<double>, C> {
  using type = expr::SumR<std::conditional_t<std::is_same_v<C, double>, double, float>>;
};

inline constexpr unsigned kFullMask = 0xffffffffu;

/// __shfl_down_sync for any trivially copyable accumulator (word by word where CUDA has no overload).
template <class A>
__device__ EMBER_INLINE A shfl_down(const A& a, int off) {
  if constexpr (std::is_same_v<A, float> || std::is_same_v<A, double> || std::is_same_v<A, int> ||
                std::is_same_v<A, long> || std::is_same_v<A, long long> || std::is_same_v<A, unsigned>) {
    return __shfl_down_sync(kFullMask, a, off);
  } else {
    constexpr int W = int((sizeof(A) + 3) / 4);
    unsigned w[W] = {};
    std::memcpy(w, &a, sizeof(A));
    EMBER_UNROLL for (int k = 0; k < W; ++k) w[k] = __shfl_down_sync(kFullMask, w[k], off);
    A r;
    std::memcpy(&r, w, sizeof(A));
    return r;
  }
}

/// Reduces over a full warp; lane 0 holds the result.
template <class R>
__device__ EMBER_INLINE typename R::acc warp_reduce(typename R::acc a) {
  EMBER_UNROLL for (int off = 16; off > 0; off /= 2) a = R::merge(a, shfl_down(a, off));
  return a;
}

/// Reduces over a block whose threads are numbered `t` in [0, nthreads) (nthreads a multiple of 32, at most
/// 1024); thread 0 holds the result. Every thread of the block must call it.
template <class R>
__device__ typename R::acc block_reduce(typename R::acc a, int t, int nthreads) {
  using Acc = typename R::acc;
  __shared__ alignas(16) unsigned char buf[32 * sizeof(Acc)];
  Acc* sh = reinterpret_cast<Acc*>(buf);
  a = warp_reduce<R>(a);
  const int warp = t / 32, lane = t % 32;
  if (lane == 0) sh[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < nthreads / 32 ? sh[lane] : R::init();
    a = warp_reduce<R>(a);
  }
  __syncthreads();  // buf may be reused by the caller's next call
  return a;
}

template <class R, class V>
__device__ EMBER_INLINE typename R::acc fold(typename R::acc a, V v, std::int64_t i) {
  if constexpr (R::indexed) return R::step(a, static_cast<decltype(a.v)>(v), i);
  else return R::step(a, static_cast<typename R::acc>(v), i);
}

/// Everything into one partial per block. Dense plans read packs of N; others walk rows (threadIdx.y picks a
/// row, threadIdx.x strides along it). Within a thread, indices only increase (arg reducers rely on it).
template <class R, int N, class Ev>
__global__ void __launch_bounds__(kThreads) reduce_all_kernel(const __grid_constant__ Ev ev, Shape shape,
                                                              std::int64_t n, bool linear, bool vec,
                                                              std::int64_t chunk, typename R::acc* partial) {
  using Acc = typename R::acc;
  Acc a = R::init();
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  if (linear) {
    const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x * blockDim.y;
    const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x * blockDim.y + t;
    const std::int64_t nvec = vec ? n / N : 0;
    for (std::int64_t v = tid; v < nvec; v += stride) {
      const auto p = ev.template eval_pack<N>(v * N, nullptr);
      EMBER_UNROLL for (int k = 0; k < N; ++k) a = fold<R>(a, p.v[k], v * N + k);
    }
    for (std::int64_t i = nvec * N + tid; i < n; i += stride) a = fold<R>(a, ev.eval(expr::LinearIdx{i}), i);
  } else {
    // Rows cut into chunks, as in the strided element-wise kernel; a thread's work items only increase.
    Ev local = ev;
    const std::int64_t row = shape[shape.n - 1];
    detail::for_row_chunks(
        shape, n / row, chunk, [&](const std::int64_t* coords, int outer) { local.set_row(coords, outer); },
        [&](std::int64_t r, std::int64_t j) { a = fold<R>(a, local.eval(expr::RowIdx{j}), r * row + j); });
  }
  a = block_reduce<R>(a, t, blockDim.x * blockDim.y);
  if (t == 0) partial[blockIdx.x] = a;
}

/// The partials of reduce_all_kernel into out[0] (one block).
template <class R, class OutT>
__global__ void __launch_bounds__(1024) finish_kernel(const typename R::acc* partial, int n, OutT* out) {
  typename R::acc a = R::init();
  for (int i = threadIdx.x; i < n; i += blockDim.x) a = R::merge(a, partial[i]);
  a = block_reduce<R>(a, threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) *out = expr::finish<OutT>(a);
}

/// Reduction of rows: the plan is [kept (nkept) | reduced], each output reduces `count` elements (rows of the
/// last dim). A group of blockDim.x threads (a warp, or the whole block when blockDim.y == 1) per output.
template <class R, class OutT, class Ev>
__global__ void __launch_bounds__(kThreads) reduce_rows_kernel(const __grid_constant__ Ev ev,
                                                               const __grid_constant__ expr::OperandEval<OutT> ob,
                                                               Shape shape, int nkept, std::int64_t nout) {
  Ev local = ev;
  expr::OperandEval<OutT> lo = ob;
  const int nd = shape.n;
  const std::int64_t row = shape[nd - 1];
  std::int64_t nrr = 1;  // rows per output
  for (int d = nkept; d < nd - 1; ++d) nrr *= shape[d];
  const int G = blockDim.x;
  // Every thread of the block runs the same number of iterations (block_reduce needs them all).
  for (std::int64_t base = std::int64_t(blockIdx.x) * blockDim.y; base < nout;
       base += std::int64_t(gridDim.x) * blockDim.y) {
    const std::int64_t o = base + threadIdx.y;
    typename R::acc a = R::init();
    std::int64_t coords[kMaxDims] = {};
    if (o < nout) {
      std::int64_t t = o;
      for (int d = nkept - 1; d >= 0; --d) {
        coords[d] = t % shape[d];
        t /= shape[d];
      }
      for (std::int64_t rr = 0; rr < nrr; ++rr) {
        std::int64_t q = rr;
        for (int d = nd - 2; d >= nkept; --d) {
          coords[d] = q % shape[d];
          q /= shape[d];
        }
        local.set_row(coords, nd - 1);
        for (std::int64_t j = threadIdx.x; j < row; j += G) a = fold<R>(a, local.eval(expr::RowIdx{j}), rr * row + j);
      }
    }
    if (blockDim.y == 1) a = block_reduce<R>(a, threadIdx.x, G);
    else a = warp_reduce<R>(a);
    if (threadIdx.x == 0 && o < nout) {
      for (int d = nkept; d < nd; ++d) coords[d] = 0;
      lo.set_row(coords, nd - 1);
      lo.at(expr::RowIdx{0}) = expr::finish<OutT>(a);
    }
  }
}

/// Reduction of columns: the plan is [reduced (nred) | kept], rows along the last kept dim. Block (32, 8):
/// threadIdx.x picks an output along the row, threadIdx.y splits the reduced elements; shared memory combines.
template <class R, class OutT, class Ev>
__global__ void __launch_bounds__(kThreads) reduce_cols_kernel(const __grid_constant__ Ev ev,
                                                               const __grid_constant__ expr::OperandEval<OutT> ob,
                                                               Shape shape, int nred) {
  using Acc = typename R::acc;
  __shared__ alignas(16) unsigned char buf[kThreads * sizeof(Acc)];
  Acc* sh = reinterpret_cast<Acc*>(buf);
  Ev local = ev;
  expr::OperandEval<OutT> lo = ob;
  const int nd = shape.n;
  const std::int64_t row = shape[nd - 1];
  std::int64_t nrows_red = 1, kept_rows = 1;
  for (int d = 0; d < nred; ++d) nrows_red *= shape[d];
  for (int d = nred; d < nd - 1; ++d) kept_rows *= shape[d];
  const std::int64_t tiles_per_row = (row + 31) / 32;
  const std::int64_t ntiles = kept_rows * tiles_per_row;
  for (std::int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
    const std::int64_t kr = tile / tiles_per_row;
    const std::int64_t j = (tile % tiles_per_row) * 32 + threadIdx.x;
    std::int64_t coords[kMaxDims] = {};
    std::int64_t t = kr;
    for (int d = nd - 2; d >= nred; --d) {
      coords[d] = t % shape[d];
      t /= shape[d];
    }
    Acc a = R::init();
    if (j < row) {
      for (std::int64_t r = threadIdx.y; r < nrows_red; r += blockDim.y) {
        std::int64_t q = r;
        for (int d = nred - 1; d >= 0; --d) {
          coords[d] = q % shape[d];
          q /= shape[d];
        }
        local.set_row(coords, nd - 1);
        a = fold<R>(a, local.eval(expr::RowIdx{j}), r);
      }
    }
    sh[threadIdx.y * 32 + threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && j < row) {
      for (unsigned y = 1; y < blockDim.y; ++y) a = R::merge(a, sh[y * 32 + threadIdx.x]);
      for (int d = 0; d < nred; ++d) coords[d] = 0;
      lo.set_row(coords, nd - 1);
      lo.at(expr::RowIdx{j}) = expr::finish<OutT>(a);
    }
    __syncthreads();
  }
}

inline unsigned capped_blocks(std::int64_t need, int dev) {
  const std::int64_t cap = std::int64_t(sm_count(dev)) * (2048 / kThreads) * 4;
  return unsigned(std::max<std::int64_t>(1, std::min(need, cap)));
}

}  // namespace detail

/// Reduces expression e (on a CUDA device) over the dims where `out` (same rank as e's shape, keepdim form, on
/// the same device) has size 1 and e does not. R is the reducer (expr/reducer.hpp); `out` receives R's result
/// converted to its type (indices for ArgR). Same semantics as cpu::reduce.
template <class R, class OutT, class E>
void reduce(const Tensor<OutT>& out, const E& e, const char* op) {
  static_assert(expr::no_slots_v<E>, "ember: this expression reads slots (expr::slot / LeafRef), which only a "
                                     "multi-output pass with a slot source (ops::assign_multi) evaluates");
  using DR = typename detail::device_reducer<R, compute_t<typename E::value_type>>::type;
  using Acc = typename DR::acc;
  const Device dev = out.device();
  EMBER_CHECK(dev.is_cuda(), op, ": the CUDA reduction got an output on ", dev.str());
  DeviceGuard guard(dev.index);
  const Shape space = e.shape();
  EMBER_CHECK(out.dim() == space.n, op, ": internal rank mismatch");
  Device d = dev;
  bool have = true;
  const std::int64_t n = space.numel();
  const cudaStream_t s = current_stream(dev.index).handle();
  constexpr int N = detail::pack_width(expr::max_leaf_bytes<E>::value);

  if (n == 0) {
    // Empty groups: every output is the reducer's identity (sum 0, prod 1).
    expr::PlanBuilder b(space);
    expr::add_leaves(e, b, d, have, op);
    if (out.numel() > 0)
      assign(out, expr::ScalarLeaf<OutT>{static_cast<compute_t<OutT>>(expr::finish<OutT>(R::init()))}, op);
    return;
  }

  if (out.numel() == 1) {
    // Everything into one value: one partial per block, then one block reduces the partials.
    expr::PlanBuilder b(space);
    expr::add_leaves(e, b, d, have, op);
    const expr::Plan p = b.collapse();
    int k = 0;
    const auto ev = expr::make_eval(e, p, k);
    using Ev = std::remove_cvref_t<decltype(ev)>;
    detail::check_body<Ev>();
    const bool vec = p.linear && detail::leaves_aligned<N>(e);
    dim3 block(detail::kThreads);
    unsigned blocks;
    std::int64_t chunk = 1;
    if (p.linear) {
      const std::int64_t work = vec ? n / N + n % N : n;
      blocks = detail::capped_blocks((work + detail::kThreads - 1) / detail::kThreads, dev.index);
    } else {
      const std::int64_t row = p.row_len(), nrows = n / row;
      const detail::RowGeometry g = detail::row_geometry(row);
      chunk = g.chunk;
      block = dim3(g.bx, g.by);
      blocks = detail::capped_blocks((nrows * ((row + chunk - 1) / chunk) + g.by - 1) / g.by, dev.index);
    }
    const Storage part = make_storage(std::size_t(blocks) * sizeof(Acc), dev);
    Acc* pp = static_cast<Acc*>(part->data);
    detail::reduce_all_kernel<DR, N, Ev><<<blocks, block, 0, s>>>(ev, p.shape, n, p.linear, vec, chunk, pp);
    EMBER_CUDA_CHECK(cudaGetLastError());
    detail::finish_kernel<DR, OutT><<<1, 1024, 0, s>>>(pp, int(blocks), out.data());
    EMBER_CUDA_CHECK(cudaGetLastError());
    out.bump_version();
    return;
  }

  // Along some dims: out is operand 0 (stride 0 on reduced dims), leaves follow; the walk is expr::plan_reduce's,
  // as on the CPU.
  const expr::ReducePlan rp = expr::plan_reduce_into(out, e, space, d, have, R::indexed, op);
  const expr::Plan& q = rp.q;
  const int nd = q.shape.n, nred = rp.nred, nkept = rp.nkept;
  const bool inner_reduced = rp.rows;
  int k = 1;
  const auto ev = expr::make_eval(e, q, k);
  using Ev = std::remove_cvref_t<decltype(ev)>;
  detail::check_body<Ev>();
  const expr::OperandEval<OutT> ob(out.data(), q, 0);
  if (inner_reduced) {
    std::int64_t nout = 1;
    for (int i = 0; i < nkept; ++i) nout *= q.shape[i];
    const std::int64_t count = n / nout;
    // A warp per output, or the whole block when there are few outputs with many elements each.
    const bool whole = count > 2048 && nout < std::int64_t(detail::sm_count(dev.index)) * 16;
    const dim3 block = whole ? dim3(detail::kThreads, 1) : dim3(32, detail::kThreads / 32);
    const unsigned blocks = detail::capped_blocks((nout + block.y - 1) / block.y, dev.index);
    detail::reduce_rows_kernel<DR, OutT, Ev><<<blocks, block, 0, s>>>(ev, ob, q.shape, nkept, nout);
    EMBER_CUDA_CHECK(cudaGetLastError());
  } else if constexpr (!R::indexed) {
    std::int64_t kept_rows = 1;
    for (int i = nred; i < nd - 1; ++i) kept_rows *= q.shape[i];
    const std::int64_t ntiles = kept_rows * ((q.shape[nd - 1] + 31) / 32);
    const unsigned blocks = detail::capped_blocks(ntiles, dev.index);
    detail::reduce_cols_kernel<DR, OutT, Ev><<<blocks, dim3(32, detail::kThreads / 32), 0, s>>>(ev, ob, q.shape, nred);
    EMBER_CUDA_CHECK(cudaGetLastError());
  }
  out.bump_version();
}

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
