// ember — differentiable matrix products: mm, bmm, matmul (PyTorch's broadcasting rules), linear.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/matmul.hpp"

namespace ember {

namespace autograd {
/// c = a @ b for 2-D (Batched = false) or 3-D batched operands: ga = g @ bᵀ, gb = aᵀ @ g.
template <class T, bool Batched>
struct MatmulNode final : TypedNode<T> {
  Saved<T> a, b;
  const char* name() const override { return Batched ? "BmmBackward" : "MmBackward"; }
  void release() override { a = b = Saved<T>(); }
  void backward() override {
    const Tensor<T>& g = this->grad;
    const Tensor<T>& av = a.get(name());
    const Tensor<T>& bv = b.get(name());
    const int r = Batched ? 1 : 0;
    if (this->next[0]) this->template deliver<T>(0, Batched ? ops::bmm(g, bv.transpose(r, r + 1)) : ops::mm(g, bv.t()));
    if (this->next[1]) this->template deliver<T>(1, Batched ? ops::bmm(av.transpose(r, r + 1), g) : ops::mm(av.t(), g));
  }
};

template <bool Batched, class T>
Tensor<T> record_matmul(Tensor<T> c, const Tensor<T>& a, const Tensor<T>& b) {
  if constexpr (is_floating_v<T>) {
    if (is_grad_enabled() && (a.requires_grad() || b.requires_grad())) {
      auto node = std::make_shared<MatmulNode<T, Batched>>();
      node->next = {gradient_edge(a), gradient_edge(b)};
      if (b.requires_grad()) node->a = Saved<T>(a);
      if (a.requires_grad()) node->b = Saved<T>(b);
      node->output = c.impl_ptr();
      set_history<T>(c, node);
    }
  }
  return c;
}
/// y = act(x @ w^T + b) on the CPU, act none or relu (ops::linear: the bias and the activation in the GEMM's
/// write-back): its backward is ops::linear_backward.
template <class T>
struct LinearNode final : TypedNode<T> {
  Saved<T> x, w, y;  // y: the output, for ReLU's derivative
  Shape x_shape;
  Activation act = Activation::none;
  bool has_bias = false;
  const char* name() const override { return act == Activation::relu ? "LinearReluBackward" : "LinearBackward"; }
  void release() override { x = w = y = Saved<T>(); }
  void backward() override {
    auto want = [&](std::size_t i) { return i < this->next.size() && this->next[i] != nullptr; };
    auto r = ops::linear_backward(this->grad, x.get(name()), w.get(name()), y.get(name()), act, x_shape, want(0),
                                  want(1), has_bias && want(2));
    if (want(0)) this->template deliver<T>(0, std::move(r.input));
    if (want(1)) this->template deliver<T>(1, std::move(r.weight));
    if (has_bias && want(2)) this->template deliver<T>(2, std::move(r.bias));
  }
};
}  // namespace autograd

/// Matrix product of 2-D tensors (m, k) @ (k, n).
template <class T>
Tensor<T> mm(const Tensor<T>& a, const Tensor<T>& b) {
  return autograd::record_matmul<false>(ops::mm(a, b), a, b);
}

/// Batched matrix product (B, m, k) @ (B, k, n).
template <class T>
Tensor<T> bmm(const Tensor<T>& a, const Tensor<T>& b) {
  return autograd::record_matmul<true>(ops::bmm(a, b), a, b);
}

/// Dot product of two 1-D tensors (one fused pass).
template <class T>
Tensor<T> dot(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_CHECK(a.dim() == 1 && b.dim() == 1 && a.numel() == b.numel(), "dot: expected two 1-D tensors of the same "
              "size, got shapes ", a.shape().str(), " and ", b.shape().str());
  return sum(a * b);
}

/// torch.matmul: 1-D operands are vectors, leading dims of N-D operands are broadcast batch dims.
template <class T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both arguments need at least 1 dimension, got shapes ",
              a.shape().str(), " and ", b.shape().str());
  // Checked here, on the shapes the user passed (the paths below reshape them before mm/bmm/dot see them).
  const std::int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  EMBER_CHECK(ka == kb, "matmul: shapes ", a.shape().str(), " and ", b.shape().str(), " cannot be multiplied (", ka,
              " != ", kb, ")");
  if (a.dim() == 1 && b.dim() == 1) return dot(a, b);
  if (a.dim() == 2 && b.dim() == 2) return mm(a, b);
  if (a.dim() == 2 && b.dim() == 1) return mm(a, b.unsqueeze(1)).squeeze(1);
  if (a.dim() == 1 && b.dim() == 2) return mm(a.unsqueeze(0), b).squeeze(0);
  // Batched: (..., m, k) @ (..., k, n) with broadcast batch dims.
  const Tensor<T> a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const Tensor<T> b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  const std::int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  EMBER_CHECK(b2.size(-2) == k, "matmul: shapes ", a.shape().str(), " and ", b.shape().str(),
              " cannot be multiplied (", k, " != ", b2.size(-2), ")");
  Shape out;
  if (b2.dim() == 2) {  // (..., m, k) @ (k, n): one GEMM over the folded batch
    Shape lead(a2.shape().begin(), a2.shape().end() - 2);
    Tensor<T> c = mm(a2.reshape({-1, k}), b2);
    out = lead;
    out.push_back(m);
    out.push_back(n);
    Tensor<T> r = c.view(out);
    if (b.dim() == 1) r = r.squeeze(-1);
    return r;
  }
  Shape ba(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  for (int i = 1; i <= std::min(ba.n, bb.n); ++i) {
    const std::int64_t da = ba[ba.n - i], db = bb[bb.n - i];
    EMBER_CHECK(da == db || da == 1 || db == 1, "matmul: shapes ", a.shape().str(), " and ", b.shape().str(),
                " cannot be multiplied: batch dims ", ba.str(), " and ", bb.str(), " do not broadcast");
  }
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  Shape ea = batch, eb = batch;
  ea.push_back(m);
  ea.push_back(k);
  eb.push_back(k);
  eb.push_back(n);
  const std::int64_t B = batch.numel();
  Tensor<T> c = bmm(a2.expand(ea).reshape({B, m, k}), b2.expand(eb).reshape({B, k, n}));
  out = batch;
  out.push_back(m);
  out.push_back(n);
  Tensor<T> r = c.view(out);
  if (a.dim() == 1) r = r.squeeze(-2);
  if (b.dim() == 1) r = r.squeeze(-1);
  return r;
}

namespace detail {
/// act(z) as the differentiable element-wise op (Activation names it).
template <class T>
Tensor<T> apply_linear_act(const Tensor<T>& z, Activation act) {
  return visit_activation(act, [&](auto op) -> Tensor<T> {
    if constexpr (std::is_same_v<decltype(op), ops_table::Identity>) return z;
    else return Tensor<T>(expr::make_unary(op, z));
  });
}

/// linear for act none or relu, the two every layer's plain forward takes: the body of ember::linear without the
/// GELU and SiLU ops, so a program that never asks for those does not compile them (see linear below).
template <class T>
Tensor<T> linear_none_or_relu(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, Activation act) {
  EMBER_CHECK(act == Activation::none || act == Activation::relu, "linear: internal: activation ", activation_name(act),
              " on the none/relu path");
  EMBER_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got ", w.shape().str());
  EMBER_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input of shape ", x.shape().str(),
              " does not match weight of shape ", w.shape().str(), " (expected last dim ", w.size(1), ")");
  EMBER_CHECK(!b.defined() || (b.dim() == 1 && b.numel() == w.size(0)), "linear: bias of shape ", b.shape().str(),
              " does not match ", w.size(0), " output features");
  const bool grad = is_grad_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  if (!grad) return ops::detail::linear_enabled(x, w, b, act);
  if (x.device().is_cpu() && w.device().is_cpu() && (!b.defined() || b.device().is_cpu())) {
    Tensor<T> y = ops::detail::linear_enabled(x, w, b, act);
    auto node = std::make_shared<autograd::LinearNode<T>>();
    auto edge = [](const Tensor<T>& t) { return t.defined() ? autograd::gradient_edge(t) : nullptr; };
    node->next = {edge(x), edge(w)};
    node->has_bias = b.defined();
    if (b.defined()) node->next.push_back(edge(b));
    // Each operand is saved only when the other's gradient needs it; y only for ReLU's derivative.
    if (w.requires_grad()) node->x = autograd::Saved<T>(x);
    if (x.requires_grad()) node->w = autograd::Saved<T>(w);
    node->x_shape = x.shape();
    node->act = act;
    if (act == Activation::relu) node->y = autograd::Saved<T>(y.detach());  // detached: no cycle through y's node
    node->output = y.impl_ptr();
    autograd::set_history<T>(y, node);
    return y;
  }
  Tensor<T> y = matmul(x, w.t());
  if (b.defined()) y = y + b;
  return act == Activation::relu ? Tensor<T>(relu(y)) : y;
}
}  // namespace detail

/// y = x @ wᵀ + b: torch.nn.functional.linear (w is (out_features, in_features); b may be undefined). The bias is
/// applied in the GEMM's write-back (ops::linear: cuBLASLt on CUDA, each block of rows while in cache on the CPU),
/// in training too: on the CPU one node on the tape (LinearBackward) whose backward forms the bias gradient in the
/// same pass and writes the weight gradient in the weight's layout. On CUDA, training runs the differentiable
/// matmul and add.
template <class T>
Tensor<T> linear(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b = Tensor<T>()) {
  return detail::linear_none_or_relu(x, w, b, Activation::none);
}

/// y = act(x @ wᵀ + b): linear followed by the activation act (none, relu, gelu, gelu_tanh, silu). ReLU is applied
/// in the GEMM's write-back in training too (on the CPU one LinearReluBackward node, whose backward forms ReLU's
/// gradient and the bias gradient in one pass). GELU and SiLU are applied in the write-back when nothing records a
/// gradient, and follow as their own differentiable op in training (their derivative reads the input). Only this
/// overload compiles the GELU and SiLU ops: the three-argument one, which every layer's plain forward calls, does
/// not, and a program that uses neither pays nothing for them.
template <class T>
Tensor<T> linear(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, Activation act) {
  if (act == Activation::none || act == Activation::relu) return detail::linear_none_or_relu(x, w, b, act);
  const bool grad = is_grad_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
  if (!grad) {
    // ops::linear checks the shapes too, with the same messages.
    return ops::linear(x, w, b, act);
  }
  return detail::apply_linear_act(detail::linear_none_or_relu(x, w, b, Activation::none), act);
}

}  // namespace ember
