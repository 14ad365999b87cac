// ember — Shape (sizes or strides), contiguous strides and NumPy/PyTorch broadcasting.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ember/config.hpp"

namespace ember {

/// Most dimensions a tensor may have. A Shape is a fixed-capacity array so it can be copied into a kernel.
inline constexpr int kMaxDims = 8;

namespace detail {
/// *out = a * b; true when the product overflows int64 (then *out is unspecified).
inline bool mul_overflow(std::int64_t a, std::int64_t b, std::int64_t* out) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_mul_overflow(a, b, out);
#else
  const bool over = a != 0 && b != 0 &&
                    ((a > 0) == (b > 0) ? (a > 0 ? a > INT64_MAX / b : a < INT64_MAX / b)
                                        : (a > 0 ? b < INT64_MIN / a : a < INT64_MIN / b));
  if (!over) *out = a * b;
  return over;
#endif
}
/// *out = a + b; true when the sum overflows int64 (then *out is unspecified).
inline bool add_overflow(std::int64_t a, std::int64_t b, std::int64_t* out) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_add_overflow(a, b, out);
#else
  const bool over = b > 0 ? a > INT64_MAX - b : a < INT64_MIN - b;
  if (!over) *out = a + b;
  return over;
#endif
}
}  // namespace detail

/// A small fixed-capacity list of int64 extents (also used for strides). Trivially copyable.
struct Shape {
  std::int64_t d[kMaxDims] = {};  ///< The extents; only the first n are meaningful.
  int n = 0;                       ///< The number of dims (0 for a scalar's shape).

  Shape() = default;  ///< The 0-d shape (a scalar's): no dims, numel() 1.
  /// The extents listed: `Shape{2, 3}` (PyTorch's `torch.Size([2, 3])`). At most kMaxDims of them.
  Shape(std::initializer_list<std::int64_t> il) { assign(il.begin(), il.end()); }
  /// The extents of a vector (at most kMaxDims).
  explicit Shape(const std::vector<std::int64_t>& v) { assign(v.begin(), v.end()); }
  /// The extents in [b, e) (at most kMaxDims).
  template <class It>
  Shape(It b, It e) {
    assign(b, e);
  }

  /// The number of dims (n), as `len(torch.Size)`.
  EMBER_HOST_DEVICE int size() const { return n; }
  /// Whether there are no dims (a 0-d shape; not whether numel() is 0).
  EMBER_HOST_DEVICE bool empty() const { return n == 0; }
  /// Extent i, 0 <= i < n (unchecked; no negative indices).
  EMBER_HOST_DEVICE std::int64_t& operator[](int i) { return d[i]; }
  /// Extent i, 0 <= i < n (unchecked; no negative indices).
  EMBER_HOST_DEVICE const std::int64_t& operator[](int i) const { return d[i]; }
  /// Iterators over the n extents, for range-for loops and algorithms.
  std::int64_t* begin() { return d; }
  /// End of the n extents.
  std::int64_t* end() { return d + n; }
  /// Iterators over the n extents, for range-for loops and algorithms.
  const std::int64_t* begin() const { return d; }
  /// End of the n extents.
  const std::int64_t* end() const { return d + n; }
  /// The last extent (n must be > 0).
  std::int64_t back() const { return d[n - 1]; }

  /// Appends a dim of extent v (an error beyond kMaxDims dims).
  void push_back(std::int64_t v) {
    EMBER_CHECK(n < kMaxDims, "Shape: at most ", kMaxDims, " dimensions are supported");
    d[n++] = v;
  }
  /// Inserts a dim of extent v before position pos (0 <= pos <= n), moving the later ones up.
  void insert(int pos, std::int64_t v) {
    push_back(0);
    for (int i = n - 1; i > pos; --i) d[i] = d[i - 1];
    d[pos] = v;
  }
  /// Removes the dim at position pos (0 <= pos < n).
  void erase(int pos) {
    for (int i = pos; i + 1 < n; ++i) d[i] = d[i + 1];
    --n;
  }

  /// Product of the extents (1 for a 0-d shape), exact: a shape whose product does not fit in int64 (no tensor has
  /// one, see checked_numel) gives an Error, never a wrapped value.
  std::int64_t numel() const {
    std::int64_t p = 1;
    bool over = false;
    for (int i = 0; i < n; ++i) over |= detail::mul_overflow(p, d[i], &p);
    if (over) [[unlikely]] return numel_overflow();
    return p;
  }
  /// The extents as a vector (PyTorch's `list(x.shape)`).
  std::vector<std::int64_t> vec() const { return {d, d + n}; }

  /// Same number of dims and the same extents.
  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.n != b.n) return false;
    for (int i = 0; i < a.n; ++i)
      if (a.d[i] != b.d[i]) return false;
    return true;
  }

  /// "[2, 3]", as error messages print shapes.
  EMBER_HEADER_INLINE std::string str() const;

 private:
  // numel() when the running product overflowed: 0 if a size is 0 (exact), else an Error.
  [[gnu::cold, gnu::noinline]] std::int64_t numel_overflow() const {
    for (int i = 0; i < n; ++i)
      if (d[i] == 0) return 0;
    throw Error(detail::concat("numel: the sizes of shape ", str(), " multiply to more than int64 can count"));
  }
  template <class It>
  void assign(It b, It e) {
    n = 0;
    for (; b != e; ++b) push_back(static_cast<std::int64_t>(*b));
  }
};

#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}
#endif

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

/// The checks every shape given to ember passes before a tensor gets it (creation, view, reshape, expand,
/// broadcasting): no size is negative, and the product of the nonzero sizes fits in int64. The second rule holds
/// even when a size is 0 (so `empty({0, 1 << 62, 1 << 62})` is refused, as it would be in PyTorch when the zero
/// comes last): then every stride and element offset of the tensor, and of any view or broadcast of it, is
/// exact in int64. Returns numel; an Error names `op`, the shape and the rule otherwise.
EMBER_HEADER_INLINE std::int64_t checked_numel(const Shape& shape, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE std::int64_t checked_numel(const Shape& shape, const char* op) {
  std::int64_t p = 1;
  bool zero = false, over = false;
  for (int i = 0; i < shape.n; ++i) {
    EMBER_CHECK(shape[i] >= 0, op, ": negative size ", shape[i], " in shape ", shape.str(),
                " (expected sizes >= 0)");
    if (shape[i] == 0) zero = true;
    else over |= detail::mul_overflow(p, shape[i], &p);
  }
  EMBER_CHECK(!over, op, ": shape ", shape.str(), " has too many elements (expected the product of its nonzero "
              "sizes to fit in int64)");
  return zero ? 0 : p;
}
#endif

/// Row-major strides of a contiguous tensor of this shape (size-0 and size-1 dims count as 1). Exact for every
/// shape that passed checked_numel.
inline Shape contiguous_strides(const Shape& shape) {
  Shape st;
  st.n = shape.n;
  std::int64_t s = 1;
  for (int i = shape.n - 1; i >= 0; --i) {
    st[i] = s;
    if (shape[i] > 1 && detail::mul_overflow(s, shape[i], &s)) [[unlikely]]
      throw Error(detail::concat("contiguous_strides: shape ", shape.str(), " has too many elements"));
  }
  return st;
}

/// True when (shape, strides) address memory densely in row-major order (size-1 dims may have any stride).
inline bool is_contiguous(const Shape& shape, const Shape& strides) {
  std::int64_t expect = 1;
  for (int i = shape.n - 1; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

/// Wraps a possibly negative dim into [0, ndim); `op` names the caller in the error.
EMBER_HEADER_INLINE int wrap_dim(std::int64_t dim, int ndim, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE int wrap_dim(std::int64_t dim, int ndim, const char* op) {
  const int lim = ndim > 0 ? ndim : 1;
  EMBER_CHECK(dim >= -lim && dim < lim, op, ": dim ", dim, " is out of range for a tensor of ", ndim,
              " dimensions (expected a dim in [", -lim, ", ", lim - 1, "])");
  return static_cast<int>(dim < 0 ? dim + lim : dim);
}
#endif

/// wrap_dim for a tensor of this shape (the error names the shape).
EMBER_HEADER_INLINE int wrap_dim(std::int64_t dim, const Shape& shape, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE int wrap_dim(std::int64_t dim, const Shape& shape, const char* op) {
  const int lim = shape.n > 0 ? shape.n : 1;
  EMBER_CHECK(dim >= -lim && dim < lim, op, ": dim ", dim, " is out of range for a tensor of shape ", shape.str(),
              " (expected a dim in [", -lim, ", ", lim - 1, "])");
  return static_cast<int>(dim < 0 ? dim + lim : dim);
}
#endif

namespace detail {
// broadcast_shapes when both operands were stretched: the result's nonzero sizes may no longer multiply within int64.
inline void check_broadcast_numel(const Shape& a, const Shape& b, const Shape& out,
                                                              const char* op) {
  std::int64_t p = 1;
  bool over = false;
  for (int i = 0; i < out.n; ++i) over |= mul_overflow(p, out[i] != 0 ? out[i] : 1, &p);
  EMBER_CHECK(!over, op, ": broadcasting shapes ", a.str(), " and ", b.str(), " gives ", out.str(),
              ", which has too many elements (expected the product of its nonzero sizes to fit in int64)");
}
}  // namespace detail

/// The broadcast of two shapes under NumPy/PyTorch rules (align right; 1 stretches), or an Error naming `op`.
/// When the result is one of the two shapes (the common case), its element count is that shape's, already checked;
/// otherwise it is checked here.
EMBER_HEADER_INLINE Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  Shape out;
  const int n = a.n > b.n ? a.n : b.n;
  out.n = n;
  bool stretched_a = false, stretched_b = false;
  for (int i = 0; i < n; ++i) {
    const int ia = a.n - n + i, ib = b.n - n + i;
    const std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    EMBER_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a.str(), " and ", b.str(),
                " cannot be broadcast together (dim ", i - n, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
    stretched_a |= da != out[i];
    stretched_b |= db != out[i];
  }
  if (stretched_a && stretched_b) detail::check_broadcast_numel(a, b, out, op);
  return out;
}
#endif

/// Strides that read a tensor of (shape, strides) as if it had the larger shape `to` (stride 0 where broadcast).
inline Shape broadcast_strides(const Shape& shape, const Shape& strides, const Shape& to) {
  Shape st;
  st.n = to.n;
  for (int i = 0; i < to.n; ++i) {
    const int j = shape.n - to.n + i;
    st[i] = (j < 0 || shape[j] == 1) ? 0 : strides[j];
  }
  return st;
}

}  // namespace ember
