// ember — the geometric and colour transforms of torchvision.transforms.v2 with its semantics and defaults, on
// (C, H, W) float images in [0, 1]: Resize (bilinear, antialiased when downscaling), CenterCrop (zero padding when the
// crop is larger), RandomResizedCrop (scale (0.08, 1), ratio (3/4, 4/3), 10 tries then the centre fallback) and
// ColorJitter (brightness, contrast, saturation, hue, in a random order). Each also tells its geometry (the output
// size, the crop box) so that ImagePipeline (data/image_pipeline.hpp) can run the chain fused, from the decoded bytes
// straight into a batch. Like the other transforms (data/transforms.hpp) they take the sample's random stream.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/transforms.hpp"

namespace ember::data::transforms {

namespace detail {
inline float clamp01(float v) { return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v; }

/// Python's round(): to nearest, ties to even.
inline std::int64_t py_round(double v) { return std::int64_t(std::nearbyint(v)); }

/// Resamples a contiguous (C, H, W) image's box (y, x, h, w in source pixels, clipped to clip) to (oh, ow).
inline Tensor<float> resample_chw(const Tensor<float>& x, double y, double xo, double h, double w,
                                               std::int64_t oh, std::int64_t ow, std::int64_t cy0, std::int64_t cy1,
                                               std::int64_t cx0, std::int64_t cx1, bool antialias);
inline Tensor<float> resample_chw(const Tensor<float>& x, double y, double xo, double h, double w,
                                               std::int64_t oh, std::int64_t ow, std::int64_t cy0, std::int64_t cy1,
                                               std::int64_t cx0, std::int64_t cx1, bool antialias) {
  const std::int64_t C = x.size(0), H = x.size(1), W = x.size(2);
  ResampleAxis ay, ax;
  compute_resample_axis(ay, y, h, oh, cy0, cy1, antialias);
  compute_resample_axis(ax, xo, w, ow, cx0, cx1, antialias);
  Tensor<float> out = empty<float>(Shape{C, oh, ow});
  std::vector<float> tmp;
  resample(ResampleSource<float>{x.data(), int(C), W, 1, H * W, 0, 0}, ay, ax,
           ResampleTarget{out.data(), oh * ow, ow, false, nullptr, nullptr}, tmp);
  return out;
}
}  // namespace detail

/// Resizes to (height, width), or, with one size, the shorter side to `size` keeping the aspect ratio (the longer
/// side int(size * long / short), at most max_size), as torchvision's Resize.
struct Resize {
  ///@{
  /// The output size; width 0: `height` is the shorter side's size (torchvision's size=int).
  std::int64_t height = 0, width = 0;  // width 0: `height` is the shorter side's size
  ///@}
  std::int64_t max_size = 0;  ///< With one size: the cap on the longer side (0: none), as torchvision's max_size.
  bool antialias = true;      ///< Low-pass filter when downscaling (torchvision's antialias=True).

  /// The shorter side to `size`; max_size (0: none) caps the longer side.
  explicit Resize(std::int64_t size) : height(size) { check(); }
  /// Exactly (h, w), whatever the aspect ratio (torchvision's Resize((h, w))).
  Resize(std::int64_t h, std::int64_t w) : height(h), width(w) { check(); }

  /// The output (height, width) for an image of H x W (torchvision's _compute_resized_output_size).
  std::pair<std::int64_t, std::int64_t> output_size(std::int64_t H, std::int64_t W) const {
    if (width > 0) return {height, width};
    const std::int64_t s = std::min(H, W), l = std::max(H, W);
    std::int64_t ns = height, nl = std::int64_t(double(height) * double(l) / double(s));
    EMBER_CHECK(max_size == 0 || (width == 0 && max_size > height), "Resize: max_size ", max_size,
                " applies to a single size only and must exceed it (", height, ")");
    if (max_size > 0 && nl > max_size) {
      ns = std::int64_t(double(max_size) * double(ns) / double(nl));
      nl = max_size;
    }
    return W <= H ? std::pair{nl, ns} : std::pair{ns, nl};
  }
  /// The resized (C, oh, ow) copy of a (C, H, W) CPU image (bilinear, as torchvision's default).
  Tensor<float> operator()(const Tensor<float>& in, Rng&) const {
    const Tensor<float> x = detail::chw(in, "Resize");
    const auto [oh, ow] = output_size(x.size(1), x.size(2));
    return detail::resample_chw(x, 0, 0, double(x.size(1)), double(x.size(2)), oh, ow, 0, x.size(1), 0, x.size(2),
                                antialias);
  }

 private:
  void check() const {
    EMBER_CHECK(height > 0 && width >= 0 && max_size >= 0, "Resize: sizes must be positive, got (", height, ", ",
                width, ") with max_size ", max_size);
  }
};

/// Cuts the central (height, width) window, padding with zeros where it is larger than the image, as torchvision's
/// CenterCrop.
struct CenterCrop {
  ///@{
  /// The crop's size in pixels.
  std::int64_t height, width;
  ///@}

  /// A square (size, size) crop.
  explicit CenterCrop(std::int64_t size) : CenterCrop(size, size) {}
  /// A (h, w) crop (both > 0).
  CenterCrop(std::int64_t h, std::int64_t w) : height(h), width(w) {
    EMBER_CHECK(h > 0 && w > 0, "CenterCrop: size (", h, ", ", w, ") must be positive");
  }
  /// The window's top-left corner in an image of H x W (negative where the crop is larger: padding).
  std::pair<std::int64_t, std::int64_t> offset(std::int64_t H, std::int64_t W) const {
    // torchvision pads first ((crop - size) // 2 before, the rest after), then crops at round((padded - crop) / 2).
    auto one = [](std::int64_t n, std::int64_t c) {
      const std::int64_t before = c > n ? (c - n) / 2 : 0, after = c > n ? (c - n + 1) / 2 : 0;
      return py_round_half(double(n + before + after - c) / 2.0) - before;
    };
    return {one(H, height), one(W, width)};
  }
  /// The (C, height, width) centre crop of a (C, H, W) CPU image.
  Tensor<float> operator()(const Tensor<float>& in, Rng&) const {
    const Tensor<float> x = detail::chw(in, "CenterCrop");
    const std::int64_t C = x.size(0), H = x.size(1), W = x.size(2);
    const auto [top, left] = offset(H, W);
    Tensor<float> out = empty<float>(Shape{C, height, width});
    std::fill(out.data(), out.data() + out.numel(), 0.0f);
    for (std::int64_t c = 0; c < C; ++c)
      for (std::int64_t i = 0; i < height; ++i) {
        const std::int64_t y = top + i;
        if (y < 0 || y >= H) continue;
        const std::int64_t j0 = std::max<std::int64_t>(0, -left), j1 = std::min(width, W - left);
        if (j1 > j0)
          std::memcpy(out.data() + (c * height + i) * width + j0, x.data() + (c * H + y) * W + left + j0,
                      std::size_t(j1 - j0) * sizeof(float));
      }
    return out;
  }

 private:
  static std::int64_t py_round_half(double v) { return detail::py_round(v); }
};

/// A crop of random area (a fraction in [scale_min, scale_max] of the image) and aspect ratio (log-uniform in
/// [ratio_min, ratio_max]) resized to (height, width), as torchvision's RandomResizedCrop: up to 10 draws for a crop
/// that fits, else the centre crop of the whole image clamped to the ratio range.
struct RandomResizedCrop {
  ///@{
  /// The output size in pixels.
  std::int64_t height, width;
  ///@}
  ///@{
  /// The crop's area as a fraction of the image's: torchvision's scale=(scale_min, scale_max).
  float scale_min = 0.08f, scale_max = 1.0f;
  ///@}
  ///@{
  /// The crop's aspect ratio (width / height) range, sampled log-uniformly: torchvision's ratio.
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;
  ///@}
  bool antialias = true;  ///< Low-pass filter when downscaling (torchvision's antialias=True).

  /// A crop box: rows [top, top + h), columns [left, left + w).
  struct Box {
    ///@{
    /// The box's top-left corner and its size.
    std::int64_t top = 0, left = 0, h = 0, w = 0;
    ///@}
  };

  /// A square (size, size) output with the default scale and ratio ranges.
  explicit RandomResizedCrop(std::int64_t size) : RandomResizedCrop(size, size) {}
  /// A (h, w) output; scale and ratio as torchvision's (each range positive and ordered).
  RandomResizedCrop(std::int64_t h, std::int64_t w, std::array<float, 2> scale = {0.08f, 1.0f},
                    std::array<float, 2> ratio = {3.0f / 4.0f, 4.0f / 3.0f})
      : height(h), width(w), scale_min(scale[0]), scale_max(scale[1]), ratio_min(ratio[0]), ratio_max(ratio[1]) {
    EMBER_CHECK(h > 0 && w > 0, "RandomResizedCrop: size (", h, ", ", w, ") must be positive");
    EMBER_CHECK(0 < scale_min && scale_min <= scale_max, "RandomResizedCrop: scale (", scale_min, ", ", scale_max,
                ") must be positive and ordered");
    EMBER_CHECK(0 < ratio_min && ratio_min <= ratio_max, "RandomResizedCrop: ratio (", ratio_min, ", ", ratio_max,
                ") must be positive and ordered");
  }

  /// The crop box for an image of H x W (torchvision's get_params).
  Box get_params(std::int64_t H, std::int64_t W, Rng& g) const {
    const double area = double(H) * double(W);
    const double lr0 = std::log(double(ratio_min)), lr1 = std::log(double(ratio_max));
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target = area * double(g.uniform(scale_min, scale_max));
      const double ratio = std::exp(lr0 + (lr1 - lr0) * double(g.uniform()));
      const std::int64_t w = detail::py_round(std::sqrt(target * ratio));
      const std::int64_t h = detail::py_round(std::sqrt(target / ratio));
      if (0 < w && w <= W && 0 < h && h <= H) {
        const std::int64_t top = std::int64_t(g.below(std::uint64_t(H - h + 1)));
        const std::int64_t left = std::int64_t(g.below(std::uint64_t(W - w + 1)));
        return {top, left, h, w};
      }
    }
    const double in_ratio = double(W) / double(H);
    std::int64_t w = W, h = H;
    if (in_ratio < double(ratio_min)) {
      h = detail::py_round(double(W) / double(ratio_min));
    } else if (in_ratio > double(ratio_max)) {
      w = detail::py_round(double(H) * double(ratio_max));
    }
    return {(H - h) / 2, (W - w) / 2, h, w};
  }
  /// A random crop of a (C, H, W) CPU image, resized to (C, height, width).
  Tensor<float> operator()(const Tensor<float>& in, Rng& g) const {
    const Tensor<float> x = detail::chw(in, "RandomResizedCrop");
    const Box b = get_params(x.size(1), x.size(2), g);
    return detail::resample_chw(x, double(b.top), double(b.left), double(b.h), double(b.w), height, width, b.top,
                                b.top + b.h, b.left, b.left + b.w, antialias);
  }
};

/// The colour adjustments of torchvision.transforms.v2.functional on a contiguous (3, H, W) float image in [0, 1],
/// in place; results are clamped to [0, 1] as torchvision's float path clamps them.
namespace color {
/// Multiplies every value by f (adjust_brightness).
inline void adjust_brightness(float* img, std::int64_t H, std::int64_t W, float f);
/// Blends with the image's mean grey level: x * f + mean * (1 - f) (adjust_contrast).
inline void adjust_contrast(float* img, std::int64_t H, std::int64_t W, float f);
/// Blends each pixel with its grey level: x * f + grey * (1 - f) (adjust_saturation).
inline void adjust_saturation(float* img, std::int64_t H, std::int64_t W, float f);
/// Shifts the hue by `hue` turns, in [-0.5, 0.5], through HSV (adjust_hue).
inline void adjust_hue(float* img, std::int64_t H, std::int64_t W, float hue);
}  // namespace color

/// Random brightness, contrast, saturation and hue changes, applied in a random order, as torchvision's
/// ColorJitter: a value b gives a factor uniform in [max(0, 1 - b), 1 + b] (0: the adjustment is off); hue h gives a
/// shift uniform in [-h, h], h <= 0.5. On RGB images (3 channels).
struct ColorJitter {
  ///@{
  /// The strength of each change (torchvision's brightness, contrast, saturation, hue); 0: off.
  float brightness = 0, contrast = 0, saturation = 0, hue = 0;
  ///@}

  ColorJitter() = default;  ///< No change at all.
  /// ColorJitter(brightness, contrast, saturation, hue), as torchvision's (b, c, s >= 0; hue in [0, 0.5]).
  inline ColorJitter(float b, float c = 0, float s = 0, float h = 0);
  /// In place on a contiguous (3, H, W) image.
  inline void apply(float* img, std::int64_t H, std::int64_t W, Rng& g) const;
  /// The jittered copy of a (3, H, W) CPU image.
  Tensor<float> operator()(const Tensor<float>& in, Rng& g) const {
    const Tensor<float> x = detail::chw(in, "ColorJitter");
    EMBER_CHECK(x.size(0) == 3, "ColorJitter: expected an RGB image (3, H, W), got ", x.shape().str());
    Tensor<float> out = empty<float>(x.shape());
    std::memcpy(out.data(), x.data(), std::size_t(x.numel()) * sizeof(float));
    apply(out.data(), x.size(1), x.size(2), g);
    return out;
  }
  /// Whether any of the changes is on.
  bool active() const { return brightness > 0 || contrast > 0 || saturation > 0 || hue > 0; }
};

namespace color {
inline void adjust_brightness(float* img, std::int64_t H, std::int64_t W, float f) {
  const std::int64_t n = 3 * H * W;
  for (std::int64_t i = 0; i < n; ++i) img[i] = detail::clamp01(img[i] * f);
}
inline void adjust_contrast(float* img, std::int64_t H, std::int64_t W, float f) {
  const std::int64_t n = H * W;
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += 0.2989f * img[i] + 0.587f * img[n + i] + 0.114f * img[2 * n + i];
  const float m = float(sum / double(n)) * (1.0f - f);
  for (std::int64_t i = 0; i < 3 * n; ++i) img[i] = detail::clamp01(img[i] * f + m);
}
inline void adjust_saturation(float* img, std::int64_t H, std::int64_t W, float f) {
  const std::int64_t n = H * W;
  for (std::int64_t i = 0; i < n; ++i) {
    const float gr = (0.2989f * img[i] + 0.587f * img[n + i] + 0.114f * img[2 * n + i]) * (1.0f - f);
    for (int c = 0; c < 3; ++c) img[c * n + i] = detail::clamp01(img[c * n + i] * f + gr);
  }
}
inline void adjust_hue(float* img, std::int64_t H, std::int64_t W, float hue) {
  if (hue == 0.0f) return;
  const std::int64_t n = H * W;
  for (std::int64_t i = 0; i < n; ++i) {
    const float r = img[i], g = img[n + i], b = img[2 * n + i];
    // RGB to HSV as torchvision's _rgb_to_hsv.
    const float maxc = std::max({r, g, b}), minc = std::min({r, g, b});
    const bool eq = maxc == minc;
    const float range = maxc - minc;
    const float s = range / (eq ? 1.0f : maxc);
    const float div = eq ? 1.0f : range;
    const float rc = (maxc - r) / div, gc = (maxc - g) / div, bc = (maxc - b) / div;
    float h;
    if (maxc == r) h = bc - gc;
    else if (maxc == g) h = 2.0f + rc - bc;
    else h = 4.0f + gc - rc;
    h = std::fmod(h / 6.0f + 1.0f, 1.0f);
    // Shift, then HSV to RGB as _hsv_to_rgb.
    h = h + hue;
    h = h - std::floor(h);  // Python's % 1.0
    const float v = maxc;
    const float h6 = h * 6.0f, fi = std::floor(h6), fr = h6 - fi;
    int k = int(fi) % 6;
    if (k < 0) k += 6;
    const float sf = s * fr;
    const float p = detail::clamp01((1.0f - s) * v), q = detail::clamp01((1.0f - sf) * v),
                t = detail::clamp01((sf + (1.0f - s)) * v);
    const float R[6] = {v, q, p, p, t, v}, G[6] = {t, v, v, q, p, p}, B[6] = {p, p, t, v, v, q};
    img[i] = R[k];
    img[n + i] = G[k];
    img[2 * n + i] = B[k];
  }
}
}  // namespace color

inline ColorJitter::ColorJitter(float b, float c, float s, float h)
    : brightness(b), contrast(c), saturation(s), hue(h) {
  EMBER_CHECK(b >= 0 && c >= 0 && s >= 0 && std::isfinite(b) && std::isfinite(c) && std::isfinite(s),
              "ColorJitter: brightness, contrast and saturation must be finite and non-negative, got ", b, ", ", c,
              ", ", s);
  EMBER_CHECK(h >= 0 && h <= 0.5f, "ColorJitter: hue must be in [0, 0.5], got ", h);
}

inline void ColorJitter::apply(float* img, std::int64_t H, std::int64_t W, Rng& g) const {
  // torchvision draws the order (a permutation of the four) and then each active adjustment's factor.
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[g.below(std::uint64_t(i + 1))]);
  auto factor = [&](float v) { return std::max(0.0f, 1.0f - v) + (1.0f + v - std::max(0.0f, 1.0f - v)) * g.uniform(); };
  const float fb = brightness > 0 ? factor(brightness) : 1.0f, fc = contrast > 0 ? factor(contrast) : 1.0f;
  const float fs = saturation > 0 ? factor(saturation) : 1.0f, fh = hue > 0 ? g.uniform(-hue, hue) : 0.0f;
  for (int o : order) {
    if (o == 0 && brightness > 0) color::adjust_brightness(img, H, W, fb);
    if (o == 1 && contrast > 0) color::adjust_contrast(img, H, W, fc);
    if (o == 2 && saturation > 0) color::adjust_saturation(img, H, W, fs);
    if (o == 3 && hue > 0) color::adjust_hue(img, H, W, fh);
  }
}

}  // namespace ember::data::transforms
