// ember — the CPU executor ("where"): runs an evaluator over a plan in one threaded pass. Dense plans take a flat
// loop the compiler vectorises; others walk rows (outer coordinates, then a strided inner loop).
#pragma once

#include <cstdint>
#include <tuple>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/aliasing.hpp"
#include "ember/expr/evaluator.hpp"

namespace ember::cpu {

/// Elements per chunk below which a loop stays on one thread.
inline constexpr std::int64_t kGrain = 32768;

/// Runs body over every index of the plan, in parallel chunks. Body provides set_row(coords, outer) and
/// run(LinearIdx/RowIdx range); it is copied per chunk so each thread has its own row pointers.
template <class Body>
void run_plan(const expr::Plan& p, const Body& body) {
  const std::int64_t n = p.numel();
  if (n == 0) return;
  if (p.linear) {
    parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) {
      Body local = body;
      local.run_linear(a, b);
    });
    return;
  }
  const std::int64_t row = p.row_len();
  const int outer = p.outer_dims();
  parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) {
    Body local = body;
    std::int64_t coords[kMaxDims] = {};
    std::int64_t o = a / row, j = a % row;
    for (int d = outer - 1; d >= 0; --d) {  // unflatten the outer index
      coords[d] = o % p.shape[d];
      o /= p.shape[d];
    }
    std::int64_t i = a;
    while (i < b) {
      local.set_row(coords, outer);
      const std::int64_t j1 = std::min(row, j + (b - i));
      local.run_row(j, j1);
      i += j1 - j;
      j = 0;
      for (int d = outer - 1; d >= 0; --d) {  // next row
        if (++coords[d] < p.shape[d]) break;
        coords[d] = 0;
      }
    }
  });
}

/// Writes each expression of a pack into its output: out_k[i] = e_k(i), all in one loop over one plan.
/// `slots` holds the operands that LeafRef nodes read (backward kernels); unused otherwise.
struct NoSlots {
  void set_row(const std::int64_t*, int) {}
};

template <bool Slots, class... Pairs>
struct AssignBody {
  using Table = std::conditional_t<Slots, expr::SlotTable, NoSlots>;
  std::tuple<Pairs...> pairs;  // each pair: (OperandEval<T> out, Eval<E> ev)
  Table slots;

  void set_row(const std::int64_t* c, int outer) {
    slots.set_row(c, outer);
    std::apply([&](auto&... pr) { (..., (pr.first.set_row(c, outer), pr.second.set_row(c, outer))); }, pairs);
  }
  void run_linear(std::int64_t a, std::int64_t b) {
    std::apply([&](auto&... pr) { run<expr::LinearIdx>(a, b, &slots, pr...); }, pairs);
  }
  void run_row(std::int64_t a, std::int64_t b) {
    std::apply([&](auto&... pr) { run<expr::RowIdx>(a, b, &slots, pr...); }, pairs);
  }
  /// Indices [a, b) of a dense space, straight from the pairs: no body to build and copy (small ops pay for
  /// every copy of these structs).
  static void run_dense(std::int64_t a, std::int64_t b, const Pairs&... pr)
    requires(!Slots)
  {
    static constexpr Table none{};
    run<expr::LinearIdx>(a, b, &none, pr...);
  }

 private:
  // Indices [a, b) of the whole space (LinearIdx) or of the current row (RowIdx).
  template <class Idx, class... P>
  EMBER_VECTORIZE static void run(std::int64_t a, std::int64_t b, const Table* sl, const P&... pr) {
    // Local copies so the compiler keeps pointers in registers and vectorises; the slot table is copied so its
    // pointers are loop invariants the compiler can prove.
    auto local = std::make_tuple(pr...);
    const Table t = *sl;
    const expr::SlotTable* tp = nullptr;
    if constexpr (Slots) tp = &t;
    std::apply(
        [&](auto&... q) {
          // No iteration reads what another writes: outputs are fresh, or alias an operand with the same
          // geometry (a = a * b), or the executor went through a temporary. So no runtime alias checks.
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#elif defined(__GNUC__)
#pragma GCC ivdep
#endif
          for (std::int64_t i = a; i < b; ++i) step(Idx{i, tp}, q...);
        },
        local);
  }
  // Every value first, then every store: a store cannot clobber what a later expression reads, so the compiler
  // computes sub-expressions shared between outputs (the same derivative factor, the same exp) once.
  template <class I, class... Q>
  EMBER_INLINE static void step(I ix, Q&... q) {
    const std::tuple<decltype(q.second.eval(ix))...> vals{q.second.eval(ix)...};
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      (..., store(q, ix, std::get<K>(vals)));
    }(std::index_sequence_for<Q...>{});
  }
  template <class Q, class I, class V>
  EMBER_INLINE static void store(Q& q, I ix, V v) {
    using T = std::remove_const_t<std::remove_reference_t<decltype(q.first.at(ix))>>;
    q.first.at(ix) = convert<T>(v);
  }
};

namespace detail {
/// The plan of out = e over out's shape: out is operand 0, the leaves follow. Checks that out can be written
/// element by element, that the operands are defined and on the CPU, and that e (of shape es) broadcasts to out.
/// Returns false, with no plan, when an operand reads out's memory with another geometry: the caller then goes
/// through a temporary. Ordinary code, compiled once however many expressions a program writes.
EMBER_HEADER_INLINE bool plan_write(const expr::OperandRef& out, const expr::OperandRef* leaves, int n,
                                    const Shape& es, const char* op, expr::Plan& p);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE bool plan_write(const expr::OperandRef& out, const expr::OperandRef* leaves, int n,
                                    const Shape& es, const char* op, expr::Plan& p) {
  EMBER_CHECK(out.defined, op, ": the output is an undefined tensor");
  const Shape& space = *out.shape;
  for (int i = 0; i < space.n; ++i)
    EMBER_CHECK(!((*out.strides)[i] == 0 && space[i] > 1), op,
                ": cannot write into a tensor with a broadcast (stride 0) dim; shape ", space.str(), ", strides ",
                out.strides->str(), " (clone() it first)");
  expr::PlanBuilder b(space);
  const int ko = b.add(space, *out.strides);
  Device dev = out.device;
  bool have = true;
  expr::add_operands(b, leaves, n, dev, have, op);
  EMBER_CHECK(broadcast_shapes(es, space, op) == space, op, ": cannot write a result of shape ", es.str(),
              " into a tensor of shape ", space.str());
  EMBER_CHECK(dev.is_cpu(), op, ": the CPU executor got tensors on ", dev.str());
  for (int k = 0; k < n; ++k)  // an operand that shares out's storage but reads it with another geometry
    if (leaves[k].storage == out.storage && (leaves[k].data != out.data || !(b.strides(k + 1) == b.strides(ko))))
      return false;
  b.collapse_into(p);
  return true;
}
#endif
}  // namespace detail

/// out = e (out already has the broadcast shape of e, or e broadcasts to it). One pass; aliasing-safe.
template <class T, class E>
void assign(const Tensor<T>& out, const E& e, const char* op = "assign") {
  // Fast path, the common small op: every operand dense with exactly out's shape. No plan to build. (Checked
  // here, inline, unrolled over the expression's leaves: the smallest ops pay for every call.)
  bool dense = out.is_contiguous() && out.device().is_cpu();
  expr::visit_leaves(e, [&](const auto& leaf) {
    const auto& t = leaf.tensor();
    dense = dense && t.defined() && t.device().is_cpu() && t.shape() == out.shape() && t.is_contiguous() &&
            (t.storage() != out.storage() || static_cast<const void*>(t.data()) == static_cast<const void*>(out.data()));
  });
  if (dense) {
    const expr::Plan& lp = expr::linear_plan();
    int kk = 1;
    auto ev = expr::make_eval(e, lp, kk);
    using Pair = std::pair<expr::OperandEval<T>, decltype(ev)>;
    const Pair pr{expr::OperandEval<T>(out.data(), lp, 0), ev};
    const std::int64_t n = out.numel();
    if (n < 2 * kGrain)
      AssignBody<false, Pair>::run_dense(0, n, pr);
    else
      parallel_for(0, n, kGrain, [&](std::int64_t a, std::int64_t b) { AssignBody<false, Pair>::run_dense(a, b, pr); });
    out.bump_version();
    return;
  }
  const expr::LeafRefs<E> leaves(e);
  expr::Plan p;
  // e's shape reads its leaves: with an undefined one, plan_write names the op and the undefined operand first.
  const Shape es = leaves.all_defined() ? e.shape() : Shape{};
  if (!detail::plan_write(expr::operand_ref(out), leaves.at, leaves.n, es, op, p)) {
    Tensor<T> tmp = empty<T>(out.shape());
    assign(tmp, e, op);
    assign(out, expr::TensorLeaf<T, false>{&tmp}, op);
    return;
  }
  int kk = 1;
  auto ev = expr::make_eval(e, p, kk);
  using Pair = std::pair<expr::OperandEval<T>, decltype(ev)>;
  run_plan(p, AssignBody<false, Pair>{std::make_tuple(Pair{expr::OperandEval<T>(out.data(), p, 0), ev}), {}});
  out.bump_version();
}

/// Several outputs of the same shape from several expressions in ONE pass (the fused backward writes every
/// leaf's gradient this way). Outputs must be fresh, dense tensors that no operand reads. The tensor leaves of
/// `slot_src` fill the slot table, in position order, for the LeafRef nodes of the expressions.
template <class... T, class... E, class S>
void assign_multi(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es, const Shape& space,
                  const S& slot_src) {
  expr::PlanBuilder b(space);
  std::apply([&](const auto&... o) { (..., b.add(o.shape(), o.strides())); }, outs);
  Device dev = std::get<0>(outs).device();
  bool have = true;
  constexpr int n = sizeof...(T);
  const char* slot_ptr[expr::kMaxLeaves];
  int nslots = 0;
  std::size_t slot_size[expr::kMaxLeaves];
  expr::visit_leaves(slot_src, [&](const auto& leaf) {
    slot_ptr[nslots] = reinterpret_cast<const char*>(leaf.tensor().data());
    slot_size[nslots++] = sizeof(*leaf.tensor().data());
  });
  expr::add_leaves(slot_src, b, dev, have, "backward");
  std::apply([&](const auto&... e) { (..., expr::add_leaves(e, b, dev, have, "backward")); }, es);
  EMBER_CHECK(dev.is_cpu(), "backward: the CPU executor got tensors on ", dev.str());
  const expr::Plan p = b.collapse();
  expr::SlotTable slots{};
  slots.n = nslots;
  for (int k = 0; k < nslots; ++k) {
    slots.base[k] = slots.row[k] = slot_ptr[k];
    for (int d = 0; d < p.shape.n; ++d) slots.st[k][d] = p.st[n + k][d] * std::int64_t(slot_size[k]);
    slots.inner[k] = slots.st[k][p.shape.n - 1];
  }
  int kk = n + nslots;
  // A braced list evaluates left to right, so leaves take plan operands in order.
  auto evs = std::apply(
      [&](const auto&... e) { return std::tuple<decltype(expr::make_eval(e, p, kk))...>{expr::make_eval(e, p, kk)...}; },
      es);
  using Evs = std::remove_cvref_t<decltype(evs)>;
  auto body = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return AssignBody<true, std::pair<expr::OperandEval<T>, std::tuple_element_t<I, Evs>>...>{
        std::make_tuple(std::make_pair(expr::OperandEval<T>(std::get<I>(outs).data(), p, int(I)), std::get<I>(evs))...),
        slots};
  }(std::index_sequence_for<T...>{});
  run_plan(p, body);
}

}  // namespace ember::cpu
