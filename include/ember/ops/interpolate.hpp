// ember — resampling along one dim without autograd (the passes of nn::functional::interpolate): forward and
// backward through the taps of cpu/interpolate.hpp. CPU tensors run cpu::resample_forward/backward; tensors on
// other devices run the same taps as a composition of index_select / index_add and fused expressions (one pass
// per tap), so every device gets the same values.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/interpolate.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/indexing.hpp"
#include "ember/profile/range.hpp"

namespace ember::ops {

namespace detail {
template <class T>
Tensor<T> resample_dense(const Tensor<T>& t) {
  if (t.is_contiguous()) return t;
  Tensor<T> c = empty<T>(t.shape(), t.device());
  ops::assign(c, expr::TensorLeaf<T, false>{&t}, "interpolate");
  return c;
}
/// (outer, inner): the products of the dims before and after d.
inline std::pair<std::int64_t, std::int64_t> resample_extents(const Shape& s, int d) {
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= s[i];
  for (int i = d + 1; i < s.n; ++i) inner *= s[i];
  return {outer, inner};
}
/// Tap t of every output position, for the composition: the indices (CPU, as index_select reads them), the
/// weights and whether the tap is used, both of shape (1, .., out, .., 1) on `dev`.
template <class T>
struct TapColumn {
  Tensor<std::int64_t> idx;
  Tensor<T> w;
  Tensor<bool> used;
  bool all_used = true;
};
template <class T>
TapColumn<T> tap_column(const cpu::ResampleTaps& r, std::int64_t t, int nd, int d, Device dev) {
  TapColumn<T> c;
  Shape ws(std::vector<std::int64_t>(std::size_t(nd), 1));
  ws[d] = r.out;
  c.idx = empty<std::int64_t>(Shape{r.out});
  c.w = empty<T>(ws);
  c.used = empty<bool>(ws);
  c.all_used = cpu::tap_column(r, t, c.idx.data(), c.w.data(), c.used.data());
  if (!dev.is_cpu()) {
    c.w = c.w.to(dev);
    c.used = c.used.to(dev);
  }
  return c;
}
}  // namespace detail

/// x with dim d resized from r.in to r.out positions by the taps r.
template <class T>
Tensor<T> resample(const Tensor<T>& x, int d, const cpu::ResampleTaps& r) {
  EMBER_PROFILE_RANGE("interpolate");
  EMBER_CHECK(d >= 0 && d < x.dim() && x.shape()[d] == r.in, "interpolate: internal: taps for a dim of size ", r.in,
              " applied to dim ", d, " of shape ", x.shape().str());
  Shape os = x.shape();
  os[d] = r.out;
  if (x.device().is_cpu()) {
    const Tensor<T> xc = detail::resample_dense(x);
    Tensor<T> y = empty<T>(os);
    const auto [outer, inner] = detail::resample_extents(x.shape(), d);
    if (y.numel() > 0) cpu::resample_forward<T>(r, outer, inner, xc.data(), y.data());
    return y;
  }
  Tensor<T> y = zeros<T>(os, x.device());
  for (std::int64_t t = 0; t < r.k; ++t) {
    const detail::TapColumn<T> c = detail::tap_column<T>(r, t, x.dim(), d, x.device());
    const Tensor<T> g = ops::index_select(x, d, c.idx);
    if (c.all_used) ops::assign(y, y + g * c.w, "interpolate");
    else ops::assign(y, y + where(c.used, g * c.w, 0.0), "interpolate");
  }
  return y;
}

/// The gradient of x (shape in_shape) from the gradient gy of resample(x, d, r).
template <class T>
Tensor<T> resample_backward(const Tensor<T>& gy, const Shape& in_shape, int d, const cpu::ResampleTaps& r) {
  EMBER_PROFILE_RANGE("interpolate_backward");
  Shape os = in_shape;
  os[d] = r.out;
  EMBER_CHECK(gy.shape() == os, "interpolate: gradient of shape ", gy.shape().str(), " does not match the output ",
              "shape ", os.str());
  if (gy.device().is_cpu()) {
    const Tensor<T> gc = detail::resample_dense(gy);
    Tensor<T> gx = empty<T>(in_shape);
    const auto [outer, inner] = detail::resample_extents(in_shape, d);
    if (gx.numel() > 0) cpu::resample_backward<T>(r, outer, inner, gc.data(), gx.data());
    return gx;
  }
  Tensor<T> gx = zeros<T>(in_shape, gy.device());
  for (std::int64_t t = 0; t < r.k; ++t) {
    const detail::TapColumn<T> c = detail::tap_column<T>(r, t, in_shape.n, d, gy.device());
    Tensor<T> part = empty<T>(os, gy.device());
    if (c.all_used) ops::assign(part, gy * c.w, "interpolate_backward");
    else ops::assign(part, where(c.used, gy * c.w, 0.0), "interpolate_backward");
    const Tensor<T> back = ops::index_add(in_shape, d, c.idx, part);
    ops::assign(gx, gx + back, "interpolate_backward");
  }
  return gx;
}

}  // namespace ember::ops
