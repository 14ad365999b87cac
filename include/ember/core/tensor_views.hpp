// ember — the views of Tensor<T>: how a view was derived from its base (ViewOp, which autograd replays in
// backward) and the members that compute a view's geometry (slice, narrow, select, transpose, permute, view, reshape,
// expand, squeeze, unsqueeze, flatten; the checks of a new shape and the strides of a view without a copy). They are
// declared in the class (core/tensor.hpp) and defined here, after it; core/tensor.hpp includes this header at its
// end, and this header includes core/tensor.hpp, so either gives the whole Tensor.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

/// How a view was derived from its base; autograd replays it (or its inverse) in backward.
struct ViewOp {
  /// Which view function made the view: view/reshape, permute/transpose, expand, slice/narrow, select/operator[].
  enum Kind : unsigned char { Reshape, Permute, Expand, Slice, Select } kind = Reshape;  ///< The view's kind.
  Shape perm{};  ///< Permute: output dim i is base dim perm[i].
  int dim = 0;   ///< Slice and Select: the dim sliced or selected.
  ///@{
  /// Slice: the (normalised) start, end and step along `dim`; Select uses `start` as the index.
  std::int64_t start = 0, end = 0, step = 1;
  ///@}
};

template <class T>
Tensor<T> Tensor<T>::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  const int dd = wrap_dim(d, shape(), "slice");
  EMBER_CHECK(step > 0, "slice: step must be positive, got ", step);
  const std::int64_t n = shape()[dd];
  auto clampi = [n](std::int64_t v) { return v < 0 ? (v + n < 0 ? 0 : v + n) : (v > n ? n : v); };
  start = clampi(start);
  end = clampi(end);
  if (end < start) end = start;
  Shape sz = shape(), st = strides();
  sz[dd] = end > start ? (end - start - 1) / step + 1 : 0;  // (no overflow for any step)
  // A step past the end leaves at most one element, whose stride does not matter: keep the old one then.
  if (detail::mul_overflow(st[dd], step, &st[dd])) st[dd] = strides()[dd];
  std::int64_t off = 0;
  EMBER_CHECK(!detail::mul_overflow(start, strides()[dd], &off) && !detail::add_overflow(off, storage_offset(), &off),
              "slice: the offset of element ", start, " of dim ", dd, " (stride ", strides()[dd],
              ") overflows int64 (shape ", shape().str(), ")");
  return view_of(sz, st, off, {ViewOp::Slice, {}, dd, start, end, step});
}

template <class T>
Tensor<T> Tensor<T>::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  const int dd = wrap_dim(d, shape(), "narrow");
  const std::int64_t n = shape()[dd];
  EMBER_CHECK(start >= -n && start <= n, "narrow: start ", start, " is out of range for dim ", dd, " of shape ",
              shape().str(), " (expected a start in [", -n, ", ", n, "])");
  if (start < 0) start += n;  // counts from the end, as in PyTorch
  EMBER_CHECK(length >= 0 && length <= n - start, "narrow: start ", start, " + length ", length,
              " is out of bounds for dim ", dd, " of shape ", shape().str(), " (expected 0 <= length <= ", n - start,
              ")");
  return slice(dd, start, start + length);
}

template <class T>
Tensor<T> Tensor<T>::select(std::int64_t d, std::int64_t i) const {
  const int dd = wrap_dim(d, shape(), "select");
  const std::int64_t n = shape()[dd];
  EMBER_CHECK(i >= -n && i < n, "select: index ", i, " is out of range for dim ", dd, " of size ", n,
              " (shape ", shape().str(), ")");
  if (i < 0) i += n;
  Shape sz = shape(), st = strides();
  sz.erase(dd);
  st.erase(dd);
  return view_of(sz, st, storage_offset() + i * strides()[dd], {ViewOp::Select, {}, dd, i, i + 1, 1});
}

template <class T>
Tensor<T> Tensor<T>::transpose(std::int64_t d0, std::int64_t d1) const {
  const int a = wrap_dim(d0, shape(), "transpose"), b = wrap_dim(d1, shape(), "transpose");
  Shape sz = shape(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  Shape perm;
  for (int i = 0; i < dim(); ++i) perm.push_back(i);
  std::swap(perm[a], perm[b]);
  return view_of(sz, st, storage_offset(), {ViewOp::Permute, perm});
}

template <class T>
Tensor<T> Tensor<T>::permute(const std::vector<std::int64_t>& order) const {
  EMBER_CHECK(int(order.size()) == dim(), "permute: got ", order.size(), " dims for a tensor of shape ",
              shape().str());
  Shape sz, st, perm;
  bool seen[kMaxDims] = {};
  for (auto o : order) {
    const int d = wrap_dim(o, shape(), "permute");
    EMBER_CHECK(!seen[d], "permute: dim ", d, " appears twice");
    seen[d] = true;
    sz.push_back(shape()[d]);
    st.push_back(strides()[d]);
    perm.push_back(d);
  }
  return view_of(sz, st, storage_offset(), {ViewOp::Permute, perm});
}

template <class T>
Tensor<T> Tensor<T>::view(Shape s) const {
  s = infer_size(s, "view");
  Shape st;
  EMBER_CHECK(view_strides(s, st), "view: a tensor of shape ", shape().str(), " and strides ", strides().str(),
              " cannot be viewed as ", s.str(), " without a copy; call reshape() or contiguous() first");
  return view_of(s, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::reshape(Shape s) const {
  s = infer_size(s, "reshape");
  Shape st;
  if (view_strides(s, st)) return view_of(s, st, storage_offset(), {});
  return contiguous().view(s);
}

template <class T>
Tensor<T> Tensor<T>::expand(Shape s) const {
  EMBER_CHECK(s.n >= dim(), "expand: the target ", s.str(), " has fewer dims than the tensor ", shape().str());
  const Shape target = s;
  Shape st;
  st.n = s.n;
  for (int i = 0; i < s.n; ++i) {
    const int j = dim() - s.n + i;
    if (j < 0) {
      EMBER_CHECK(s[i] >= 0, "expand: invalid size ", s[i], " for the new leading dim ", i, " (target ",
                  target.str(), "; -1 is allowed only for an existing dim)");
      st[i] = 0;
      continue;
    }
    if (s[i] == -1) s[i] = shape()[j];
    EMBER_CHECK(s[i] >= 0, "expand: invalid size ", s[i], " in the target ", target.str(),
                " (expected sizes >= 0, or -1 to keep a size)");
    EMBER_CHECK(shape()[j] == s[i] || shape()[j] == 1, "expand: cannot expand shape ", shape().str(), " to ",
                target.str(), " (dim ", i, ": ", shape()[j], " vs ", s[i], ")");
    st[i] = shape()[j] == s[i] ? strides()[j] : 0;
  }
  checked_numel(s, "expand");
  return view_of(s, st, storage_offset(), {ViewOp::Expand, {}});
}

template <class T>
Tensor<T> Tensor<T>::squeeze() const {
  Shape sz, st;
  for (int i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      sz.push_back(shape()[i]);
      st.push_back(strides()[i]);
    }
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::squeeze(std::int64_t d) const {
  const int dd = wrap_dim(d, shape(), "squeeze");
  Shape sz = shape(), st = strides();
  if (sz[dd] == 1) {
    sz.erase(dd);
    st.erase(dd);
  }
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::unsqueeze(std::int64_t d) const {
  const int n = dim() + 1;
  EMBER_CHECK(d >= -n && d < n, "unsqueeze: dim ", d, " is out of range for a tensor of shape ", shape().str(),
              " (expected a dim in [", -n, ", ", n - 1, "])");
  const int dd = int(d < 0 ? d + n : d);
  Shape sz = shape(), st = strides();
  // The stride of a size-1 dim is never used to address memory; this is PyTorch's choice, or 1 past the end.
  std::int64_t s = 1;
  if (dd < dim() && detail::mul_overflow(strides()[dd], shape()[dd], &s)) s = 1;
  sz.insert(dd, 1);
  st.insert(dd, s);
  return view_of(sz, st, storage_offset(), {});
}

template <class T>
Tensor<T> Tensor<T>::flatten(std::int64_t start, std::int64_t end) const {
  if (dim() == 0) return reshape(Shape{1});
  const int a = wrap_dim(start, shape(), "flatten"), b = wrap_dim(end, shape(), "flatten");
  EMBER_CHECK(a <= b, "flatten: start dim ", a, " is after end dim ", b);
  Shape s;
  for (int i = 0; i < a; ++i) s.push_back(shape()[i]);
  std::int64_t m = 1;
  bool over = false;
  for (int i = a; i <= b; ++i) over |= detail::mul_overflow(m, shape()[i], &m);
  EMBER_CHECK(!over, "flatten: dims ", a, "..", b, " of shape ", shape().str(), " have too many elements");
  s.push_back(m);
  for (int i = b + 1; i < dim(); ++i) s.push_back(shape()[i]);
  return reshape(s);
}

template <class T>
Shape Tensor<T>::infer_size(Shape s, const char* op) const {
  int infer = -1;
  std::int64_t known = 1;
  bool zero = false, over = false;
  for (int i = 0; i < s.n; ++i) {
    if (s[i] == -1) {
      EMBER_CHECK(infer < 0, op, ": only one dim can be -1, got ", s.str());
      infer = i;
    } else {
      EMBER_CHECK(s[i] >= 0, op, ": invalid size ", s[i], " in ", s.str());
      if (s[i] == 0) zero = true;
      else over |= detail::mul_overflow(known, s[i], &known);
    }
  }
  EMBER_CHECK(!over, op, ": shape ", s.str(), " has too many elements (expected the product of its nonzero sizes "
              "to fit in int64; the tensor has shape ", shape().str(), ")");
  if (zero) known = 0;
  if (infer >= 0) {
    EMBER_CHECK(known != 0 && numel() % known == 0, op, ": shape ", s.str(), " is invalid for a tensor of ",
                numel(), " elements (shape ", shape().str(), ")");
    s[infer] = numel() / known;
  }
  EMBER_CHECK(s.numel() == numel(), op, ": shape ", s.str(), " is invalid for a tensor of ", numel(),
              " elements (shape ", shape().str(), ")");
  return s;
}

template <class T>
bool Tensor<T>::view_strides(const Shape& s, Shape& out) const {
  if (numel() == 0 || s.n == 0) {
    out = contiguous_strides(s);
    return true;
  }
  out = Shape();
  out.n = s.n;
  // Old dims without size-1 ones (numel() > 0, so every size is >= 1).
  std::int64_t os[kMaxDims] = {}, ost[kMaxDims] = {};
  int on = 0;
  for (int i = 0; i < dim(); ++i)
    if (shape()[i] != 1) {
      os[on] = shape()[i];
      ost[on] = strides()[i];
      ++on;
    }
  int oi = 0, ni = 0;
  while (ni < s.n) {
    if (s[ni] == 1) {  // any stride will do; PyTorch's choice, unless it overflows
      std::int64_t st = 1;
      if (oi < on && detail::mul_overflow(ost[oi], os[oi], &st)) st = 1;
      out[ni++] = st;
      continue;
    }
    // Take a chunk of old dims [oi, oj) and new dims [ni, nj) with equal products. Both products stay within
    // numel(); the bounds only matter if the numels differed.
    if (oi >= on) return false;
    int oj = oi, nj = ni;
    std::int64_t po = os[oj++], pn = s[nj++];
    while (po != pn) {
      if (po < pn) {
        if (oj >= on) return false;
        po *= os[oj++];
      } else {
        if (nj >= s.n) return false;
        pn *= s[nj++];
      }
    }
    for (int k = oi; k + 1 < oj; ++k) {
      std::int64_t inner = 0;  // old chunk not contiguous?
      if (detail::mul_overflow(ost[k + 1], os[k + 1], &inner) || ost[k] != inner) return false;
    }
    // New strides from the innermost old one (the chunk's outermost stride is not formed: it may not fit).
    std::int64_t st = ost[oj - 1];
    for (int k = nj - 1; k >= ni; --k) {
      out[k] = st;
      if (k > ni) st *= s[k];
    }
    oi = oj;
    ni = nj;
  }
  return true;
}

}  // namespace ember
