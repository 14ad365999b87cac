// ember — precision policies: which element types a layer stores its parameters in, computes in, accumulates in
// and keeps gradients in. Layers take a policy as a template parameter (fp32 by default), so mixed precision is a
// type, not a rewrite of the model.
#pragma once

#include <type_traits>

#include "ember/core/dtype.hpp"
#include "ember/core/float16.hpp"

namespace ember::amp {

/// A precision policy names four element types:
///  - param_t:      what parameters (the master weights the optimizer updates) are stored in;
///  - compute_t:    what activations flowing between layers are in (a layer casts its parameters to it);
///  - accumulate_t: what reductions and GEMMs accumulate in;
///  - grad_t:       what the parameters' gradients are in (the same as param_t: gradients land on the masters).
template <class Param, class Compute, class Accumulate = float>
struct Policy {
  using param_t = Param;            ///< What parameters are stored in.
  using compute_t = Compute;        ///< What activations are in.
  using accumulate_t = Accumulate;  ///< What reductions and GEMMs accumulate in.
  using grad_t = Param;             ///< What the parameters' gradients are in.
  /// True when the layer must cast its parameters to compute_t in forward.
  static constexpr bool casts = !std::is_same_v<Param, Compute>;
};

/// Everything in fp32 (the default).
using fp32 = Policy<float, float, float>;
/// Everything in fp64 (gradient checks, numerics research).
using fp64 = Policy<double, double, double>;
/// fp32 master weights, fp16 activations, fp32 accumulation (use with a loss scaler).
using fp16_mixed = Policy<float, half, float>;
/// fp32 master weights, bf16 activations, fp32 accumulation (no loss scaling needed).
using bf16_mixed = Policy<float, bfloat16, float>;

template <class P>
concept PrecisionPolicy = requires {
  typename P::param_t;
  typename P::compute_t;
  typename P::accumulate_t;
  typename P::grad_t;
} && is_floating_v<typename P::param_t> && is_floating_v<typename P::compute_t>;

}  // namespace ember::amp
