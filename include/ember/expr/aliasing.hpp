// ember — the write checks every executor makes before an element-wise pass into an existing tensor: the output
// has no broadcast (stride 0) dims, and no operand reads the output's memory with a different geometry (which
// would need a temporary). Host-side logic shared by cpu/ and cuda/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/evaluator.hpp"
#include "ember/expr/leaves.hpp"
#include "ember/expr/node_types.hpp"

namespace ember::expr {

/// Throws unless `out` can be written element by element (no dim of size > 1 with stride 0).
template <class T>
void check_writable(const Tensor<T>& out, const char* op) {
  for (int i = 0; i < out.dim(); ++i)
    EMBER_CHECK(!(out.strides()[i] == 0 && out.shape()[i] > 1), op,
                ": cannot write into a tensor with a broadcast (stride 0) dim; shape ", out.shape().str(),
                ", strides ", out.strides().str(), " (clone() it first)");
}

/// True when writing `out` in one element-wise pass could overwrite an element an operand still has to read:
/// an operand shares its storage but reads it with a different geometry.
template <class T>
bool overlaps_badly(const Tensor<T>& out, const PlanBuilder& b, int out_k, int nops, const void* const* ptrs,
                    const StorageImpl* const* storages) {
  for (int k = 0; k < nops; ++k) {
    if (k == out_k || storages[k] != out.storage().get()) continue;
    if (ptrs[k] != static_cast<const void*>(out.data()) || !(b.strides(k) == b.strides(out_k))) return true;
  }
  return false;
}

/// Plans a multi-output pass (ops::assign_multi) over `space`: outputs `outs` become operands 0 .. nout-1 of b, the
/// operands it reads (`ins`: slot sources, then the expressions' tensor leaves) follow. Checks that the outputs are
/// defined, of shape `space`, writable and on one device, and that every operand is defined, on that device and
/// broadcasts to `space`. Returns multi_in_place_ok's verdict (below).
EMBER_HEADER_INLINE bool plan_multi(PlanBuilder& b, const OperandRef* outs, int nout, const OperandRef* ins, int nin,
                                    const Shape& space, const char* op);
/// The aliasing rule of a multi-output pass (ops::assign_multi), which reads every operand at an index before it
/// stores any output there: outputs (`outs`, operands 0 .. nout-1 of b) must not share memory with each other
/// (an error), and an operand (`ins`, operands nout .. nout+nin-1) may share an output's memory only where it reads
/// it with the output's own geometry, as an in-place update does (p = p - lr * m). Returns false when an operand
/// reads an output's memory otherwise: the pass must then write temporaries first.
EMBER_HEADER_INLINE bool multi_in_place_ok(const PlanBuilder& b, const OperandRef* outs, int nout, const OperandRef* ins,
                                           int nin, const char* op);
/// The operands of one multi-output pass (cpu::assign_multi and cuda::assign_multi set it up alike): the outputs,
/// then what the pass reads in the plan's order (the slot sources, each expression's tensor leaves, the check's),
/// planned over `space` in a PlanBuilder, with plan_multi's verdict.
template <int N>
struct MultiPass {
  OperandRef outs[N];                 ///< The outputs: operands 0 .. N-1 of the plan.
  OperandRef ins[kMaxOperands];       ///< What the pass reads, in the plan's order after the outputs.
  std::size_t slot_size[kMaxLeaves];  ///< The element size of each slot source.
  int nin = 0;                        ///< The entries of ins.
  int nslots = 0;                     ///< The slot sources: the first nslots entries of ins.
  bool in_place = false;  ///< plan_multi's verdict: no operand reads an output with another geometry.
  PlanBuilder b;          ///< The plan over the pass's space, outputs then ins.
  /// An empty pass over `space`.
  explicit MultiPass(const Shape& space) : b(space) {}

  /// The slot table of the collapsed plan p: the slot sources' rows and byte strides, and slot_src's parameters.
  template <class S>
  SlotTable slots(const Plan& p, const S& slot_src) const {
    SlotTable t{};
    t.n = nslots;
    const Params params = params_of(slot_src);
    for (int k = 0; k < kMaxParams; ++k) t.param[k] = params.v[k];
    for (int k = 0; k < nslots; ++k) {
      t.base[k] = t.row[k] = static_cast<const char*>(ins[k].data);
      for (int d = 0; d < p.shape.n; ++d) t.st[k][d] = p.st[N + k][d] * std::int64_t(slot_size[k]);
      t.inner[k] = t.st[k][p.shape.n - 1];
    }
    return t;
  }

  /// The evaluators over the collapsed plan p of the expressions es (a tuple) and of the check, as a pair: their
  /// tensor leaves take the plan's operands after the outputs and the slots, in order.
  template <class... E, class C>
  auto evals(const Plan& p, const std::tuple<E...>& es, const C& check) const {
    int k = N + nslots;
    // A braced list evaluates left to right, so leaves take plan operands in order.
    auto evs = std::apply(
        [&](const auto&... e) { return std::tuple<decltype(make_eval(e, p, k))...>{make_eval(e, p, k)...}; }, es);
    auto chk = make_eval(check, p, k);
    return std::make_pair(std::move(evs), std::move(chk));
  }
};

/// Gathers and plans the operands of a multi-output pass writing `outs` from the expressions `es` over `space`, with
/// slot_src's tensors in the slot table and a bool expression `check` (expr::NoCheck: none); the errors name `op`.
template <class... T, class... E, class S, class C>
MultiPass<int(sizeof...(T))> plan_multi_pass(const std::tuple<Tensor<T>...>& outs, const std::tuple<E...>& es,
                                            const Shape& space, const S& slot_src, const C& check, const char* op) {
  constexpr int n = sizeof...(T);
  MultiPass<n> m(space);
  std::apply([&](const auto&... o) {
    int j = 0;
    (..., (m.outs[j++] = operand_ref(o)));
  }, outs);
  auto push = [&](const auto& leaf) {
    EMBER_CHECK(n + m.nin < kMaxOperands, op, ": the pass has too many operands (at most ", kMaxOperands, ")");
    m.ins[m.nin++] = operand_ref(leaf.tensor());
  };
  visit_leaves(slot_src, [&](const auto& leaf) {
    EMBER_CHECK(m.nslots < kMaxLeaves, op, ": too many slots (at most ", kMaxLeaves, ")");
    m.slot_size[m.nslots++] = sizeof(*leaf.tensor().data());
    push(leaf);
  });
  std::apply([&](const auto&... e) { (..., visit_leaves(e, push)); }, es);
  visit_leaves(check, push);
  m.in_place = plan_multi(m.b, m.outs, n, m.ins, m.nin, space, op);
  return m;
}

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE bool multi_in_place_ok(const PlanBuilder& b, const OperandRef* outs, int nout, const OperandRef* ins,
                                           int nin, const char* op) {
  for (int j = 0; j < nout; ++j)
    for (int k = j + 1; k < nout; ++k)
      EMBER_CHECK(outs[j].storage != outs[k].storage, op, ": outputs ", j, " and ", k, " of one pass share memory");
  for (int i = 0; i < nin; ++i)
    for (int j = 0; j < nout; ++j)
      if (ins[i].storage == outs[j].storage && (ins[i].data != outs[j].data || !(b.strides(nout + i) == b.strides(j))))
        return false;
  return true;
}
EMBER_HEADER_INLINE bool plan_multi(PlanBuilder& b, const OperandRef* outs, int nout, const OperandRef* ins, int nin,
                                    const Shape& space, const char* op) {
  for (int j = 0; j < nout; ++j) {
    const OperandRef& o = outs[j];
    EMBER_CHECK(o.defined, op, ": output ", j, " is an undefined tensor");
    EMBER_CHECK(*o.shape == space, op, ": output ", j, " has shape ", o.shape->str(), " but the pass runs over ",
                space.str());
    EMBER_CHECK(o.device == outs[0].device, op, ": outputs are on different devices (", outs[0].device.str(), " and ",
                o.device.str(), ")");
    for (int i = 0; i < space.n; ++i)
      EMBER_CHECK(!((*o.strides)[i] == 0 && space[i] > 1), op,
                  ": cannot write into a tensor with a broadcast (stride 0) dim; shape ", space.str(), ", strides ",
                  o.strides->str(), " (clone() it first)");
    b.add(*o.shape, *o.strides);
  }
  Device dev = outs[0].device;
  bool have = true;
  add_operands(b, ins, nin, dev, have, op);
  for (int i = 0; i < nin; ++i)
    EMBER_CHECK(broadcast_shapes(*ins[i].shape, space, op) == space, op, ": an operand of shape ", ins[i].shape->str(),
                " does not broadcast to the pass's shape ", space.str());
  return multi_in_place_ok(b, outs, nout, ins, nin, op);
}
#endif

}  // namespace ember::expr
