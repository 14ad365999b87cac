// ember — copying and indexing ops without autograd: cat, index_select and its adjoint index_add, gather, scatter,
// scatter_add and index_add along a dim, and triangle masks. The element loops are cpu/index.hpp's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/index.hpp"
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
  const std::int64_t i = cpu::first_out_of_range(idx.data(), idx.numel(), idx.strides()[0], 0, n);
  EMBER_CHECK(i < 0, op, ": index ", idx.data()[i * idx.strides()[0]], " at position ", i, " is out of range [0, ", n,
              ")", dim >= 0 ? " for dim " + std::to_string(dim) : std::string(), " of size ", n,
              shape.n ? " (shape " + shape.str() + ")" : std::string());
  std::vector<std::int64_t> r(std::size_t(idx.numel()));
  cpu::fill_index(r.data(), idx.numel(), [&](std::int64_t k) { return idx.data()[k * idx.strides()[0]]; });
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

// ---- gather, scatter and index_add along a dim (CPU) --------------------------------------------------------------

/// The checks gather, scatter and scatter_add share: index is int64 on the CPU with as many dims as x, no larger
/// than x outside `dim` (and no larger than src anywhere, for the scatters), every entry in [0, x.size(dim)).
template <class T>
void check_scatter_index(const char* op, const Tensor<T>& x, int d, const Tensor<std::int64_t>& index,
                         const Tensor<T>* src) {
  x.check_cpu(op);
  index.check_cpu(op);
  EMBER_CHECK(index.dim() == x.dim(), op, ": index (shape ", index.shape().str(), ") must have as many dims as the ",
              "input (shape ", x.shape().str(), ")");
  for (int k = 0; k < x.dim(); ++k) {
    EMBER_CHECK(k == d || index.shape()[k] <= x.shape()[k], op, ": index shape ", index.shape().str(),
                " is larger than the input's ", x.shape().str(), " in dim ", k, " (only dim ", d, " may be)");
    if (src)
      EMBER_CHECK(index.shape()[k] <= src->shape()[k], op, ": index shape ", index.shape().str(),
                  " is larger than src's ", src->shape().str(), " in dim ", k);
  }
  if (src) {
    EMBER_CHECK(src->dim() == x.dim(), op, ": src (shape ", src->shape().str(), ") must have as many dims as the ",
                "input (shape ", x.shape().str(), ")");
    src->check_cpu(op);
  }
  const std::int64_t n = x.shape()[d];
  std::int64_t v = 0;
  EMBER_CHECK(!cpu::first_bad_index(index, n, v), op, ": index ", v, " is out of bounds for dim ", d, " with size ", n,
              " (input shape ", x.shape().str(), ")");
}

/// out (index's shape) = x gathered along d (checked by check_scatter_index).
template <class T>
Tensor<T> gather(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index) {
  return cpu::gather(x, d, index);
}

/// out[..i_d..] += src[..] at i_d = index[..] along d, for every position of index (out: any strides).
template <class T>
void scatter_add_(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>& src) {
  cpu::scatter_add(out, d, index, src);
}

/// out[..i_d..] = src[..] (or value, src null) at i_d = index[..] along d; a repeated position keeps the last write.
template <class T>
void scatter_(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src, T value) {
  cpu::scatter(out, d, index, src, value);
}

/// The gradient of gather: zeros of the input's shape with grad added back at the gathered positions.
template <class T>
Tensor<T> gather_backward(const Shape& in_shape, int d, const Tensor<std::int64_t>& index, const Tensor<T>& grad) {
  Tensor<T> g = zeros<T>(in_shape);
  cpu::scatter_add(g, d, index, grad);
  return g;
}

/// A tensor of `shape` holding zeros except g (a smaller tensor) in its leading corner: the gradient of a src
/// that was larger than the index it was read through.
template <class T>
Tensor<T> pad_to(const Tensor<T>& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  Tensor<T> r = zeros<T>(shape, g.device());
  Tensor<T> part = r;
  for (int k = 0; k < shape.n; ++k) part = part.narrow(k, 0, g.shape()[k]);
  cpu::copy_elements(g, part);
  return r;
}

/// r[..ix[i_d]..] += alpha * src[..i_d..] along d in double (r: a copy the caller owns).
template <class T>
void index_add_(const Tensor<T>& r, int d, const std::vector<std::int64_t>& ix, const Tensor<T>& src, double alpha) {
  cpu::index_add(r, d, ix, src, alpha);
}

/// t = t * alpha in double, in place (t contiguous on the CPU).
template <class T>
void scale_in_double_(const Tensor<T>& t, double alpha) {
  cpu::scale_(t.data(), t.numel(), alpha);
}

/// The (r, c) boolean mask of the lower (j - i <= diagonal) or upper (j - i >= diagonal) triangle, on `device`. (A
/// template only so that it is compiled where it is called, after the Tensor members it uses.)
template <class Deferred = void>
Tensor<bool> triangle_mask(std::int64_t r, std::int64_t c, std::int64_t diagonal, bool lower, Device device) {
  Tensor<bool> keep = cpu::triangle_mask(r, c, diagonal, lower);
  if (!device.is_cpu()) keep = keep.to(device);
  return keep;
}

}  // namespace ember::ops
