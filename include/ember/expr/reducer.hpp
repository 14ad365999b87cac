// ember — reducers: how a reduction folds values (sum, product, max/min, arg-max/min). Each is a small type with
// an accumulator, its identity, a step (fold one value in) and a merge (combine two partial results). Everything
// is EMBER_HOST_DEVICE: the CPU reduction (cpu/reduce.hpp) and the CUDA one (cuda/reduce.cuh) fold with the same
// rows, so they agree on NaN handling, ties and identities.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"

namespace ember::expr {

/// The accumulator of a sum over values of compute type C: double for floating types, int64 otherwise.
template <class C>
using sum_acc_t = std::conditional_t<std::is_floating_point_v<C>, double, std::int64_t>;

namespace detail {
// Limits as constants (not calls), so that device code may read them.
template <class A>
inline constexpr A kHighest =
    std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
template <class A>
inline constexpr A kLowest =
    std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
}  // namespace detail

/// The reducer of sum(): accumulates in A (sum_acc_t of the input's compute type). A reducer names its
/// accumulator `acc`, whether it needs the index (`indexed`), its identity (init), how it folds in one value (step)
/// and how it combines two partials (merge); the CPU and CUDA reductions run any reducer so.
template <class A>
struct SumR {
  using acc = A;                          ///< The running sum.
  static constexpr bool indexed = false;  ///< Indices are not needed.
  /// 0.
  EMBER_HOST_DEVICE static acc init() { return A(0); }
  /// a + v.
  EMBER_HOST_DEVICE EMBER_INLINE static acc step(acc a, A v, std::int64_t) { return a + v; }
  /// a + b.
  EMBER_HOST_DEVICE EMBER_INLINE static acc merge(acc a, acc b) { return a + b; }
};
/// The reducer of prod().
template <class A>
struct ProdR {
  using acc = A;                          ///< The running product.
  static constexpr bool indexed = false;  ///< Indices are not needed.
  /// 1.
  EMBER_HOST_DEVICE static acc init() { return A(1); }
  /// a * v.
  EMBER_HOST_DEVICE EMBER_INLINE static acc step(acc a, A v, std::int64_t) { return a * v; }
  /// a * b.
  EMBER_HOST_DEVICE EMBER_INLINE static acc merge(acc a, acc b) { return a * b; }
};
/// Max (Less = false) or min (Less = true); NaN wins, as in PyTorch.
template <class A, bool Less>
struct ExtremumR {
  using acc = A;                          ///< The extreme so far.
  static constexpr bool indexed = false;  ///< Indices are not needed.
  /// The worst value: +inf for min, -inf for max (the type's limits without infinities).
  EMBER_HOST_DEVICE static acc init() { return Less ? detail::kHighest<A> : detail::kLowest<A>; }
  /// Whether v beats a: smaller (min) or larger (max), or NaN.
  EMBER_HOST_DEVICE EMBER_INLINE static bool better(A v, A a) { return (Less ? v < a : v > a) || v != v; }
  /// v when it beats a and a is not NaN, else a.
  EMBER_HOST_DEVICE EMBER_INLINE static acc step(acc a, A v, std::int64_t) { return better(v, a) && a == a ? v : a; }
  /// step(a, b).
  EMBER_HOST_DEVICE EMBER_INLINE static acc merge(acc a, acc b) { return step(a, b, 0); }
};
/// Arg-max/min: the first index of the extreme value (NaN counts as extreme; the first NaN wins).
template <class A, bool Less>
struct ArgR {
  /// The extreme so far and its index.
  struct acc {
    A v;             ///< The value.
    std::int64_t i;  ///< Its index (-1: none yet).
  };
  static constexpr bool indexed = true;  ///< step() needs each value's index.
  /// No value yet (index -1).
  EMBER_HOST_DEVICE static acc init() { return {ExtremumR<A, Less>::init(), -1}; }
  /// Folds in value v at index i (indices arrive in increasing order within one partial).
  EMBER_HOST_DEVICE EMBER_INLINE static acc step(acc a, A v, std::int64_t i) {
    const bool take = a.i < 0 || (a.v == a.v && ExtremumR<A, Less>::better(v, a.v));
    return take ? acc{v, i} : a;
  }
  /// Combines two partials in either order: the better value wins, ties (and two NaNs) go to the smaller index.
  EMBER_HOST_DEVICE EMBER_INLINE static acc merge(acc a, acc b) {
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    const bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) return an && bn ? (b.i < a.i ? b : a) : (an ? a : b);
    if (ExtremumR<A, Less>::better(b.v, a.v)) return b;
    if (ExtremumR<A, Less>::better(a.v, b.v)) return a;
    return b.i < a.i ? b : a;
  }
};

/// The result a reducer's accumulator stands for, as element type V (the index for arg reducers).
template <class V, class Acc>
EMBER_HOST_DEVICE EMBER_INLINE V finish(const Acc& a) {
  if constexpr (requires { a.i; }) return V(a.i);
  else return convert<V>(a);
}

}  // namespace ember::expr
