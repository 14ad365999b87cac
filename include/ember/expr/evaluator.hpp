// ember — evaluators ("how"): the trivially copyable twin of an expression, holding raw pointers and strides
// laid out for one iteration space (a Plan). An executor (cpu/ or cuda/) copies the evaluator into its loop or
// kernel and asks it for element values by index:
//   LinearIdx{i}: every operand is dense over the whole space, element i;
//   RowIdx{j}:    element j of the current row (after set_row with the outer coordinates).
// Broadcasting is stride 0; strided views are their strides; half/bfloat16 load as float.
//
// The plan the evaluators read is expr/plan.hpp, the leaf traits of the executors' set-up expr/leaf_traits.hpp;
// this header includes both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/expr/leaf_traits.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/expr/plan.hpp"

namespace ember::expr {

/// Operands shared by every LeafRef<T, K> (and scalars by every ParamRef<T, K>) of a multi-output pass: slot K is
/// read through one pointer, so the compiler sees repeated reads of a leaf as the same value and computes shared
/// sub-expressions once.
struct SlotTable {
  const char* base[kMaxLeaves];
  const char* row[kMaxLeaves];
  std::int64_t inner[kMaxLeaves];  // bytes
  std::int64_t st[kMaxLeaves][kMaxDims];  // bytes
  double param[kMaxParams];
  int n = 0;
  EMBER_HOST_DEVICE void set_row(const std::int64_t* coords, int outer) {
    for (int k = 0; k < n; ++k) {
      std::int64_t off = 0;
      for (int d = 0; d < outer; ++d) off += coords[d] * st[k][d];
      row[k] = base[k] + off;
    }
  }
};

struct LinearIdx {
  std::int64_t i;
  const SlotTable* slots = nullptr;
};
struct RowIdx {
  std::int64_t j;
  const SlotTable* slots = nullptr;
};

/// N consecutive values of one expression (the CUDA executor evaluates N elements per step so that every
/// operand moves 16 bytes per load or store).
template <class V, int N>
struct Pack {
  V v[N];
};

/// N elements of T as one aligned block: a single (vector) load or store of N * sizeof(T) bytes.
template <class T, int N>
struct alignas(sizeof(T) * N) RawPack {
  T v[N];
};

#if defined(__CUDA_ARCH__)
#define EMBER_UNROLL _Pragma("unroll")
#else
#define EMBER_UNROLL
#endif

/// Reads (or writes) one operand: base pointer, strides over the plan, and the current row.
template <class T>
struct OperandEval {
  T* base = nullptr;
  T* row = nullptr;
  std::int64_t inner = 1;
  std::int64_t st[kMaxDims] = {};

  OperandEval() = default;
  OperandEval(T* p, const Plan& plan, int k) : base(p), row(p) {
    for (int i = 0; i < plan.shape.n; ++i) st[i] = plan.st[k][i];
    inner = plan.st[k][plan.shape.n - 1];
  }
  EMBER_HOST_DEVICE EMBER_INLINE T& at(LinearIdx ix) const { return base[ix.i]; }
  EMBER_HOST_DEVICE EMBER_INLINE T& at(RowIdx ix) const { return row[ix.j * inner]; }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* coords, int outer) {
    std::int64_t off = 0;
    for (int d = 0; d < outer; ++d) off += coords[d] * st[d];
    row = base + off;
  }
};

template <class E>
struct Eval;

template <class T, bool O>
struct Eval<TensorLeaf<T, O>> {
  OperandEval<const T> in;
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<T> eval(I ix) const {
    return static_cast<compute_t<T>>(in.at(ix));
  }
  /// Elements i .. i+N-1 of a dense operand; base + i must be aligned to N * sizeof(T).
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<compute_t<T>, N> eval_pack(std::int64_t i, const SlotTable*) const {
    const RawPack<T, N> r = *reinterpret_cast<const RawPack<T, N>*>(in.base + i);
    Pack<compute_t<T>, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = static_cast<compute_t<T>>(r.v[k]);
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* c, int outer) { in.set_row(c, outer); }
};

template <class T, int K>
struct Eval<LeafRef<T, K>> {
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<T> eval(LinearIdx ix) const {
    return static_cast<compute_t<T>>(reinterpret_cast<const T*>(ix.slots->base[K])[ix.i]);
  }
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<T> eval(RowIdx ix) const {
    return static_cast<compute_t<T>>(*reinterpret_cast<const T*>(ix.slots->row[K] + ix.j * ix.slots->inner[K]));
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<compute_t<T>, N> eval_pack(std::int64_t i, const SlotTable* s) const {
    const RawPack<T, N> r = *reinterpret_cast<const RawPack<T, N>*>(reinterpret_cast<const T*>(s->base[K]) + i);
    Pack<compute_t<T>, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = static_cast<compute_t<T>>(r.v[k]);
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t*, int) {}
};

template <class T, int K>
struct Eval<ParamRef<T, K>> {
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<T> eval(I ix) const {
    return static_cast<compute_t<T>>(ix.slots->param[K]);
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<compute_t<T>, N> eval_pack(std::int64_t, const SlotTable* s) const {
    Pack<compute_t<T>, N> p;
    const compute_t<T> v = static_cast<compute_t<T>>(s->param[K]);
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = v;
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t*, int) {}
};

template <class T>
struct Eval<ScalarLeaf<T>> {
  compute_t<T> v;
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<T> eval(I) const {
    return v;
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<compute_t<T>, N> eval_pack(std::int64_t, const SlotTable*) const {
    Pack<compute_t<T>, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = v;
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t*, int) {}
};

template <class Op, class A>
struct Eval<UnaryExpr<Op, A>> {
  Op op;
  Eval<A> a;
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE auto eval(I ix) const {
    return op(a.eval(ix));
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE auto eval_pack(std::int64_t i, const SlotTable* s) const {
    const auto x = a.template eval_pack<N>(i, s);
    Pack<decltype(op(x.v[0])), N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = op(x.v[k]);
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* c, int outer) { a.set_row(c, outer); }
};

template <class Op, class A, class B>
struct Eval<BinaryExpr<Op, A, B>> {
  using CT = typename BinaryExpr<Op, A, B>::compute_type;
  Op op;
  Eval<A> a;
  Eval<B> b;
  // Operands left to right, as eval_pack's (function arguments have no order): a compiler that contracts
  // a * b + c * d into a fused multiply-add then contracts it as it would the same formula written as a loop.
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE auto eval(I ix) const {
    const CT x = static_cast<CT>(a.eval(ix));
    const CT y = static_cast<CT>(b.eval(ix));
    return op(x, y);
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE auto eval_pack(std::int64_t i, const SlotTable* s) const {
    const auto x = a.template eval_pack<N>(i, s);
    const auto y = b.template eval_pack<N>(i, s);
    Pack<decltype(op(CT{}, CT{})), N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = op(static_cast<CT>(x.v[k]), static_cast<CT>(y.v[k]));
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* c, int outer) {
    a.set_row(c, outer);
    b.set_row(c, outer);
  }
};

template <class C, class A, class B>
struct Eval<WhereExpr<C, A, B>> {
  using CT = compute_t<typename WhereExpr<C, A, B>::value_type>;
  Eval<C> c;
  Eval<A> a;
  Eval<B> b;
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE CT eval(I ix) const {
    const CT x = static_cast<CT>(a.eval(ix)), y = static_cast<CT>(b.eval(ix));
    return c.eval(ix) ? x : y;
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<CT, N> eval_pack(std::int64_t i, const SlotTable* s) const {
    const auto pc = c.template eval_pack<N>(i, s);
    const auto pa = a.template eval_pack<N>(i, s);
    const auto pb = b.template eval_pack<N>(i, s);
    Pack<CT, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) {
      const CT x = static_cast<CT>(pa.v[k]), y = static_cast<CT>(pb.v[k]);
      p.v[k] = pc.v[k] ? x : y;
    }
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* cc, int outer) {
    c.set_row(cc, outer);
    a.set_row(cc, outer);
    b.set_row(cc, outer);
  }
};

template <class U, class A>
struct Eval<CastExpr<U, A>> {
  Eval<A> a;
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE compute_t<U> eval(I ix) const {
    return static_cast<compute_t<U>>(convert<U>(a.eval(ix)));
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<compute_t<U>, N> eval_pack(std::int64_t i, const SlotTable* s) const {
    const auto x = a.template eval_pack<N>(i, s);
    Pack<compute_t<U>, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = static_cast<compute_t<U>>(convert<U>(x.v[k]));
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t* c, int outer) { a.set_row(c, outer); }
};

/// The check of a multi-output pass that checks nothing (ops::assign_multi without a flag): false at every index,
/// known at compile time, so the pass folds nothing.
struct NoCheck {
  using value_type = bool;
  static constexpr int num_leaves = 0;
  Shape shape() const { return {}; }
};
template <>
struct Eval<NoCheck> {
  template <class I>
  EMBER_HOST_DEVICE EMBER_INLINE static constexpr bool eval(I) {
    return false;
  }
  template <int N>
  EMBER_HOST_DEVICE EMBER_INLINE Pack<bool, N> eval_pack(std::int64_t, const SlotTable*) const {
    Pack<bool, N> p;
    EMBER_UNROLL for (int k = 0; k < N; ++k) p.v[k] = false;
    return p;
  }
  EMBER_HOST_DEVICE EMBER_INLINE void set_row(const std::int64_t*, int) {}
};
template <class F>
void visit_leaves(const NoCheck&, F&&) {}

// ---- building an evaluator for a plan: leaves take plan operands first, second, ... in position order ------

inline Eval<NoCheck> make_eval(const NoCheck&, const Plan&, int&) { return {}; }

template <class T, bool O>
Eval<TensorLeaf<T, O>> make_eval(const TensorLeaf<T, O>& l, const Plan& p, int& k) {
  return {OperandEval<const T>(l.tensor().data(), p, k++)};
}
template <class T, int K>
Eval<LeafRef<T, K>> make_eval(const LeafRef<T, K>&, const Plan&, int&) {
  return {};
}
template <class T, int K>
Eval<ParamRef<T, K>> make_eval(const ParamRef<T, K>&, const Plan&, int&) {
  return {};
}
template <class T>
Eval<ScalarLeaf<T>> make_eval(const ScalarLeaf<T>& l, const Plan&, int&) {
  return {l.value};
}
template <class Op, class A>
Eval<UnaryExpr<Op, A>> make_eval(const UnaryExpr<Op, A>& e, const Plan& p, int& k) {
  return {e.op, make_eval(e.a, p, k)};
}
template <class Op, class A, class B>
Eval<BinaryExpr<Op, A, B>> make_eval(const BinaryExpr<Op, A, B>& e, const Plan& p, int& k) {
  auto a = make_eval(e.a, p, k);
  auto b = make_eval(e.b, p, k);
  return {e.op, a, b};
}
template <class C, class A, class B>
Eval<WhereExpr<C, A, B>> make_eval(const WhereExpr<C, A, B>& e, const Plan& p, int& k) {
  auto c = make_eval(e.c, p, k);
  auto a = make_eval(e.a, p, k);
  auto b = make_eval(e.b, p, k);
  return {c, a, b};
}
template <class U, class A>
Eval<CastExpr<U, A>> make_eval(const CastExpr<U, A>& e, const Plan& p, int& k) {
  return {make_eval(e.a, p, k)};
}

}  // namespace ember::expr
