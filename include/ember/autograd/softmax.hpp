// ember — differentiable softmax and log_softmax along a dim (torch.softmax / torch.log_softmax). The backward
// node keeps only the output: softmax's gradient is y (g - Σ g y), log_softmax's g - exp(y) Σ g.
#pragma once

#include <cstdint>
#include <memory>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/softmax.hpp"

namespace ember {

namespace autograd {
template <class T, bool Log>
struct SoftmaxNode final : TypedNode<T> {
  Saved<T> y;  // the forward output
  int dim = 0;
  const char* name() const override { return Log ? "LogSoftmaxBackward" : "SoftmaxBackward"; }
  void release() override { y = Saved<T>(); }
  void backward() override {
    const Tensor<T>& yv = y.get(name());
    if constexpr (Log) this->template deliver<T>(0, ops::log_softmax_backward(yv, this->grad, dim));
    else this->template deliver<T>(0, ops::softmax_backward(yv, this->grad, dim));
  }
};

template <bool Log, class T>
Tensor<T> record_softmax(Tensor<T> y, const Tensor<T>& x, std::int64_t dim) {
  if (is_grad_enabled() && x.requires_grad()) {
    auto node = std::make_shared<SoftmaxNode<T, Log>>();
    node->next = {gradient_edge(x)};
    node->dim = wrap_dim(dim, x.shape(), Log ? "log_softmax" : "softmax");
    node->output = y.impl_ptr();
    set_history<T>(y, node);
    node->y = Saved<T>(y.detach());  // detached: a saved output holding its own node would be a reference cycle
  }
  return y;
}
}  // namespace autograd

/// Softmax along dim: exp(x - max) / Σ exp(x - max); rows of the result sum to 1. Use it for probabilities; for a
/// loss, pass raw logits to nn::cross_entropy (or log_softmax to nn::nll_loss), which is stabler than log(softmax).
template <class T>
Tensor<T> softmax(const Tensor<T>& x, std::int64_t dim) {
  return autograd::record_softmax<false>(ops::softmax(x, dim), x, dim);
}

/// log(softmax(x)) along dim, computed stably as (x - max) - log Σ exp(x - max): the input nn::nll_loss expects.
template <class T>
Tensor<T> log_softmax(const Tensor<T>& x, std::int64_t dim) {
  return autograd::record_softmax<true>(ops::log_softmax(x, dim), x, dim);
}

}  // namespace ember
