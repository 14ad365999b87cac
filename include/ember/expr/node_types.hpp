// ember — expression nodes ("what"): small values describing element-wise math over tensors and scalars.
// `a * b + c` builds BinaryExpr<Add, BinaryExpr<Mul, Leaf, Leaf>, Leaf>; nothing runs until the expression is
// assigned to a tensor or reduced. Tensors are held by value (a shared handle: a reference-count increment, never a
// data copy), so an expression cannot dangle; scalars by value. (Internal code that evaluates an expression within
// one statement may use TensorLeaf<T, false>, a pointer to a tensor that outlives it.) Here: the node types (tensor
// and scalar leaves, the slots and scalars of a multi-output pass, unary, binary, where and cast nodes). Visiting
// their leaves is expr/leaves.hpp, building them from user operands expr/build.hpp, the public functions and
// operators expr/vocabulary.hpp (all four: expr/nodes.hpp). How an expression is evaluated is in evaluator.hpp;
// where, in cpu/ and cuda/.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"

namespace ember::expr {

/// The most tensor leaves one fused expression may have (a CUDA kernel's parameter space is finite).
/// Beyond it, materialise part of the expression into a tensor.
inline constexpr int kMaxLeaves = 16;

/// A tensor operand of an expression: what `a` becomes in `a * b`. Own: the leaf holds the tensor handle by value
/// (what user expressions do); false: a pointer to a tensor that outlives the expression (internal code).
template <class T, bool Own>
struct TensorLeaf {
  using value_type = T;                 ///< The element type the leaf reads.
  static constexpr int num_leaves = 1;  ///< The tensor leaves in this (sub)expression: one.
  std::conditional_t<Own, Tensor<T>, const Tensor<T>*> ref;  ///< The tensor (Own) or a pointer to it.

  /// The tensor read.
  const Tensor<T>& tensor() const {
    if constexpr (Own) return ref;
    else return *ref;
  }
  /// The tensor's shape (the leaf's, before broadcasting).
  Shape shape() const { return tensor().shape(); }
};

/// Slot K of a multi-output pass (ops::assign_multi), read through its SlotTable: every use of a slot is the same
/// load, so an expression that reads an operand several times reads it once per element. The fused backward reads
/// the leaves of the forward expression so; an optimizer's update reads its parameter, gradient and state so
/// (expr::slot). It is not a plan operand itself, and only a pass with a slot source can evaluate it.
template <class T, int K>
struct LeafRef {
  using value_type = T;                 ///< The slot's element type.
  static constexpr int num_leaves = 1;  ///< Counts as one tensor leaf.
  Shape shape_;                         ///< The slot's shape.
  /// The slot's shape.
  Shape shape() const { return shape_; }
};

/// Slot K, a tensor of t's dtype and shape, as an operand of the element-wise vocabulary: `slot<0>(p) * 2`.
template <int K, class T>
LeafRef<T, K> slot(const Tensor<T>& t) {
  static_assert(K >= 0 && K < kMaxLeaves, "expr::slot: at most kMaxLeaves slots");
  return {t.shape()};
}

/// The most scalars one multi-output pass holds in its slot table.
inline constexpr int kMaxParams = 16;

/// Scalar K of a multi-output pass's slot table, in type T: every use reads the same place, so a sub-expression
/// that several outputs share (an optimizer's g' = g + wd p in its m, v and p) is the same value everywhere and is
/// computed once, where separate scalar leaves would each be their own copy.
template <class T, int K>
struct ParamRef {
  using value_type = T;                 ///< The type the scalar is read as.
  static constexpr int num_leaves = 0;  ///< A scalar: no tensor leaf.
  /// The 0-d shape (a scalar broadcasts to anything).
  Shape shape() const { return {}; }
};
/// Scalar K of the pass as an operand of type T: `slot<1>(p) * param<0, float>()`.
template <int K, class T>
ParamRef<T, K> param() {
  static_assert(K >= 0 && K < kMaxParams, "expr::param: at most kMaxParams scalars");
  static_assert(is_floating_v<T>, "expr::param: floating-point scalars (the table holds them as double)");
  return {};
}

/// The scalars of a pass, by position: param<K, T>() reads v[K], converted to T (exactly, for a value that is a T).
struct Params {
  double v[kMaxParams] = {};  ///< The scalars; the first n are set.
  int n = 0;                  ///< How many scalars there are.
  Params() = default;         ///< No scalars.
  /// The scalars listed, in order: `Params{lr, beta1}` (at most kMaxParams).
  Params(std::initializer_list<double> l) {
    EMBER_CHECK(l.size() <= std::size_t(kMaxParams), "expr::Params: at most ", kMaxParams, " scalars, got ", l.size());
    for (double x : l) v[n++] = x;
  }
};

/// A slot source with scalars: the tensors fill slots 0, 1, ... (expr::slot<K>), the scalars the table's params
/// (expr::param<K, T>).
template <class... T>
struct Slots {
  std::tuple<Tensor<T>...> tensors;  ///< The tensors of slots 0, 1, ...
  Params params;                     ///< The scalars of param<0, T>(), param<1, T>(), ...
  /// The slot source of tensors `t` and scalars `p`.
  Slots(std::tuple<Tensor<T>...> t, Params p) : tensors(std::move(t)), params(p) {}
};
/// The scalars of a slot source (none but a Slots' own).
template <class S>
Params params_of(const S&) {
  return {};
}
template <class... T>
Params params_of(const Slots<T...>& s) {
  return s.params;
}

/// A scalar operand of an expression: what `2` becomes in `a * 2`, held in T's compute type.
template <class T>
struct ScalarLeaf {
  using value_type = T;                 ///< The scalar's type in the expression.
  static constexpr int num_leaves = 0;  ///< A scalar: no tensor leaf.
  compute_t<T> value;                   ///< The value (float for half and bfloat16).
  /// The 0-d shape (a scalar broadcasts to anything).
  Shape shape() const { return {}; }
};

template <class Op, class V>
using unary_result_t =
    std::conditional_t<std::is_same_v<decltype(std::declval<Op>()(compute_t<V>{})), bool>, bool, V>;

/// op(a) element-wise: what `relu(x)` or `-x` builds. Op is a functor of ops_table.
template <class Op, class A>
struct UnaryExpr {
  using value_type = unary_result_t<Op, typename A::value_type>;  ///< A's type, or bool for a predicate.
  static constexpr int num_leaves = A::num_leaves;                 ///< The tensor leaves below.
  Op op;  ///< The functor (with its parameter, for ops such as LeakyRelu).
  A a;    ///< The operand.
  /// The operand's shape.
  Shape shape() const { return a.shape(); }
};

template <class VA, class VB>
using common_value_t = std::conditional_t<std::is_same_v<VA, VB>, VA, std::common_type_t<compute_t<VA>, compute_t<VB>>>;

/// op(a, b) element-wise with broadcasting: what `a * b` or `maximum(a, b)` builds. Op is a functor of ops_table.
template <class Op, class A, class B>
struct BinaryExpr {
  /// The type the op computes in: the operands' common compute type.
  using compute_type = std::common_type_t<compute_t<typename A::value_type>, compute_t<typename B::value_type>>;
  /// The result's type: the operands' common type (half with half stays half), or bool for a comparison.
  using value_type =
      std::conditional_t<std::is_same_v<decltype(std::declval<Op>()(compute_type{}, compute_type{})), bool>, bool,
                         common_value_t<typename A::value_type, typename B::value_type>>;
  static constexpr int num_leaves = A::num_leaves + B::num_leaves;  ///< The tensor leaves below.
  Op op;  ///< The functor.
  A a;    ///< The left operand.
  B b;    ///< The right operand.
  /// The operands' broadcast shape (an error naming the op when they do not broadcast).
  Shape shape() const { return broadcast_shapes(a.shape(), b.shape(), Op::name); }
};

/// where(c, a, b): a where c is true, else b.
template <class C, class A, class B>
struct WhereExpr {
  using value_type = common_value_t<typename A::value_type, typename B::value_type>;  ///< a's and b's common type.
  static constexpr int num_leaves = C::num_leaves + A::num_leaves + B::num_leaves;  ///< The tensor leaves below.
  C c;  ///< The condition.
  A a;  ///< The value where c is true.
  B b;  ///< The value where c is false.
  /// The three operands' broadcast shape.
  Shape shape() const {
    return broadcast_shapes(c.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  }
};

/// cast<U>(a): converts each element to U (so half storage computes in float inside the same loop).
template <class U, class A>
struct CastExpr {
  using value_type = U;                             ///< The target type.
  static constexpr int num_leaves = A::num_leaves;  ///< The tensor leaves below.
  A a;                                              ///< The operand.
  /// The operand's shape.
  Shape shape() const { return a.shape(); }
};

}  // namespace ember::expr

namespace ember::detail {
template <class Op, class A>
struct is_expression<expr::UnaryExpr<Op, A>> : std::true_type {};
template <class Op, class A, class B>
struct is_expression<expr::BinaryExpr<Op, A, B>> : std::true_type {};
template <class C, class A, class B>
struct is_expression<expr::WhereExpr<C, A, B>> : std::true_type {};
template <class U, class A>
struct is_expression<expr::CastExpr<U, A>> : std::true_type {};
template <class T, int K>
struct is_expression<expr::LeafRef<T, K>> : std::true_type {};
template <class T, int K>
struct is_expression<expr::ParamRef<T, K>> : std::true_type {};
}  // namespace ember::detail
