// ember — what quant/ attaches to a Linear or Conv2d (an extension of its state), and how the layer's forward defers
// to it. Here so that nn/ needs no part of quant/.
#pragma once

#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {
namespace detail {

/// What quant::prepare (an observer) or quant::convert (the int8 layer) attaches to a Linear or Conv2d: while
/// calibrating it observes the layer's inputs; once converted it runs the layer in int8 (float input and output)
/// instead of the float forward.
struct QuantHook : Extension {
  virtual bool converted() const = 0;
  virtual void observe(const Tensor<float>& x) = 0;
  virtual Tensor<float> forward(const Tensor<float>& x) const = 0;
};

/// For a layer quant/ prepared or converted: observes x (calibration) and returns false, or writes the int8 layer's
/// output to `out` and returns true. Returns false at once for every other module.
template <class T>
bool quant_forward(const Module& m, const Tensor<T>& x, Tensor<T>& out) {
  QuantHook* q = m.extension<QuantHook>();
  if (!q) return false;
  if constexpr (std::is_same_v<T, float>) {
    if (q->converted()) {
      out = q->forward(x);
      return true;
    }
    q->observe(x);
    return false;
  } else {
    (void)out;
    throw Error(m.type_name() + ": a layer prepared or converted by quant:: takes float32 input, got " +
                dtype_name<T>() + " " + x.shape().str());
  }
}

}  // namespace detail

/// Whether quant::prepare or quant::convert attached itself to the layer m.
inline bool quantized(const Module& m) { return m.extension<detail::QuantHook>() != nullptr; }

}  // namespace ember::nn
