// ember — CPU resampling along one dim: the loops of nn::functional::interpolate. For each mode, the taps of every
// output position (which inputs it reads, with which weights) follow PyTorch's CPU rules exactly: nearest
// (floor(j * scale) in float; for 2-D inputs PyTorch's shortcuts for equal and doubled sizes), nearest-exact
// (floor((j + 0.5) * scale)), linear (half-pixel or align_corners source, clamped at 0), cubic (A = -0.75, four
// taps clamped to the edge, source not clamped) and area (adaptive average bins [floor(j*in/out),
// ceil((j+1)*in/out)), the rule of cpu/pool.hpp). The multi-dim modes are separable, one pass per dim. The kernels
// apply taps along a dim of a contiguous (outer, in, inner) tensor and send gradients back through the adjoint;
// half and bfloat16 compute in fp32 (compute_t<T>), gradients accumulating in an fp32 row rounded once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

enum class ResampleKind { nearest, nearest_exact, linear, cubic, area };

/// The taps of one dim: output position j reads input positions idx[j * k + t] with weights w[j * k + t], t < k.
/// An unused tap (an area bin narrower than k) has index -1. Every used tap counts, zero weights included (0 times
/// an inf input is NaN, as in PyTorch).
struct ResampleTaps {
  std::int64_t in = 0, out = 0, k = 1;
  std::vector<std::int64_t> idx;
  std::vector<double> w;
};

namespace detail {
/// PyTorch's area_pixel_compute_scale: the source step per output position.
inline double resample_scale(std::int64_t in, std::int64_t out, double factor, bool align_corners) {
  if (align_corners) return out > 1 ? double(in - 1) / double(out - 1) : 0.0;
  return factor > 0 ? 1.0 / factor : double(in) / double(out);
}
/// The source coordinate of output position j (area_pixel_compute_source_index); clamped at 0 except for cubic.
inline double resample_source(double scale, std::int64_t j, bool align_corners, bool cubic) {
  if (align_corners) return scale * double(j);
  const double s = scale * (double(j) + 0.5) - 0.5;
  return !cubic && s < 0 ? 0.0 : s;
}
// The cubic convolution kernel (Keys, A = -0.75 as PyTorch): |x| <= 1 and 1 < |x| < 2.
inline double cubic_near(double x, double a) { return ((a + 2) * x - (a + 3)) * x * x + 1; }
inline double cubic_far(double x, double a) { return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a; }
}  // namespace detail

/// The taps of `kind` resizing a dim from `in` to `out` positions (both >= 1). `factor` is the user's scale factor
/// for the dim, or 0 when the output size was given (PyTorch then derives the scale from the sizes).
/// `nearest_shortcuts`: nearest copies position j when out == in and reads j / 2 when out == 2 * in, whatever the
/// factor, as PyTorch's kernel for 2-D inputs does (its 1-D and 3-D kernels do not).
inline ResampleTaps resample_taps(ResampleKind kind, std::int64_t in, std::int64_t out, double factor,
                                  bool align_corners, bool nearest_shortcuts = false) {
  ResampleTaps r;
  r.in = in;
  r.out = out;
  auto put = [&](std::int64_t j, std::int64_t t, std::int64_t i, double w) {
    r.idx[std::size_t(j * r.k + t)] = std::clamp<std::int64_t>(i, 0, in - 1);
    r.w[std::size_t(j * r.k + t)] = w;
  };
  auto alloc = [&](std::int64_t k) {
    r.k = k;
    r.idx.assign(std::size_t(out * k), 0);
    r.w.assign(std::size_t(out * k), 0.0);
  };
  switch (kind) {
    case ResampleKind::nearest:
    case ResampleKind::nearest_exact: {
      alloc(1);
      // In float, as PyTorch's compute_scales_value<float> and nearest(_exact)_idx.
      const float scale = factor > 0 ? float(1.0 / factor) : float(in) / float(out);
      for (std::int64_t j = 0; j < out; ++j) {
        std::int64_t i;
        if (kind == ResampleKind::nearest_exact) i = std::int64_t(std::floor(float((double(j) + 0.5) * double(scale))));
        else if (nearest_shortcuts && out == in) i = j;
        else if (nearest_shortcuts && out == 2 * in) i = j >> 1;
        else i = std::int64_t(std::floor(float(j) * scale));
        put(j, 0, std::min(i, in - 1), 1.0);
      }
      break;
    }
    case ResampleKind::linear: {
      alloc(2);
      const double scale = detail::resample_scale(in, out, factor, align_corners);
      for (std::int64_t j = 0; j < out; ++j) {
        const double src = detail::resample_source(scale, j, align_corners, false);
        const std::int64_t i0 = std::min<std::int64_t>(std::int64_t(std::floor(src)), in - 1);
        const double l1 = std::clamp(src - double(i0), 0.0, 1.0);
        put(j, 0, i0, 1.0 - l1);
        put(j, 1, i0 < in - 1 ? i0 + 1 : i0, l1);
      }
      break;
    }
    case ResampleKind::cubic: {
      alloc(4);
      const double scale = detail::resample_scale(in, out, factor, align_corners), a = -0.75;
      for (std::int64_t j = 0; j < out; ++j) {
        const double src = detail::resample_source(scale, j, align_corners, true);
        const std::int64_t i = std::min<std::int64_t>(std::int64_t(std::floor(src)), in - 1);
        const double t = std::clamp(src - double(i), 0.0, 1.0);
        put(j, 0, i - 1, detail::cubic_far(t + 1, a));
        put(j, 1, i, detail::cubic_near(t, a));
        put(j, 2, i + 1, detail::cubic_near(1 - t, a));
        put(j, 3, i + 2, detail::cubic_far(2 - t, a));
      }
      break;
    }
    case ResampleKind::area: {
      std::int64_t k = 1;
      for (std::int64_t j = 0; j < out; ++j)
        k = std::max(k, detail::adaptive_end(j, in, out) - detail::adaptive_start(j, in, out));
      alloc(k);
      for (std::int64_t j = 0; j < out; ++j) {
        const std::int64_t a = detail::adaptive_start(j, in, out), b = detail::adaptive_end(j, in, out);
        for (std::int64_t t = 0; t < b - a; ++t) put(j, t, a + t, 1.0 / double(b - a));
        for (std::int64_t t = b - a; t < k; ++t) r.idx[std::size_t(j * k + t)] = -1;
      }
      break;
    }
  }
  return r;
}

namespace detail {
inline constexpr std::int64_t kResampleBlock = 256;  // inner elements per unit of parallel work
}  // namespace detail

/// y (outer, out, inner) = the taps of r applied to x (outer, in, inner) along the middle dim.
template <class T>
void resample_forward(const ResampleTaps& r, std::int64_t outer, std::int64_t inner, const T* x, T* y) {
  using C = compute_t<T>;
  const std::int64_t nb = (inner + detail::kResampleBlock - 1) / detail::kResampleBlock, rows = outer * r.out;
  const std::int64_t work = r.k * std::min(inner, detail::kResampleBlock);
  parallel_for(0, rows * nb, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(work, 1)),
               [&](std::int64_t u0, std::int64_t u1) {
                 C acc[detail::kResampleBlock];
                 for (std::int64_t u = u0; u < u1; ++u) {
                   const std::int64_t row = u / nb, b = u % nb, o = row / r.out, j = row % r.out;
                   const std::int64_t c0 = b * detail::kResampleBlock,
                                      n = std::min(detail::kResampleBlock, inner - c0);
                   std::fill(acc, acc + n, C(0));
                   for (std::int64_t t = 0; t < r.k; ++t) {
                     const std::int64_t i = r.idx[std::size_t(j * r.k + t)];
                     if (i < 0) continue;
                     const C wt = C(r.w[std::size_t(j * r.k + t)]);
                     const T* xr = x + (o * r.in + i) * inner + c0;
                     for (std::int64_t c = 0; c < n; ++c) acc[c] += wt * static_cast<C>(xr[c]);
                   }
                   T* yr = y + row * inner + c0;
                   for (std::int64_t c = 0; c < n; ++c) yr[c] = convert<T>(acc[c]);
                 }
               });
}

/// gx (outer, in, inner) = the adjoint of resample_forward applied to gy (outer, out, inner); overwrites gx.
template <class T>
void resample_backward(const ResampleTaps& r, std::int64_t outer, std::int64_t inner, const T* gy, T* gx) {
  using C = compute_t<T>;
  const std::int64_t nb = (inner + detail::kResampleBlock - 1) / detail::kResampleBlock;
  const std::int64_t work = (r.in + r.out * r.k) * std::min(inner, detail::kResampleBlock);
  parallel_for(0, outer * nb, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(work, 1)),
               [&](std::int64_t u0, std::int64_t u1) {
                 std::vector<C> acc(std::size_t(r.in * std::min(inner, detail::kResampleBlock)));
                 for (std::int64_t u = u0; u < u1; ++u) {
                   const std::int64_t o = u / nb, c0 = (u % nb) * detail::kResampleBlock,
                                      n = std::min(detail::kResampleBlock, inner - c0);
                   std::fill(acc.begin(), acc.end(), C(0));
                   for (std::int64_t j = 0; j < r.out; ++j) {
                     const T* g = gy + (o * r.out + j) * inner + c0;
                     for (std::int64_t t = 0; t < r.k; ++t) {
                       const std::int64_t i = r.idx[std::size_t(j * r.k + t)];
                       if (i < 0) continue;
                       const C wt = C(r.w[std::size_t(j * r.k + t)]);
                       C* a = acc.data() + i * n;
                       for (std::int64_t c = 0; c < n; ++c) a[c] += wt * static_cast<C>(g[c]);
                     }
                   }
                   for (std::int64_t i = 0; i < r.in; ++i) {
                     T* d = gx + (o * r.in + i) * inner + c0;
                     const C* a = acc.data() + i * n;
                     for (std::int64_t c = 0; c < n; ++c) d[c] = convert<T>(a[c]);
                   }
                 }
               });
}

/// Tap t of every output position of r: the input index (0 for an unused tap), its weight and whether it is used
/// (r.out values each); returns whether every one is used.
template <class T>
bool tap_column(const ResampleTaps& r, std::int64_t t, std::int64_t* idx, T* w, bool* used) {
  bool all_used = true;
  for (std::int64_t j = 0; j < r.out; ++j) {
    const std::int64_t i = r.idx[std::size_t(j * r.k + t)];
    idx[j] = i < 0 ? 0 : i;
    w[j] = convert<T>(r.w[std::size_t(j * r.k + t)]);
    used[j] = i >= 0;
    all_used = all_used && i >= 0;
  }
  return all_used;
}

}  // namespace ember::cpu
