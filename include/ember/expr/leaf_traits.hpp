// ember — compile-time facts about an expression type's leaves, for the executors' set-up: how many tensor leaves
// it has (leaf_count), whether it reads the slots of a multi-output pass (has_slots, no_slots_v), and the widest
// element type among its tensor leaves (max_leaf_bytes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "ember/core/tensor.hpp"
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

}  // namespace ember::expr
