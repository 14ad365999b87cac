// ember — differentiable conv2d -> training-mode batch_norm -> [relu] -> [2x2 max pool] as one operation on the CPU
// (ops/conv_bn.hpp): one node whose backward writes the gradients of the input, the convolution's weight and bias
// and the batch norm's weight and bias. nn::Sequential runs its Conv2d -> BatchNorm2d [-> ReLU] [-> MaxPool2d(2)]
// groups through it in training mode.
#pragma once

#include <memory>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/conv_bn.hpp"

namespace ember {

namespace autograd {
template <class T, class P = T>  // P: the batch norm's parameter dtype (float for 16-bit data under mixed precision)
struct ConvBatchNormNode final : TypedNode<T> {
  Saved<T> x, w, z;  // z: the convolution's output
  Saved<P> bn_weight, bn_bias;
  std::vector<double> mean, invstd;
  Conv2dOptions opts;
  ops::ConvBnOptions bn_opts;
  bool has_bias = false;
  const char* name() const override { return "ConvBatchNormBackward"; }
  void release() override {
    x = w = z = Saved<T>();
    bn_weight = bn_bias = Saved<P>();
    mean.clear();
    invstd.clear();
  }
  void backward() override {
    // next: x, w, [b], bn_weight, bn_bias (null where no gradient flows)
    const std::size_t bi = has_bias ? 2 : std::size_t(-1), gi = has_bias ? 3 : 2;
    auto want = [&](std::size_t i) { return i < this->next.size() && this->next[i] != nullptr; };
    const Tensor<P>& gwt = bn_weight.get(name());  // undefined when the batch norm has no affine parameters
    const Tensor<P>& gbt = bn_bias.get(name());
    auto r = ops::conv2d_batch_norm_backward(this->grad, x.get(name()), w.get(name()), z.get(name()), gwt, gbt, mean,
                                             invstd, opts, bn_opts, want(0), want(1), want(bi), want(gi),
                                             want(gi + 1));
    if (want(0)) this->template deliver<T>(0, std::move(r.input));
    if (want(1)) this->template deliver<T>(1, std::move(r.weight));
    if (want(bi)) this->template deliver<T>(bi, std::move(r.bias));
    if (want(gi)) this->template deliver<P>(gi, std::move(r.bn_weight));
    if (want(gi + 1)) this->template deliver<P>(gi + 1, std::move(r.bn_bias));
  }
};
}  // namespace autograd

/// relu? / pool2? of batch_norm(conv2d(x, w, b, o), running_mean, running_var, bn_weight, bn_bias, training = true,
/// bo.momentum, bo.eps), computed as one operation on the CPU (ops/conv_bn.hpp): the same values and gradients as
/// the four ops, bit for bit, with fewer passes over memory and one node on the tape. x (N, C, H, W); b, bn_weight,
/// bn_bias, running_mean and running_var (O) may be undefined, as for conv2d and batch_norm. Differentiable in x, w,
/// b, bn_weight and bn_bias. For half / bfloat16 data the batch norm's parameters and statistics may be float (as
/// batch_norm's mixed-type form; their gradients are float).
template <class T, ops::BatchNormParam<T> P = T>
Tensor<T> conv2d_batch_norm(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, const Tensor<P>& running_mean,
                            const Tensor<P>& running_var, const Tensor<P>& bn_weight, const Tensor<P>& bn_bias,
                            const Conv2dOptions& o = {}, const ops::ConvBnOptions& bo = {}) {
  auto r = ops::conv2d_batch_norm_forward(x, w, b, running_mean, running_var, bn_weight, bn_bias, o, bo);
  Tensor<T> y = std::move(r.y);
  auto wants = [](const auto& t) { return t.defined() && t.requires_grad(); };
  if (is_grad_enabled() && (wants(x) || wants(w) || wants(b) || wants(bn_weight) || wants(bn_bias))) {
    auto node = std::make_shared<autograd::ConvBatchNormNode<T, P>>();
    auto edge = [](const auto& t) -> std::shared_ptr<autograd::Node> {
      return t.defined() ? autograd::gradient_edge(t) : nullptr;
    };
    node->next = {edge(x), edge(w)};
    node->has_bias = b.defined();
    if (b.defined()) node->next.push_back(edge(b));
    node->next.push_back(edge(bn_weight));
    node->next.push_back(edge(bn_bias));
    node->x = autograd::Saved<T>(x);
    node->w = autograd::Saved<T>(w);
    node->z = autograd::Saved<T>(r.z);
    if (bn_weight.defined()) node->bn_weight = autograd::Saved<P>(bn_weight);
    if (bn_bias.defined()) node->bn_bias = autograd::Saved<P>(bn_bias);
    node->mean = std::move(r.mean);
    node->invstd = std::move(r.invstd);
    node->opts = o;
    node->bn_opts = bo;
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
  }
  return y;
}

}  // namespace ember
