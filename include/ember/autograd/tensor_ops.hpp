// ember — the members of Tensor<T> that need the executor or autograd (declared in core/tensor.hpp as
// detail::TensorOps<T>): materialising and assigning expressions, copies, views' backward, and backward().
#pragma once

#include <memory>
#include <type_traits>

#include "ember/autograd/engine.hpp"
#include "ember/autograd/expr_backward.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/expr/nodes.hpp"

namespace ember::autograd {

/// Backward of a view: maps the view's gradient back onto the base's shape.
template <class T>
struct ViewNode final : TypedNode<T> {
  Shape base_shape;
  ViewOp op;
  const char* name() const override {
    switch (op.kind) {
      case ViewOp::Permute: return "PermuteBackward";
      case ViewOp::Expand: return "ExpandBackward";
      case ViewOp::Slice: return "SliceBackward";
      case ViewOp::Select: return "SelectBackward";
      default: return "ViewBackward";
    }
  }
  void backward() override {
    const Tensor<T>& g = this->grad;
    switch (op.kind) {
      case ViewOp::Reshape:
        this->template deliver<T>(0, g.reshape(base_shape));
        return;
      case ViewOp::Permute: {
        std::vector<std::int64_t> inv(std::size_t(op.perm.n));
        for (int i = 0; i < op.perm.n; ++i) inv[std::size_t(op.perm[i])] = i;
        this->template deliver<T>(0, g.permute(inv));
        return;
      }
      case ViewOp::Expand:
        this->template deliver<T>(0, sum_to<T>(expr::TensorLeaf<T, false>{&g}, g.shape(), base_shape));
        return;
      case ViewOp::Slice:
      case ViewOp::Select: {
        Tensor<T> gb = zeros<T>(base_shape, g.device());
        Tensor<T> part = op.kind == ViewOp::Slice ? gb.slice(op.dim, op.start, op.end, op.step)
                                                  : gb.select(op.dim, op.start);
        ops::assign(part, expr::TensorLeaf<T, false>{&g}, name());
        this->template deliver<T>(0, std::move(gb));
        return;
      }
    }
  }
};

/// Backward of a copy to another device or into pinned memory (to(), cuda(), cpu(), pin_memory()): the gradient
/// is copied back to the source's device.
template <class T>
struct DeviceCopyNode final : TypedNode<T> {
  Device src_device;
  const char* name() const override { return "ToCopyBackward"; }
  void backward() override {
    const Tensor<T>& g = this->grad;
    this->template deliver<T>(0, g.device() == src_device ? g : ember::detail::copy_to_device(g, src_device, false));
  }
};

}  // namespace ember::autograd

namespace ember::detail {

template <class T>
struct TensorOps {
  /// Turns any right-hand side (tensor, expression, scalar) into an expression node.
  template <class X>
  static auto node_of(const X& x) {
    if constexpr (std::is_arithmetic_v<X> || std::is_same_v<X, T>) return expr::ScalarLeaf<T>{compute_t<T>(x)};
    else if constexpr (expr::is_tensor_v<X>) return expr::TensorLeaf<typename X::value_type, false>{&x};
    else return x;
  }

  template <class E>
  static Tensor<T> materialize(const E& e) {
    static_assert(std::is_same_v<typename E::value_type, T>,
                  "ember: the expression's dtype differs from the tensor's; wrap it in cast<T>(...)");
    Device dev = Device::cpu();
    bool have = false;
    expr::visit_leaves(e, [&](const auto& leaf) {
      if (!have) dev = leaf.tensor().device();
      have = true;
    });
    Tensor<T> out = empty<T>(e.shape(), dev);
    ops::assign(out, e, "materialize");
    autograd::record_expr(out, e);
    return out;
  }

  /// y (=, +=, -=, *=, /=) x, written into y's memory in one pass. Mode: 0 = assign, 1..4 = + - * /. A template
  /// parameter, so each operator instantiates only its own form (a plain `=` into a Tensor<bool> builds no Mul<bool>).
  template <int Mode, class X>
  static void assign(Tensor<T>& y, const X& x) {
    static_assert(!(std::is_same_v<T, bool> && (Mode == 2 || Mode == 4)),
                  "ember: -= and /= are not defined for Tensor<bool> (as in PyTorch); use logical ops or cast<T>()");
    auto rhs = node_of(x);
    if (!y.defined()) {
      EMBER_CHECK(Mode == 0, "compound assignment to an undefined tensor");
      if constexpr (expr::is_tensor_v<X>) y = x;
      else y = materialize(rhs);
      return;
    }
    using L = expr::TensorLeaf<T, false>;
    if constexpr (Mode == 0) write(y, rhs);
    else if constexpr (Mode == 1) write(y, expr::BinaryExpr<ops_table::Add, L, decltype(rhs)>{{}, L{&y}, rhs});
    else if constexpr (Mode == 2) write(y, expr::BinaryExpr<ops_table::Sub, L, decltype(rhs)>{{}, L{&y}, rhs});
    else if constexpr (Mode == 3) write(y, expr::BinaryExpr<ops_table::Mul, L, decltype(rhs)>{{}, L{&y}, rhs});
    else write(y, expr::BinaryExpr<ops_table::Div, L, decltype(rhs)>{{}, L{&y}, rhs});
  }

  template <class E>
  static void write(Tensor<T>& y, const E& e) {
    static_assert(std::is_same_v<typename E::value_type, T>,
                  "ember: the expression's dtype differs from the tensor's; wrap it in cast<T>(...)");
    if constexpr (is_floating_v<T>) {
      // Whatever the right-hand side, as in PyTorch (and as fill_ does): a leaf that requires grad changes only
      // under NoGradGuard.
      EMBER_CHECK(!(is_grad_enabled() && y.is_leaf() && y.requires_grad()), "in-place assignment: the target (shape ",
                  y.shape().str(),
                  ") is a leaf that requires grad; do it under NoGradGuard or assign into a new tensor");
      if (autograd::needs_grad(e)) {
        EMBER_CHECK(!y.is_view(), "in-place assignment: writing a differentiable expression into a view (shape ",
                    y.shape().str(), ") is not supported; materialise into a new tensor instead");
        EMBER_CHECK(y.shape() == e.shape(), "in-place assignment: a differentiable result of shape ",
                    e.shape().str(), " cannot be broadcast into shape ", y.shape().str());
        // The node must see the operands' values from before the write: save copies of any that alias y.
        auto saved = expr::make_owned(e);
        auto node = std::make_shared<autograd::ExprNode<T, decltype(saved)>>();
        node->s.save(*node, saved);
        bool aliased = false;
        expr::visit_leaves(*node->s.e, [&](auto& leaf) {
          if (leaf.tensor().storage() == y.storage()) aliased = true;
        });
        if (aliased) {
          int k = 0;
          visit_mut(*node->s.e, [&](auto& leaf) {
            if (leaf.ref.storage() == y.storage()) {
              leaf.ref = leaf.ref.detach().clone();
              node->s.versions[std::size_t(k)] = leaf.ref.version();
            }
            ++k;
          });
        }
        ops::assign(y, e, "assign");
        node->space = y.shape();
        node->output = y.impl_ptr();
        // y's retain_grad() and hooks now belong to its new version: the old node must not also write y.grad()
        // (it would overwrite the new gradient with the old version's) or run y's hooks a second time.
        if (const auto& old = y.meta().grad_fn) static_cast<autograd::TypedNode<T>*>(old.get())->output.reset();
        y.meta().requires_grad = true;
        y.meta().grad_fn = node;
        return;
      }
    }
    ops::assign(y, e, "assign");
  }

  static void fill(Tensor<T>& t, T v) {
    EMBER_CHECK(!(t.is_leaf() && t.requires_grad() && is_grad_enabled()), "fill_: the tensor is a leaf that "
                "requires grad; fill it under NoGradGuard");
    ops::assign(t, expr::ScalarLeaf<T>{compute_t<T>(v)}, "fill_");
  }

  static Tensor<T> clone(const Tensor<T>& t) { return materialize(expr::TensorLeaf<T, false>{&t}); }

  static void record_view(const Tensor<T>& base, Tensor<T>& view, const ViewOp& op) {
    if constexpr (is_floating_v<T>) {
      if (!is_grad_enabled()) return;
      auto node = std::make_shared<autograd::ViewNode<T>>();
      node->base_shape = base.shape();
      node->op = op;
      node->next.push_back(autograd::gradient_edge(base));
      node->output = view.impl_ptr();
      autograd::set_history<T>(view, node);
    }
  }

  /// Tensor::to for another device: a contiguous copy that records the copy's backward.
  static Tensor<T> to_device(const Tensor<T>& t, Device d, bool non_blocking) {
    Tensor<T> out = copy_to_device(t, d, non_blocking);
    record_copy(t, out);
    return out;
  }

  /// Tensor::pin_memory: a contiguous copy in page-locked host memory.
  static Tensor<T> pin_memory(const Tensor<T>& t) {
    EMBER_CHECK(t.defined(), "pin_memory: the tensor is undefined");
    EMBER_CHECK(t.device().is_cpu(), "pin_memory: only CPU tensors can be pinned, this one is on ", t.device().str());
    Tensor<T> out = empty_pinned<T>(t.shape());
    gather_host(t, out.data());
    record_copy(t, out);
    return out;
  }

  /// Tensor::copy_ from another device: a direct copy between the two memories when no gradient is involved and both
  /// are contiguous with the same shape, else src moved to this device first and then assigned (broadcast, strides,
  /// autograd).
  static void copy_across(Tensor<T>& dst, const Tensor<T>& src, bool non_blocking) {
    EMBER_CHECK(dst.defined() && src.defined(), "copy_: undefined tensor");
    const bool grad = is_floating_v<T> && is_grad_enabled() && (src.requires_grad() || dst.requires_grad());
    if (!grad && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
      copy_bytes(dst.storage(), std::size_t(dst.storage_offset()) * sizeof(T), src.storage(),
                 std::size_t(src.storage_offset()) * sizeof(T), std::size_t(src.numel()) * sizeof(T), non_blocking);
      dst.bump_version();
      return;
    }
    const Tensor<T> moved = to_device(src, dst.device(), non_blocking);
    copy_same(dst, moved);
  }

  /// Tensor::copy_ on one device: assign(y, x, 0) without instantiating the compound modes.
  static void copy_same(Tensor<T>& y, const Tensor<T>& x) {
    if (!y.defined()) y = x;
    else write(y, node_of(x));
  }

  static void backward(const Tensor<T>& root, const Tensor<T>& gradient, bool retain_graph) {
    if constexpr (!is_floating_v<T>) {
      EMBER_CHECK(false, "backward: called on a ", dtype_name<T>(), " tensor; only floating tensors have gradients");
    } else {
      EMBER_CHECK(root.requires_grad(), "backward: the tensor (shape ", root.shape().str(),
                  ") does not require grad and has no grad_fn; did you forget requires_grad_() on a leaf, or run "
                  "the forward pass under NoGradGuard?");
      Tensor<T> g = gradient;
      if (!g.defined()) {
        EMBER_CHECK(root.numel() == 1, "backward: a gradient can be created implicitly only for a one-element "
                    "output, but the output has shape ", root.shape().str(), "; pass backward(gradient)");
        g = ones<T>(root.shape(), root.device());
      }
      EMBER_CHECK(g.shape() == root.shape(), "backward: the gradient has shape ", g.shape().str(),
                  " but the output has shape ", root.shape().str());
      EMBER_CHECK(g.device() == root.device(), "backward: the gradient is on ", g.device().str(),
                  " but the output of shape ", root.shape().str(), " is on ", root.device().str(), ", as in PyTorch");
      auto node = autograd::gradient_edge(root);
      static_cast<autograd::TypedNode<T>*>(node.get())->accumulate(g);
      autograd::run_backward(node, retain_graph);
    }
  }

 private:
  static void record_copy(const Tensor<T>& src, Tensor<T>& out) {
    if constexpr (is_floating_v<T>) {
      if (!is_grad_enabled() || !src.requires_grad()) return;
      auto node = std::make_shared<autograd::DeviceCopyNode<T>>();
      node->src_device = src.device();
      node->next.push_back(autograd::gradient_edge(src));
      node->output = out.impl_ptr();
      autograd::set_history<T>(out, node);
    }
  }

  template <class F, class U, bool O>
  static void visit_mut(expr::TensorLeaf<U, O>& l, F&& f) {
    f(l);
  }
  template <class F, class U>
  static void visit_mut(expr::ScalarLeaf<U>&, F&&) {}
  template <class F, class Op, class A>
  static void visit_mut(expr::UnaryExpr<Op, A>& e, F&& f) {
    visit_mut(e.a, f);
  }
  template <class F, class Op, class A, class B>
  static void visit_mut(expr::BinaryExpr<Op, A, B>& e, F&& f) {
    visit_mut(e.a, f);
    visit_mut(e.b, f);
  }
  template <class F, class C, class A, class B>
  static void visit_mut(expr::WhereExpr<C, A, B>& e, F&& f) {
    visit_mut(e.c, f);
    visit_mut(e.a, f);
    visit_mut(e.b, f);
  }
  template <class F, class U, class A>
  static void visit_mut(expr::CastExpr<U, A>& e, F&& f) {
    visit_mut(e.a, f);
  }
};

}  // namespace ember::detail
