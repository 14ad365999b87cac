// ember — the write checks every executor makes before an element-wise pass into an existing tensor: the output
// has no broadcast (stride 0) dims, and no operand reads the output's memory with a different geometry (which
// would need a temporary). Host-side logic shared by cpu/ and cuda/.
#pragma once

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/evaluator.hpp"

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

}  // namespace ember::expr
