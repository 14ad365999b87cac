// ember — compile-time derivatives of expressions. Every leaf has a position (left to right); the derivative of
// an expression with respect to the leaf at position P is the product of the local partial derivatives along the
// unique path from the root to that leaf, each one a row of the op table (functors.hpp) applied to the same
// sub-expressions. The backward of `y = f(leaves)` for leaf P is then the fused expression `grad_y * dy/dleaf_P`:
// intermediates are recomputed inside one loop, never stored.
#pragma once

#include <type_traits>

#include "ember/expr/nodes.hpp"

namespace ember::expr {

/// The derivative of a leaf with respect to itself; vanishes from products at compile time.
struct One {};

template <class X, class Y>
auto chain(X x, Y y) {
  if constexpr (std::is_same_v<Y, One>) return x;
  else return BinaryExpr<ops_table::Mul, X, Y>{{}, std::move(x), std::move(y)};
}

/// Whether a gradient can flow from the root of E to the leaf at position P (through differentiable ops, to a
/// floating-point leaf).
template <class E, int P>
struct grad_path : std::false_type {};
template <class T, bool O>
struct grad_path<TensorLeaf<T, O>, 0> : std::bool_constant<is_floating_v<T>> {};
template <class T, int K>
struct grad_path<LeafRef<T, K>, 0> : std::bool_constant<is_floating_v<T>> {};
template <class Op, class A, int P>
struct grad_path<UnaryExpr<Op, A>, P> : std::bool_constant<Op::differentiable && grad_path<A, P>::value> {};
template <class Op, class A, class B, int P>
struct grad_path<BinaryExpr<Op, A, B>, P>
    : std::bool_constant<Op::differentiable &&
                         (P < A::num_leaves ? grad_path<A, P>::value : grad_path<B, P - A::num_leaves>::value)> {};
template <class C, class A, class B, int P>
struct grad_path<WhereExpr<C, A, B>, P>
    : std::bool_constant<(P >= C::num_leaves) && (P < C::num_leaves + A::num_leaves
                                                      ? grad_path<A, P - C::num_leaves>::value
                                                      : grad_path<B, P - C::num_leaves - A::num_leaves>::value)> {};
template <class U, class A, int P>
struct grad_path<CastExpr<U, A>, P> : std::bool_constant<is_floating_v<U> && grad_path<A, P>::value> {};

/// d e / d leaf_P as an expression (or One). Only instantiated where grad_path<E, P> holds.
template <int P, class T, bool O>
One deriv(const TensorLeaf<T, O>&) {
  static_assert(P == 0);
  return {};
}
template <int P, class T, int K>
One deriv(const LeafRef<T, K>&) {
  static_assert(P == 0);
  return {};
}
template <int P, class Op, class A>
auto deriv(const UnaryExpr<Op, A>& e) {
  return chain(UnaryExpr<ops_table::Deriv<Op>, A>{{e.op}, e.a}, deriv<P>(e.a));
}
template <int P, class Op, class A, class B>
auto deriv(const BinaryExpr<Op, A, B>& e) {
  if constexpr (P < A::num_leaves)
    return chain(BinaryExpr<ops_table::DerivA<Op>, A, B>{{e.op}, e.a, e.b}, deriv<P>(e.a));
  else
    return chain(BinaryExpr<ops_table::DerivB<Op>, A, B>{{e.op}, e.a, e.b}, deriv<P - A::num_leaves>(e.b));
}
template <int P, class C, class A, class B>
auto deriv(const WhereExpr<C, A, B>& e) {
  using V = typename WhereExpr<C, A, B>::value_type;
  if constexpr (P < C::num_leaves + A::num_leaves) {
    return chain(CastExpr<V, C>{e.c}, deriv<P - C::num_leaves>(e.a));
  } else {
    using NotC = UnaryExpr<ops_table::Not, C>;
    return chain(CastExpr<V, NotC>{NotC{{}, e.c}}, deriv<P - C::num_leaves - A::num_leaves>(e.b));
  }
}
template <int P, class U, class A>
auto deriv(const CastExpr<U, A>& e) {
  return deriv<P>(e.a);
}

/// The leaf at position P (its type and a reference to it).
template <int P, class T, bool O>
const TensorLeaf<T, O>& leaf_at(const TensorLeaf<T, O>& l) {
  return l;
}
template <int P, class Op, class A>
const auto& leaf_at(const UnaryExpr<Op, A>& e) {
  return leaf_at<P>(e.a);
}
template <int P, class Op, class A, class B>
const auto& leaf_at(const BinaryExpr<Op, A, B>& e) {
  if constexpr (P < A::num_leaves) return leaf_at<P>(e.a);
  else return leaf_at<P - A::num_leaves>(e.b);
}
template <int P, class C, class A, class B>
const auto& leaf_at(const WhereExpr<C, A, B>& e) {
  if constexpr (P < C::num_leaves) return leaf_at<P>(e.c);
  else if constexpr (P < C::num_leaves + A::num_leaves) return leaf_at<P - C::num_leaves>(e.a);
  else return leaf_at<P - C::num_leaves - A::num_leaves>(e.b);
}
template <int P, class U, class A>
const auto& leaf_at(const CastExpr<U, A>& e) {
  return leaf_at<P>(e.a);
}

/// The same expression with the tensor leaf at position p replaced by LeafRef<T, Base + p>.
template <int Base, class T, bool O>
LeafRef<T, Base> slotted(const TensorLeaf<T, O>& l) {
  return {l.tensor().shape()};
}
template <int Base, class T>
ScalarLeaf<T> slotted(const ScalarLeaf<T>& l) {
  return l;
}
template <int Base, class Op, class A>
auto slotted(const UnaryExpr<Op, A>& e) {
  auto a = slotted<Base>(e.a);
  return UnaryExpr<Op, decltype(a)>{e.op, a};
}
template <int Base, class Op, class A, class B>
auto slotted(const BinaryExpr<Op, A, B>& e) {
  auto a = slotted<Base>(e.a);
  auto b = slotted<Base + A::num_leaves>(e.b);
  return BinaryExpr<Op, decltype(a), decltype(b)>{e.op, a, b};
}
template <int Base, class C, class A, class B>
auto slotted(const WhereExpr<C, A, B>& e) {
  auto c = slotted<Base>(e.c);
  auto a = slotted<Base + C::num_leaves>(e.a);
  auto b = slotted<Base + C::num_leaves + A::num_leaves>(e.b);
  return WhereExpr<decltype(c), decltype(a), decltype(b)>{c, a, b};
}
template <int Base, class U, class A>
auto slotted(const CastExpr<U, A>& e) {
  auto a = slotted<Base>(e.a);
  return CastExpr<U, decltype(a)>{a};
}

}  // namespace ember::expr
