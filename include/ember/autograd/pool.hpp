// ember — differentiable 2-D pooling (torch.nn.functional.max_pool2d, avg_pool2d, adaptive_avg_pool2d) with
// hand-written backward nodes over ops/pool.hpp. Max pooling sends each gradient to the recorded argmax.
#pragma once

#include <cstdint>
#include <memory>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/pool.hpp"
#include "ember/ops/window.hpp"

namespace ember {

namespace autograd {
/// On the CPU the node keeps the argmax indices; on CUDA (cuDNN finds each maximum again) the input and output.
template <class T>
struct MaxPool2dNode final : TypedNode<T> {
  Tensor<std::int64_t> indices;  // (N, C, oh, ow): flat h*W+w of each maximum (CPU)
  Shape input_shape;             // (N, C, H, W)
  Saved<T> x, y;                 // (N, C, H, W), (N, C, oh, ow) (CUDA)
  Size2 kernel;
  Pool2dOptions opts;
  const char* name() const override { return "MaxPool2dBackward"; }
  void release() override {
    indices = Tensor<std::int64_t>();
    x = y = Saved<T>();
  }
  void backward() override {
    if (indices.defined())
      this->template deliver<T>(0, ops::max_pool2d_backward(this->grad, indices, input_shape));
    else
      this->template deliver<T>(0, ops::max_pool2d_backward(this->grad, x.get(name()), y.get(name()), kernel, opts));
  }
};

template <class T>
struct AvgPool2dNode final : TypedNode<T> {
  Shape input_shape;  // (N, C, H, W)
  Size2 kernel;
  Pool2dOptions opts;
  const char* name() const override { return "AvgPool2dBackward"; }
  void backward() override {
    this->template deliver<T>(0, ops::avg_pool2d_backward(this->grad, input_shape, kernel, opts));
  }
};

template <class T>
struct AdaptiveAvgPool2dNode final : TypedNode<T> {
  Shape input_shape;  // (N, C, H, W)
  const char* name() const override { return "AdaptiveAvgPool2dBackward"; }
  void backward() override { this->template deliver<T>(0, ops::adaptive_avg_pool2d_backward(this->grad, input_shape)); }
};

template <class T, class N>
void record_pool(Tensor<T>& y, const Tensor<T>& x, const std::shared_ptr<N>& node) {
  node->next = {gradient_edge(x)};
  node->output = y.impl_ptr();
  set_history<T>(y, node);
}

template <class T>
bool pool_needs_grad(const Tensor<T>& x) {
  return is_grad_enabled() && x.requires_grad();
}

template <class T>
void check_pool_rank(const char* op, const Tensor<T>& x) {
  EMBER_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ",
              x.shape().str());
}
}  // namespace autograd

/// Max pooling over kernel windows of x (N, C, H, W) or (C, H, W). Padding is -inf; a tie keeps the first
/// maximum and a NaN wins; the gradient goes to the chosen element.
template <class T>
Tensor<T> max_pool2d(const Tensor<T>& x, Size2 kernel, const Pool2dOptions& o = {}) {
  static_assert(is_floating_v<T>, "max_pool2d: floating-point tensors only");
  autograd::check_pool_rank("max_pool2d", x);
  if (x.dim() == 3) return max_pool2d(x.unsqueeze(0), kernel, o).squeeze(0);
  const bool grad = autograd::pool_needs_grad(x);
  const bool cuda = x.device().is_cuda();
  auto [y, idx] = ops::max_pool2d_with_indices(x, kernel, o, grad && !cuda);
  if (grad) {
    auto node = std::make_shared<autograd::MaxPool2dNode<T>>();
    node->indices = idx;
    node->input_shape = x.shape();
    node->kernel = kernel;
    node->opts = o;
    autograd::record_pool(y, x, node);
    if (cuda) {
      node->x = autograd::Saved<T>(x);
      node->y = autograd::Saved<T>(y.detach());  // detached: no cycle through y's own node
    }
  }
  return y;
}

/// Average pooling over kernel windows of x (N, C, H, W) or (C, H, W); see Pool2dOptions for the divisor rule.
template <class T>
Tensor<T> avg_pool2d(const Tensor<T>& x, Size2 kernel, const Pool2dOptions& o = {}) {
  static_assert(is_floating_v<T>, "avg_pool2d: floating-point tensors only");
  autograd::check_pool_rank("avg_pool2d", x);
  if (x.dim() == 3) return avg_pool2d(x.unsqueeze(0), kernel, o).squeeze(0);
  Tensor<T> y = ops::avg_pool2d(x, kernel, o);
  if (autograd::pool_needs_grad(x)) {
    auto node = std::make_shared<autograd::AvgPool2dNode<T>>();
    node->input_shape = x.shape();
    node->kernel = kernel;
    node->opts = o;
    autograd::record_pool(y, x, node);
  }
  return y;
}

/// Average pooling of x (N, C, H, W) or (C, H, W) to a fixed output size, bins as PyTorch's (overlapping when
/// the sizes do not divide).
template <class T>
Tensor<T> adaptive_avg_pool2d(const Tensor<T>& x, Size2 output_size) {
  static_assert(is_floating_v<T>, "adaptive_avg_pool2d: floating-point tensors only");
  autograd::check_pool_rank("adaptive_avg_pool2d", x);
  if (x.dim() == 3) return adaptive_avg_pool2d(x.unsqueeze(0), output_size).squeeze(0);
  Tensor<T> y = ops::adaptive_avg_pool2d(x, output_size);
  if (autograd::pool_needs_grad(x)) {
    auto node = std::make_shared<autograd::AdaptiveAvgPool2dNode<T>>();
    node->input_shape = x.shape();
    autograd::record_pool(y, x, node);
  }
  return y;
}

}  // namespace ember
