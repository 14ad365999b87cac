// ember — CPU reductions over expressions. The element-wise part is evaluated inside the reduction loop (one
// pass, nothing materialised). Sums of float accumulate in double over eight lanes per block, and blocks combine
// in a fixed order, so results are accurate and do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/evaluator.hpp"
#include "ember/expr/reduce_plan.hpp"
#include "ember/expr/reducer.hpp"

namespace ember::cpu {

// The reducers live in expr/reducer.hpp (the CUDA reduction folds with the same ones); the CPU names stay.
using expr::ArgR;
using expr::ExtremumR;
using expr::ProdR;
using expr::sum_acc_t;
using expr::SumR;

namespace detail {
inline constexpr int kLanes = 8;
inline constexpr std::int64_t kBlock = 16384;

// Reduces elements [a, b) of an evaluator (LinearIdx or RowIdx), with `base` added to indices.
template <class R, class Ev, class Idx>
EMBER_VECTORIZE typename R::acc reduce_range(const Ev& ev, std::int64_t a, std::int64_t b, std::int64_t base) {
  using Acc = typename R::acc;
  Acc lanes[kLanes];
  for (auto& l : lanes) l = R::init();
  std::int64_t j = a;
  if constexpr (!R::indexed) {
    for (; j + kLanes <= b; j += kLanes)
      for (int l = 0; l < kLanes; ++l)
        lanes[l] = R::step(lanes[l], static_cast<Acc>(ev.eval(Idx{j + l})), 0);
  }
  Acc acc = R::init();
  for (int l = 0; l < kLanes; ++l) acc = R::merge(acc, lanes[l]);
  for (; j < b; ++j) {
    if constexpr (R::indexed) acc = R::step(acc, static_cast<decltype(acc.v)>(ev.eval(Idx{j})), base + j);
    else acc = R::step(acc, static_cast<Acc>(ev.eval(Idx{j})), 0);
  }
  return acc;
}

// acc[j] = R(acc[j], row[j]) along one row (the column-sum case of a reduction).
template <class R, class Ev>
EMBER_VECTORIZE void accumulate_row(typename R::acc* EMBER_RESTRICT acc, const Ev& ev, std::int64_t n, std::int64_t r) {
  for (std::int64_t j = 0; j < n; ++j) acc[j] = R::step(acc[j], static_cast<typename R::acc>(ev.eval(expr::RowIdx{j})), r);
}

using expr::finish;
}  // namespace detail

/// Reduces expression e over the dims where `out` (same rank as e's shape, keepdim form) has size 1 and e does
/// not. R is the reducer; `out` receives R's result converted to its type (indices for ArgR).
template <class R, class OutT, class E>
void reduce(const Tensor<OutT>& out, const E& e, const char* op) {
  static_assert(expr::no_slots_v<E>, "ember: this expression reads slots (expr::slot / LeafRef), which only a "
                                     "multi-output pass with a slot source (ops::assign_multi) evaluates");
  const Shape space = e.shape();
  EMBER_CHECK(out.dim() == space.n, op, ": internal rank mismatch");
  Device dev = Device::cpu();
  bool have = false;
  const std::int64_t n = space.numel();
  if (n == 0 && out.numel() != 1) {
    // Empty groups (a reduced dim of size 0): every output is the reducer's identity (sum 0, prod 1).
    if (out.numel() > 0)
      assign(out, expr::ScalarLeaf<OutT>{static_cast<compute_t<OutT>>(detail::finish<OutT>(R::init()))}, op);
    return;
  }
  if (out.numel() == 1 || n == 0) {
    // Everything into one value: fixed blocks, partials merged in order.
    expr::PlanBuilder b(space);
    expr::add_leaves(e, b, dev, have, op);
    EMBER_CHECK(dev.is_cpu(), op, ": the CPU executor got tensors on ", dev.str());
    const expr::Plan p = b.collapse();
    int k = 0;
    const auto ev = expr::make_eval(e, p, k);
    const std::int64_t nblocks = std::max<std::int64_t>(1, (n + detail::kBlock - 1) / detail::kBlock);
    std::vector<typename R::acc> part(std::size_t(nblocks), R::init());
    const std::int64_t row = p.row_len();
    const int outer = p.outer_dims();
    parallel_for(0, nblocks, 2, [&](std::int64_t b0, std::int64_t b1) {
      auto local = ev;
      for (std::int64_t blk = b0; blk < b1; ++blk) {
        const std::int64_t a = blk * detail::kBlock, z = std::min(n, a + detail::kBlock);
        if (a >= z) continue;
        if (p.linear) {
          part[blk] = detail::reduce_range<R, decltype(local), expr::LinearIdx>(local, a, z, 0);
          continue;
        }
        typename R::acc acc = R::init();
        std::int64_t coords[kMaxDims] = {};
        std::int64_t o = a / row, j = a % row, i = a;
        for (int d = outer - 1; d >= 0; --d) {
          coords[d] = o % p.shape[d];
          o /= p.shape[d];
        }
        while (i < z) {
          local.set_row(coords, outer);
          const std::int64_t j1 = std::min(row, j + (z - i));
          acc = R::merge(acc, detail::reduce_range<R, decltype(local), expr::RowIdx>(local, j, j1, i - j));
          i += j1 - j;
          j = 0;
          for (int d = outer - 1; d >= 0; --d) {
            if (++coords[d] < p.shape[d]) break;
            coords[d] = 0;
          }
        }
        part[blk] = acc;
      }
    });
    typename R::acc total = R::init();
    for (auto& v : part) total = R::merge(total, v);
    if (out.numel() == 1) *out.data() = detail::finish<OutT>(total);
    return;
  }

  // Along some dims: out is operand 0 (stride 0 on reduced dims), leaves follow; the walk is expr::plan_reduce's.
  const expr::ReducePlan rp = expr::plan_reduce_into(out, e, space, dev, have, R::indexed, op);
  EMBER_CHECK(dev.is_cpu(), op, ": the CPU executor got tensors on ", dev.str());
  const expr::Plan& q = rp.q;
  const int nd = q.shape.n, nred = rp.nred, nkept = rp.nkept;
  const bool inner_reduced = rp.rows;
  int k = 1;
  const auto ev = expr::make_eval(e, q, k);
  const expr::OperandEval<OutT> ob(out.data(), q, 0);

  if (inner_reduced) {
    // q = [kept (nkept) | reduced (nred)], rows along the last reduced dim.
    std::int64_t nout = 1, inner_rows = 1;
    for (int i = 0; i < nkept; ++i) nout *= q.shape[i];
    for (int i = nkept; i < nd - 1; ++i) inner_rows *= q.shape[i];
    const std::int64_t row = q.shape[nd - 1];
    const std::int64_t grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, inner_rows * row));
    parallel_for(0, nout, grain, [&](std::int64_t o0, std::int64_t o1) {
      auto local = ev;
      auto lo = ob;
      std::int64_t coords[kMaxDims] = {};
      for (std::int64_t o = o0; o < o1; ++o) {
        std::int64_t t = o;
        for (int d = nkept - 1; d >= 0; --d) {
          coords[d] = t % q.shape[d];
          t /= q.shape[d];
        }
        for (int d = nkept; d < nd; ++d) coords[d] = 0;
        typename R::acc acc = R::init();
        for (std::int64_t r = 0; r < inner_rows; ++r) {
          local.set_row(coords, nd - 1);
          acc = R::merge(acc, detail::reduce_range<R, decltype(local), expr::RowIdx>(local, 0, row, r * row));
          for (int d = nd - 2; d >= nkept; --d) {
            if (++coords[d] < q.shape[d]) break;
            coords[d] = 0;
          }
        }
        for (int d = nkept; d < nd; ++d) coords[d] = 0;
        lo.set_row(coords, nd - 1);
        lo.at(expr::RowIdx{0}) = detail::finish<OutT>(acc);
      }
    });
  } else if constexpr (!R::indexed) {
    // q = [reduced (nred) | kept (nkept)], rows along the last kept dim; accumulate per output.
    std::int64_t nout = 1, nrows_red = 1;
    for (int i = nred; i < nd; ++i) nout *= q.shape[i];
    for (int i = 0; i < nred; ++i) nrows_red *= q.shape[i];
    const std::int64_t row = q.shape[nd - 1];
    const std::int64_t kept_rows = nout / row;
    std::vector<typename R::acc> acc(std::size_t(nout), R::init());
    const std::int64_t grain = std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(1, nrows_red * row));
    parallel_for(0, kept_rows, grain, [&](std::int64_t k0, std::int64_t k1) {
      auto local = ev;
      auto lo = ob;
      std::int64_t coords[kMaxDims] = {};
      for (std::int64_t kr = k0; kr < k1; ++kr) {
        typename R::acc* a = acc.data() + kr * row;
        std::int64_t t = kr;
        for (int d = nd - 2; d >= nred; --d) {
          coords[d] = t % q.shape[d];
          t /= q.shape[d];
        }
        for (int d = 0; d < nred; ++d) coords[d] = 0;
        for (std::int64_t r = 0; r < nrows_red; ++r) {
          local.set_row(coords, nd - 1);
          detail::accumulate_row<R>(a, local, row, r);
          for (int d = nred - 1; d >= 0; --d) {
            if (++coords[d] < q.shape[d]) break;
            coords[d] = 0;
          }
        }
        lo.set_row(coords, nd - 1);
        for (std::int64_t j = 0; j < row; ++j) lo.at(expr::RowIdx{j}) = detail::finish<OutT>(a[j]);
      }
    });
  }
}

}  // namespace ember::cpu
