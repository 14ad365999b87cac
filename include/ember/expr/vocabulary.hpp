// ember — the public element-wise vocabulary: the operators (`a * b + 1`, `x < 0`, `!m`) and functions (relu, exp,
// pow, maximum, clamp, cast, where, ...) that build expressions, one line per row of the op table
// (expr/functors.hpp); also visible in ember::expr, so argument-dependent lookup finds them for expressions.
#pragma once

#include <limits>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/expr/build.hpp"
#include "ember/expr/functors.hpp"
#include "ember/expr/node_types.hpp"

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
