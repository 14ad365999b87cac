// ember — the parts of reductions that are not fused expressions, without autograd: the gradient factor of prod
// (the loops are cpu/reduce_backward.hpp's).
#pragma once

#include <cstdint>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/reduce_backward.hpp"

namespace ember::ops {

/// d prod / d x_j for the Kn groups of R values of the contiguous CPU tensor x (group k at k * R), given their
/// products `result` (Kn values, contiguous): see cpu::prod_of_others for `all` and `nonempty`. The result has x's
/// shape.
template <class T>
Tensor<T> prod_of_others(const Tensor<T>& x, const Tensor<T>& result, std::int64_t Kn, std::int64_t R, bool all,
                         bool nonempty) {
  Tensor<T> o = empty<T>(x.shape());
  cpu::prod_of_others(x.data(), result.data(), o.data(), Kn, R, all, nonempty);
  return o;
}

}  // namespace ember::ops
