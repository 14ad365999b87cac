// ember — differentiable batch norm and layer norm (F.batch_norm, F.layer_norm). Each records one hand-written
// node whose backward is the closed-form gradient for the input, the weight and the bias together.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/normalization.hpp"

namespace ember {

namespace autograd {
template <class T, class P = T>  // P: the dtype of the weight and bias (float for 16-bit data under mixed precision)
struct BatchNormNode final : TypedNode<T> {
  Saved<T> x;
  Saved<P> weight;
  std::vector<double> mean, invstd;  // (C) what the forward normalised with (CPU)
  Tensor<ops::bn_param_t<T>> save_mean, save_invstd;  // (C) the same on the device (CUDA)
  double eps = 1e-5;
  bool training = true;
  const char* name() const override { return "BatchNormBackward"; }
  void release() override {
    x = Saved<T>();
    weight = Saved<P>();
    mean.clear();
    invstd.clear();
    save_mean = save_invstd = Tensor<ops::bn_param_t<T>>();
  }
  void backward() override {
    const Tensor<T>& xv = x.get(name());
    const Tensor<P>& wv = weight.get(name());
    auto g = ops::batch_norm_backward(this->grad, xv, wv, mean, invstd, training, this->next[0] != nullptr,
                                      this->next[1] != nullptr, this->next[2] != nullptr, save_mean, save_invstd,
                                      eps);
    if (this->next[0]) this->template deliver<T>(0, std::move(g.dx));
    if (this->next[1]) this->template deliver<P>(1, std::move(g.dweight));
    if (this->next[2]) this->template deliver<P>(2, std::move(g.dbias));
  }
};

template <class T>
struct LayerNormNode final : TypedNode<T> {
  Saved<T> x, weight;
  Shape normalized_shape;
  std::vector<double> mean, rstd;  // per row (CPU)
  Tensor<double> save_mean, save_rstd;  // (R) the same on the device (CUDA)
  const char* name() const override { return "LayerNormBackward"; }
  void release() override {
    x = weight = Saved<T>();
    mean.clear();
    rstd.clear();
    save_mean = save_rstd = Tensor<double>();
  }
  void backward() override {
    const Tensor<T>& xv = x.get(name());
    const Tensor<T>& wv = weight.get(name());
    auto g = ops::layer_norm_backward(this->grad, xv, normalized_shape, wv, mean, rstd, this->next[0] != nullptr,
                                      this->next[1] != nullptr, this->next[2] != nullptr, save_mean, save_rstd);
    if (this->next[0]) this->template deliver<T>(0, std::move(g.dx));
    if (this->next[1]) this->template deliver<T>(1, std::move(g.dweight));
    if (this->next[2]) this->template deliver<T>(2, std::move(g.dbias));
  }
};

template <class T, class P>
bool any_requires_grad(const Tensor<T>& a, const Tensor<P>& b, const Tensor<P>& c) {
  return (a.defined() && a.requires_grad()) || (b.defined() && b.requires_grad()) ||
         (c.defined() && c.requires_grad());
}
template <class T>
std::shared_ptr<Node> edge_or_null(const Tensor<T>& t) {
  return t.defined() ? gradient_edge(t) : nullptr;
}
}  // namespace autograd

/// F.batch_norm. x is (N, C) or (N, C, *); running_mean, running_var, weight, bias are (C) or undefined.
/// In training, normalises with the batch statistics (mean and biased variance over N and the spatial dims) and,
/// when running_mean / running_var are defined, updates them in place (outside autograd):
/// r = (1 - momentum) r + momentum * batch_stat, with the UNBIASED batch variance for running_var, as PyTorch.
/// In eval (training = false), normalises with the running statistics, which must be defined.
/// Differentiable in x, weight and bias. For half / bfloat16 x the statistics and parameters may be float (mixed
/// precision, as PyTorch's mixed-type batch norm): the output and x's gradient are 16-bit, the weight's and bias's
/// gradients float, and no float copy of x is made.
template <class T, ops::BatchNormParam<T> P = T>
Tensor<T> batch_norm(const Tensor<T>& x, const Tensor<P>& running_mean, const Tensor<P>& running_var,
                     const Tensor<P>& weight, const Tensor<P>& bias, bool training, double momentum = 0.1,
                     double eps = 1e-5) {
  EMBER_CHECK(x.defined(), "batch_norm: the input is undefined");
  auto r = ops::batch_norm_forward(x, running_mean, running_var, weight, bias, training, momentum, eps);
  Tensor<T> y = std::move(r.y);
  if (is_grad_enabled() && autograd::any_requires_grad(x, weight, bias)) {
    auto node = std::make_shared<autograd::BatchNormNode<T, P>>();
    node->next = {autograd::edge_or_null(x), autograd::edge_or_null(weight), autograd::edge_or_null(bias)};
    node->x = autograd::Saved<T>(x);
    if (weight.defined()) node->weight = autograd::Saved<P>(weight);
    node->mean = std::move(r.mean);
    node->invstd = std::move(r.invstd);
    node->save_mean = std::move(r.save_mean);
    node->save_invstd = std::move(r.save_invstd);
    node->eps = eps;
    node->training = training;
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
  }
  return y;
}

/// F.layer_norm: normalises over the trailing dims given by normalized_shape (mean and biased variance of each
/// row of numel(normalized_shape) elements), then y = xhat * weight + bias (both of normalized_shape, optional).
/// Differentiable in x, weight and bias.
template <class T>
Tensor<T> layer_norm(const Tensor<T>& x, const Shape& normalized_shape, const Tensor<T>& weight = Tensor<T>(),
                     const Tensor<T>& bias = Tensor<T>(), double eps = 1e-5) {
  EMBER_CHECK(x.defined(), "layer_norm: the input is undefined");
  auto r = ops::layer_norm_forward(x, normalized_shape, weight, bias, eps);
  Tensor<T> y = std::move(r.y);
  if (is_grad_enabled() && autograd::any_requires_grad(x, weight, bias)) {
    auto node = std::make_shared<autograd::LayerNormNode<T>>();
    node->next = {autograd::edge_or_null(x), autograd::edge_or_null(weight), autograd::edge_or_null(bias)};
    node->x = autograd::Saved<T>(x);
    if (weight.defined()) node->weight = autograd::Saved<T>(weight);
    node->normalized_shape = normalized_shape;
    node->mean = std::move(r.mean);
    node->rstd = std::move(r.rstd);
    node->save_mean = std::move(r.save_mean);
    node->save_rstd = std::move(r.save_rstd);
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
  }
  return y;
}

}  // namespace ember
