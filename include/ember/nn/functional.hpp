// ember — torch.nn.functional's pad, interpolate and one_hot. pad is built from differentiable pieces (cat,
// index_select), interpolate from one resampling pass per spatial dim (autograd/interpolate.hpp; the loops in
// cpu/interpolate.hpp), so their gradients come from those and they run wherever those run.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ember/autograd/interpolate.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/autograd/shape_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/index.hpp"
#include "ember/cpu/interpolate.hpp"
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
    cpu::fill_index(idx.data(), n + lo + hi, [&](std::int64_t i) { return detail::pad_source(i - lo, n, mode); });
    r = index_select(r, d, idx);
  }
  return r.same_impl(x) ? r.clone() : r;
}

enum class InterpolateMode { nearest, linear, bilinear, bicubic, trilinear, area, nearest_exact };

/// The options of nn::functional::interpolate after the input, with the names and order of
/// torch.nn.functional.interpolate; exactly one of size and scale_factor is given:
/// ```
/// Tensor<float> up = interpolate(x, {.scale_factor = {2.0}, .mode = InterpolateMode::bilinear});  // (N, C, 2H, 2W)
/// ```
/// recompute_scale_factor is PyTorch's None (the given factors are used) and antialias is not supported.
struct InterpolateOptions {
  /// The output's spatial size, one value for every spatial dim or one per dim; empty: from scale_factor.
  std::vector<std::int64_t> size{};
  /// The factor per spatial dim (one value applies to all): output size floor(input size * factor); empty: use size.
  std::vector<double> scale_factor{};
  InterpolateMode mode = InterpolateMode::nearest;  ///< PyTorch's mode string ("nearest-exact": nearest_exact)
  /// Map the corner pixels' centres onto each other (linear, bilinear, bicubic and trilinear only; PyTorch's None
  /// is false).
  bool align_corners = false;
};

namespace detail {
inline const char* interp_mode_name(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::nearest: return "nearest";
    case InterpolateMode::linear: return "linear";
    case InterpolateMode::bilinear: return "bilinear";
    case InterpolateMode::bicubic: return "bicubic";
    case InterpolateMode::trilinear: return "trilinear";
    case InterpolateMode::area: return "area";
    default: return "nearest-exact";
  }
}
/// The number of spatial dims a mode needs (0: any of 1, 2 and 3).
inline int interp_mode_dims(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::linear: return 1;
    case InterpolateMode::bilinear:
    case InterpolateMode::bicubic: return 2;
    case InterpolateMode::trilinear: return 3;
    default: return 0;
  }
}
inline cpu::ResampleKind interp_kind(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::nearest: return cpu::ResampleKind::nearest;
    case InterpolateMode::nearest_exact: return cpu::ResampleKind::nearest_exact;
    case InterpolateMode::bicubic: return cpu::ResampleKind::cubic;
    case InterpolateMode::area: return cpu::ResampleKind::area;
    default: return cpu::ResampleKind::linear;
  }
}
}  // namespace detail

/// torch.nn.functional.interpolate of the trailing spatial dims of a 3-D (N, C, W), 4-D (N, C, H, W) or 5-D
/// (N, C, D, H, W) input: nearest, nearest-exact and area (= adaptive_avg_pool) for any of them, linear (3-D),
/// bilinear and bicubic (4-D, bicubic with A = -0.75) and trilinear (5-D), with PyTorch's source coordinates
/// (align_corners, the scale from scale_factor when given, as recompute_scale_factor=None; output sizes
/// floor(in * scale_factor)). Each spatial dim is one separable pass (cpu/interpolate.hpp), differentiable.
template <class T>
Tensor<T> interpolate(const Tensor<T>& x, const InterpolateOptions& o) {
  const char* m = detail::interp_mode_name(o.mode);
  EMBER_CHECK(x.dim() >= 3 && x.dim() <= 5, "interpolate: expected a 3-D (N, C, W), 4-D (N, C, H, W) or 5-D ",
              "(N, C, D, H, W) input, got shape ", x.shape().str());
  const int sp = x.dim() - 2, need = detail::interp_mode_dims(o.mode);
  EMBER_CHECK(need == 0 || need == sp, "interpolate: mode ", m, " needs a ", need + 2, "-D input, got shape ",
              x.shape().str());
  EMBER_CHECK(!o.align_corners || need > 0, "interpolate: align_corners only applies to the interpolating modes ",
              "(linear, bilinear, bicubic, trilinear), not mode ", m);
  EMBER_CHECK(o.size.empty() != o.scale_factor.empty(), "interpolate: give either size or scale_factor, not ",
              o.size.empty() ? "neither" : "both");
  EMBER_CHECK(o.size.empty() || o.size.size() == 1 || int(o.size.size()) == sp, "interpolate: ", o.size.size(),
              " sizes for ", sp, " spatial dims (shape ", x.shape().str(), ")");
  EMBER_CHECK(o.scale_factor.empty() || o.scale_factor.size() == 1 || int(o.scale_factor.size()) == sp,
              "interpolate: ", o.scale_factor.size(), " scale factors for ", sp, " spatial dims (shape ",
              x.shape().str(), ")");
  // PyTorch's kernels take sizes as int32-range values; the bound also keeps the taps' tables finite.
  constexpr std::int64_t kMaxOut = std::int64_t(1) << 31;
  std::vector<std::int64_t> outs(static_cast<std::size_t>(sp));
  std::vector<double> factors(static_cast<std::size_t>(sp), 0.0);
  for (int k = 0; k < sp; ++k) {
    const int d = 2 + k;
    const std::int64_t in = x.shape()[d];
    std::int64_t out = 0;
    if (!o.size.empty()) {
      out = o.size[o.size.size() == 1 ? 0 : std::size_t(k)];
    } else {
      const double factor = o.scale_factor[o.scale_factor.size() == 1 ? 0 : std::size_t(k)];
      EMBER_CHECK(std::isfinite(factor) && factor > 0, "interpolate: scale_factor must be positive and finite, got ",
                  factor);
      // In floating point first: the product may lie beyond int64, whose conversion is undefined.
      const double want = std::floor(double(in) * factor);
      EMBER_CHECK(want <= double(kMaxOut), "interpolate: scale_factor ", factor, " makes the output size of dim ", d,
                  " too large (", in, " * ", factor, " = ", want, " positions, at most 2^31)");
      out = std::int64_t(want);
      if (o.mode != InterpolateMode::area) factors[std::size_t(k)] = factor;  // area: adaptive pooling, sizes only
    }
    EMBER_CHECK(out > 0 && in > 0, "interpolate: input (", in, ") and output (", out, ") sizes of dim ", d,
                " must be positive (shape ", x.shape().str(), ")");
    EMBER_CHECK(out <= kMaxOut, "interpolate: output size ", out, " of dim ", d, " is too large (at most 2^31)");
    outs[std::size_t(k)] = out;
  }
  Tensor<T> r = x;
  for (int k = 0; k < sp; ++k)
    r = ember::detail::resample(r, 2 + k,
                                cpu::resample_taps(detail::interp_kind(o.mode), x.shape()[2 + k], outs[std::size_t(k)],
                                                   factors[std::size_t(k)], o.align_corners, sp == 2));
  return r;
}

/// torch.nn.functional.one_hot: an int64 tensor of index's shape plus a last dim of num_classes (-1: the largest
/// index + 1) with a 1 at each index.
inline Tensor<std::int64_t> one_hot(const Tensor<std::int64_t>& index, std::int64_t num_classes = -1) {
  index.check_cpu("one_hot");
  const Tensor<std::int64_t> c = index.contiguous();
  const std::int64_t top = cpu::checked_max_class(c.data(), c.numel(), "one_hot");
  if (num_classes < 0) {
    EMBER_CHECK(num_classes == -1, "one_hot: num_classes must be -1 or non-negative, got ", num_classes);
    EMBER_CHECK(c.numel() > 0, "one_hot: cannot infer num_classes from an empty tensor");
    num_classes = top + 1;
  }
  EMBER_CHECK(top < num_classes, "one_hot: class value ", top, " is out of range for num_classes = ", num_classes);
  Shape s = index.shape();
  s.push_back(num_classes);
  Tensor<std::int64_t> r = zeros<std::int64_t>(s);
  cpu::one_hot_fill(c.data(), c.numel(), num_classes, r.data());
  return r;
}

}  // namespace ember::nn::functional
