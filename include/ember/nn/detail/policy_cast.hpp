// ember — how a layer turns its stored parameters into the precision it computes in.
#pragma once

#include <type_traits>

#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/nodes.hpp"

namespace ember::nn::detail {

/// p itself when it already has the compute type; otherwise a differentiable cast (the gradient flows back to the
/// fp32 master parameter). Undefined stays undefined.
template <class C, class T>
Tensor<C> to_compute(const Tensor<T>& p) {
  if constexpr (std::is_same_v<C, T>) {
    return p;
  } else {
    if (!p.defined()) return Tensor<C>();
    return cast<C>(p);
  }
}

}  // namespace ember::nn::detail
