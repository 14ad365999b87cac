// ember — torch.nn.functional's pad, interpolate and one_hot, built from differentiable pieces (cat, index_select,
// fused expressions), so their gradients come from those and they run wherever those run.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/autograd/reduce.hpp"
#include "ember/autograd/shape_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/nodes.hpp"

namespace ember::nn::functional {

enum class PadMode { constant, reflect, replicate, circular };

namespace detail {
/// The source position of output position i (in [-lo, n + hi)) of a dim of size n under `mode`.
inline std::int64_t pad_source(std::int64_t i, std::int64_t n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::reflect: return i < 0 ? -i : 2 * (n - 1) - i;
    case PadMode::replicate: return i < 0 ? 0 : n - 1;
    default: return ((i % n) + n) % n;  // circular
  }
}
inline const char* pad_mode_name(PadMode m) {
  switch (m) {
    case PadMode::constant: return "constant";
    case PadMode::reflect: return "reflect";
    case PadMode::replicate: return "replicate";
    default: return "circular";
  }
}
}  // namespace detail

/// torch.nn.functional.pad: `pads` holds (left, right) pairs starting from the last dim ((1, 2) pads the last
/// dim, (1, 1, 2, 0) the last two). Constant padding takes any number of dims and negative pads (crop); reflect,
/// replicate and circular pad the last 1, 2 or 3 dims of an input with one or two more dims than that, as in
/// PyTorch (reflect needs pads smaller than the dim, circular no larger).
template <class T>
Tensor<T> pad(const Tensor<T>& x, const std::vector<std::int64_t>& pads, PadMode mode = PadMode::constant,
              double value = 0) {
  const char* m = detail::pad_mode_name(mode);
  EMBER_CHECK(pads.size() % 2 == 0, "pad: the padding (", pads.size(), " values) must come in (left, right) pairs");
  const int np = int(pads.size() / 2);
  EMBER_CHECK(np <= x.dim(), "pad: ", np, " padded dims for an input of shape ", x.shape().str());
  if (mode != PadMode::constant) {
    EMBER_CHECK(np >= 1 && np <= 3 && (x.dim() == np + 1 || x.dim() == np + 2), "pad: ", m, " padding of ", np,
                " dims needs a ", np + 1, "-D or ", np + 2, "-D input, got shape ", x.shape().str());
    EMBER_CHECK(value == 0, "pad: a fill value is only used by constant padding (mode ", m, ")");
  }
  Tensor<T> r = x;
  for (int k = 0; k < np; ++k) {
    const int d = x.dim() - 1 - k;
    std::int64_t lo = pads[std::size_t(2 * k)], hi = pads[std::size_t(2 * k + 1)];
    const std::int64_t n = r.shape()[d];
    if (mode == PadMode::constant) {
      EMBER_CHECK(n + lo + hi >= 0, "pad: padding (", lo, ", ", hi, ") of dim ", d, " (size ", n, ", shape ",
                  x.shape().str(), ") leaves a negative size");
      if (lo < 0 || hi < 0) {  // negative padding crops
        const std::int64_t a = lo < 0 ? -lo : 0, b = hi < 0 ? -hi : 0;
        r = r.narrow(d, std::min(a, n), std::max<std::int64_t>(n - a - b, 0));
        lo = std::max<std::int64_t>(lo, 0);
        hi = std::max<std::int64_t>(hi, 0);
      }
      std::vector<Tensor<T>> parts;
      Shape s = r.shape();
      if (lo > 0) {
        s[d] = lo;
        parts.push_back(full<T>(s, T(value), x.device()));
      }
      parts.push_back(r);
      if (hi > 0) {
        s[d] = hi;
        parts.push_back(full<T>(s, T(value), x.device()));
      }
      if (parts.size() > 1) r = cat(parts, d);
      continue;
    }
    EMBER_CHECK(lo >= 0 && hi >= 0, "pad: ", m, " padding must be non-negative, got (", lo, ", ", hi, ") for dim ", d);
    if (mode == PadMode::reflect)
      EMBER_CHECK(lo < n && hi < n, "pad: reflect padding (", lo, ", ", hi, ") of dim ", d, " must be smaller than ",
                  "its size ", n, " (shape ", x.shape().str(), ")");
    else if (mode == PadMode::circular)
      EMBER_CHECK(lo <= n && hi <= n, "pad: circular padding (", lo, ", ", hi, ") of dim ", d,
                  " must not exceed its size ", n, " (shape ", x.shape().str(), ")");
    else
      EMBER_CHECK(n > 0 || lo + hi == 0, "pad: replicate padding of dim ", d, " of size 0 (shape ", x.shape().str(),
                  ")");
    if (lo == 0 && hi == 0) continue;
    Tensor<std::int64_t> idx = empty<std::int64_t>({n + lo + hi});
    for (std::int64_t i = 0; i < n + lo + hi; ++i) idx.data()[i] = detail::pad_source(i - lo, n, mode);
    r = index_select(r, d, idx);
  }
  return r.same_impl(x) ? r.clone() : r;
}

enum class InterpolateMode { nearest, linear, bilinear };

struct InterpolateOptions {
  std::vector<std::int64_t> size{};    // the output's spatial size, or
  std::vector<double> scale_factor{};  // a factor per spatial dim (one value applies to all)
  InterpolateMode mode = InterpolateMode::nearest;
  bool align_corners = false;  // linear modes only
};

namespace detail {
/// PyTorch's source coordinate scale for one dim (area_pixel_compute_scale).
inline double interp_scale(std::int64_t in, std::int64_t out, double factor, bool align_corners) {
  if (align_corners) return out > 1 ? double(in - 1) / double(out - 1) : 0.0;
  return factor > 0 ? 1.0 / factor : double(in) / double(out);
}
/// Resizes dim d of x from n to `out` positions.
template <class T>
Tensor<T> interp_dim(const Tensor<T>& x, int d, std::int64_t out, double factor, InterpolateMode mode,
                     bool align_corners) {
  const std::int64_t in = x.shape()[d];
  Tensor<std::int64_t> i0 = empty<std::int64_t>({out});
  if (mode == InterpolateMode::nearest) {
    // As PyTorch's CPU kernel: in float, floor(dst * scale), clamped.
    const float scale = float(interp_scale(in, out, factor, false));
    for (std::int64_t j = 0; j < out; ++j)
      i0.data()[j] = out == in ? j : std::min<std::int64_t>(std::int64_t(std::floor(float(j) * scale)), in - 1);
    return index_select(x, d, i0);
  }
  Tensor<std::int64_t> i1 = empty<std::int64_t>({out});
  Shape ws(std::vector<std::int64_t>(std::size_t(x.dim()), 1));
  ws[d] = out;
  Tensor<T> w0 = empty<T>(ws), w1 = empty<T>(ws);
  const double scale = interp_scale(in, out, factor, align_corners);
  for (std::int64_t j = 0; j < out; ++j) {
    double src = align_corners ? scale * double(j) : scale * (double(j) + 0.5) - 0.5;
    if (src < 0) src = 0;
    const std::int64_t a = std::min<std::int64_t>(std::int64_t(src), in - 1);
    i0.data()[j] = a;
    i1.data()[j] = a < in - 1 ? a + 1 : a;
    const double l1 = std::min(src - double(a), 1.0);
    w1.data()[j] = T(l1);
    w0.data()[j] = T(1.0 - l1);
  }
  if (!x.device().is_cpu()) {
    w0 = w0.to(x.device());
    w1 = w1.to(x.device());
  }
  const Tensor<T> a = index_select(x, d, i0), b = index_select(x, d, i1);
  return Tensor<T>(a * w0 + b * w1);
}
}  // namespace detail

/// torch.nn.functional.interpolate for nearest (3-D and 4-D inputs), linear (3-D) and bilinear (4-D) resizing
/// of the trailing spatial dims, with PyTorch's source coordinates (align_corners, the scale from scale_factor
/// when given, as recompute_scale_factor=None).
template <class T>
Tensor<T> interpolate(const Tensor<T>& x, const InterpolateOptions& o) {
  const char* m = o.mode == InterpolateMode::nearest ? "nearest" : o.mode == InterpolateMode::linear ? "linear" : "bilinear";
  const int sp = x.dim() - 2;
  EMBER_CHECK(x.dim() == 3 || x.dim() == 4, "interpolate: expected a 3-D (N, C, W) or 4-D (N, C, H, W) input, got ",
              "shape ", x.shape().str());
  EMBER_CHECK(o.mode != InterpolateMode::linear || sp == 1, "interpolate: mode linear needs a 3-D input, got shape ",
              x.shape().str());
  EMBER_CHECK(o.mode != InterpolateMode::bilinear || sp == 2,
              "interpolate: mode bilinear needs a 4-D input, got shape ", x.shape().str());
  EMBER_CHECK(!(o.mode == InterpolateMode::nearest && o.align_corners),
              "interpolate: align_corners only applies to the linear modes (mode ", m, ")");
  EMBER_CHECK(o.size.empty() != o.scale_factor.empty(), "interpolate: give either size or scale_factor, not ",
              o.size.empty() ? "neither" : "both");
  for (int k = 0; k < sp; ++k) {
    const int d = 2 + k;
    const std::int64_t in = x.shape()[d];
    std::int64_t out = 0;
    double factor = 0;
    if (!o.size.empty()) {
      EMBER_CHECK(o.size.size() == 1 || int(o.size.size()) == sp, "interpolate: ", o.size.size(),
                  " sizes for ", sp, " spatial dims (shape ", x.shape().str(), ")");
      out = o.size[o.size.size() == 1 ? 0 : std::size_t(k)];
    } else {
      EMBER_CHECK(o.scale_factor.size() == 1 || int(o.scale_factor.size()) == sp, "interpolate: ",
                  o.scale_factor.size(), " scale factors for ", sp, " spatial dims (shape ", x.shape().str(), ")");
      factor = o.scale_factor[o.scale_factor.size() == 1 ? 0 : std::size_t(k)];
      EMBER_CHECK(std::isfinite(factor) && factor > 0, "interpolate: scale_factor must be positive and finite, got ",
                  factor);
      out = std::int64_t(std::floor(double(in) * factor));
    }
    EMBER_CHECK(out > 0 && in > 0, "interpolate: input (", in, ") and output (", out, ") sizes of dim ", d,
                " must be positive (shape ", x.shape().str(), ")");
    EMBER_CHECK(out <= (std::int64_t(1) << 31), "interpolate: output size ", out, " of dim ", d, " is too large");
  }
  Tensor<T> r = x;
  for (int k = 0; k < sp; ++k) {
    const int d = 2 + k;
    const std::int64_t in = x.shape()[d];
    double factor = 0;
    std::int64_t out;
    if (!o.size.empty()) {
      out = o.size[o.size.size() == 1 ? 0 : std::size_t(k)];
    } else {
      factor = o.scale_factor[o.scale_factor.size() == 1 ? 0 : std::size_t(k)];
      out = std::int64_t(std::floor(double(in) * factor));
    }
    r = detail::interp_dim(r, d, out, factor, o.mode, o.align_corners);
  }
  return r.same_impl(x) ? r.clone() : r;
}

/// torch.nn.functional.one_hot: an int64 tensor of index's shape plus a last dim of num_classes (-1: the largest
/// index + 1) with a 1 at each index.
inline Tensor<std::int64_t> one_hot(const Tensor<std::int64_t>& index, std::int64_t num_classes = -1) {
  index.check_cpu("one_hot");
  const Tensor<std::int64_t> c = index.contiguous();
  std::int64_t top = -1;
  for (std::int64_t i = 0; i < c.numel(); ++i) {
    EMBER_CHECK(c.data()[i] >= 0, "one_hot: class values must be non-negative, got ", c.data()[i], " at position ", i);
    top = std::max(top, c.data()[i]);
  }
  if (num_classes < 0) {
    EMBER_CHECK(num_classes == -1, "one_hot: num_classes must be -1 or non-negative, got ", num_classes);
    EMBER_CHECK(c.numel() > 0, "one_hot: cannot infer num_classes from an empty tensor");
    num_classes = top + 1;
  }
  EMBER_CHECK(top < num_classes, "one_hot: class value ", top, " is out of range for num_classes = ", num_classes);
  Shape s = index.shape();
  s.push_back(num_classes);
  Tensor<std::int64_t> r = zeros<std::int64_t>(s);
  for (std::int64_t i = 0; i < c.numel(); ++i) r.data()[i * num_classes + c.data()[i]] = 1;
  return r;
}

}  // namespace ember::nn::functional
