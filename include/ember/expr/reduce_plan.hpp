// ember — the plan of a reduction along some dims, one for both executors (cpu/reduce.hpp, cuda/reduce.cuh): which
// dims of the iteration space are kept and which reduced, and in which order an executor walks them. Host-side
// logic; the executors differ only in how they run it.
#pragma once

#include "ember/config.hpp"
#include "ember/core/shape.hpp"
#include "ember/expr/evaluator.hpp"

namespace ember::expr {

/// A reduction along the dims where its output (operand 0 of the plan: stride 0 on reduced dims) has size 1, with
/// the dims reordered into one of two walks:
///   rows     [kept (nkept) | reduced (nred)]: each output folds rows along the last reduced dim. Taken when the
///            inner dim is reduced, and always by indexed reducers (arg-max/min fold each output's elements in
///            order).
///   columns  [reduced (nred) | kept (nkept)]: rows of outputs accumulate along the last kept dim.
struct ReducePlan {
  Plan q;             ///< The reordered plan (never linear).
  bool rows = false;  ///< The rows walk (else the columns walk).
  ///@{
  /// The reduced and the kept dims of q.
  int nred = 0, nkept = 0;
  ///@}
};

/// The walk of a reduction from the collapsed plan `p` of its space (output first). collapse() drops size-1 dims, so
/// when only size-1 dims are reduced no reduced dim is left: an indexed reducer then gets one back (size 1, stride 0
/// for every operand), so that each output folds a row of length 1 (index 0) rather than taking the last kept dim
/// for its row; any other reducer walks columns with nothing reduced, each output folding its one element.
EMBER_HEADER_INLINE ReducePlan plan_reduce(const Plan& p, bool indexed);

/// The plan of reducing expression e (over `space`) into `out` (operand 0: its strides are 0 on the reduced dims;
/// e's tensor leaves follow, and set `dev` / `have_dev` as add_leaves does). Both executors start a reduction along
/// some dims here.
template <class OutT, class E>
ReducePlan plan_reduce_into(const Tensor<OutT>& out, const E& e, const Shape& space, Device& dev, bool& have_dev,
                            bool indexed, const char* op) {
  PlanBuilder b(space);
  b.add(out.shape(), out.strides());
  add_leaves(e, b, dev, have_dev, op);
  return plan_reduce(b.collapse(), indexed);
}

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE ReducePlan plan_reduce(const Plan& p, bool indexed) {
  ReducePlan r;
  Plan& q = r.q;
  q = p;
  bool any_red = false;
  for (int d = 0; d < q.shape.n; ++d) any_red = any_red || q.st[0][d] == 0;
  if (indexed && !any_red) {
    q.shape.push_back(1);
    for (int k = 0; k < q.nops; ++k) q.st[k].push_back(0);
  }
  const Plan src = q;
  const int nd = q.shape.n;
  auto is_red = [&](int d) { return src.st[0][d] == 0; };
  r.rows = is_red(nd - 1) || indexed;
  int order[kMaxDims], no = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int d = 0; d < nd; ++d)
      if (is_red(d) == (r.rows ? pass == 1 : pass == 0)) order[no++] = d;
  for (int i = 0; i < nd; ++i) {
    q.shape[i] = src.shape[order[i]];
    for (int k = 0; k < q.nops; ++k) q.st[k][i] = src.st[k][order[i]];
  }
  q.linear = false;
  for (int d = 0; d < nd; ++d) r.nred += is_red(d);
  r.nkept = nd - r.nred;
  return r;
}
#endif

}  // namespace ember::expr
