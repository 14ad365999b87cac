// ember — the tensor ops a transformer reaches for, with PyTorch's semantics: tril/triu, masked_fill,
// split/chunk/unbind, gather/scatter/scatter_add/index_add, sort/argsort/topk, cumsum/cumprod, flip, roll,
// repeat/tile, outer, baddbmm and multinomial; einsum is in autograd/einsum.hpp (included here).
//
// Where an op is a composition of differentiable pieces (views, fused expressions, cat, index_select, bmm) it is
// written as one and runs on every device those run on; the ones with a loop of their own (gather, scatter,
// index_add, sort, cumsum, cumprod, multinomial) call ops/indexing.hpp and ops/sort.hpp (their loops are
// cpu/index.hpp's and cpu/sort.hpp's), run on the CPU and say so for a CUDA tensor.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/autograd/einsum.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/autograd/shape_ops.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/indexing.hpp"
#include "ember/ops/sort.hpp"

namespace ember {

namespace detail {

/// A scalar for an expression over Tensor<T>: the value as double for floating T (half and bfloat16 have no
/// scalar operands of their own), as T for integers.
template <class T>
auto expr_scalar(double v) {
  if constexpr (is_floating_v<T>) return v;
  else return T(v);
}

}  // namespace detail

namespace autograd {
template <class T>
struct GatherNode final : TypedNode<T> {
  Shape in_shape;
  int dim = 0;
  Tensor<std::int64_t> index;
  const char* name() const override { return "GatherBackward"; }
  void release() override { index = Tensor<std::int64_t>(); }
  void backward() override {
    this->template deliver<T>(0, ops::gather_backward(in_shape, dim, index, this->grad));
  }
};

/// scatter (add = false) and scatter_add (add = true): next[0] is the input, next[1] src (absent for a value).
template <class T>
struct ScatterNode final : TypedNode<T> {
  int dim = 0;
  bool add = false;
  Shape src_shape;
  Tensor<std::int64_t> index;
  const char* name() const override { return add ? "ScatterAddBackward" : "ScatterBackward"; }
  void release() override { index = Tensor<std::int64_t>(); }
  void backward() override {
    const Tensor<T>& g = this->grad;
    if (this->next[0]) {
      if (add) {
        this->template deliver<T>(0, g);
      } else {  // the overwritten positions do not depend on the input
        Tensor<T> gx = g.clone();
        ops::scatter_(gx, dim, index, static_cast<const Tensor<T>*>(nullptr), T(0));
        this->template deliver<T>(0, std::move(gx));
      }
    }
    if (this->next.size() > 1 && this->next[1])
      this->template deliver<T>(1, ops::pad_to(ops::gather(g, dim, index), src_shape));
  }
};

template <class T>
struct IndexAddNode final : TypedNode<T> {
  int dim = 0;
  double alpha = 1;
  Tensor<std::int64_t> index;
  const char* name() const override { return "IndexAddBackward"; }
  void release() override { index = Tensor<std::int64_t>(); }
  void backward() override {
    const Tensor<T>& g = this->grad;
    if (this->next[0]) this->template deliver<T>(0, g);
    if (this->next[1]) {
      Tensor<T> gs = ops::index_select(g, dim, index);
      if (alpha != 1) ops::scale_in_double_(gs, alpha);
      this->template deliver<T>(1, std::move(gs));
    }
  }
};

/// cumsum (prod = false) and cumprod along dim of a contiguous input.
template <class T>
struct CumNode final : TypedNode<T> {
  int dim = 0;
  bool prod = false;
  Tensor<T> x, y;  // cumprod's input and output (contiguous)
  const char* name() const override { return prod ? "CumprodBackward" : "CumsumBackward"; }
  void release() override { x = y = Tensor<T>(); }
  void backward() override {
    this->template deliver<T>(0, ops::cumulative_backward(this->grad, x, y, dim, prod));
  }
};
}  // namespace autograd

// ---- masks ---------------------------------------------------------------------------------------------------

namespace detail {
template <class T>
Tensor<T> triangle(const Tensor<T>& x, std::int64_t diagonal, bool lower, const char* op) {
  EMBER_CHECK(x.dim() >= 2, op, ": expected a tensor with at least 2 dims, got shape ", x.shape().str());
  const std::int64_t r = x.shape()[x.dim() - 2], c = x.shape()[x.dim() - 1];
  const Tensor<bool> keep = ops::triangle_mask(r, c, diagonal, lower, x.device());
  return Tensor<T>(where(keep, x, expr_scalar<T>(0)));
}
}  // namespace detail

/// The lower triangle of the last two dims (elements with j - i <= diagonal), zeros elsewhere: torch.tril.
template <class T>
Tensor<T> tril(const Tensor<T>& x, std::int64_t diagonal = 0) {
  return detail::triangle(x, diagonal, true, "tril");
}
/// The upper triangle of the last two dims (elements with j - i >= diagonal), zeros elsewhere: torch.triu.
template <class T>
Tensor<T> triu(const Tensor<T>& x, std::int64_t diagonal = 0) {
  return detail::triangle(x, diagonal, false, "triu");
}

/// x with `value` where mask (bool, broadcastable to x's shape) is true: torch.masked_fill.
template <class T>
Tensor<T> masked_fill(const Tensor<T>& x, const Tensor<bool>& mask, double value) {
  EMBER_CHECK(mask.device() == x.device(), "masked_fill: the mask is on ", mask.device().str(), ", the input on ",
              x.device().str());
  EMBER_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), "masked_fill: the mask (shape ",
              mask.shape().str(), ") must broadcast to the input's shape ", x.shape().str());
  return Tensor<T>(where(mask, detail::expr_scalar<T>(value), x));
}

// ---- splitting (views: their gradients flow back through the view's backward) ---------------------------------

/// Pieces of split_size along dim (the last one smaller when the size does not divide): torch.split.
template <class T>
std::vector<Tensor<T>> split(const Tensor<T>& x, std::int64_t split_size, std::int64_t dim = 0) {
  const int d = wrap_dim(dim, x.dim(), "split");
  const std::int64_t n = x.shape()[d];
  EMBER_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, got ", split_size,
              " (shape ", x.shape().str(), ", dim ", d, ")");
  std::vector<Tensor<T>> r;
  if (n == 0) return {x};
  for (std::int64_t at = 0; at < n; at += split_size) r.push_back(x.narrow(d, at, std::min(split_size, n - at)));
  return r;
}
/// Pieces of the given sizes along dim (they must add up to its size): torch.split with a list.
template <class T>
std::vector<Tensor<T>> split(const Tensor<T>& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0) {
  const int d = wrap_dim(dim, x.dim(), "split");
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    EMBER_CHECK(s >= 0, "split: sizes must be non-negative, got ", s);
    total += s;
  }
  EMBER_CHECK(total == x.shape()[d], "split: the sizes add up to ", total, " but dim ", d, " of shape ",
              x.shape().str(), " has size ", x.shape()[d]);
  std::vector<Tensor<T>> r;
  std::int64_t at = 0;
  for (std::int64_t s : sizes) {
    r.push_back(x.narrow(d, at, s));
    at += s;
  }
  return r;
}
/// `chunks` pieces of ceil(size / chunks) along dim (fewer when the size runs out first): torch.chunk.
template <class T>
std::vector<Tensor<T>> chunk(const Tensor<T>& x, std::int64_t chunks, std::int64_t dim = 0) {
  EMBER_CHECK(chunks > 0, "chunk: chunks must be positive, got ", chunks);
  const int d = wrap_dim(dim, x.dim(), "chunk");
  const std::int64_t n = x.shape()[d];
  const std::int64_t size = (n + chunks - 1) / chunks;
  if (size == 0) return std::vector<Tensor<T>>(std::size_t(chunks), x);  // an empty dim: chunks empty pieces
  return split(x, size, d);
}
/// Every slice along dim, each without that dim: torch.unbind.
template <class T>
std::vector<Tensor<T>> unbind(const Tensor<T>& x, std::int64_t dim = 0) {
  const int d = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor<T>> r;
  for (std::int64_t i = 0; i < x.shape()[d]; ++i) r.push_back(x.select(d, i));
  return r;
}

// ---- gather and scatter ----------------------------------------------------------------------------------------

/// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (and likewise for other dims): torch.gather. index is int64
/// with x's number of dims, no larger than x outside dim; entries must lie in [0, x.size(dim)).
template <class T>
Tensor<T> gather(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index) {
  const int d = wrap_dim(dim, x.dim(), "gather");
  ops::check_scatter_index<T>("gather", x, d, index, nullptr);
  Tensor<T> r = ops::gather(x, d, index);
  if constexpr (is_floating_v<T>) {
    if (x.requires_grad() && is_grad_enabled()) {
      auto node = std::make_shared<autograd::GatherNode<T>>();
      node->in_shape = x.shape();
      node->dim = d;
      node->index = index.clone();
      node->next.push_back(autograd::gradient_edge(x));
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}

namespace detail {
template <class T>
Tensor<T> scatter_impl(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src, T value,
                       bool add, const char* op) {
  ops::check_scatter_index<T>(op, x, d, index, src);
  Tensor<T> r;
  {
    NoGradGuard ng;
    r = x.detach().clone();
  }
  if (add) ops::scatter_add_(r, d, index, *src);
  else ops::scatter_(r, d, index, src, value);
  if constexpr (is_floating_v<T>) {
    const bool sg = src && src->requires_grad();
    if ((x.requires_grad() || sg) && is_grad_enabled()) {
      auto node = std::make_shared<autograd::ScatterNode<T>>();
      node->dim = d;
      node->add = add;
      node->index = index.clone();
      node->next.push_back(autograd::gradient_edge(x));
      if (src) {
        node->src_shape = src->shape();
        node->next.push_back(autograd::gradient_edge(*src));
      }
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}
}  // namespace detail

/// x with src's values written at the positions index names along dim (out-of-place torch.scatter). Where index
/// repeats a position the last write wins (PyTorch leaves that unspecified). src may be larger than index: only its
/// leading corner is read and gets a gradient (PyTorch's backward refuses such a src).
template <class T>
Tensor<T> scatter(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index, const Tensor<T>& src) {
  return detail::scatter_impl(x, wrap_dim(dim, x.dim(), "scatter"), index, &src, T(0), false, "scatter");
}
/// x with `value` written at the positions index names along dim.
template <class T>
Tensor<T> scatter(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index, double value) {
  return detail::scatter_impl<T>(x, wrap_dim(dim, x.dim(), "scatter"), index, nullptr, T(value), false, "scatter");
}
/// x with src's values added at the positions index names along dim (repeats accumulate): torch.scatter_add.
template <class T>
Tensor<T> scatter_add(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index, const Tensor<T>& src) {
  return detail::scatter_impl(x, wrap_dim(dim, x.dim(), "scatter_add"), index, &src, T(0), true, "scatter_add");
}

/// x with alpha * src's slices added at the rows (along dim) a 1-D int64 index names (repeats accumulate):
/// torch.index_add. src has x's shape except src.size(dim) == index.numel().
template <class T>
Tensor<T> index_add(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index, const Tensor<T>& src,
                    double alpha = 1) {
  const int d = wrap_dim(dim, x.dim(), "index_add");
  const auto ix = ops::check_index_add(x, d, index, src);  // the rows, on the host for CPU tensors
  Tensor<T> r;
  {
    NoGradGuard ng;
    r = x.detach().clone();
  }
  ops::index_add_(r, d, ix, index, src, alpha);
  if constexpr (is_floating_v<T>) {
    if ((x.requires_grad() || src.requires_grad()) && is_grad_enabled()) {
      auto node = std::make_shared<autograd::IndexAddNode<T>>();
      node->dim = d;
      node->alpha = alpha;
      node->index = index.clone();
      node->next.push_back(autograd::gradient_edge(x));
      node->next.push_back(autograd::gradient_edge(src));
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}

// ---- sorting -----------------------------------------------------------------------------------------------------

/// What sort and topk return (torch's (values, indices) named tuple); `auto [v, i] = sort(x);` works.
template <class T>
struct SortResult {
  Tensor<T> values;               ///< The sorted (or top-k) values.
  Tensor<std::int64_t> indices;   ///< Where each value came from along the sorted dim.
};

/// Sorts along dim (ascending unless descending; NaN counts as the largest value); the sort is stable, so equal
/// values keep their order (torch.sort with stable=True). values is differentiable (a gather of x).
template <class T>
SortResult<T> sort(const Tensor<T>& x, std::int64_t dim = -1, bool descending = false) {
  if (x.dim() == 0) return {x.clone(), zeros<std::int64_t>({})};
  const int d = wrap_dim(dim, x.dim(), "sort");
  Tensor<std::int64_t> idx = ops::sort_indices(x, d, x.shape()[d], descending, "sort");
  return {gather(x, d, idx), idx};
}
/// The indices that sort x along dim: torch.argsort (stable).
template <class T>
Tensor<std::int64_t> argsort(const Tensor<T>& x, std::int64_t dim = -1, bool descending = false) {
  if (x.dim() == 0) return zeros<std::int64_t>({});
  const int d = wrap_dim(dim, x.dim(), "argsort");
  return ops::sort_indices(x, d, x.shape()[d], descending, "argsort");
}
/// The k largest (or smallest) values along dim and their indices, always in sorted order (torch.topk with
/// sorted=True; equal values in order of position). values is differentiable.
template <class T>
SortResult<T> topk(const Tensor<T>& x, std::int64_t k, std::int64_t dim = -1, bool largest = true) {
  EMBER_CHECK(x.dim() > 0, "topk: expected a tensor with at least one dim, got shape []");
  const int d = wrap_dim(dim, x.dim(), "topk");
  EMBER_CHECK(k >= 0 && k <= x.shape()[d], "topk: k = ", k, " is out of range for dim ", d, " of shape ",
              x.shape().str(), " (0 <= k <= ", x.shape()[d], ")");
  Tensor<std::int64_t> idx = ops::sort_indices(x, d, k, largest, "topk");
  return {gather(x, d, idx), idx};
}

// ---- cumulative ops ----------------------------------------------------------------------------------------------

namespace detail {
template <class T>
Tensor<T> cumulative(const Tensor<T>& x, std::int64_t dim, bool prod, const char* op) {
  if (x.dim() == 0) return x.clone();
  const int d = wrap_dim(dim, x.dim(), op);
  const Tensor<T> c = ops::detail::scan_input(x);
  Tensor<T> r = ops::cumulative(c, d, prod);
  if constexpr (is_floating_v<T>) {
    if (x.requires_grad() && is_grad_enabled()) {
      auto node = std::make_shared<autograd::CumNode<T>>();
      node->dim = d;
      node->prod = prod;
      if (prod) {
        node->x = c;
        node->y = r.detach();
      }
      node->next.push_back(autograd::gradient_edge(x));
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}
}  // namespace detail

/// Running sums along dim: torch.cumsum (accumulated in double for floating types, int64 for integers, as
/// PyTorch's CPU kernel; the result keeps x's dtype).
template <class T>
Tensor<T> cumsum(const Tensor<T>& x, std::int64_t dim) {
  return detail::cumulative(x, dim, false, "cumsum");
}
/// Running products along dim: torch.cumprod (its gradient is exact with zeros in the input).
template <class T>
Tensor<T> cumprod(const Tensor<T>& x, std::int64_t dim) {
  return detail::cumulative(x, dim, true, "cumprod");
}

// ---- rearranging -------------------------------------------------------------------------------------------------

/// x reversed along each of dims: torch.flip (a copy).
template <class T>
Tensor<T> flip(const Tensor<T>& x, const std::vector<std::int64_t>& dims) {
  Tensor<T> r = x;
  bool seen[kMaxDims] = {};
  for (std::int64_t dim : dims) {
    const int d = wrap_dim(dim, x.dim(), "flip");
    EMBER_CHECK(!seen[d], "flip: dim ", d, " appears more than once in the dims");
    seen[d] = true;
    const std::int64_t n = x.shape()[d];
    if (n < 2) continue;
    r = index_select(r, d, arange<std::int64_t>(double(n - 1), -1, -1));
  }
  return r.same_impl(x) ? r.clone() : r;
}

/// x shifted along dims by shifts, elements leaving one end re-entering at the other: torch.roll. With no dims x is
/// rolled as if flattened.
template <class T>
Tensor<T> roll(const Tensor<T>& x, const std::vector<std::int64_t>& shifts, const std::vector<std::int64_t>& dims = {}) {
  if (dims.empty()) {
    EMBER_CHECK(shifts.size() == 1, "roll: without dims, expected one shift, got ", shifts.size());
    return roll(x.reshape({x.numel()}), shifts, {0}).reshape(x.shape());
  }
  EMBER_CHECK(shifts.size() == dims.size(), "roll: ", shifts.size(), " shifts for ", dims.size(),
              " dims (expected as many)");
  Tensor<T> r = x;
  for (std::size_t k = 0; k < dims.size(); ++k) {
    const int d = wrap_dim(dims[k], x.dim(), "roll");
    const std::int64_t n = x.shape()[d];
    if (n == 0) continue;
    const std::int64_t s = ((shifts[k] % n) + n) % n;
    if (s == 0) continue;
    r = cat<T>({r.narrow(d, n - s, s), r.narrow(d, 0, n - s)}, d);
  }
  return r.same_impl(x) ? r.clone() : r;
}

/// x repeated sizes[k] times along each dim (sizes may have more entries than x has dims; x then gains leading
/// dims): torch.Tensor.repeat.
template <class T>
Tensor<T> repeat(const Tensor<T>& x, const std::vector<std::int64_t>& sizes) {
  const int nd = int(sizes.size());
  EMBER_CHECK(nd >= x.dim(), "repeat: ", nd, " repeat counts for a tensor of shape ", x.shape().str(),
              " (at least one per dim expected)");
  EMBER_CHECK(nd < kMaxDims, "repeat: at most ", kMaxDims - 1, " repeat counts are supported, got ", nd);
  Shape padded;
  for (int k = 0; k < nd; ++k) {
    EMBER_CHECK(sizes[std::size_t(k)] >= 0, "repeat: repeat counts must be non-negative, got ", sizes[std::size_t(k)]);
    const int xd = k - (nd - x.dim());
    padded.push_back(xd >= 0 ? x.shape()[xd] : 1);
  }
  Tensor<T> r = x.reshape(padded);
  bool copied = false;
  for (int k = 0; k < nd; ++k) {  // dim k becomes (count, size), then one dim of count * size
    const std::int64_t c = sizes[std::size_t(k)];
    if (c == 1) continue;
    Shape e = r.shape(), merged = r.shape();
    e.insert(k, c);
    merged[k] *= c;
    r = r.unsqueeze(k).expand(e).reshape(merged);
    copied = true;
  }
  return copied ? r : r.clone();
}
/// torch.tile: repeat, with missing leading counts taken as 1.
template <class T>
Tensor<T> tile(const Tensor<T>& x, std::vector<std::int64_t> dims) {
  while (int(dims.size()) < x.dim()) dims.insert(dims.begin(), 1);
  return repeat(x, dims);
}

// ---- products ----------------------------------------------------------------------------------------------------

/// The outer product of two 1-D tensors: torch.outer.
template <class T>
Tensor<T> outer(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_CHECK(a.dim() == 1 && b.dim() == 1, "outer: expected two 1-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  EMBER_CHECK(a.device() == b.device(), "outer: the tensors are on ", a.device().str(), " and ", b.device().str());
  const Tensor<T> col = a.unsqueeze(1), row = b.unsqueeze(0);
  return Tensor<T>(col * row);
}

/// beta * input + alpha * bmm(b1, b2), input broadcast to the product's shape: torch.baddbmm. With beta == 0 the
/// input is ignored, NaN and inf included, and its gradient is zeros (defined), as in PyTorch.
template <class T>
Tensor<T> baddbmm(const Tensor<T>& input, const Tensor<T>& b1, const Tensor<T>& b2, double beta = 1, double alpha = 1) {
  Tensor<T> p = bmm(b1, b2);
  EMBER_CHECK(broadcast_shapes(input.shape(), p.shape(), "baddbmm") == p.shape(), "baddbmm: input of shape ",
              input.shape().str(), " does not broadcast to the product's shape ", p.shape().str());
  if (beta != 0) return Tensor<T>(input * detail::expr_scalar<T>(beta) + p * detail::expr_scalar<T>(alpha));
  if (!(is_grad_enabled() && input.requires_grad()))
    return alpha == 1 ? p : Tensor<T>(p * detail::expr_scalar<T>(alpha));
  // Selecting from the input nowhere: the value is alpha * p exactly and the input's gradient is zeros.
  const Tensor<bool> nowhere = zeros<bool>(Shape{}, p.device());
  return Tensor<T>(where(nowhere, input, p * detail::expr_scalar<T>(alpha)));
}

// ---- sampling ----------------------------------------------------------------------------------------------------

/// num_samples category indices per row of probs (1-D or 2-D; non-negative, finite weights with a positive sum,
/// need not sum to 1), drawn from gen: torch.multinomial. Without replacement a category is drawn at most once,
/// so num_samples may not exceed the number of categories with non-zero weight. The draws come from ember's
/// Philox stream, so they are reproducible under manual_seed but not the same numbers PyTorch draws.
template <class T>
Tensor<std::int64_t> multinomial(const Tensor<T>& probs, std::int64_t num_samples, bool replacement = false,
                                 Generator& gen = default_generator()) {
  return ops::multinomial(probs, num_samples, replacement, gen);
}

}  // namespace ember
