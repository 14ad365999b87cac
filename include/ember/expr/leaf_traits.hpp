// ember — compile-time facts about an expression type's leaves, for the executors' set-up: how many tensor leaves
// it has (leaf_count), whether it reads the slots of a multi-output pass (has_slots, no_slots_v), the widest
// element type among its tensor leaves (max_leaf_bytes), and whether it costs little more than reading its operands
// (memory_bound_v).
#pragma once

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "ember/core/tensor.hpp"
#include "ember/expr/functors.hpp"
#include "ember/expr/node_types.hpp"

namespace ember::expr {

/// The number of tensor leaves of an expression type.
template <class E>
struct leaf_count : std::integral_constant<int, 0> {};
template <class T, bool O>
struct leaf_count<TensorLeaf<T, O>> : std::integral_constant<int, 1> {};
template <class Op, class A>
struct leaf_count<UnaryExpr<Op, A>> : leaf_count<A> {};
template <class U, class A>
struct leaf_count<CastExpr<U, A>> : leaf_count<A> {};
template <class Op, class A, class B>
struct leaf_count<BinaryExpr<Op, A, B>> : std::integral_constant<int, leaf_count<A>::value + leaf_count<B>::value> {};
template <class C, class A, class B>
struct leaf_count<WhereExpr<C, A, B>>
    : std::integral_constant<int, leaf_count<C>::value + leaf_count<A>::value + leaf_count<B>::value> {};

template <class... T>
struct leaf_count<std::tuple<Tensor<T>...>> : std::integral_constant<int, int(sizeof...(T))> {};
template <class... T>
struct leaf_count<Slots<T...>> : std::integral_constant<int, int(sizeof...(T))> {};

/// Whether an expression reads slots (LeafRef nodes): only a multi-output pass with a slot source evaluates it.
template <class E>
struct has_slots : std::false_type {};
template <class T, int K>
struct has_slots<LeafRef<T, K>> : std::true_type {};
template <class T, int K>
struct has_slots<ParamRef<T, K>> : std::true_type {};
template <class Op, class A>
struct has_slots<UnaryExpr<Op, A>> : has_slots<A> {};
template <class U, class A>
struct has_slots<CastExpr<U, A>> : has_slots<A> {};
template <class Op, class A, class B>
struct has_slots<BinaryExpr<Op, A, B>> : std::bool_constant<has_slots<A>::value || has_slots<B>::value> {};
template <class C, class A, class B>
struct has_slots<WhereExpr<C, A, B>>
    : std::bool_constant<has_slots<C>::value || has_slots<A>::value || has_slots<B>::value> {};
template <class E>
inline constexpr bool no_slots_v = !has_slots<E>::value;

/// The widest element type (in bytes) among an expression's tensor leaves; 0 when it has none.
template <class E>
struct max_leaf_bytes : std::integral_constant<std::size_t, 0> {};
template <class T, bool O>
struct max_leaf_bytes<TensorLeaf<T, O>> : std::integral_constant<std::size_t, sizeof(T)> {};
template <class T, int K>
struct max_leaf_bytes<LeafRef<T, K>> : std::integral_constant<std::size_t, sizeof(T)> {};
template <class Op, class A>
struct max_leaf_bytes<UnaryExpr<Op, A>> : max_leaf_bytes<A> {};
template <class U, class A>
struct max_leaf_bytes<CastExpr<U, A>> : max_leaf_bytes<A> {};
template <class Op, class A, class B>
struct max_leaf_bytes<BinaryExpr<Op, A, B>>
    : std::integral_constant<std::size_t, std::max(max_leaf_bytes<A>::value, max_leaf_bytes<B>::value)> {};
template <class C, class A, class B>
struct max_leaf_bytes<WhereExpr<C, A, B>>
    : std::integral_constant<std::size_t, std::max({max_leaf_bytes<C>::value, max_leaf_bytes<A>::value,
                                                    max_leaf_bytes<B>::value})> {};
template <class... T>
struct max_leaf_bytes<std::tuple<Tensor<T>...>> : std::integral_constant<std::size_t, std::max({std::size_t(0), sizeof(T)...})> {};
template <class... T>
struct max_leaf_bytes<Slots<T...>> : max_leaf_bytes<std::tuple<Tensor<T>...>> {};

/// Whether evaluating an expression costs little more than moving its operands: every node a load, a scalar, an
/// addition, subtraction or multiplication, a minimum or maximum, a negation, absolute value, square or ReLU, a
/// comparison or logical op, a where or a cast. A pass over such an expression is bound by memory bandwidth, so
/// the CPU executor may stream its output (cpu/detail/stream_store.hpp); with a division or an elementary function
/// it is bound by arithmetic at a few threads, and the streaming path's extra copy made it slower (gelu(a * b + c)
/// streamed anyway: 0.94x forward, 0.85x forward + backward on Zen 5, bench/RESULTS.md). Unknown nodes count as not
/// memory-bound.
template <class Op>
struct cheap_op : std::false_type {};
template <> struct cheap_op<ops_table::Identity> : std::true_type {};
template <> struct cheap_op<ops_table::Neg> : std::true_type {};
template <> struct cheap_op<ops_table::Abs> : std::true_type {};
template <> struct cheap_op<ops_table::Square> : std::true_type {};
template <> struct cheap_op<ops_table::Relu> : std::true_type {};
template <> struct cheap_op<ops_table::Add> : std::true_type {};
template <> struct cheap_op<ops_table::Sub> : std::true_type {};
template <> struct cheap_op<ops_table::Mul> : std::true_type {};
template <> struct cheap_op<ops_table::Maximum> : std::true_type {};
template <> struct cheap_op<ops_table::Minimum> : std::true_type {};
template <> struct cheap_op<ops_table::Lt> : std::true_type {};
template <> struct cheap_op<ops_table::Le> : std::true_type {};
template <> struct cheap_op<ops_table::Gt> : std::true_type {};
template <> struct cheap_op<ops_table::Ge> : std::true_type {};
template <> struct cheap_op<ops_table::Eq> : std::true_type {};
template <> struct cheap_op<ops_table::Ne> : std::true_type {};
template <> struct cheap_op<ops_table::And> : std::true_type {};
template <> struct cheap_op<ops_table::Or> : std::true_type {};
template <> struct cheap_op<ops_table::Xor> : std::true_type {};
template <> struct cheap_op<ops_table::Not> : std::true_type {};
// The derivatives of those ops are constants, an operand or a select (the fused backward's factors).
template <class Op>
struct cheap_op<ops_table::Deriv<Op>> : cheap_op<Op> {};
template <class Op>
struct cheap_op<ops_table::DerivA<Op>> : cheap_op<Op> {};
template <class Op>
struct cheap_op<ops_table::DerivB<Op>> : cheap_op<Op> {};

struct NoCheck;
template <class E>
struct memory_bound : std::false_type {};
template <> struct memory_bound<NoCheck> : std::true_type {};
template <class T, bool O>
struct memory_bound<TensorLeaf<T, O>> : std::true_type {};
template <class T>
struct memory_bound<ScalarLeaf<T>> : std::true_type {};
template <class T, int K>
struct memory_bound<LeafRef<T, K>> : std::true_type {};
template <class T, int K>
struct memory_bound<ParamRef<T, K>> : std::true_type {};
template <class Op, class A>
struct memory_bound<UnaryExpr<Op, A>> : std::bool_constant<cheap_op<Op>::value && memory_bound<A>::value> {};
template <class U, class A>
struct memory_bound<CastExpr<U, A>> : memory_bound<A> {};
template <class Op, class A, class B>
struct memory_bound<BinaryExpr<Op, A, B>>
    : std::bool_constant<cheap_op<Op>::value && memory_bound<A>::value && memory_bound<B>::value> {};
template <class C, class A, class B>
struct memory_bound<WhereExpr<C, A, B>>
    : std::bool_constant<memory_bound<C>::value && memory_bound<A>::value && memory_bound<B>::value> {};
template <class E>
inline constexpr bool memory_bound_v = memory_bound<E>::value;

}  // namespace ember::expr
