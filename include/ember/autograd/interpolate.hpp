// ember — differentiable resampling along one dim (the passes nn::functional::interpolate is built from): the
// forward and backward of ops/interpolate.hpp recorded as one node per pass.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/interpolate.hpp"
#include "ember/ops/interpolate.hpp"

namespace ember {

namespace autograd {
template <class T>
struct ResampleNode final : TypedNode<T> {
  cpu::ResampleTaps taps;
  Shape in_shape;
  int dim = 0;
  const char* name() const override { return "InterpolateBackward"; }
  void release() override { taps = cpu::ResampleTaps(); }
  void backward() override { this->template deliver<T>(0, ops::resample_backward(this->grad, in_shape, dim, taps)); }
};
}  // namespace autograd

namespace detail {
/// x with dim d resized by the taps r (cpu::resample_taps), differentiable in x.
template <class T>
Tensor<T> resample(const Tensor<T>& x, int d, cpu::ResampleTaps r) {
  static_assert(is_floating_v<T>, "interpolate: floating-point tensors only");
  Tensor<T> y = ops::resample(x, d, r);
  if (is_grad_enabled() && x.requires_grad()) {
    auto node = std::make_shared<autograd::ResampleNode<T>>();
    node->taps = std::move(r);
    node->in_shape = x.shape();
    node->dim = d;
    node->next = {autograd::gradient_edge(x)};
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
  }
  return y;
}
}  // namespace detail

}  // namespace ember
