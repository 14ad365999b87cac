// ember — building expression nodes from user operands: a tensor becomes a leaf holding its handle, an expression
// stays as it is, a scalar becomes a leaf of the other side's type (make_unary, make_binary, with their dtype
// checks), and the concepts that say which operands the element-wise vocabulary (expr/vocabulary.hpp) accepts.
#pragma once

#include <type_traits>
#include <utility>

#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/functors.hpp"
#include "ember/expr/node_types.hpp"

namespace ember::expr {

// ---- building expressions from user operands -----------------------------------------------------------------

template <class X>
struct is_tensor : std::false_type {};
template <class T>
struct is_tensor<Tensor<T>> : std::true_type {};
template <class X>
inline constexpr bool is_tensor_v = is_tensor<std::remove_cvref_t<X>>::value;

template <class X>
concept TensorOrExpr = is_tensor_v<X> || Expression<X>;
template <class X>
concept Arithmetic = std::is_arithmetic_v<std::remove_cvref_t<X>>;

/// The value type of a tensor or expression operand.
template <class X>
struct value_of {
  using type = typename std::remove_cvref_t<X>::value_type;  ///< X's element type.
};

/// The node an operand becomes: a tensor → a leaf holding the handle by value (a reference-count increment, never
/// a data copy; moved when the operand is an rvalue), expression → as is. So an expression outlives the tensors it
/// was built from and keeps seeing them: `auto e = a * b; a = other;` still multiplies the old `a`.
template <class X>
auto as_node(X&& x) {
  using D = std::remove_cvref_t<X>;
  if constexpr (is_tensor_v<D>) {
    return TensorLeaf<typename D::value_type, true>{std::forward<X>(x)};
  } else {
    return D(std::forward<X>(x));
  }
}
/// A scalar operand becomes a leaf of the other side's type (a float tensor times 2 computes in float).
template <class V, class S>
ScalarLeaf<V> as_scalar(S s) {
  static_assert(!(std::is_floating_point_v<S> && !is_floating_v<V>),
                "ember: a floating-point scalar with an integer tensor would truncate; use cast<float>(x) first");
  return {static_cast<compute_t<V>>(s)};
}

template <class Op, class A, class B>
auto make_binary(Op op, A&& a, B&& b) {
  if constexpr (std::is_same_v<Op, ops_table::Div>) {
    using V = typename value_of<std::conditional_t<Arithmetic<A>, B, A>>::type;
    static_assert(is_floating_v<V>, "ember: `/` on integer tensors would truncate (PyTorch promotes to float); "
                                    "divide cast<float>(x) instead");
  }
  if constexpr (Arithmetic<A>) {
    using V = typename value_of<B>::type;
    auto nb = as_node(std::forward<B>(b));
    return BinaryExpr<Op, ScalarLeaf<V>, decltype(nb)>{op, as_scalar<V>(a), std::move(nb)};
  } else if constexpr (Arithmetic<B>) {
    using V = typename value_of<A>::type;
    auto na = as_node(std::forward<A>(a));
    return BinaryExpr<Op, decltype(na), ScalarLeaf<V>>{op, std::move(na), as_scalar<V>(b)};
  } else {
    static_assert(std::is_same_v<typename value_of<A>::type, typename value_of<B>::type>,
                  "ember: element-wise operands have different dtypes; convert one with cast<T>(x)");
    auto na = as_node(std::forward<A>(a));
    auto nb = as_node(std::forward<B>(b));
    return BinaryExpr<Op, decltype(na), decltype(nb)>{op, std::move(na), std::move(nb)};
  }
}

template <class Op, class A>
auto make_unary(Op op, A&& a) {
  auto na = as_node(std::forward<A>(a));
  return UnaryExpr<Op, decltype(na)>{op, std::move(na)};
}

template <class A, class B>
concept BinaryOperands = (TensorOrExpr<A> && (TensorOrExpr<B> || Arithmetic<B>)) || (Arithmetic<A> && TensorOrExpr<B>);

}  // namespace ember::expr
