// ember — element-wise evaluation and reductions on whichever device the tensors live on. The CPU executor
// (cpu/executor.hpp, cpu/reduce.hpp) runs CPU tensors; CUDA tensors go to the CUDA executor (cuda/executor.cuh,
// cuda/reduce.cuh) when this translation unit is compiled by nvcc, and are an error that says so otherwise. A
// CPU-only build includes no CUDA header from here.
#pragma once

#include <cstdint>
#include <tuple>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
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
/// The error of an op with its own CUDA kernels (`kernels`, e.g. "the layer norm kernels") reached with CUDA
/// tensors in a translation unit that nvcc did not compile.
[[noreturn, gnu::cold, gnu::noinline]] inline void no_cuda_kernel(const char* op, Device d, const char* kernels) {
  throw Error(::ember::detail::concat(
      op, ": got tensors on ", d.str(), ", but this translation unit was not compiled by nvcc; ", kernels,
      " for CUDA tensors are instantiated in the user's own translation unit, so compile it with nvcc (a .cu file) "
      "and link ember::cuda"));
}

/// t itself when contiguous, else a contiguous copy on its device (not recorded by autograd).
template <class T>
Tensor<T> dense(const Tensor<T>& t) {
  if (t.is_contiguous()) return t;
  if (t.device().is_cuda()) return t.detach().contiguous();  // the device's element-wise copy
  Tensor<T> c = empty<T>(t.shape(), t.device());
  cpu::assign(c, expr::TensorLeaf<T, false>{&t}, "contiguous");
  return c;
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

/// Several outputs of one shape from several expressions in ONE pass over `space`, on the outputs' device: the
/// fused backward writes every leaf's gradient so, an optimizer's update its parameter and state. The tensors of
/// `slot_src` (an expression's tensor leaves, or a std::tuple of tensors) fill, in order, the slots that the
/// expressions' expr::slot<K> (LeafRef) nodes read: every use of a slot is one load. An output may also be read,
/// through a slot or a leaf, with its own geometry: at each index every value is computed before any output is
/// stored there, so `p = p - lr * m` and `m = b1 * m + (1 - b1) * g` update in place in one pass. Outputs must not
/// share memory with each other; an operand that reads an output's memory with another geometry sends the pass
/// through temporaries.
template <class... T, class... E, class S>
void assign_multi(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                  const S& slot_src, const char* op = "backward") {
  // No profiler range of its own: its callers (a backward node, an optimizer's step, the scaler's unscale_) record
  // theirs, and the trace's "backward" is the training loop's phase.
  const Tensor<std::tuple_element_t<0, std::tuple<T...>>>& first = std::get<0>(outs);
  if (first.defined() && first.device().is_cuda()) {
#if EMBER_CUDA_EXECUTOR
    cuda::assign_multi(outs, es, space, slot_src, op);
    return;
#else
    detail::no_cuda_executor(op, first.device());
#endif
  }
  cpu::assign_multi(outs, es, space, slot_src, op);
}

/// assign_multi's pass with the bool expression `check` evaluated at every index of it: `flag` (one int64 element
/// on the outputs' device) is set to 1 when the check is true anywhere, and never cleared here, so one flag collects
/// the checks of many passes and is read once (GradScaler's unscale and inf/NaN test: one read and one write of each
/// gradient, one device-to-host read in all).
template <class... T, class... E, class S, class C>
void assign_multi_flag(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                       const S& slot_src, const C& check, const Tensor<std::int64_t>& flag, const char* op) {
  static_assert(std::is_same_v<typename C::value_type, bool>, "ops::assign_multi_flag: the check is a bool expression");
  const Tensor<std::tuple_element_t<0, std::tuple<T...>>>& first = std::get<0>(outs);
  EMBER_CHECK(flag.defined() && flag.numel() == 1 && flag.is_contiguous(), op, ": the flag is one int64 element");
  EMBER_CHECK(!first.defined() || flag.device() == first.device(), op, ": the flag is on ", flag.device().str(),
              " but the outputs on ", first.device().str());
  if (first.defined() && first.device().is_cuda()) {
#if EMBER_CUDA_EXECUTOR
    cuda::assign_multi(outs, es, space, slot_src, op, check, flag.data());
    flag.bump_version();
    return;
#else
    detail::no_cuda_executor(op, first.device());
#endif
  }
  if (cpu::assign_multi(outs, es, space, slot_src, op, check)) {
    *flag.data() = 1;
    flag.bump_version();
  }
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
