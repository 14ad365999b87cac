// ember — CPU index loops: gather, scatter, scatter_add and index_add along a dim (any strides), the index range
// checks, and the index tensors of masks and padding. ops/indexing.hpp checks the shapes and dispatches;
// cpu/sort.hpp holds the sort, scan and sampling loops.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"

namespace ember::cpu {

namespace detail {

/// Calls f(coords) for every position of `s` in row-major order (coords: s.n entries).
template <class F>
void for_each_coord(const Shape& s, F&& f) {
  const std::int64_t n = s.numel();
  std::int64_t c[kMaxDims] = {};
  for (std::int64_t i = 0; i < n; ++i) {
    f(static_cast<const std::int64_t*>(c));
    for (int d = s.n - 1; d >= 0; --d) {
      if (++c[d] < s[d]) break;
      c[d] = 0;
    }
  }
}

inline std::int64_t offset_of(const std::int64_t* c, const Shape& strides, int skip = -1, std::int64_t at = 0) {
  std::int64_t o = 0;
  for (int d = 0; d < strides.n; ++d) o += (d == skip ? at : c[d]) * strides[d];
  return o;
}

}  // namespace detail

/// The position of the first of n values p[i * stride] outside [lo, hi), or -1 when every one is inside.
inline std::int64_t first_out_of_range(const std::int64_t* p, std::int64_t n, std::int64_t stride, std::int64_t lo,
                                       std::int64_t hi) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t v = p[i * stride];
    if (!(v >= lo && v < hi)) return i;
  }
  return -1;
}

/// Whether an entry of index (any strides) lies outside [0, n); v receives the first such (in row-major order).
inline bool first_bad_index(const Tensor<std::int64_t>& index, std::int64_t n, std::int64_t& v) {
  const std::int64_t* ip = index.data();
  bool bad = false;
  detail::for_each_coord(index.shape(), [&](const std::int64_t* c) {
    const std::int64_t e = ip[detail::offset_of(c, index.strides())];
    if (!bad && !(e >= 0 && e < n)) {
      bad = true;
      v = e;
    }
  });
  return bad;
}

/// out[..i_d..] += src[..] at i_d = index[..] along d, for every position of index (out: any strides).
template <class T>
void scatter_add(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>& src) {
  const std::int64_t* ip = index.data();
  T* op = out.data();
  const T* sp = src.data();
  detail::for_each_coord(index.shape(), [&](const std::int64_t* c) {
    const std::int64_t v = ip[detail::offset_of(c, index.strides())];
    T& o = op[detail::offset_of(c, out.strides(), d, v)];
    o = T(o + sp[detail::offset_of(c, src.strides())]);
  });
  out.bump_version();
}

/// out (index's shape) = x gathered along d.
template <class T>
Tensor<T> gather(const Tensor<T>& x, int d, const Tensor<std::int64_t>& index) {
  Tensor<T> out = empty<T>(index.shape());
  const std::int64_t* ip = index.data();
  const T* xp = x.data();
  T* op = out.data();
  std::int64_t i = 0;
  detail::for_each_coord(index.shape(), [&](const std::int64_t* c) {
    op[i++] = xp[detail::offset_of(c, x.strides(), d, ip[detail::offset_of(c, index.strides())])];
  });
  return out;
}

/// out[..i_d..] = src[..] (or value, src null) at i_d = index[..] along d, for every position of index in row-major
/// order (a repeated position keeps the last write).
template <class T>
void scatter(const Tensor<T>& out, int d, const Tensor<std::int64_t>& index, const Tensor<T>* src, T value) {
  const std::int64_t* ip = index.data();
  detail::for_each_coord(index.shape(), [&](const std::int64_t* c) {
    out.data()[detail::offset_of(c, out.strides(), d, ip[detail::offset_of(c, index.strides())])] =
        src ? src->data()[detail::offset_of(c, src->strides())] : value;
  });
}

/// dst (any strides, g's shape) = g, element by element.
template <class T>
void copy_elements(const Tensor<T>& g, const Tensor<T>& dst) {
  const T* gp = g.data();
  T* pp = dst.data();
  detail::for_each_coord(g.shape(), [&](const std::int64_t* c) {
    pp[detail::offset_of(c, dst.strides())] = gp[detail::offset_of(c, g.strides())];
  });
}

/// r[..ix[i_d]..] += alpha * src[..i_d..] along d, for every position of src (in double, rounded once into T).
template <class T>
void index_add(const Tensor<T>& r, int d, const std::vector<std::int64_t>& ix, const Tensor<T>& src, double alpha) {
  const T* sp = src.data();
  T* rp = r.data();
  detail::for_each_coord(src.shape(), [&](const std::int64_t* c) {
    T& o = rp[detail::offset_of(c, r.strides(), d, ix[std::size_t(c[d])])];
    o = T(double(o) + alpha * double(sp[detail::offset_of(c, src.strides())]));
  });
}

/// x[i] = x[i] * alpha for n values, in double.
template <class T>
void scale_(T* x, std::int64_t n, double alpha) {
  for (std::int64_t i = 0; i < n; ++i) x[i] = T(double(x[i]) * alpha);
}

/// The (r, c) mask of the lower (j - i <= diagonal) or upper (j - i >= diagonal) triangle.
inline Tensor<bool> triangle_mask(std::int64_t r, std::int64_t c, std::int64_t diagonal, bool lower) {
  Tensor<bool> keep = empty<bool>(Shape{r, c});
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) keep.data()[i * c + j] = lower ? j - i <= diagonal : j - i >= diagonal;
  return keep;
}

/// out[i] = f(i) for n positions (an index tensor computed position by position).
template <class F>
void fill_index(std::int64_t* out, std::int64_t n, const F& f) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = f(i);
}

/// The largest of n values (-1 when n is 0); a negative value is an error naming `op` and its position.
inline std::int64_t checked_max_class(const std::int64_t* c, std::int64_t n, const char* op) {
  std::int64_t top = -1;
  for (std::int64_t i = 0; i < n; ++i) {
    EMBER_CHECK(c[i] >= 0, op, ": class values must be non-negative, got ", c[i], " at position ", i);
    top = std::max(top, c[i]);
  }
  return top;
}

/// r (n x classes, zeros) gets a 1 at column c[i] of row i.
inline void one_hot_fill(const std::int64_t* c, std::int64_t n, std::int64_t classes, std::int64_t* r) {
  for (std::int64_t i = 0; i < n; ++i) r[i * classes + c[i]] = 1;
}

}  // namespace ember::cpu
