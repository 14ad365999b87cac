// ember — expression nodes ("what"): small values describing element-wise math over tensors and scalars.
// `a * b + c` builds BinaryExpr<Add, BinaryExpr<Mul, Leaf, Leaf>, Leaf>; nothing runs until the expression is
// assigned to a tensor or reduced. Tensors are held by value (a shared handle: a reference-count increment, never a
// data copy), so an expression cannot dangle; scalars by value. (Internal code that evaluates an expression within
// one statement may use TensorLeaf<T, false>, a pointer to a tensor that outlives it.) How an expression is evaluated is in evaluator.hpp; where, in cpu/ and cuda/.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/functors.hpp"

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

namespace ember {

// ---- the public element-wise vocabulary -------------------------------------------------------------------------

#define EMBER_BINARY_OPERATOR(SYM, OP)                                                  \
  template <class A, class B>                                                           \
    requires expr::BinaryOperands<A, B>                                                 \
  auto operator SYM(A&& a, B&& b) {                                                     \
    return expr::make_binary(ops_table::OP{}, std::forward<A>(a), std::forward<B>(b));  \
  }
EMBER_BINARY_OPERATOR(+, Add)
EMBER_BINARY_OPERATOR(-, Sub)
EMBER_BINARY_OPERATOR(*, Mul)
EMBER_BINARY_OPERATOR(/, Div)
EMBER_BINARY_OPERATOR(<, Lt)
EMBER_BINARY_OPERATOR(<=, Le)
EMBER_BINARY_OPERATOR(>, Gt)
EMBER_BINARY_OPERATOR(>=, Ge)
EMBER_BINARY_OPERATOR(==, Eq)
EMBER_BINARY_OPERATOR(!=, Ne)
#undef EMBER_BINARY_OPERATOR

#define EMBER_BINARY_FUNCTION(NAME, OP)                                                 \
  template <class A, class B>                                                           \
    requires expr::BinaryOperands<A, B>                                                 \
  auto NAME(A&& a, B&& b) {                                                             \
    return expr::make_binary(ops_table::OP{}, std::forward<A>(a), std::forward<B>(b));  \
  }
EMBER_BINARY_FUNCTION(pow, Pow)
EMBER_BINARY_FUNCTION(maximum, Maximum)
EMBER_BINARY_FUNCTION(minimum, Minimum)
EMBER_BINARY_FUNCTION(logical_and, And)
EMBER_BINARY_FUNCTION(logical_or, Or)
EMBER_BINARY_FUNCTION(logical_xor, Xor)
EMBER_BINARY_FUNCTION(eq, Eq)
EMBER_BINARY_FUNCTION(ne, Ne)
EMBER_BINARY_FUNCTION(lt, Lt)
EMBER_BINARY_FUNCTION(le, Le)
EMBER_BINARY_FUNCTION(gt, Gt)
EMBER_BINARY_FUNCTION(ge, Ge)
#undef EMBER_BINARY_FUNCTION

#define EMBER_UNARY_FUNCTION(NAME, OP)                             \
  template <expr::TensorOrExpr A>                                  \
  auto NAME(A&& a) {                                               \
    return expr::make_unary(ops_table::OP{}, std::forward<A>(a));  \
  }
EMBER_UNARY_FUNCTION(neg, Neg)
EMBER_UNARY_FUNCTION(abs, Abs)
EMBER_UNARY_FUNCTION(sign, Sign)
EMBER_UNARY_FUNCTION(exp, Exp)
EMBER_UNARY_FUNCTION(expm1, Expm1)
EMBER_UNARY_FUNCTION(log, Log)
EMBER_UNARY_FUNCTION(log1p, Log1p)
EMBER_UNARY_FUNCTION(sqrt, Sqrt)
EMBER_UNARY_FUNCTION(rsqrt, Rsqrt)
EMBER_UNARY_FUNCTION(square, Square)
EMBER_UNARY_FUNCTION(sin, Sin)
EMBER_UNARY_FUNCTION(cos, Cos)
EMBER_UNARY_FUNCTION(tanh, Tanh)
EMBER_UNARY_FUNCTION(sigmoid, Sigmoid)
EMBER_UNARY_FUNCTION(relu, Relu)
EMBER_UNARY_FUNCTION(silu, Silu)
EMBER_UNARY_FUNCTION(softplus, Softplus)
EMBER_UNARY_FUNCTION(logical_not, Not)
#undef EMBER_UNARY_FUNCTION

template <expr::TensorOrExpr A>
auto operator-(A&& a) {
  return expr::make_unary(ops_table::Neg{}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto operator!(A&& a) {
  return expr::make_unary(ops_table::Not{}, std::forward<A>(a));
}
template <class A, class B>
  requires expr::BinaryOperands<A, B>
auto operator&(A&& a, B&& b) {
  return logical_and(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
  requires expr::BinaryOperands<A, B>
auto operator|(A&& a, B&& b) {
  return logical_or(std::forward<A>(a), std::forward<B>(b));
}
template <class A, class B>
  requires expr::BinaryOperands<A, B>
auto operator^(A&& a, B&& b) {
  return logical_xor(std::forward<A>(a), std::forward<B>(b));
}

/// GELU (erf form); gelu_tanh is PyTorch's approximate='tanh'.
template <expr::TensorOrExpr A>
auto gelu(A&& a) {
  return expr::make_unary(ops_table::Gelu{}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto gelu_tanh(A&& a) {
  return expr::make_unary(ops_table::GeluTanh{}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto leaky_relu(A&& a, double negative_slope = 0.01) {
  return expr::make_unary(ops_table::LeakyRelu{negative_slope}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto elu(A&& a, double alpha = 1.0) {
  return expr::make_unary(ops_table::Elu{alpha}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto clamp(A&& a, double lo, double hi) {
  EMBER_CHECK(!(lo > hi), "clamp: min ", lo, " is greater than max ", hi);
  return expr::make_unary(ops_table::Clamp{lo, hi}, std::forward<A>(a));
}
template <expr::TensorOrExpr A>
auto clamp_min(A&& a, double lo) {
  return clamp(std::forward<A>(a), lo, std::numeric_limits<double>::infinity());
}
template <expr::TensorOrExpr A>
auto clamp_max(A&& a, double hi) {
  return clamp(std::forward<A>(a), -std::numeric_limits<double>::infinity(), hi);
}

/// Converts every element to U inside the fused loop ("fp16 storage, fp32 math" is cast<float>(x)).
template <class U, expr::TensorOrExpr A>
auto cast(A&& a) {
  auto na = expr::as_node(std::forward<A>(a));
  return expr::CastExpr<U, decltype(na)>{std::move(na)};
}

/// a where cond is true, else b. a or b may be scalars.
template <class C, class A, class B>
  requires expr::TensorOrExpr<C> && (expr::TensorOrExpr<A> || expr::TensorOrExpr<B>)
auto where(C&& cond, A&& a, B&& b) {
  static_assert(std::is_same_v<typename expr::value_of<C>::type, bool>, "where: the condition must be bool");
  auto nc = expr::as_node(std::forward<C>(cond));
  if constexpr (expr::Arithmetic<A>) {
    using V = typename expr::value_of<B>::type;
    auto nb = expr::as_node(std::forward<B>(b));
    return expr::WhereExpr<decltype(nc), expr::ScalarLeaf<V>, decltype(nb)>{std::move(nc), expr::as_scalar<V>(a),
                                                                             std::move(nb)};
  } else if constexpr (expr::Arithmetic<B>) {
    using V = typename expr::value_of<A>::type;
    auto na = expr::as_node(std::forward<A>(a));
    return expr::WhereExpr<decltype(nc), decltype(na), expr::ScalarLeaf<V>>{std::move(nc), std::move(na),
                                                                             expr::as_scalar<V>(b)};
  } else {
    static_assert(std::is_same_v<typename expr::value_of<A>::type, typename expr::value_of<B>::type>,
                  "where: a and b have different dtypes; convert one with cast<T>(x)");
    auto na = expr::as_node(std::forward<A>(a));
    auto nb = expr::as_node(std::forward<B>(b));
    return expr::WhereExpr<decltype(nc), decltype(na), decltype(nb)>{std::move(nc), std::move(na), std::move(nb)};
  }
}

}  // namespace ember

// Argument-dependent lookup for expressions: their types live in ember::expr, so the vocabulary is visible there
// too (`(a * b) + (c * d)` then works without `using namespace ember`).
namespace ember::expr {
using ember::operator+;
using ember::operator-;
using ember::operator*;
using ember::operator/;
using ember::operator<;
using ember::operator<=;
using ember::operator>;
using ember::operator>=;
using ember::operator==;
using ember::operator!=;
using ember::operator!;
using ember::operator&;
using ember::operator|;
using ember::operator^;
using ember::pow;
using ember::maximum;
using ember::minimum;
using ember::logical_and;
using ember::logical_or;
using ember::logical_xor;
using ember::eq;
using ember::ne;
using ember::lt;
using ember::le;
using ember::gt;
using ember::ge;
using ember::neg;
using ember::abs;
using ember::sign;
using ember::exp;
using ember::expm1;
using ember::log;
using ember::log1p;
using ember::sqrt;
using ember::rsqrt;
using ember::square;
using ember::sin;
using ember::cos;
using ember::tanh;
using ember::sigmoid;
using ember::relu;
using ember::silu;
using ember::softplus;
using ember::logical_not;
using ember::gelu;
using ember::gelu_tanh;
using ember::leaky_relu;
using ember::elu;
using ember::clamp;
using ember::clamp_min;
using ember::clamp_max;
using ember::cast;
using ember::where;
}  // namespace ember::expr
