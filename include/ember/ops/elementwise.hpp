// ember — element-wise evaluation and reductions on whichever device the tensors live on. The CPU executor
// (cpu/executor.hpp, cpu/reduce.hpp) runs CPU tensors; CUDA tensors go to the CUDA executor (cuda/executor.cuh,
// cuda/reduce.cuh) when this translation unit is compiled by nvcc, and are an error that says so otherwise. A
// CPU-only build includes no CUDA header from here.
#pragma once

#include <tuple>

#include "ember/config.hpp"
#include "ember/core/device.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/reduce.hpp"
#include "ember/expr/evaluator.hpp"
#include "ember/expr/reducer.hpp"
#include "ember/profile/range.hpp"

#if EMBER_WITH_CUDA && defined(__CUDACC__)
#include "ember/cuda/executor.cuh"
#include "ember/cuda/reduce.cuh"
#define EMBER_CUDA_EXECUTOR 1
#else
#define EMBER_CUDA_EXECUTOR 0
#endif

namespace ember::ops {

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void no_cuda_executor(const char* op, Device d) {
  throw Error(::ember::detail::concat(
      op, ": got tensors on ", d.str(), ", but this translation unit was not compiled by nvcc; element-wise code on "
      "CUDA tensors is instantiated in the user's own translation unit, so compile it with nvcc (a .cu file) and "
      "link ember::cuda"));
}
}  // namespace detail

/// out = e, in one pass on out's device (out has e's broadcast shape, or e broadcasts to it). Aliasing-safe.
template <class T, class E>
void assign(const Tensor<T>& out, const E& e, const char* op = "assign") {
  EMBER_PROFILE_RANGE_CAT(op, "elementwise");
  if (out.device().is_cuda()) {
#if EMBER_CUDA_EXECUTOR
    cuda::assign(out, e, op);
    return;
#else
    detail::no_cuda_executor(op, out.device());
#endif
  }
  cpu::assign(out, e, op);
}

/// Several outputs (fresh, dense, same shape) from several expressions in one pass (the fused backward).
template <class... T, class... E, class S>
void assign_multi(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                  const S& slot_src) {
  const Device dev = std::get<0>(outs).device();
  if (dev.is_cuda()) {
#if EMBER_CUDA_EXECUTOR
    cuda::assign_multi(outs, es, space, slot_src);
    return;
#else
    detail::no_cuda_executor("backward", dev);
#endif
  }
  cpu::assign_multi(outs, es, space, slot_src);
}

/// Reduces e with reducer R (expr/reducer.hpp) over the dims where `out` (keepdim form, on e's device) has size 1.
template <class R, class OutT, class E>
void reduce(const Tensor<OutT>& out, const E& e, const char* op) {
  EMBER_PROFILE_RANGE_CAT(op, "reduction");
  if (out.device().is_cuda()) {
#if EMBER_CUDA_EXECUTOR
    cuda::reduce<R>(out, e, op);
    return;
#else
    detail::no_cuda_executor(op, out.device());
#endif
  }
  cpu::reduce<R>(out, e, op);
}

}  // namespace ember::ops
