// ember — copying and indexing ops without autograd: cat, index_select and its adjoint index_add, gather, scatter,
// scatter_add and index_add along a dim, and triangle masks. The element loops are cpu/index.hpp's; CUDA tensors run
// cuda/index.cuh's kernels (deterministic: sorting-based reductions) when the translation unit is compiled by nvcc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/index.hpp"
#include "ember/cuda/device.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/profile/range.hpp"

#if EMBER_WITH_CUDA && defined(__CUDACC__)
#include "ember/cuda/index.cuh"
#define EMBER_CUDA_INDEX 1
#else
#define EMBER_CUDA_INDEX 0
#endif

namespace ember::ops {

namespace detail {
/// The first entry (row-major) of a CUDA index tensor outside [0, n): its position (-1 when none) and value. Waits
/// for the device.
inline std::pair<std::int64_t, std::int64_t> first_bad_on_device(const Tensor<std::int64_t>& idx, std::int64_t n,
                                                                 const char* op) {
#if EMBER_CUDA_INDEX
  (void)op;
  cuda::check_device(idx.device(), op);
  cuda::DeviceGuard guard(idx.device());
  const cuda::BadIndex b = cuda::first_bad_index(idx.data(), idx.shape(), idx.strides(), 0, n, idx.device().index);
  return {b.position, b.value};
#else
  (void)n;
  no_cuda_kernel(op, idx.device(), "the index kernels");
#endif
}

[[noreturn, gnu::cold, gnu::noinline]] inline void index_range_error(const char* op, std::int64_t v, std::int64_t i,
                                                                   std::int64_t n, const Shape& shape, int dim) {
  throw Error(::ember::detail::concat(op, ": index ", v, " at position ", i, " is out of range [0, ", n, ")",
                                      dim >= 0 ? " for dim " + std::to_string(dim) : std::string(), " of size ", n,
                                      shape.n ? " (shape " + shape.str() + ")" : std::string()));
}
}  // namespace detail

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
  if (i >= 0) detail::index_range_error(op, idx.data()[i * idx.strides()[0]], i, n, shape, dim);
  std::vector<std::int64_t> r(std::size_t(idx.numel()));
  cpu::fill_index(r.data(), idx.numel(), [&](std::int64_t k) { return idx.data()[k * idx.strides()[0]]; });
  return r;
}

/// read_index's checks for an index on a CUDA device (nothing is read back but the first bad entry, if any).
inline void check_index_on_device(const Tensor<std::int64_t>& idx, std::int64_t n, const char* op, Device want,
                                  const Shape& shape = Shape(), int dim = -1) {
  EMBER_CHECK(idx.dim() == 1, op, ": index must be 1-D, got shape ", idx.shape().str());
  EMBER_CHECK(idx.device() == want, op, ": the index is on ", idx.device().str(), " but the tensor",
              shape.n ? " of shape " + shape.str() : std::string(), " is on ", want.str());
  const auto [i, v] = detail::first_bad_on_device(idx, n, op);
  if (i >= 0) detail::index_range_error(op, v, i, n, shape, dim);
}

namespace detail {
/// x's extents before, along and after dim d: (outer, n, inner).
inline void split_at(const Shape& s, int d, std::int64_t& outer, std::int64_t& inner) {
  outer = inner = 1;
  for (int k = 0; k < d; ++k) outer *= s[k];
  for (int k = d + 1; k < s.n; ++k) inner *= s[k];
}

#if EMBER_CUDA_INDEX
template <class T>
Tensor<T> index_select_cuda(const Tensor<T>& x, int d, const Tensor<std::int64_t>& idx) {
  const std::int64_t n = x.shape()[d];
  check_index_on_device(idx, n, "index_select", x.device(), x.shape(), d);
  cuda::DeviceGuard guard(x.device());
  Shape out = x.shape();
  out[d] = idx.numel();
  Tensor<T> r = empty<T>(out, x.device());
  std::int64_t outer, inner;
  split_at(x.shape(), d, outer, inner);
  const Tensor<T> xc = dense(x);
  const Tensor<std::int64_t> ic = dense(idx);
  cuda::index_select(xc.data(), ic.data(), r.data(), outer, n, idx.numel(), inner, x.device().index);
  return r;
}

/// out (contiguous) += alpha * src at the rows idx names along d, on the device.
template <class T>
void index_add_cuda(const Tensor<T>& out, int d, const Tensor<std::int64_t>& idx, const Tensor<T>& src, double alpha) {
  cuda::DeviceGuard guard(out.device());
  std::int64_t outer, inner;
  split_at(out.shape(), d, outer, inner);
  const Tensor<T> sc = dense(src);
  cuda::index_add(out.data(), idx.data(), idx.strides()[0], sc.data(), outer, out.shape()[d], idx.numel(), inner,
                  alpha, out.device().index);
  out.bump_version();
}
#endif
}  // namespace detail

/// Rows (along dim) of x picked by a 1-D int64 index with entries in [0, x.size(dim)), as torch.index_select.
template <class T>
Tensor<T> index_select(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& idx) {
  EMBER_PROFILE_RANGE("index_select");
  const int d = wrap_dim(dim, x.dim(), "index_select");
  const std::int64_t n = x.shape()[d];
  if (x.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    return detail::index_select_cuda(x, d, idx);
#else
    detail::no_cuda_kernel("index_select", x.device(), "the index kernels");
#endif
  }
  EMBER_CHECK(idx.device() == x.device(), "index_select: the index is on ", idx.device().str(),
              " but the tensor of shape ", x.shape().str(), " is on ", x.device().str());
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
  if (src.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    check_index_on_device(idx, n, "index_add", src.device(), shape, d);
    Tensor<T> out = zeros<T>(shape, src.device());
    detail::index_add_cuda(out, d, idx, src, 1.0);
    return out;
#else
    detail::no_cuda_kernel("index_add", src.device(), "the index kernels");
#endif
  }
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

// ---- gather, scatter and index_add along a dim ----------------------------------------------------------------------

/// The checks gather, scatter and scatter_add share: index is int64 on x's device with as many dims as x, no larger
/// than x outside `dim` (and no larger than src anywhere, for the scatters), every entry in [0, x.size(dim)).
template <class T>
void check_scatter_index(const char* op, const Tensor<T>& x, int d, const Tensor<std::int64_t>& index,
                         const Tensor<T>* src) {
  EMBER_CHECK(index.device() == x.device(), op, ": the index is on ", index.device().str(), " but the input (shape ",
              x.shape().str(), ") is on ", x.device().str());
  EMBER_CHECK(!src || src->device() == x.device(), op, ": src is on ", src ? src->device().str() : std::string(),
              " but the input (shape ", x.shape().str(), ") is on ", x.device().str());
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
  }
  const std::int64_t n = x.shape()[d];
  std::int64_t v = 0;
  bool bad = false;
  if (x.device().is_cuda()) {
    const auto [i, value] = detail::first_bad_on_device(index, n, op);
    bad = i >= 0;
    v = value;
  } else {
    x.check_cpu(op);
    bad = cpu::first_bad_index(index, n, v);
  }
  EMBER_CHECK(!bad, op, ": index ", v, " is out of bounds for dim ", d, " with size ", n, " (input shape ",
              x.shape().str(), ")");
}

namespace detail {
#if EMBER_CUDA_INDEX
/// The walk over index's positions reading x (gather) or writing it (the scatters), and src.
template <class T>
cuda::IndexWalk index_walk(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src) {
  cuda::IndexWalk w;
  w.shape = index.shape();
  w.idx_strides = index.strides();
  w.x_strides = x.strides();
  if (src) w.src_strides = src->strides();
  w.dim = d;
  return w;
}

template <class T>
void scatter_cuda(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src, T value,
                  bool add) {
  EMBER_CHECK(out.is_contiguous(), add ? "scatter_add" : "scatter", ": the CUDA kernel writes a contiguous result, ",
              "got strides ", out.strides().str());
  cuda::DeviceGuard guard(out.device());
  cuda::scatter(out.data(), out.numel(), index.data(), index_walk(out, d, index, src), src ? src->data() : nullptr,
                value, add, out.device().index);
  out.bump_version();
}
#endif
}  // namespace detail

/// out (index's shape) = x gathered along d (checked by check_scatter_index).
template <class T>
Tensor<T> gather(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index) {
  if (x.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    cuda::DeviceGuard guard(x.device());
    Tensor<T> out = empty<T>(index.shape(), x.device());
    cuda::gather(x.data(), index.data(), detail::index_walk<T>(x, d, index, nullptr), out.data(), x.device().index);
    return out;
#else
    detail::no_cuda_kernel("gather", x.device(), "the index kernels");
#endif
  }
  return cpu::gather(x, d, index);
}

/// out[..i_d..] += src[..] at i_d = index[..] along d, for every position of index (out: any strides on the CPU,
/// contiguous on CUDA). On CUDA the sums are deterministic (sorted by target, in position order).
template <class T>
void scatter_add_(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>& src) {
  if (out.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    return detail::scatter_cuda(out, d, index, &src, T(0), true);
#else
    detail::no_cuda_kernel("scatter_add", out.device(), "the index kernels");
#endif
  }
  cpu::scatter_add(out, d, index, src);
}

/// out[..i_d..] = src[..] (or value, src null) at i_d = index[..] along d; a repeated position keeps the last write.
template <class T>
void scatter_(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src, T value) {
  if (out.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    return detail::scatter_cuda(out, d, index, src, value, false);
#else
    detail::no_cuda_kernel("scatter", out.device(), "the index kernels");
#endif
  }
  cpu::scatter(out, d, index, src, value);
}

/// The gradient of gather: zeros of the input's shape with grad added back at the gathered positions.
template <class T>
Tensor<T> gather_backward(const Shape& in_shape, int d, const Tensor<std::int64_t>& index, const Tensor<T>& grad) {
  Tensor<T> g = zeros<T>(in_shape, grad.device());
  scatter_add_(g, d, index, grad);
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
  if (g.device().is_cuda()) ops::assign(part, expr::TensorLeaf<T, false>{&g}, "pad_to");
  else cpu::copy_elements(g, part);
  return r;
}

/// index_add's checks (torch.index_add: x with alpha * src's slices added at the rows a 1-D index names along d):
/// index, src and x on one device, src of x's shape but index.numel() along d, every entry in [0, x.size(d)).
/// Returns the rows on the host for CPU tensors (nothing for CUDA ones).
template <class T>
std::vector<std::int64_t> check_index_add(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index,
                                          const Tensor<T>& src) {
  EMBER_CHECK(src.device() == x.device(), "index_add: src is on ", src.device().str(), " but the input (shape ",
              x.shape().str(), ") is on ", x.device().str());
  std::vector<std::int64_t> ix;
  if (x.device().is_cuda()) check_index_on_device(index, x.shape()[d], "index_add", x.device(), x.shape(), d);
  else ix = read_index(index, x.shape()[d], "index_add", x.shape(), d);
  Shape want = x.shape();
  want[d] = index.numel();
  EMBER_CHECK(src.shape() == want, "index_add: src has shape ", src.shape().str(), ", expected ", want.str(),
              " (the input's shape ", x.shape().str(), " with dim ", d, " the index's length ", index.numel(), ")");
  return ix;
}

/// r[..ix[i_d]..] += alpha * src[..i_d..] along d in double (r: a contiguous copy the caller owns); the rows are ix
/// (check_index_add's) on the CPU, index on CUDA (deterministic: sorted by row, in position order).
template <class T>
void index_add_(const Tensor<T>& r, int d, const std::vector<std::int64_t>& ix, const Tensor<std::int64_t>& index,
                const Tensor<T>& src, double alpha) {
  if (r.device().is_cuda()) {
#if EMBER_CUDA_INDEX
    (void)ix;
    return detail::index_add_cuda(r, d, index, src, alpha);
#else
    (void)index, (void)src, (void)alpha;
    detail::no_cuda_kernel("index_add", r.device(), "the index kernels");
#endif
  }
  cpu::index_add(r, d, ix, src, alpha);
}

/// t = t * alpha in double, in place (t contiguous).
template <class T>
void scale_in_double_(const Tensor<T>& t, double alpha) {
  if (t.device().is_cuda()) {
    ops::assign(t, cast<T>(cast<double>(t) * alpha), "scale");
    return;
  }
  cpu::scale_(t.data(), t.numel(), alpha);
}

/// The first entry (row-major) of an index tensor on any device outside [0, n): its position (-1 when none) and
/// value.
/// (A template only so that it is compiled where it is called, after the Tensor members it uses.)
template <class Deferred = void>
std::pair<std::int64_t, std::int64_t> first_out_of_range(const Tensor<std::int64_t>& idx, std::int64_t n,
                                                         const char* op) {
  if (idx.device().is_cuda()) return detail::first_bad_on_device(idx, n, op);
  const Tensor<std::int64_t> ic = idx.contiguous();
  const std::int64_t i = cpu::first_out_of_range(ic.data(), ic.numel(), 1, 0, n);
  return {i, i >= 0 ? ic.data()[i] : 0};
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
