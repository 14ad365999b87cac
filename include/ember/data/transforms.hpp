// ember — image transforms run by DataLoader workers: Normalize, RandomCrop (with padding), RandomHorizontalFlip,
// RandomErasing, Compose. A transform maps one sample's input (C, H, W) float tensor and the sample's own random
// stream to a new tensor; it never writes to its input (a dataset may hand out views of its storage).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/rng.hpp"

namespace ember::data::transforms {

namespace detail {
/// x as a contiguous CPU (C, H, W) tensor (a copy only when x is strided); `op` names the transform in errors.
EMBER_HEADER_INLINE Tensor<float> chw(const Tensor<float>& x, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Tensor<float> chw(const Tensor<float>& x, const char* op) {
  EMBER_CHECK(x.defined(), op, ": got an undefined tensor");
  EMBER_CHECK(x.dim() == 3, op, ": expected an image (C, H, W), got shape ", x.shape().str());
  x.check_cpu(op);
  if (x.is_contiguous()) return x;
  Tensor<float> c = empty<float>(x.shape());
  ember::data::detail::copy_to_contiguous(x, c.data());
  return c;
}
#endif
}  // namespace detail

/// (x - mean[c]) / std[c] per channel; one value applies to every channel. Like torchvision's Normalize.
struct Normalize {
  ///@{
  /// The per-channel means and standard deviations (the same count; one value each applies to every channel).
  std::vector<float> mean, std;
  ///@}

  /// Normalize(mean, std), as torchvision's: m and s have the same, non-zero count; every s is finite and non-zero.
  EMBER_HEADER_INLINE Normalize(std::vector<float> m, std::vector<float> s);
  /// The normalized copy of a (C, H, W) CPU image (C = mean's count, or any C with one value).
  EMBER_HEADER_INLINE Tensor<float> operator()(const Tensor<float>& in, Rng&) const;
  /// In place, on a contiguous image nobody else holds (Compose calls it on its own intermediates).
  void apply_(Tensor<float>& x, Rng&) const { run(x, x); }

 private:
  EMBER_HEADER_INLINE void run(const Tensor<float>& x, const Tensor<float>& out) const;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Normalize::Normalize(std::vector<float> m, std::vector<float> s)
    : mean(std::move(m)), std(std::move(s)) {
  EMBER_CHECK(!mean.empty() && mean.size() == std.size(), "Normalize: mean has ", mean.size(),
              " values and std has ", std.size(), "; expected the same non-zero count");
  for (float v : std) EMBER_CHECK(v != 0.0f && std::isfinite(v), "Normalize: std must be finite and non-zero, got ", v);
}

EMBER_HEADER_INLINE Tensor<float> Normalize::operator()(const Tensor<float>& in, Rng&) const {
  const Tensor<float> x = detail::chw(in, "Normalize");
  Tensor<float> out = empty<float>(x.shape());
  run(x, out);
  return out;
}

EMBER_HEADER_INLINE void Normalize::run(const Tensor<float>& x, const Tensor<float>& out) const {
  const std::int64_t C = x.size(0), hw = x.size(1) * x.size(2);
  EMBER_CHECK(mean.size() == 1 || std::int64_t(mean.size()) == C, "Normalize: ", mean.size(),
              " means for an image of ", C, " channels (shape ", x.shape().str(), ")");
  for (std::int64_t c = 0; c < C; ++c) {
    const float m = mean[mean.size() == 1 ? 0 : c], inv = 1.0f / std[std.size() == 1 ? 0 : c];
    const float* s = x.data() + c * hw;
    float* o = out.data() + c * hw;
    for (std::int64_t i = 0; i < hw; ++i) o[i] = (s[i] - m) * inv;
  }
}
#endif

/// The options of RandomCrop after its size, in torchvision's RandomCrop order (its pad_if_needed and padding_mode
/// are not supported: the padding is constant):
///   data::transforms::RandomCrop crop(32, {.padding = 4});
struct RandomCropOptions {
  /// Pixels added on every side before cropping, >= 0; 0: none (torchvision: padding=None; one number only, not a
  /// per-side tuple).
  std::int64_t padding = 0;
  float fill = 0.0f;  ///< the padding's value, in every channel (torchvision: fill, padding_mode="constant")
};

/// Pads the image by `padding` on each side, then cuts a (height, width) window at a random position, as
/// torchvision's RandomCrop(size, padding).
struct RandomCrop {
  ///@{
  /// The crop's size in pixels (torchvision's size=(height, width)).
  std::int64_t height, width;
  ///@}
  RandomCropOptions opt;  ///< The padding and its fill value.

  /// A (h, w) crop (both > 0), as torchvision's RandomCrop((h, w), padding=...).
  EMBER_HEADER_INLINE RandomCrop(std::int64_t h, std::int64_t w, RandomCropOptions o = {});
  /// A square (size, size) crop, as RandomCrop(size, padding=...).
  explicit RandomCrop(std::int64_t size, RandomCropOptions o = {}) : RandomCrop(size, size, o) {}

  /// The (C, height, width) crop of a (C, H, W) CPU image, at a position drawn from g; the padded image must be at
  /// least the crop's size.
  EMBER_HEADER_INLINE Tensor<float> operator()(const Tensor<float>& in, Rng& g) const;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE RandomCrop::RandomCrop(std::int64_t h, std::int64_t w, RandomCropOptions o)
    : height(h), width(w), opt(o) {
  EMBER_CHECK(h > 0 && w > 0 && o.padding >= 0, "RandomCrop: size (", h, ", ", w, ") must be positive and padding ",
              o.padding, " non-negative");
}

EMBER_HEADER_INLINE Tensor<float> RandomCrop::operator()(const Tensor<float>& in, Rng& g) const {
  const Tensor<float> x = detail::chw(in, "RandomCrop");
  const std::int64_t C = x.size(0), H = x.size(1), W = x.size(2), p = opt.padding;
  EMBER_CHECK(H + 2 * p >= height && W + 2 * p >= width, "RandomCrop: a (", height, ", ", width,
              ") crop does not fit an image of shape ", x.shape().str(), " padded by ", p);
  const std::int64_t top = std::int64_t(g.below(std::uint64_t(H + 2 * p - height + 1))) - p;
  const std::int64_t left = std::int64_t(g.below(std::uint64_t(W + 2 * p - width + 1))) - p;
  Tensor<float> out = empty<float>(Shape{C, height, width});
  // Output columns [j0, j1) come from the image; the rest, and rows outside it, are padding.
  const std::int64_t j0 = std::clamp<std::int64_t>(-left, 0, width), j1 = std::clamp<std::int64_t>(W - left, j0, width);
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t i = 0; i < height; ++i) {
      float* o = out.data() + (c * height + i) * width;
      const std::int64_t y = top + i;
      if (y < 0 || y >= H) {
        std::fill(o, o + width, opt.fill);
        continue;
      }
      std::fill(o, o + j0, opt.fill);
      if (j1 > j0) std::memcpy(o + j0, x.data() + (c * H + y) * W + left + j0, std::size_t(j1 - j0) * sizeof(float));
      std::fill(o + j1, o + width, opt.fill);
    }
  return out;
}
#endif

/// Mirrors the image left-right with probability p.
struct RandomHorizontalFlip {
  float p = 0.5f;  ///< The probability of flipping (torchvision's p).

  /// The (C, H, W) CPU image mirrored left-right (a new tensor) with probability p, else the image itself.
  EMBER_HEADER_INLINE Tensor<float> operator()(const Tensor<float>& in, Rng& g) const;
  /// In place, on a contiguous image nobody else holds; draws the same random numbers as operator().
  EMBER_HEADER_INLINE void apply_(Tensor<float>& x, Rng& g) const;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Tensor<float> RandomHorizontalFlip::operator()(const Tensor<float>& in, Rng& g) const {
  const Tensor<float> x = detail::chw(in, "RandomHorizontalFlip");
  if (!g.bernoulli(p)) return x;
  const std::int64_t rows = x.size(0) * x.size(1), W = x.size(2);
  Tensor<float> out = empty<float>(x.shape());
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = x.data() + r * W;
    float* o = out.data() + r * W;
    for (std::int64_t j = 0; j < W; ++j) o[j] = s[W - 1 - j];
  }
  return out;
}

EMBER_HEADER_INLINE void RandomHorizontalFlip::apply_(Tensor<float>& x, Rng& g) const {
  if (!g.bernoulli(p)) return;
  const std::int64_t rows = x.size(0) * x.size(1), W = x.size(2);
  for (std::int64_t r = 0; r < rows; ++r) std::reverse(x.data() + r * W, x.data() + (r + 1) * W);
}
#endif

/// The options of RandomErasing, in torchvision's RandomErasing order and with its defaults (its scale and ratio
/// tuples are two fields each; value is one number; inplace is apply_):
///   data::transforms::RandomErasing erase({.p = 0.25f, .scale_max = 0.2f});
struct RandomErasingOptions {
  float p = 0.5f;  ///< the probability of erasing a rectangle, in [0, 1]
  float scale_min = 0.02f,  ///< the erased area's smallest fraction of the image, in (0, scale_max] (scale[0])
      scale_max = 0.33f;    ///< the erased area's largest fraction of the image, in [scale_min, 1] (scale[1])
  float ratio_min = 0.3f,   ///< the smallest aspect ratio (height / width), > 0 (ratio[0]); sampled log-uniformly
      ratio_max = 3.3f;     ///< the largest aspect ratio, >= ratio_min (ratio[1])
  float value = 0.0f;       ///< the rectangle's fill value, in every channel (torchvision's "random" is not supported)
};

/// With probability p, fills a random rectangle of random area and aspect ratio with `value` (Zhong et al., 2017;
/// torchvision's RandomErasing: up to 10 tries to find a rectangle that fits, else the image is unchanged).
struct RandomErasing {
  RandomErasingOptions opt;  ///< The probability, the area and aspect-ratio ranges and the fill value.

  RandomErasing() = default;  ///< With the default options (torchvision's defaults).
  /// With options `o` (checked: p in [0, 1], ordered ranges within their bounds).
  EMBER_HEADER_INLINE explicit RandomErasing(RandomErasingOptions o);

  /// A copy of the (C, H, W) CPU image with one rectangle filled, with probability p; else the image itself.
  EMBER_HEADER_INLINE Tensor<float> operator()(const Tensor<float>& in, Rng& g) const;
  /// In place, on a contiguous image nobody else holds; draws the same random numbers as operator().
  EMBER_HEADER_INLINE void apply_(Tensor<float>& x, Rng& g) const;

 private:
  struct Rect {
    std::int64_t top = 0, left = 0, h = 0, w = 0;
  };
  // Whether to erase, and where.
  EMBER_HEADER_INLINE bool draw(const Tensor<float>& x, Rng& g, Rect& r) const;
  EMBER_HEADER_INLINE void fill(const Tensor<float>& out, const Rect& r) const;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE RandomErasing::RandomErasing(RandomErasingOptions o)
    : opt(o) {
  EMBER_CHECK(o.p >= 0 && o.p <= 1, "RandomErasing: p must be in [0, 1], got ", o.p);
  EMBER_CHECK(0 < o.scale_min && o.scale_min <= o.scale_max && o.scale_max <= 1, "RandomErasing: scale range [",
              o.scale_min, ", ", o.scale_max, "] must lie in (0, 1] and be ordered");
  EMBER_CHECK(0 < o.ratio_min && o.ratio_min <= o.ratio_max, "RandomErasing: ratio range [", o.ratio_min, ", ",
              o.ratio_max, "] must be positive and ordered");
}

EMBER_HEADER_INLINE Tensor<float> RandomErasing::operator()(const Tensor<float>& in, Rng& g) const {
  const Tensor<float> x = detail::chw(in, "RandomErasing");
  Rect r;
  if (!draw(x, g, r)) return x;
  Tensor<float> out = empty<float>(x.shape());
  std::memcpy(out.data(), x.data(), std::size_t(x.numel()) * sizeof(float));
  fill(out, r);
  return out;
}

EMBER_HEADER_INLINE void RandomErasing::apply_(Tensor<float>& x, Rng& g) const {
  Rect r;
  if (draw(x, g, r)) fill(x, r);
}

EMBER_HEADER_INLINE bool RandomErasing::draw(const Tensor<float>& x, Rng& g, Rect& r) const {
  if (!g.bernoulli(opt.p)) return false;
  const std::int64_t H = x.size(1), W = x.size(2);
  const float area = float(H * W);
  const float lr0 = std::log(opt.ratio_min), lr1 = std::log(opt.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const float target = area * g.uniform(opt.scale_min, opt.scale_max);
    const float ratio = std::exp(g.uniform(lr0, lr1));
    // Sizes rounded and checked in floating point before they become integers (huge options give sizes beyond
    // int64; NaN fails every comparison).
    const float hf = std::round(std::sqrt(target * ratio)), wf = std::round(std::sqrt(target / ratio));
    if (!(hf >= 1 && wf >= 1 && hf < float(H) && wf < float(W))) continue;
    const std::int64_t h = std::int64_t(hf), w = std::int64_t(wf);
    r.top = std::int64_t(g.below(std::uint64_t(H - h + 1)));
    r.left = std::int64_t(g.below(std::uint64_t(W - w + 1)));
    r.h = h;
    r.w = w;
    return true;
  }
  return false;
}

EMBER_HEADER_INLINE void RandomErasing::fill(const Tensor<float>& out, const Rect& r) const {
  const std::int64_t C = out.size(0), H = out.size(1), W = out.size(2);
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t i = r.top; i < r.top + r.h; ++i) {
      float* o = out.data() + (c * H + i) * W;
      std::fill(o + r.left, o + r.left + r.w, opt.value);
    }
}
#endif

/// Applies transforms in order: Compose(RandomCrop(28, {.padding = 2}), RandomHorizontalFlip{}, Normalize(...)).
template <class... Ts>
struct Compose {
  std::tuple<Ts...> ts;  ///< The transforms, in the order they run.

  /// Composes the transforms `t...`, run first to last (torchvision's Compose([...])).
  explicit Compose(Ts... t) : ts(std::move(t)...) {}
  /// Transforms that have an in-place form (apply_) run in place on an image nobody else holds: the results are
  /// the same, without a copy per transform.
  Tensor<float> operator()(Tensor<float> x, Rng& g) const {
    std::apply([&](const auto&... t) { (step(t, x, g), ...); }, ts);
    return x;
  }

 private:
  template <class T>
  static void step(const T& t, Tensor<float>& x, Rng& g) {
    if constexpr (requires { t.apply_(x, g); })
      if (x.defined() && x.dim() == 3 && x.device().is_cpu() && x.is_contiguous() && x.unshared()) {
        t.apply_(x, g);
        return;
      }
    x = t(x, g);
  }
};
template <class... Ts>
Compose(Ts...) -> Compose<Ts...>;

}  // namespace ember::data::transforms
