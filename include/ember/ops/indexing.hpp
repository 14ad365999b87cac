// ember — copying ops without autograd: cat, index_select and its adjoint index_add.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/profile/range.hpp"

namespace ember::ops {

/// Concatenates tensors along dim (each piece is one strided copy into a slice of the result).
template <class T>
Tensor<T> cat(const std::vector<Tensor<T>>& ts, std::int64_t dim) {
  EMBER_PROFILE_RANGE("cat");
  EMBER_CHECK(!ts.empty(), "cat: expected a non-empty list of tensors");
  const Tensor<T>& f = ts[0];
  EMBER_CHECK(f.dim() > 0, "cat: zero-dimensional tensor (shape ", f.shape().str(), ") cannot be concatenated");
  const int d = wrap_dim(dim, f.dim(), "cat");
  Shape out = f.shape();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const Tensor<T>& t = ts[i];
    EMBER_CHECK(t.dim() == f.dim(), "cat: tensor ", i, " has shape ", t.shape().str(), " but tensor 0 has shape ",
                f.shape().str(), " (same number of dims expected)");
    EMBER_CHECK(t.device() == f.device(), "cat: tensor ", i, " is on ", t.device().str(), ", tensor 0 on ",
                f.device().str());
    for (int k = 0; k < f.dim(); ++k)
      EMBER_CHECK(k == d || t.shape()[k] == f.shape()[k], "cat: tensor ", i, " has shape ", t.shape().str(),
                  " but tensor 0 has shape ", f.shape().str(), "; sizes must match except in dim ", d);
    EMBER_CHECK(!ember::detail::add_overflow(total, t.shape()[d], &total), "cat: the size along dim ", d,
                " overflows int64 at tensor ", i, " (shape ", t.shape().str(), ")");
  }
  out[d] = total;
  Tensor<T> r = empty<T>(out, f.device());
  std::int64_t at = 0;
  for (const auto& t : ts) {
    const std::int64_t n = t.shape()[d];
    if (n) ops::assign(r.as_strided_raw(t.shape(), r.strides(), at * r.strides()[d]), expr::TensorLeaf<T, false>{&t}, "cat");
    at += n;
  }
  return r;
}

/// Reads a 1-D int64 index (any stride), checking every entry lies in [0, n): as torch.index_select and
/// index_add, a negative index is an error, not a count from the end (a corrupt -1 must not pick the last row).
/// `shape`, when given, is the indexed tensor's (for the error message).
inline std::vector<std::int64_t> read_index(const Tensor<std::int64_t>& idx, std::int64_t n, const char* op,
                                            const Shape& shape = Shape(), int dim = -1) {
  EMBER_CHECK(idx.dim() == 1, op, ": index must be 1-D, got shape ", idx.shape().str());
  idx.check_cpu(op);
  std::vector<std::int64_t> r(std::size_t(idx.numel()));
  for (std::int64_t i = 0; i < idx.numel(); ++i) {
    const std::int64_t v = idx.data()[i * idx.strides()[0]];
    EMBER_CHECK(v >= 0 && v < n, op, ": index ", v, " at position ", i, " is out of range [0, ", n, ")",
                dim >= 0 ? " for dim " + std::to_string(dim) : std::string(), " of size ", n,
                shape.n ? " (shape " + shape.str() + ")" : std::string());
    r[std::size_t(i)] = v;
  }
  return r;
}

/// Rows (along dim) of x picked by a 1-D int64 index with entries in [0, x.size(dim)), as torch.index_select.
template <class T>
Tensor<T> index_select(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& idx) {
  EMBER_PROFILE_RANGE("index_select");
  const int d = wrap_dim(dim, x.dim(), "index_select");
  const std::int64_t n = x.shape()[d];
  const auto ix = read_index(idx, n, "index_select", x.shape(), d);
  Shape out = x.shape();
  out[d] = idx.numel();
  Tensor<T> r = empty<T>(out, x.device());
  for (std::int64_t i = 0; i < std::int64_t(ix.size()); ++i) {
    const std::int64_t v = ix[std::size_t(i)];
    Tensor<T> src = x.as_strided_raw(x.shape(), x.strides(), x.storage_offset()).select(d, v);
    ops::assign(r.as_strided_raw(r.shape(), r.strides(), 0).select(d, i), expr::TensorLeaf<T, false>{&src},
                "index_select");
  }
  return r;
}

/// The adjoint of index_select: out (shape `shape`) with src's slices added at the indexed positions.
template <class T>
Tensor<T> index_add(const Shape& shape, std::int64_t dim, const Tensor<std::int64_t>& idx, const Tensor<T>& src) {
  const int d = wrap_dim(dim, shape.n, "index_add");
  const std::int64_t n = shape[d];
  Tensor<T> out = zeros<T>(shape, src.device());
  const auto ix = read_index(idx, n, "index_add", shape, d);
  for (std::int64_t i = 0; i < std::int64_t(ix.size()); ++i) {
    const std::int64_t v = ix[std::size_t(i)];
    Tensor<T> dst = out.select(d, v);
    Tensor<T> s = src.as_strided_raw(src.shape(), src.strides(), src.storage_offset()).select(d, i);
    ops::assign(dst, expr::make_binary(ops_table::Add{}, dst, s), "index_add");
  }
  return out;
}

}  // namespace ember::ops
