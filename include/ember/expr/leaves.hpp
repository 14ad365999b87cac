// ember — the tensor leaves of an expression: visiting them in position order (left to right; the order in which
// a plan takes its operands and derivative.hpp numbers the leaves), and the owned copy of an expression, each
// tensor leaf holding its tensor by value (what an autograd node saves).
#pragma once

#include <tuple>
#include <type_traits>

#include "ember/core/tensor.hpp"
#include "ember/expr/node_types.hpp"

namespace ember::expr {

// ---- visiting leaves in position order --------------------------------------------------------------------------

/// Calls f(leaf) for every tensor leaf, in position order (left to right).
template <class F, class T, bool O>
void visit_leaves(const TensorLeaf<T, O>& l, F&& f) {
  f(l);
}
template <class F, class T>
void visit_leaves(const ScalarLeaf<T>&, F&&) {}
template <class F, class T, int K>
void visit_leaves(const LeafRef<T, K>&, F&&) {}
template <class F, class T, int K>
void visit_leaves(const ParamRef<T, K>&, F&&) {}
template <class F, class Op, class A>
void visit_leaves(const UnaryExpr<Op, A>& e, F&& f) {
  visit_leaves(e.a, f);
}
template <class F, class Op, class A, class B>
void visit_leaves(const BinaryExpr<Op, A, B>& e, F&& f) {
  visit_leaves(e.a, f);
  visit_leaves(e.b, f);
}
template <class F, class C, class A, class B>
void visit_leaves(const WhereExpr<C, A, B>& e, F&& f) {
  visit_leaves(e.c, f);
  visit_leaves(e.a, f);
  visit_leaves(e.b, f);
}
template <class F, class U, class A>
void visit_leaves(const CastExpr<U, A>& e, F&& f) {
  visit_leaves(e.a, f);
}
/// A tuple of tensors (the slot source of a multi-output pass): each tensor one leaf, in order.
template <class F, class... T>
void visit_leaves(const std::tuple<Tensor<T>...>& ts, F&& f) {
  std::apply([&](const auto&... t) { (..., f(TensorLeaf<typename std::remove_cvref_t<decltype(t)>::value_type, false>{&t})); },
             ts);
}
template <class F, class... T>
void visit_leaves(const Slots<T...>& s, F&& f) {
  visit_leaves(s.tensors, f);
}

// ---- owned copies: every tensor leaf held by value (what an autograd node saves) -----------------------------

/// owned<E>::type is E with every tensor leaf holding its tensor by value; owned<E>::make(e) builds it from e.
template <class E>
struct owned;
/// The owned form of expression type E.
template <class E>
using owned_t = typename owned<E>::type;
/// A tensor leaf: held by value.
template <class T, bool O>
struct owned<TensorLeaf<T, O>> {
  using type = TensorLeaf<T, true>;  ///< The owning leaf.
  /// The owning leaf of l's tensor.
  static type make(const TensorLeaf<T, O>& l) { return {l.tensor()}; }
};
/// A slot reference: unchanged (it holds no tensor).
template <class T, int K>
struct owned<LeafRef<T, K>> {
  using type = LeafRef<T, K>;  ///< The same type.
  /// A copy of l.
  static type make(const LeafRef<T, K>& l) { return l; }
};
/// A scalar: unchanged.
template <class T>
struct owned<ScalarLeaf<T>> {
  using type = ScalarLeaf<T>;  ///< The same type.
  /// A copy of l.
  static type make(const ScalarLeaf<T>& l) { return l; }
};
/// A unary node: its operand owned.
template <class Op, class A>
struct owned<UnaryExpr<Op, A>> {
  using type = UnaryExpr<Op, owned_t<A>>;  ///< The node over the owned operand.
  /// e with its operand owned.
  static type make(const UnaryExpr<Op, A>& e) { return {e.op, owned<A>::make(e.a)}; }
};
/// A binary node: both operands owned.
template <class Op, class A, class B>
struct owned<BinaryExpr<Op, A, B>> {
  using type = BinaryExpr<Op, owned_t<A>, owned_t<B>>;  ///< The node over the owned operands.
  /// e with its operands owned.
  static type make(const BinaryExpr<Op, A, B>& e) { return {e.op, owned<A>::make(e.a), owned<B>::make(e.b)}; }
};
/// A where node: its three operands owned.
template <class C, class A, class B>
struct owned<WhereExpr<C, A, B>> {
  using type = WhereExpr<owned_t<C>, owned_t<A>, owned_t<B>>;  ///< The node over the owned operands.
  /// e with its operands owned.
  static type make(const WhereExpr<C, A, B>& e) {
    return {owned<C>::make(e.c), owned<A>::make(e.a), owned<B>::make(e.b)};
  }
};
/// A cast node: its operand owned.
template <class U, class A>
struct owned<CastExpr<U, A>> {
  using type = CastExpr<U, owned_t<A>>;  ///< The node over the owned operand.
  /// e with its operand owned.
  static type make(const CastExpr<U, A>& e) { return {owned<A>::make(e.a)}; }
};
template <class E>
owned_t<E> make_owned(const E& e) {
  return owned<E>::make(e);
}

}  // namespace ember::expr
