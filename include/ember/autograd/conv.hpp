// ember — differentiable 2-D convolution (torch.nn.functional.conv2d), with a hand-written backward node over
// ops/conv.hpp. Pooling, the other sliding-window family, lives in autograd/pool.hpp and comes with this header.
#pragma once

#include <memory>
#include <type_traits>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/pool.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/window.hpp"

namespace ember {

namespace autograd {
/// y = conv2d(x, w, b): gx is the transposed convolution of g, gw correlates g with x, gb sums g.
template <class T>
struct Conv2dNode final : TypedNode<T> {
  Saved<T> x, w;  // (N, C, H, W), (O, C/groups, kh, kw)
  Conv2dOptions opts;
  const char* name() const override { return "Conv2dBackward"; }
  void release() override { x = w = Saved<T>(); }
  void backward() override {
    const bool gx = this->next[0] != nullptr, gw = this->next[1] != nullptr;
    const bool gb = this->next.size() > 2 && this->next[2] != nullptr;
    auto r = ops::conv2d_backward(this->grad, x.get(name()), w.get(name()), opts, gx, gw, gb);
    if (gx) this->template deliver<T>(0, std::move(r.input));
    if (gw) this->template deliver<T>(1, std::move(r.weight));
    if (gb) this->template deliver<T>(2, std::move(r.bias));
  }
};

template <class T>
void check_unbatched_rank(const char* op, const Tensor<T>& x) {
  EMBER_CHECK(x.dim() == 3 || x.dim() == 4, op, ": expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got shape ",
              x.shape().str());
}
}  // namespace autograd

/// 2-D convolution (cross-correlation, as PyTorch) of x (N, C, H, W) or unbatched (C, H, W) with
/// w (O, C/groups, kh, kw) plus an optional bias b (O); returns (N, O, oh, ow) or (O, oh, ow).
template <class T>
Tensor<T> conv2d(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b = Tensor<T>(),
                 const Conv2dOptions& o = {}) {
  static_assert(is_floating_v<T>, "conv2d: floating-point tensors only");
  autograd::check_unbatched_rank("conv2d", x);
  if (x.dim() == 3) return conv2d(x.unsqueeze(0), w, b, o).squeeze(0);
  Tensor<T> y = ops::detail::conv2d_enabled(x, w, b, o, Activation::none, false);
  if (is_grad_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()))) {
    auto node = std::make_shared<autograd::Conv2dNode<T>>();
    node->next = {autograd::gradient_edge(x), autograd::gradient_edge(w)};
    if (b.defined()) node->next.push_back(autograd::gradient_edge(b));
    node->x = autograd::Saved<T>(x);
    node->w = autograd::Saved<T>(w);
    node->opts = o;
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
  }
  return y;
}

/// Tensors of two dtypes cannot be convolved: a compile-time error that says what to do.
template <class T, class U, class... Rest>
  requires(!std::is_same_v<T, U>)
Tensor<T> conv2d(const Tensor<T>&, const Tensor<U>&, Rest&&...) {
  static_assert(std::is_same_v<T, U>, "conv2d: input and weight have different dtypes; convert one with cast<T>(x)");
  return {};
}

}  // namespace ember
