// ember — calibration observers for INT8 post-training quantization (torch.ao.quantization's MinMaxObserver,
// MovingAverageMinMaxObserver and a percentile HistogramObserver), the affine per-tensor qparams they produce,
// symmetric per-channel weight scales, and scalar quantize / dequantize.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "ember/config.hpp"

namespace ember::quant {

/// Integer type of quantized activations: quint8 = [0, 255], qint8 = [-128, 127] (affine, per tensor).
enum class QDtype : unsigned char { quint8, qint8 };

/// Affine quantization parameters: real = (q - zero_point) * scale.
struct QParams {
  float scale = 1.0f;           ///< the real value of one integer step (> 0)
  std::int32_t zero_point = 0;  ///< the integer that stands for real 0
};

/// How an Observer turns the calibration batches into a range: torch.ao.quantization's MinMaxObserver,
/// MovingAverageMinMaxObserver, and a percentile histogram (PyTorch's HistogramObserver minimises the quantization
/// error instead).
enum class ObserverKind : unsigned char { min_max, moving_average_min_max, histogram };

/// The options of an Observer (and QConfig::activation). The default, min_max over quint8, is PyTorch's
/// MinMaxObserver default; histogram with a percentile is the robust choice when activations have rare outliers.
/// Fields a kind does not use are ignored.
/// ```
/// quant::prepare(model, {.activation = {.kind = quant::ObserverKind::histogram, .percentile = 99.9}});
/// ```
struct ObserverOptions {
  ObserverKind kind = ObserverKind::min_max;  ///< which observer (PyTorch: the observer class)
  QDtype dtype = QDtype::quint8;  ///< the activations' integer type (PyTorch: dtype=torch.quint8 / torch.qint8)
  /// moving_average_min_max: min += c * (batch_min - min), likewise max; the first batch sets them. In (0, 1].
  float averaging_constant = 0.01f;
  /// histogram: number of equal-width bins, in [1, 1 << 20].
  int bins = 2048;
  /// histogram: [min, max] holds this percentage of the observed values; (100 - p) / 2 % is clipped from each
  /// tail. In (0, 100]; 100 keeps the exact observed range. PyTorch has no such parameter.
  double percentile = 99.99;
};

/// qmin / qmax of a QDtype.
constexpr std::int32_t qmin(QDtype dt) { return dt == QDtype::quint8 ? 0 : -128; }
constexpr std::int32_t qmax(QDtype dt) { return dt == QDtype::quint8 ? 255 : 127; }

namespace detail {
/// Round half to even whatever the floating-point rounding mode (torch.round, std::nearbyint under FE_TONEAREST).
inline double round_half_even(double v) {
  const double r = std::round(v);  // half away from zero
  if (std::fabs(v - std::trunc(v)) == 0.5) return 2.0 * std::round(v / 2.0);
  return r;
}
}  // namespace detail

/// Affine per-tensor qparams for the range [min, max], as PyTorch computes them: the range is extended to include
/// 0 (so 0 is exact), scale = (max - min) / (qmax - qmin) but at least FLT_EPSILON (torch.finfo(float32).eps),
/// zero_point = qmin - round(min / scale) clamped to [qmin, qmax].
inline QParams affine_qparams(float min, float max, QDtype dt) {
  EMBER_CHECK(std::isfinite(min) && std::isfinite(max) && min <= max, "quant::affine_qparams: invalid range [", min,
              ", ", max, "], expected finite min <= max");
  const float lo = std::min(min, 0.0f), hi = std::max(max, 0.0f);
  const std::int32_t q0 = qmin(dt), q1 = qmax(dt);
  QParams p;
  p.scale = std::max((hi - lo) / float(q1 - q0), std::numeric_limits<float>::epsilon());
  const double zp = double(q0) - detail::round_half_even(double(lo / p.scale));
  p.zero_point = std::int32_t(std::clamp(zp, double(q0), double(q1)));
  return p;
}

/// q = clamp(round_half_even(x · (1 / scale)) + zero_point, lo, hi), in float32 as PyTorch and the int8 layers.
inline std::int32_t quantize_value(float x, QParams p, std::int32_t lo, std::int32_t hi) {
  EMBER_CHECK(!std::isnan(x), "quant::quantize_value: input is NaN");
  EMBER_CHECK(p.scale > 0 && std::isfinite(p.scale) && lo <= hi, "quant::quantize_value: invalid scale ", p.scale,
              " or bounds [", lo, ", ", hi, "], expected a finite scale > 0 and lo <= hi");
  const double r = detail::round_half_even(double(x * (1.0f / p.scale))) + double(p.zero_point);
  return std::int32_t(std::clamp(r, double(lo), double(hi)));
}

/// (q - zero_point) * scale.
inline float dequantize_value(std::int32_t q, QParams p) {
  return float(std::int64_t(q) - std::int64_t(p.zero_point)) * p.scale;
}

/// Symmetric per-channel int8 weight scales over the restricted range [-127, 127]: scale_c = max|w_c| / 127,
/// zero_point 0. A channel whose scale would be 0 or subnormal (an all-zero channel) gets scale 1, so quantizing
/// never divides by zero and its weights quantize to 0. (PyTorch floors the scale at FLT_EPSILON instead.)
/// w: (channels, per_channel), row-major.
inline std::vector<float> symmetric_scales(const float* w, std::int64_t channels, std::int64_t per_channel) {
  EMBER_CHECK(channels >= 0 && per_channel >= 0, "quant::symmetric_scales: invalid shape (", channels, ", ",
              per_channel, ")");
  EMBER_CHECK(w != nullptr || channels * per_channel == 0, "quant::symmetric_scales: null weights");
  std::vector<float> s(std::size_t(channels), 1.0f);
  for (std::int64_t c = 0; c < channels; ++c) {
    const float* row = w + c * per_channel;
    float m = 0.0f;
    for (std::int64_t i = 0; i < per_channel; ++i) {
      EMBER_CHECK(std::isfinite(row[i]), "quant::symmetric_scales: non-finite weight ", row[i], " at channel ", c,
                  ", index ", i);
      m = std::max(m, std::fabs(row[i]));
    }
    const float sc = m / 127.0f;
    if (sc >= std::numeric_limits<float>::min()) s[std::size_t(c)] = sc;
  }
  return s;
}

/// Records the range of activations over calibration batches and turns it into qparams.
///
/// histogram: `bins` equal-width bins over [lo, lo + bins * width]. The first batch sets the grid to its range.
/// When a batch falls outside, the grid grows to cover the occupied bins and the batch, with the bin width
/// multiplied by the smallest power of two that suffices; the new edges are edges of the old grid, so re-binning
/// merges whole old bins (no counts are split or lost) and the width stays under twice what the span needs. The
/// percentile range interpolates linearly inside a bin and is clipped to the exact observed [min, max]. An
/// equal-width grid resolves the bulk only as finely as (span of all values) / bins: rare huge outliers call for
/// more bins.
class Observer {
 public:
  /// An observer of kind o.kind for dtype o.dtype (checked), as torch.ao.quantization's MinMaxObserver,
  /// MovingAverageMinMaxObserver or HistogramObserver.
  explicit Observer(ObserverOptions o = {}) : o_(o) {
    EMBER_CHECK(o.kind == ObserverKind::min_max || o.kind == ObserverKind::moving_average_min_max ||
                    o.kind == ObserverKind::histogram,
                "quant::Observer: invalid kind ", int(o.kind));
    EMBER_CHECK(o.dtype == QDtype::quint8 || o.dtype == QDtype::qint8, "quant::Observer: invalid dtype ",
                int(o.dtype));
    EMBER_CHECK(o.averaging_constant > 0.0f && o.averaging_constant <= 1.0f,
                "quant::Observer: averaging_constant must be in (0, 1], got ", o.averaging_constant);
    EMBER_CHECK(o.bins >= 1 && o.bins <= (1 << 20), "quant::Observer: bins must be in [1, 1048576], got ", o.bins);
    EMBER_CHECK(o.percentile > 0.0 && o.percentile <= 100.0, "quant::Observer: percentile must be in (0, 100], got ",
                o.percentile);
  }

  /// Records one batch of n values. Non-finite values throw and leave the observer unchanged.
  void observe(const float* x, std::int64_t n) {
    EMBER_CHECK(n >= 0 && (x != nullptr || n == 0), "quant::Observer: invalid batch (", n, " values at ",
                x == nullptr ? "null" : "non-null", " pointer)");
    if (n == 0) return;
    float bmin = x[0], bmax = x[0];
    for (std::int64_t i = 0; i < n; ++i) {
      EMBER_CHECK(std::isfinite(x[i]), "quant::Observer: non-finite value ", x[i], " at index ", i,
                  " of a batch of ", n, " (calibration data must be finite)");
      bmin = std::min(bmin, x[i]);
      bmax = std::max(bmax, x[i]);
    }
    const bool first = count_ == 0;
    if (o_.kind == ObserverKind::moving_average_min_max && !first) {
      const double c = o_.averaging_constant;
      min_ = float(double(min_) + c * (double(bmin) - double(min_)));
      max_ = float(double(max_) + c * (double(bmax) - double(max_)));
    } else {
      min_ = first ? bmin : std::min(min_, bmin);
      max_ = first ? bmax : std::max(max_, bmax);
    }
    if (o_.kind == ObserverKind::histogram) add_to_histogram(x, n, bmin, bmax, first);
    count_ += n;
  }

  /// Whether any value was observed.
  bool has_data() const { return count_ > 0; }
  /// Values observed so far.
  std::int64_t count() const { return count_; }

  /// The recorded range: for histogram, the percentile-clipped one. Before any data: +inf and -inf (as PyTorch).
  float min() const { return o_.kind == ObserverKind::histogram && has_data() ? clipped().first : min_; }
  /// The top of the recorded range (see min()).
  float max() const { return o_.kind == ObserverKind::histogram && has_data() ? clipped().second : max_; }

  /// affine_qparams of the recorded range for the observer's dtype.
  QParams qparams() const {
    EMBER_CHECK(has_data(), "quant::Observer: no calibration data observed (call observe() on calibration batches "
                            "before qparams())");
    const auto r = o_.kind == ObserverKind::histogram ? clipped() : std::pair<float, float>(min_, max_);
    return affine_qparams(r.first, r.second, o_.dtype);
  }

  /// The options the observer was made with.
  const ObserverOptions& options() const { return o_; }

 private:
  std::size_t bin_of(double v) const {
    const double b = std::floor((v - lo_) / width_);
    return std::size_t(std::clamp(b, 0.0, double(o_.bins - 1)));  // the last bin is closed
  }

  void add_to_histogram(const float* x, std::int64_t n, float bmin, float bmax, bool first) {
    const double nb = o_.bins;
    if (first) {
      double a = bmin, b = bmax;
      if (a == b) {
        const double d = std::max(std::fabs(a) * double(std::numeric_limits<float>::epsilon()),
                                  double(std::numeric_limits<float>::min()));
        a -= d;
        b += d;
      }
      counts_.assign(std::size_t(o_.bins), 0);
      lo_ = a;
      width_ = (b - a) / nb;
    } else if (bmin < lo_ || bmax > lo_ + nb * width_) {
      grow(std::min(double(bmin), double(min_)), std::max(double(bmax), double(max_)), bmin < lo_,
           bmax > lo_ + nb * width_);
    }
    for (std::int64_t i = 0; i < n; ++i) ++counts_[bin_of(x[i])];
  }

  // New grid covering [a, b] (all values so far), edges on the old grid, width a power-of-two multiple.
  void grow(double a, double b, bool down, bool up) {
    const double nb = o_.bins;
    const double jlo = std::min(std::floor((a - lo_) / width_), double(bin_of(a)));  // in old bins
    const double jhi = std::max(std::floor((b - lo_) / width_), double(bin_of(b)));
    const double need = jhi - jlo + 1.0;
    double f = 1.0;
    while (nb * f < need) f *= 2.0;
    const double slack = nb * f - need;
    const double below = down && up ? std::floor(slack / 2.0) : down ? slack : 0.0;
    const double new_lo = lo_ + (jlo - below) * width_, new_w = width_ * f;
    std::vector<std::int64_t> next(counts_.size(), 0);
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      if (counts_[i] == 0) continue;
      const double centre = lo_ + (double(i) + 0.5) * width_;
      const double k = std::floor((centre - new_lo) / new_w);
      next[std::size_t(std::clamp(k, 0.0, nb - 1.0))] += counts_[i];
    }
    counts_.swap(next);
    lo_ = new_lo;
    width_ = new_w;
  }

  std::pair<float, float> clipped() const {
    const double tail = double(count_) * (100.0 - o_.percentile) / 200.0;
    const std::size_t nb = counts_.size();
    double lo = min_, hi = max_;
    double cum = 0.0;
    for (std::size_t i = 0; i < nb; ++i) {
      const double c = double(counts_[i]);
      if (c > 0 && cum + c >= tail) {
        lo = lo_ + (double(i) + (tail - cum) / c) * width_;
        break;
      }
      cum += c;
    }
    cum = 0.0;
    for (std::size_t i = nb; i-- > 0;) {
      const double c = double(counts_[i]);
      if (c > 0 && cum + c >= tail) {
        hi = lo_ + (double(i) + 1.0 - (tail - cum) / c) * width_;
        break;
      }
      cum += c;
    }
    lo = std::clamp(lo, double(min_), double(max_));
    hi = std::clamp(hi, double(min_), double(max_));
    if (lo > hi) lo = hi = 0.5 * (lo + hi);
    return {float(lo), float(hi)};
  }

  ObserverOptions o_;
  float min_ = std::numeric_limits<float>::infinity();
  float max_ = -std::numeric_limits<float>::infinity();
  std::int64_t count_ = 0;
  // histogram: counts_[i] holds values in [lo_ + i * width_, lo_ + (i + 1) * width_)
  std::vector<std::int64_t> counts_;
  double lo_ = 0.0, width_ = 1.0;
};

}  // namespace ember::quant
