// ember — the backward of fused expressions. For each leaf position P on a differentiable path, the gradient is
// the fused expression `G * d expr / d leaf_P` (derivative.hpp), where G is the upstream gradient as an
// expression (the output's gradient for a materialised expression; a broadcast of it, maybe scaled, for a
// reduction). When every such leaf needs a gradient and has the full shape, all of them are written in ONE
// pass; a broadcast leaf gets its gradient summed over the broadcast dims inside a fused reduction.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <utility>

#include "ember/config.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/creation.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/expr/derivative.hpp"
#include "ember/expr/nodes.hpp"

namespace ember::autograd {

namespace detail {
template <class E, std::size_t... I>
constexpr std::array<bool, sizeof...(I)> path_mask(std::index_sequence<I...>) {
  return {expr::grad_path<E, int(I)>::value...};
}
template <class E>
inline constexpr auto paths = path_mask<E>(std::make_index_sequence<E::num_leaves>{});
template <class E>
constexpr int path_count() {
  int c = 0;
  for (bool b : paths<E>) c += b;
  return c;
}
template <class E>
constexpr std::array<int, path_count<E>()> path_list() {
  std::array<int, path_count<E>()> r{};
  int k = 0;
  for (int i = 0; i < E::num_leaves; ++i)
    if (paths<E>[i]) r[k++] = i;
  return r;
}
template <int P, class E>
using leaf_value_t = typename std::remove_cvref_t<decltype(expr::leaf_at<P>(std::declval<const E&>()))>::value_type;
}  // namespace detail

/// `shape` left-padded with 1s to the rank of `space` (the keepdim form of a broadcast operand).
inline Shape keepdim_shape(const Shape& shape, const Shape& space) {
  Shape k;
  k.n = space.n;
  for (int i = 0; i < space.n; ++i) {
    const int j = shape.n - space.n + i;
    k[i] = j < 0 ? 1 : shape[j];
  }
  return k;
}

/// Sums expression ge (over `space`) down to shape `to`, which broadcasts to `space`.
template <class U, class GE>
Tensor<U> sum_to(const GE& ge, const Shape& space, const Shape& to) {
  Tensor<U> out = empty<U>(keepdim_shape(to, space), expr::device_of(ge));
  ops::reduce<expr::SumR<expr::sum_acc_t<compute_t<U>>>>(out, ge, "backward");
  return out.as_strided_raw(to, contiguous_strides(to), 0);
}

/// Delivers, for every leaf position of e on a differentiable path, G * de/dleaf to node.next[P]. All of them
/// are written in ONE fused pass (so each expression has exactly one backward kernel, which keeps compile times
/// down); a leaf that was broadcast is then summed down to its shape by the reduction shared by every
/// expression of that dtype. A position whose input needs no gradient is computed and dropped.
template <class T, class E, class G>
void backward_through(TypedNode<T>& node, const E& e, const G& g, const Shape& space, const std::uint64_t* versions,
                      const char* op) {
  constexpr auto list = detail::path_list<E>();
  constexpr int npaths = int(list.size());
  if constexpr (npaths > 0) {
    bool any = false;
    auto check = [&]<int P>() {
      const auto& t = expr::leaf_at<P>(e).tensor();
      EMBER_CHECK(t.version() == versions[P], op, ": a tensor needed for gradient computation (leaf ", P, ", shape ",
                  t.shape().str(), ") was modified by an in-place operation after it was used (version ",
                  versions[P], ", now ", t.version(), "); clone() it before modifying it");
      any = any || node.next[P] != nullptr;
    };
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (check.template operator()<list[J]>(), ...);
    }(std::make_index_sequence<npaths>{});
    if (!any) return;
    // Leaves of e are read through slots: every use of a leaf is one load, shared sub-expressions are computed once.
    const auto es = expr::slotted<0>(e);
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      const Device dev = expr::device_of(e);
      auto outs = std::make_tuple(empty<detail::leaf_value_t<list[J], E>>(space, dev)...);
      auto exprs = std::make_tuple(expr::chain(g, expr::deriv<list[J]>(es))...);
      ops::assign_multi(outs, exprs, space, e);
      auto give = [&]<int P, class U>(Tensor<U>& full) {
        if (!node.next[P]) return;
        const Shape& ls = expr::leaf_at<P>(e).tensor().shape();
        if (ls == space) node.template deliver<U>(std::size_t(P), std::move(full));
        else node.template deliver<U>(std::size_t(P), sum_to<U>(expr::TensorLeaf<U, false>{&full}, space, ls));
      };
      (give.template operator()<list[J]>(std::get<J>(outs)), ...);
    }(std::make_index_sequence<npaths>{});
  }
}

/// Saves an expression's leaves (by value) with their versions, and its edges.
template <class E>
struct SavedExpr {
  std::optional<expr::owned_t<E>> e;                   ///< The expression, its tensors held by value.
  std::array<std::uint64_t, E::num_leaves> versions{};  ///< Each leaf's version when saved, in leaf order.

  /// Saves `ex` and its leaves' versions, and sets node's edges to the leaves' gradient nodes.
  template <class T>
  void save(TypedNode<T>& node, const E& ex) {
    e.emplace(expr::make_owned(ex));
    int k = 0;
    expr::visit_leaves(ex, [&](const auto& leaf) {
      check_not_inference(leaf.tensor(), "autograd");
      versions[k] = leaf.tensor().version();
      using L = typename std::remove_cvref_t<decltype(leaf.tensor())>::value_type;
      if constexpr (is_floating_v<L>)  // (an integer leaf has no gradient path: no edge type to compile)
        node.next.push_back(detail::paths<E>[k] ? gradient_edge(leaf.tensor()) : nullptr);
      else
        node.next.push_back(nullptr);
      ++k;
    });
  }
};

/// The node of a materialised expression: y = e(leaves).
template <class T, class E>
struct ExprNode final : TypedNode<T> {
  SavedExpr<E> s;
  Shape space;
  const char* name() const override { return "ExprBackward"; }
  void backward() override {
    backward_through(*this, *s.e, expr::TensorLeaf<T, false>{&this->grad}, space, s.versions.data(), name());
  }
  void release() override { s.e.reset(); }
};

/// True when any tensor leaf of e requires a gradient and grad mode is on.
template <class E>
bool needs_grad(const E& e) {
  if (!is_grad_enabled()) return false;
  bool any = false;
  expr::visit_leaves(e, [&](const auto& leaf) { any = any || leaf.tensor().requires_grad(); });
  return any;
}

/// Records y = e on the tape (call after y was computed).
template <class T, class E>
void record_expr(Tensor<T>& y, const E& e) {
  if constexpr (is_floating_v<T> && detail::path_count<E>() > 0) {
    if (!needs_grad(e)) return;
    auto node = std::make_shared<ExprNode<T, E>>();
    node->s.save(*node, e);
    node->space = y.shape();
    node->output = y.impl_ptr();
    set_history<T>(y, node);
  }
}

}  // namespace ember::autograd
