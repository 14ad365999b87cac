// ember — the plan of one element-wise pass (Plan): its iteration space after merging the dims that every operand
// walks contiguously, with each operand's strides broadcast to it (PlanBuilder), and the set-up that adds an
// expression's tensor leaves to it as operands, checking that they are defined and on one device (OperandRef,
// add_operands, add_leaves; device_of). Host-side logic for both executors (cpu/, cuda/); the evaluators
// (evaluator.hpp) address the operands through the plan.
#pragma once

#include <cstdint>

#include "ember/config.hpp"
#include "ember/core/device.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/storage.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/leaf_traits.hpp"
#include "ember/expr/leaves.hpp"
#include "ember/expr/node_types.hpp"

namespace ember::expr {

/// Most operands (leaves plus outputs) one plan holds.
inline constexpr int kMaxOperands = 2 * kMaxLeaves + 8;

/// An iteration space after merging dims that every operand walks contiguously, with each operand's strides.
/// Outer dims come first; the last dim is the inner (row) loop.
struct Plan {
  Shape shape;  // collapsed extents; 0-d spaces become {1}
  int nops = 0;
  Shape st[kMaxOperands];
  bool linear = false;  // every operand is dense with unit stride over the whole space: use LinearIdx

  std::int64_t numel() const { return shape.numel(); }
  std::int64_t row_len() const { return shape.back(); }
  int outer_dims() const { return shape.n - 1; }
};

/// The plan of a dense 1-d space where every operand has unit stride (the executors' fast path).
inline const Plan& linear_plan() {
  static const Plan p = [] {
    Plan q;
    q.shape = Shape{1};
    q.nops = kMaxOperands;
    for (auto& st : q.st) st = Shape{1};
    q.linear = true;
    return q;
  }();
  return p;
}

/// Collects operands (broadcast to `space`), then collapse() merges dims.
class PlanBuilder {
 public:
  explicit PlanBuilder(const Shape& space) : space_(space) {}
  int add(const Shape& shape, const Shape& strides) {
    EMBER_CHECK(nops_ < kMaxOperands, "expression has too many operands (at most ", kMaxOperands, ")");
    st_[nops_] = broadcast_strides(shape, strides, space_);
    return nops_++;
  }
  /// An operand with explicit strides over the space (e.g. a reduction output with stride 0 on reduced dims).
  int add_raw(const Shape& strides) {
    EMBER_CHECK(nops_ < kMaxOperands, "expression has too many operands (at most ", kMaxOperands, ")");
    st_[nops_] = strides;
    return nops_++;
  }
  const Shape& strides(int k) const { return st_[k]; }

  Plan collapse() const {
    Plan p;
    collapse_into(p);
    return p;
  }
  /// collapse() into a plan the caller holds (a plan is a few KB: no copy).
  EMBER_HEADER_INLINE void collapse_into(Plan& p) const;

 private:
  Shape space_;
  Shape st_[kMaxOperands];
  int nops_ = 0;
};
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void PlanBuilder::collapse_into(Plan& p) const {
  p.nops = nops_;
  // Walk dims inner to outer, skipping size-1 dims and merging a dim into the one inside it when every
  // operand steps over the inner dim exactly once per step of the outer dim.
  std::int64_t ext[kMaxDims];
  std::int64_t st[kMaxOperands][kMaxDims];
  int nd = 0;
  for (int d = space_.n - 1; d >= 0; --d) {
    const std::int64_t n = space_[d];
    if (n == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; merge && k < nops_; ++k) merge = st_[k][d] == st[k][nd - 1] * ext[nd - 1];
    if (merge) {
      ext[nd - 1] *= n;
      continue;
    }
    ext[nd] = n;
    for (int k = 0; k < nops_; ++k) st[k][nd] = st_[k][d];
    ++nd;
  }
  if (nd == 0) {  // a single element (or a 0-d space)
    ext[0] = space_.numel();
    for (int k = 0; k < nops_; ++k) st[k][0] = 1;
    nd = 1;
  }
  p.shape.n = nd;
  for (int i = 0; i < nd; ++i) p.shape[i] = ext[nd - 1 - i];
  p.linear = nd == 1;
  for (int k = 0; k < nops_; ++k) {
    p.st[k].n = nd;
    for (int i = 0; i < nd; ++i) p.st[k][i] = st[k][nd - 1 - i];
    p.linear = p.linear && p.st[k][0] == 1;
  }
}
#endif

/// A tensor operand as the executors' set-up code sees it, without its dtype: planning, the device checks and the
/// aliasing checks then run in ordinary functions compiled once per program, not once per expression.
struct OperandRef {
  const Shape* shape = nullptr;
  const Shape* strides = nullptr;
  const void* data = nullptr;
  const StorageImpl* storage = nullptr;
  Device device = Device::cpu();
  bool defined = false;
};

template <class T>
OperandRef operand_ref(const Tensor<T>& t) {
  if (!t.defined()) return {};
  return {&t.shape(), &t.strides(), static_cast<const void*>(t.data()), t.storage().get(), t.device(), true};
}

/// The tensor leaves of e, in position order: an array with room for one more (never empty).
template <class E>
struct LeafRefs {
  OperandRef at[leaf_count<E>::value + 1];
  int n = 0;
  explicit LeafRefs(const E& e) {
    visit_leaves(e, [&](const auto& leaf) { at[n++] = operand_ref(leaf.tensor()); });
  }
  bool all_defined() const {
    for (int k = 0; k < n; ++k)
      if (!at[k].defined) return false;
    return true;
  }
};

/// Adds operands to the plan builder, in order, checking each is defined and all are on one device.
EMBER_HEADER_INLINE void add_operands(PlanBuilder& b, const OperandRef* ops, int n, Device& dev, bool& have_dev,
                                      const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void add_operands(PlanBuilder& b, const OperandRef* ops, int n, Device& dev, bool& have_dev,
                                      const char* op) {
  for (int k = 0; k < n; ++k) {
    const OperandRef& t = ops[k];
    EMBER_CHECK(t.defined, op, ": an operand is an undefined tensor");
    if (!have_dev) {
      dev = t.device;
      have_dev = true;
    }
    EMBER_CHECK(t.device == dev, op, ": operands are on different devices (", dev.str(), " and ", t.device.str(), ")");
    b.add(*t.shape, *t.strides);
  }
}
#endif

/// Adds every tensor leaf of `e` to the plan builder, in position order, checking devices agree.
template <class E>
void add_leaves(const E& e, PlanBuilder& b, Device& dev, bool& have_dev, const char* op) {
  const LeafRefs<E> refs(e);
  add_operands(b, refs.at, refs.n, dev, have_dev, op);
}

/// The device of an expression's first tensor leaf (the CPU for an expression of scalars only).
template <class E>
Device device_of(const E& e) {
  Device d = Device::cpu();
  bool have = false;
  visit_leaves(e, [&](const auto& leaf) {
    if (!have) d = leaf.tensor().device();
    have = true;
  });
  return d;
}

}  // namespace ember::expr
