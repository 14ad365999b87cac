// ember — separable image resampling with torchvision's bilinear filter: antialiased when downscaling (the filter
// widens to the scale factor, as torch.nn.functional.interpolate(mode="bilinear", antialias=True) and PIL), plain
// bilinear (align_corners=False) otherwise. A vertical and a horizontal pass over the source window the output needs
// write the output channel-planar (CHW) with an optional mirror and a per-channel affine map
// (ToTensor's 1/255 and Normalize folded together), so a decoded image goes to its slot of a batch tensor in one go.
// (The passes run vertical first: see resample().)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ember/config.hpp"

namespace ember::data {

/// The weights of one axis of a resampling: output i reads count[i] source samples from first[i] on, with weights
/// weights[i * taps + k] (summing to 1).
struct ResampleAxis {
  std::vector<std::int64_t> first;  ///< Per output: its first source sample.
  std::vector<int> count;           ///< Per output: how many source samples it reads.
  std::vector<float> weights;       ///< (n, taps): the samples' weights, each output's summing to 1.
  int taps = 0;                     ///< The weights' stride: the most samples any output reads.
  ///@{
  /// The source samples any output reads: [lo, hi).
  std::int64_t lo = 0, hi = 0;  // the source samples any output reads: [lo, hi)
  ///@}
  /// The number of outputs n.
  std::int64_t size() const { return std::int64_t(first.size()); }
};

/// Fills `a` for n outputs sampling the source interval [x0, x0 + len): output i is centred on
/// x0 + (i + 0.5) * len / n. The filter is the triangle of bilinear interpolation, widened by len / n when that is
/// above 1 and `antialias` is set; the samples it reads are clipped to [clip_lo, clip_hi) and the weights
/// renormalised (torchvision's _upsample_bilinear2d_aa, where a crop's clip range is the crop itself).
inline void compute_resample_axis(ResampleAxis& a, double x0, double len, std::int64_t n,
                                               std::int64_t clip_lo, std::int64_t clip_hi, bool antialias = true);

/// A source image for resample(): element (y, x, c) at data[y * row + x * col + c * chan], y and x counted from
/// (y0, x0) of the full image (a decoded window starts there).
template <class T>
struct ResampleSource {
  const T* data = nullptr;  ///< Element (y0, x0, 0).
  int channels = 0;         ///< The number of channels.
  ///@{
  /// The strides (in elements) of a row, a column and a channel.
  std::ptrdiff_t row = 0, col = 0, chan = 0;
  ///@}
  ///@{
  /// Where data starts in the full image.
  std::int64_t y0 = 0, x0 = 0;
  ///@}
};

/// Where resample() writes: channel c, row y, column x at data[c * chan + y * row + x], the value v * scale[c] +
/// bias[c], columns mirrored when `flip`.
struct ResampleTarget {
  float* data = nullptr;  ///< Element (0, 0, 0) of the output.
  ///@{
  /// The strides (in elements) of a channel and a row (columns are contiguous).
  std::ptrdiff_t chan = 0, row = 0;
  ///@}
  bool flip = false;             ///< Mirror the columns (a horizontal flip).
  const float* scale = nullptr;  ///< (channels): per-channel scale; null: 1.
  const float* bias = nullptr;   ///< (channels): per-channel offset; null: 0.
};

/// Resamples src through the axes ay (rows) and ax (columns) into dst. `tmp` is scratch, reused between calls.
template <class T>
void resample(const ResampleSource<T>& src, const ResampleAxis& ay, const ResampleAxis& ax, const ResampleTarget& dst,
              std::vector<float>& tmp);

inline void compute_resample_axis(ResampleAxis& a, double x0, double len, std::int64_t n,
                                               std::int64_t clip_lo, std::int64_t clip_hi, bool antialias) {
  EMBER_CHECK(n > 0 && len > 0 && clip_lo < clip_hi, "resample: ", n, " outputs from an interval of ", len,
              " samples clipped to [", clip_lo, ", ", clip_hi, ")");
  const double scale = len / double(n);
  const double support = antialias && scale > 1.0 ? scale : 1.0;  // the triangle's half-width, in source samples
  const double inv = 1.0 / support;
  a.taps = int(std::ceil(support)) * 2 + 1;
  a.first.resize(std::size_t(n));
  a.count.resize(std::size_t(n));
  a.weights.assign(std::size_t(n) * std::size_t(a.taps), 0.0f);
  a.lo = clip_hi;
  a.hi = clip_lo;
  for (std::int64_t i = 0; i < n; ++i) {
    const double center = x0 + scale * (double(i) + 0.5);
    std::int64_t lo = std::int64_t(std::floor(center - support + 0.5));
    std::int64_t hi = std::int64_t(std::floor(center + support + 0.5));
    lo = std::clamp(lo, clip_lo, clip_hi - 1);
    hi = std::clamp(hi, lo + 1, clip_hi);
    hi = std::min(hi, lo + a.taps);
    float* w = a.weights.data() + std::size_t(i) * std::size_t(a.taps);
    double total = 0;
    for (std::int64_t j = lo; j < hi; ++j) {
      const double t = std::abs((double(j) - center + 0.5) * inv);
      const double v = t < 1.0 ? 1.0 - t : 0.0;
      w[j - lo] = float(v);
      total += v;
    }
    if (total > 0)
      for (std::int64_t j = 0; j < hi - lo; ++j) w[j] = float(double(w[j]) / total);
    else
      w[0] = 1.0f;  // a centre outside the clip range: the nearest sample
    a.first[std::size_t(i)] = lo;
    a.count[std::size_t(i)] = int(hi - lo);
    a.lo = std::min(a.lo, lo);
    a.hi = std::max(a.hi, hi);
  }
}

namespace detail {
// Horizontal pass of one row of interleaved floats (the vertical pass's output, columns from x0 on) into `out`
// (nx * C interleaved): C known at compile time (1 or 3 for decoded images) keeps the accumulators in registers.
template <int C>
EMBER_INLINE void resample_row(const float* s, std::int64_t x0, const ResampleAxis& ax, float* out, int channels) {
  const int nc = C > 0 ? C : channels;
  const std::int64_t nx = ax.size();
  for (std::int64_t x = 0; x < nx; ++x) {
    const float* w = ax.weights.data() + std::size_t(x) * std::size_t(ax.taps);
    const float* p = s + (ax.first[std::size_t(x)] - x0) * nc;
    const int n = ax.count[std::size_t(x)];
    if constexpr (C > 0) {
      float acc[C > 0 ? C : 1] = {};
      for (int k = 0; k < n; ++k)
        for (int c = 0; c < C; ++c) acc[c] += w[k] * p[k * C + c];
      for (int c = 0; c < C; ++c) out[x * C + c] = acc[c];
    } else {
      for (int c = 0; c < nc; ++c) {
        float acc = 0;
        for (int k = 0; k < n; ++k) acc += w[k] * p[k * nc + c];
        out[x * nc + c] = acc;
      }
    }
  }
}
// One output row, interleaved, to its planar place: v * scale + bias, mirrored when asked.
inline void store_row(const float* row, std::int64_t nx, int C, const ResampleTarget& dst, std::int64_t y) {
  for (int c = 0; c < C; ++c) {
    const float sc = dst.scale ? dst.scale[c] : 1.0f, bi = dst.bias ? dst.bias[c] : 0.0f;
    float* o = dst.data + c * dst.chan + y * dst.row;
    if (dst.flip)
      for (std::int64_t x = 0; x < nx; ++x) o[nx - 1 - x] = row[x * C + c] * sc + bi;
    else
      for (std::int64_t x = 0; x < nx; ++x) o[x] = row[x * C + c] * sc + bi;
  }
}
}  // namespace detail

// Vertical first: each output row is a weighted sum of whole source rows over the columns the output reads
// (contiguous interleaved samples: vectorised, and the costly pass when downscaling runs on as few columns as
// needed), then the horizontal pass per output row. torchvision runs the horizontal pass first; the two orders
// differ by float rounding only.
template <class T>
void resample(const ResampleSource<T>& src, const ResampleAxis& ay, const ResampleAxis& ax, const ResampleTarget& dst,
              std::vector<float>& tmp) {
  const int C = src.channels;
  const std::int64_t ny = ay.size(), cols = ax.hi - ax.lo;
  const std::size_t line = std::size_t(cols) * std::size_t(C);
  tmp.resize(line + std::size_t(ax.size()) * std::size_t(C));
  float* hrow = tmp.data() + line;
  const bool packed = src.col == C && src.chan == 1;  // interleaved rows (decoded images)
  for (std::int64_t y = 0; y < ny; ++y) {
    const float* w = ay.weights.data() + std::size_t(y) * std::size_t(ay.taps);
    const int n = ay.count[std::size_t(y)];
    float* acc = tmp.data();
    const std::int64_t r0 = ay.first[std::size_t(y)] - src.y0;
    if (packed) {
      const T* base = src.data + r0 * src.row + (ax.lo - src.x0) * C;
      for (std::size_t i = 0; i < line; ++i) acc[i] = w[0] * float(base[i]);
      for (int k = 1; k < n; ++k) {
        const float wk = w[k];
        const T* b = base + k * src.row;
        for (std::size_t i = 0; i < line; ++i) acc[i] += wk * float(b[i]);
      }
    } else {
      for (std::int64_t x = 0; x < cols; ++x)
        for (int c = 0; c < C; ++c) {
          const T* b = src.data + r0 * src.row + (ax.lo + x - src.x0) * src.col + c * src.chan;
          float a = 0;
          for (int k = 0; k < n; ++k) a += w[k] * float(b[k * src.row]);
          acc[std::size_t(x) * std::size_t(C) + std::size_t(c)] = a;
        }
    }
    if (C == 3)
      detail::resample_row<3>(acc, ax.lo, ax, hrow, C);
    else if (C == 1)
      detail::resample_row<1>(acc, ax.lo, ax, hrow, C);
    else
      detail::resample_row<0>(acc, ax.lo, ax, hrow, C);
    detail::store_row(hrow, ax.size(), C, dst, y);
  }
}

}  // namespace ember::data
