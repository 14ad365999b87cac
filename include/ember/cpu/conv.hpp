// ember — CPU 2-D convolution: im2col + GEMM (cpu::gemm) forward, backward-data (GEMM + col2im) and
// backward-weight (im2col + GEMM), with stride, padding, dilation and groups, on contiguous NCHW buffers. In
// AVX-512 and AVX2 builds the float forward without a per-image callback runs the direct kernel of
// cpu/conv_direct.hpp.
//
// Parallelism: with at least as many images as threads, the batch is cut into a few runs of images per thread;
// each run does its own im2col and serial GEMMs on a column buffer of its own that stays in cache (GEMMs nested in
// the parallel loop run serially); weight gradients are summed per run and reduced in a fixed order, so results
// do not depend on scheduling. With fewer images than threads, images run one after another and each GEMM is
// split across the threads instead. A 1x1 convolution with stride 1 and no padding reads the input as its own
// column matrix. In AVX-512 and AVX2 builds, 3x3 stride-1 float convolutions with 16 or more channels in and out
// take the Winograd kernels of cpu/conv_winograd.hpp for the forward and the gradients to the input and the weight.
// bfloat16 and half convolutions where those kernels apply (with no activation, or ReLU) run them on float copies of
// their operands (widening is exact; each result is rounded once) unless the 16-bit GEMM is the faster (bfloat16 on
// AMX, or on AVX512-BF16 dot products where they are on): with GEMMs at fp32's speed, im2col + GEMM would do about
// twice Winograd's work.
//
// Choosing the algorithm: by default each pass runs the first that applies of Winograd, the direct kernel (forward
// only) and im2col + GEMM, an order measured on this project's shapes (bench_conv's *Algo benchmarks). In benchmark
// mode (set_conv_benchmark(true), like torch.backends.cudnn.benchmark) the first call of each problem times every
// algorithm that applies and the fastest is cached for the problem (pass, shapes, padding, stride, dilation, groups,
// dtype, fused epilogue, thread count).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/core/window.hpp"
#include "ember/cpu/conv_direct.hpp"
#include "ember/cpu/detail/cast16.hpp"
#include "ember/cpu/conv_winograd.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/gemm.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/cpu/thread_pool.hpp"

namespace ember::cpu {

/// The geometry of one conv2d call (all extents already checked by ops/): the window (kernel kh x kw, stride,
/// padding, dilation) and the extents around it.
struct ConvGeometry : Window2d {
  std::int64_t n = 0, c = 0, h = 0, w = 0;  // input (N, C, H, W)
  std::int64_t o = 0;                       // weight (O, C/groups, kh, kw)
  std::int64_t oh = 0, ow = 0;              // output (N, O, oh, ow)
  std::int64_t groups = 1;

  std::int64_t cg() const { return c / groups; }     // input channels per group
  std::int64_t og() const { return o / groups; }     // output channels per group
  std::int64_t kg() const { return cg() * kh * kw; }  // GEMM depth per group
  std::int64_t l() const { return oh * ow; }          // output positions per image
  /// The input is its own column matrix (1x1 kernel, stride 1, no padding).
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

/// The CPU convolution algorithms and the passes each is chosen for.
enum class ConvAlgo : int { im2col = 0, direct = 1, winograd = 2 };
enum class ConvPass : int { forward = 0, backward_data = 1, backward_weight = 2 };

namespace detail {
inline std::atomic<bool>& conv_benchmark_flag() {
  static std::atomic<bool> on{false};
  return on;
}
}  // namespace detail

/// Benchmark mode (off by default, as torch.backends.cudnn.benchmark): the first call of each convolution problem
/// times every algorithm that applies to it (one untimed run each, then the faster of two timed runs) and later
/// calls run the fastest. Results then depend on which algorithm won, which can differ from run to run (each is
/// tested against double; they differ in rounding); with the mode off the choice is fixed.
inline void set_conv_benchmark(bool on) { detail::conv_benchmark_flag().store(on, std::memory_order_relaxed); }
inline bool conv_benchmark() { return detail::conv_benchmark_flag().load(std::memory_order_relaxed); }

namespace detail {
/// What benchmark mode's cache tells problems apart by: the pass, the geometry, the element size, the fused
/// epilogue (activation, pool, per-image callback) and the thread count.
using ConvChoiceKey = std::array<std::int64_t, 20>;
inline ConvChoiceKey conv_choice_key(ConvPass pass, const ConvGeometry& g, std::int64_t elem_size, Activation act,
                                     bool pool2, bool callback) {
  return {std::int64_t(pass), g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, g.groups,
          elem_size, std::int64_t(act), pool2 ? 1 : 0, callback ? 1 : 0, get_num_threads()};
}
/// Runs one pass of the problem being chosen for with algorithm a (its outputs are overwritten).
using ConvRunFn = void (*)(const void* ctx, ConvAlgo a);
/// The algorithm cached for key, or, on the first call, the fastest of cands[0, n) timed through run, cached.
EMBER_HEADER_INLINE ConvAlgo choose_conv_algo(const ConvChoiceKey& key, const ConvAlgo* cands, int n, ConvRunFn run,
                                              const void* ctx);
EMBER_HEADER_INLINE std::size_t conv_choice_cache_size(bool clear);
}  // namespace detail

/// How many problems benchmark mode has timed and cached; clear_conv_benchmark_cache() forgets them.
inline std::size_t conv_benchmark_cache_size() { return detail::conv_choice_cache_size(false); }
inline void clear_conv_benchmark_cache() { (void)detail::conv_choice_cache_size(true); }

namespace detail {

// dst[0, n) = src[0, n) rounded to T, once (cpu/detail/cast16.hpp).
template <class T, class A>
inline void store_rounded(T* EMBER_RESTRICT dst, const A* EMBER_RESTRICT src, std::int64_t n) {
  cast16::store_run(dst, src, n, false);
}

// floor(a / b) for b > 0 and any sign of a.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The range [lo, hi) of output positions whose input position o*s + off lies in [0, n).
inline void valid_range(std::int64_t n, std::int64_t s, std::int64_t off, std::int64_t out, std::int64_t& lo,
                        std::int64_t& hi) {
  lo = std::clamp<std::int64_t>(floor_div(-off + s - 1, s), 0, out);
  hi = std::clamp<std::int64_t>(floor_div(n - off + s - 1, s), lo, out);
}

/// cols (C*kh*kw, oh*ow) of one image x (C, H, W); padded positions read as zero.
template <class T>
void im2col(const ConvGeometry& g, const T* EMBER_RESTRICT x, T* EMBER_RESTRICT cols) {
  const std::int64_t L = g.l();
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        T* row = cols + ((c * g.kh + i) * g.kw + j) * L;
        const std::int64_t offy = i * g.dh - g.ph, offx = j * g.dw - g.pw;
        std::int64_t y0, y1, x0, x1;
        valid_range(g.h, g.sh, offy, g.oh, y0, y1);
        valid_range(g.w, g.sw, offx, g.ow, x0, x1);
        std::fill(row, row + y0 * g.ow, T(0));
        for (std::int64_t oy = y0; oy < y1; ++oy) {
          T* dst = row + oy * g.ow;
          const T* src = x + (c * g.h + oy * g.sh + offy) * g.w + offx;
          std::fill(dst, dst + x0, T(0));
          if (g.sw == 1) std::memcpy(dst + x0, src + x0, std::size_t(x1 - x0) * sizeof(T));
          else
            for (std::int64_t ox = x0; ox < x1; ++ox) dst[ox] = src[ox * g.sw];
          std::fill(dst + x1, dst + g.ow, T(0));
        }
        std::fill(row + y1 * g.ow, row + L, T(0));
      }
}

/// x (C, H, W) += the columns folded back onto the image (the adjoint of im2col).
template <class T>
EMBER_VECTORIZE void col2im(const ConvGeometry& g, const T* EMBER_RESTRICT cols, T* EMBER_RESTRICT x) {
  const std::int64_t L = g.l();
  for (std::int64_t c = 0; c < g.c; ++c)
    for (std::int64_t i = 0; i < g.kh; ++i)
      for (std::int64_t j = 0; j < g.kw; ++j) {
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * L;
        const std::int64_t offy = i * g.dh - g.ph, offx = j * g.dw - g.pw;
        std::int64_t y0, y1, x0, x1;
        valid_range(g.h, g.sh, offy, g.oh, y0, y1);
        valid_range(g.w, g.sw, offx, g.ow, x0, x1);
        for (std::int64_t oy = y0; oy < y1; ++oy) {
          const T* src = row + oy * g.ow;
          T* dst = x + (c * g.h + oy * g.sh + offy) * g.w + offx;
          if (g.sw == 1)
            for (std::int64_t ox = x0; ox < x1; ++ox) dst[ox] += src[ox];
          else
            for (std::int64_t ox = x0; ox < x1; ++ox) dst[ox * g.sw] += src[ox];
        }
      }
}

/// Sum of r[0..n) in acc_t<T>, with 16 independent partial sums (a single running sum would be one long
/// dependency chain).
template <class T>
EMBER_VECTORIZE acc_t<T> row_sum(const T* EMBER_RESTRICT r, std::int64_t n) {
  using A = acc_t<T>;
  constexpr int kLanes = 16;
  A acc[kLanes] = {};
  std::int64_t p = 0;
  for (; p + kLanes <= n; p += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += A(r[p + j]);
  A s = 0;
  for (; p < n; ++p) s += A(r[p]);
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// How many runs of images the batch is split into: with at least as many images as threads, a few runs per
// thread (so a thread slowed by other work on the machine does not hold up the rest) while each run's column
// buffer (`buffer_bytes`) is small, one per thread otherwise, each with serial GEMMs; with fewer images, one run
// on the calling thread, whose GEMMs split across the threads instead.
inline std::int64_t image_tasks(std::int64_t n, std::int64_t buffer_bytes) {
  const std::int64_t nt = get_num_threads();
  if (nt <= 1 || n < nt) return 1;
  return std::min<std::int64_t>(n, buffer_bytes <= (std::int64_t(1) << 20) ? 4 * nt : nt);
}

/// y[0, n) = v, vectorised (std::fill is not at -O2).
template <class T>
EMBER_VECTORIZE void fill_run(T* EMBER_RESTRICT y, std::int64_t n, T v) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = v;
}

// Runs body(task, first_image, end_image) for each of `tasks` runs of images.
template <class F>
void for_image_runs(std::int64_t n, std::int64_t tasks, const F& body) {
  if (tasks == 1) {
    body(0, 0, n);
    return;
  }
  parallel_for(0, tasks, 1, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) body(t, t * n / tasks, (t + 1) * n / tasks);
  });
}


/// Whether 16-bit GEMMs run faster than fp32 ones here: bfloat16 on AMX tiles or on AVX512-BF16 dot products (where
/// those are on: cpu::set_amx, cpu::set_bf16_dot); never for half, whose GEMMs convert to fp32.
template <class T>
bool conv16_fast_gemm() {
#if EMBER_GEMM_BF16_PAIRS
  if constexpr (std::is_same_v<T, bfloat16>) {
#if EMBER_GEMM_AMX
    if (gemm::amx::active()) return true;
#endif
    return gemm::bf16::active();
  }
#endif
  return false;
}

/// Whether a 16-bit convolution (bfloat16, half) runs the float kernels on widened copies of its operands: where
/// Winograd (or, for the forward, the direct kernel) applies to the float problem and the 16-bit GEMM is no faster
/// than fp32's, so im2col + GEMM would do Winograd's work twice over (or the direct kernel's with the column
/// buffer's traffic). Widening is exact and the float results are rounded once, as the GEMM path's are.
template <class T>
bool conv16_widens(bool winograd, bool direct) {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, half>, "conv16_widens: a 16-bit type");
  return (winograd || direct) && !conv16_fast_gemm<T>();
}

/// n values of a 16-bit src widened into a new float buffer (threaded).
template <class T>
Tensor<float> widened(const T* src, std::int64_t n) {
  Tensor<float> out = empty<float>(Shape{n});
  float* dst = out.data();
  parallel_for(0, n, 1 << 16,
               [&](std::int64_t i0, std::int64_t i1) { cast16::to_compute_run(src + i0, dst + i0, i1 - i0); });
  return out;
}

/// dst[0, n) = src[0, n) rounded to T (threaded).
template <class T>
void rounded_into(T* dst, const float* src, std::int64_t n) {
  parallel_for(0, n, 1 << 16, [&](std::int64_t i0, std::int64_t i1) { store_rounded(dst + i0, src + i0, i1 - i0); });
}
}  // namespace detail

/// conv2d_forward through im2col + GEMM, whatever the geometry (every dtype; the fallback of the faster kernels).
/// y (N, O, oh, ow) = act(conv2d(x (N, C, H, W), w (O, C/groups, kh, kw)) + b (O; may be null)). All contiguous.
/// The activation is applied to each image's output right after its GEMMs, while it is in cache. With pool2, y is
/// (N, O, oh/2, ow/2): a 2x2 max pool (stride 2, floor) of that output, taken while it is in cache too.
/// image_done (optional): called as image_done(i, yi) with image i's output (O, oh, ow) after the activation and
/// before the pool, while it is in cache (a batch norm's statistics are gathered there); calls for different images
/// may run concurrently.
template <class T, class ImageDone = std::nullptr_t>
void conv2d_forward_im2col(const ConvGeometry& g, const T* x, const T* w, const T* b, T* y,
                           Activation act = Activation::none, bool pool2 = false,
                           const ImageDone& image_done = nullptr) {
  const std::int64_t L = g.l(), K = g.c * g.kh * g.kw, Og = g.og(), Kg = g.kg();
  const bool direct = g.pointwise();
  const std::int64_t tasks = detail::image_tasks(g.n, direct ? 0 : K * L * std::int64_t(sizeof(T)));
  Tensor<T> ws, pre;
  if (!direct) ws = empty<T>(Shape{tasks, K * L});
  if (pool2) pre = empty<T>(Shape{tasks, g.o * L});  // each image's output before the pool
  PoolGeometry pg;
  pg.h = g.oh;
  pg.w = g.ow;
  pg.oh = g.oh / 2;
  pg.ow = g.ow / 2;
  const std::int64_t yl = pool2 ? pg.oh * pg.ow : L;  // y's plane size
  // Each group's weights are packed for the GEMM once, not once per image.
  std::vector<PackedA<T>> wp;
  wp.reserve(std::size_t(g.groups));
  for (std::int64_t gi = 0; gi < g.groups; ++gi) wp.emplace_back(Og, Kg, MatView<T>{w + gi * Og * Kg, Kg, 1});
  // float and double add the bias after the GEMM, with the activation, in one pass over each image's output while
  // it is in cache; 16-bit outputs start from the bias so that the fp32 sum is rounded once.
  constexpr bool bias_first = sizeof(T) == 2;
  detail::for_image_runs(g.n, tasks, [&](std::int64_t t, std::int64_t i0, std::int64_t i1) {
    T* cols = direct ? nullptr : ws.data() + t * K * L;
    for (std::int64_t i = i0; i < i1; ++i) {
      const T* xi = x + i * g.c * g.h * g.w;
      T* yi = pool2 ? pre.data() + t * g.o * L : y + i * g.o * L;
      if (!direct) detail::im2col(g, xi, cols);
      const T* src = direct ? xi : cols;
      if (bias_first && b)
        for (std::int64_t oc = 0; oc < g.o; ++oc) detail::fill_run(yi + oc * L, L, b[oc]);
      for (std::int64_t gi = 0; gi < g.groups; ++gi)
        wp[std::size_t(gi)].gemm(L, MatView<T>{src + gi * Kg * L, L, 1}, yi + gi * Og * L, L, bias_first && b);
      if (!bias_first && b) {
        for (std::int64_t oc = 0; oc < g.o; ++oc) bias_act_(yi + oc * L, L, b[oc], act);
      } else {
        act_(yi, g.o * L, act);
      }
      if constexpr (!std::is_same_v<ImageDone, std::nullptr_t>) image_done(i, static_cast<const T*>(yi));
      if (pool2)
        for (std::int64_t oc = 0; oc < g.o; ++oc)
          detail::max_pool_plane_2x2<T, false>(pg, yi + oc * L, y + (i * g.o + oc) * yl, nullptr);
    }
  });
}

/// conv2d_backward through GEMMs, im2col and col2im, whatever the geometry (every dtype).
/// Gradients of conv2d from gy (N, O, oh, ow): gx (N, C, H, W), gw (O, C/groups, kh, kw) and gb (O); each may
/// be null when not wanted. x is needed only for gw, w only for gx. Outputs are overwritten. All contiguous.
/// 16-bit tensors accumulate in fp32 (acc_t<T>): the weight and bias sums over the batch and the columns folded
/// back onto the input are fp32 buffers, each output is rounded once.
template <class T>
void conv2d_backward_im2col(const ConvGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw, T* gb) {
  using A = acc_t<T>;
  constexpr bool wide = std::is_same_v<A, T>;  // float and double accumulate in place
  const std::int64_t L = g.l(), K = g.c * g.kh * g.kw, Og = g.og(), Kg = g.kg(), HW = g.h * g.w;
  const std::int64_t wn = g.o * Kg;
  const bool direct = g.pointwise();
  const std::int64_t tasks = detail::image_tasks(g.n, direct ? 0 : K * L * std::int64_t(sizeof(T)));
  Tensor<T> ws;
  Tensor<A> part, gxw;
  if (!direct && (gw || (gx && wide))) ws = empty<T>(Shape{tasks, K * L});
  // Per-run weight and bias gradient sums (with a wide T, run 0 writes straight into gw / gb).
  const std::int64_t own = wide ? 1 : 0;
  if ((gw || gb) && tasks > own) part = empty<A>(Shape{tasks - own, wn + g.o});
  // 16-bit gx: per run, the fp32 columns and the fp32 image they fold onto.
  if (!wide && gx && !direct) gxw = empty<A>(Shape{tasks, K * L + g.c * HW});
  detail::for_image_runs(g.n, tasks, [&](std::int64_t t, std::int64_t i0, std::int64_t i1) {
    T* cols = ws.defined() ? ws.data() + t * K * L : nullptr;
    A* pt = part.defined() && t >= own ? part.data() + (t - own) * (wn + g.o) : nullptr;
    A* gwt = gw ? (pt ? pt : reinterpret_cast<A*>(gw)) : nullptr;
    A* gbt = gb ? (pt ? pt + wn : reinterpret_cast<A*>(gb)) : nullptr;
    if (gbt) std::fill(gbt, gbt + g.o, A(0));
    if (gwt && i0 == i1) std::fill(gwt, gwt + wn, A(0));
    for (std::int64_t i = i0; i < i1; ++i) {
      const T* gyi = gy + i * g.o * L;
      if (gbt)
        for (std::int64_t oc = 0; oc < g.o; ++oc) gbt[oc] += detail::row_sum(gyi + oc * L, L);
      if (gwt) {
        const T* xi = x + i * g.c * HW;
        if (!direct) detail::im2col(g, xi, cols);
        const T* src = direct ? xi : cols;
        for (std::int64_t gi = 0; gi < g.groups; ++gi)
          gemm<T, A>(Og, Kg, L, MatView<T>{gyi + gi * Og * L, L, 1}, MatView<T>{src + gi * Kg * L, 1, L},
                     gwt + gi * Og * Kg, Kg, i != i0);
      }
      if (gx) {
        T* gxi = gx + i * g.c * HW;
        if (direct) {
          for (std::int64_t gi = 0; gi < g.groups; ++gi)
            gemm<T>(Kg, L, Og, MatView<T>{w + gi * Og * Kg, 1, Kg}, MatView<T>{gyi + gi * Og * L, L, 1},
                    gxi + gi * Kg * L, L, false);
          continue;
        }
        A* acols = wide ? reinterpret_cast<A*>(cols) : gxw.data() + t * (K * L + g.c * HW);
        A* img = wide ? reinterpret_cast<A*>(gxi) : acols + K * L;
        for (std::int64_t gi = 0; gi < g.groups; ++gi)
          gemm<T, A>(Kg, L, Og, MatView<T>{w + gi * Og * Kg, 1, Kg}, MatView<T>{gyi + gi * Og * L, L, 1},
                     acols + gi * Kg * L, L, false);
        std::fill(img, img + g.c * HW, A(0));
        detail::col2im(g, acols, img);
        if constexpr (!wide) detail::store_rounded(gxi, img, g.c * HW);
      }
    }
  });
  // Sum the other runs' partials in order (in fp32 for 16-bit T, rounded once).
  if constexpr (wide) {
    for (std::int64_t t = 1; t < tasks && (gw || gb); ++t) {
      const A* p = part.data() + (t - 1) * (wn + g.o);
      if (gw)
        for (std::int64_t k = 0; k < wn; ++k) gw[k] += p[k];
      if (gb)
        for (std::int64_t k = 0; k < g.o; ++k) gb[k] += p[wn + k];
    }
  } else if (gw || gb) {
    A* p0 = part.data();
    for (std::int64_t t = 1; t < tasks; ++t) {
      const A* p = part.data() + t * (wn + g.o);
      for (std::int64_t k = 0; k < wn + g.o; ++k) p0[k] += p[k];
    }
    if (gw) detail::store_rounded(gw, p0, wn);
    if (gb) detail::store_rounded(gb, p0 + wn, g.o);
  }
}

/// y (N, O, oh, ow) = act(conv2d(x (N, C, H, W), w (O, C/groups, kh, kw)) + b (O; may be null)). All contiguous.
/// With pool2, y is (N, O, oh/2, ow/2): a 2x2 max pool (stride 2, floor) of the activated output. image_done
/// (optional): called as image_done(i, yi) with image i's output (O, oh, ow) after the activation and before the
/// pool, once per image; calls for different images may run concurrently. Runs Winograd, the direct kernel or
/// im2col + GEMM (the header's comment says which).
template <class T, class ImageDone = std::nullptr_t>
void conv2d_forward(const ConvGeometry& g, const T* x, const T* w, const T* b, T* y, Activation act = Activation::none,
                    bool pool2 = false, const ImageDone& image_done = nullptr) {
  constexpr bool no_done = std::is_same_v<ImageDone, std::nullptr_t>;
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) {
    // (only without an activation or with ReLU, which commute with the rounding: others act on the rounded values)
    const bool exact_act = act == Activation::none || act == Activation::relu;
    if (exact_act && detail::conv16_widens<T>((no_done || !pool2) && conv_winograd_applies<float>(g),
                                              no_done && conv_direct_applies<float>(g))) {
      const std::int64_t L = g.oh * g.ow, ny = g.n * g.o * (pool2 ? (g.oh / 2) * (g.ow / 2) : L);
      const Tensor<float> xf = detail::widened(x, g.n * g.c * g.h * g.w),
                          wf = detail::widened(w, g.o * g.cg() * g.kh * g.kw);
      const Tensor<float> bf = b ? detail::widened(b, g.o) : Tensor<float>();
      Tensor<float> yf = empty<float>(Shape{ny});
      if constexpr (no_done) {
        conv2d_forward<float>(g, xf.data(), wf.data(), b ? bf.data() : nullptr, yf.data(), act, pool2);
        detail::rounded_into(y, yf.data(), ny);
      } else {  // each image rounded as it is done, then handed on in T
        conv2d_forward<float>(g, xf.data(), wf.data(), b ? bf.data() : nullptr, yf.data(), act, pool2,
                              [&](std::int64_t i, const float* yi) {
                                detail::store_rounded(y + i * g.o * L, yi, g.o * L);
                                image_done(i, static_cast<const T*>(y + i * g.o * L));
                              });
      }
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    ConvAlgo cands[3];
    int nc = 0;
    if ((no_done || !pool2) && conv_winograd_applies<T>(g)) cands[nc++] = ConvAlgo::winograd;
    if (no_done && conv_direct_applies<T>(g)) cands[nc++] = ConvAlgo::direct;
    cands[nc++] = ConvAlgo::im2col;
    ConvAlgo a = cands[0];
    if (nc > 1 && conv_benchmark()) {
      // Timed without the callback (it may gather statistics: it must see each image once, in the real run).
      struct Ctx {
        const ConvGeometry* g;
        const T *x, *w, *b;
        T* y;
        Activation act;
        bool pool2;
      } ctx{&g, x, w, b, y, act, pool2};
      auto run = [](const void* p, ConvAlgo c) {
        const Ctx& k = *static_cast<const Ctx*>(p);
        if (c == ConvAlgo::winograd) conv2d_forward_winograd(*k.g, k.x, k.w, k.b, k.y, k.act, k.pool2, nullptr);
        else if (c == ConvAlgo::direct) conv2d_forward_direct(*k.g, k.x, k.w, k.b, k.y, k.act, k.pool2);
        else conv2d_forward_im2col(*k.g, k.x, k.w, k.b, k.y, k.act, k.pool2, nullptr);
      };
      a = detail::choose_conv_algo(detail::conv_choice_key(ConvPass::forward, g, sizeof(T), act, pool2, !no_done),
                                   cands, nc, run, &ctx);
    }
    if (a == ConvAlgo::winograd) return conv2d_forward_winograd(g, x, w, b, y, act, pool2, image_done);
    if constexpr (no_done) {
      if (a == ConvAlgo::direct) return conv2d_forward_direct(g, x, w, b, y, act, pool2);
    }
  }
  conv2d_forward_im2col(g, x, w, b, y, act, pool2, image_done);
}

/// Gradients of conv2d from gy (N, O, oh, ow): gx (N, C, H, W), gw (O, C/groups, kh, kw) and gb (O); each may
/// be null when not wanted. x is needed only for gw, w only for gx. Outputs are overwritten. All contiguous. The
/// input's and the weight's gradients each run Winograd or the GEMMs (the header's comment says which).
template <class T>
void conv2d_backward(const ConvGeometry& g, const T* x, const T* w, const T* gy, T* gx, T* gw, T* gb) {
  if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, half>) {
    if ((gx || gw) && detail::conv16_widens<T>(conv_winograd_applies<float>(g), false)) {
      const std::int64_t nx = g.n * g.c * g.h * g.w, nw = g.o * g.cg() * g.kh * g.kw;
      const Tensor<float> gyf = detail::widened(gy, g.n * g.o * g.oh * g.ow);
      const Tensor<float> xf = gw ? detail::widened(x, nx) : Tensor<float>(),
                          wf = gx ? detail::widened(w, nw) : Tensor<float>();
      Tensor<float> gxf = gx ? empty<float>(Shape{nx}) : Tensor<float>(),
                    gwf = gw ? empty<float>(Shape{nw}) : Tensor<float>(),
                    gbf = gb ? empty<float>(Shape{g.o}) : Tensor<float>();
      conv2d_backward<float>(g, gw ? xf.data() : nullptr, gx ? wf.data() : nullptr, gyf.data(),
                             gx ? gxf.data() : nullptr, gw ? gwf.data() : nullptr, gb ? gbf.data() : nullptr);
      if (gx) detail::rounded_into(gx, gxf.data(), nx);
      if (gw) detail::rounded_into(gw, gwf.data(), nw);
      if (gb) detail::rounded_into(gb, gbf.data(), g.o);
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if ((gx || gw) && conv_winograd_applies<T>(g)) {
      ConvAlgo ax = ConvAlgo::winograd, aw = ConvAlgo::winograd;
      if (conv_benchmark()) {
        struct Ctx {
          const ConvGeometry* g;
          const T *x, *w, *gy;
          T *gx, *gw;
        } ctx{&g, x, w, gy, gx, gw};
        const ConvAlgo cands[2] = {ConvAlgo::winograd, ConvAlgo::im2col};
        auto run_x = [](const void* p, ConvAlgo c) {
          const Ctx& k = *static_cast<const Ctx*>(p);
          if (c == ConvAlgo::winograd) conv2d_backward_data_winograd(*k.g, k.w, k.gy, k.gx);
          else conv2d_backward_im2col<T>(*k.g, k.x, k.w, k.gy, k.gx, nullptr, nullptr);
        };
        auto run_w = [](const void* p, ConvAlgo c) {
          const Ctx& k = *static_cast<const Ctx*>(p);
          if (c == ConvAlgo::winograd) conv2d_backward_weight_winograd(*k.g, k.x, k.gy, k.gw);
          else conv2d_backward_im2col<T>(*k.g, k.x, k.w, k.gy, nullptr, k.gw, nullptr);
        };
        if (gx)
          ax = detail::choose_conv_algo(
              detail::conv_choice_key(ConvPass::backward_data, g, sizeof(T), Activation::none, false, false), cands, 2,
              run_x, &ctx);
        if (gw)
          aw = detail::choose_conv_algo(
              detail::conv_choice_key(ConvPass::backward_weight, g, sizeof(T), Activation::none, false, false), cands,
              2, run_w, &ctx);
      }
      if (gx && ax == ConvAlgo::winograd) {
        conv2d_backward_data_winograd(g, w, gy, gx);
        gx = nullptr;
      }
      if (gw && aw == ConvAlgo::winograd) {
        conv2d_backward_weight_winograd(g, x, gy, gw);
        gw = nullptr;
      }
      if (!gx && !gw && !gb) return;  // the rest (the bias, a gradient im2col won) below
    }
  }
  conv2d_backward_im2col(g, x, w, gy, gx, gw, gb);
}

#if EMBER_HEADER_BODIES
namespace detail {
struct ConvChoiceCache {
  std::mutex mu;
  std::map<ConvChoiceKey, ConvAlgo> map;
  static ConvChoiceCache& instance() {
    static ConvChoiceCache* c = new ConvChoiceCache;  // never destroyed: convolutions may run at exit
    return *c;
  }
};

EMBER_HEADER_INLINE ConvAlgo choose_conv_algo(const ConvChoiceKey& key, const ConvAlgo* cands, int n, ConvRunFn run,
                                              const void* ctx) {
  ConvChoiceCache& cache = ConvChoiceCache::instance();
  {
    std::lock_guard<std::mutex> lk(cache.mu);
    const auto it = cache.map.find(key);
    if (it != cache.map.end()) return it->second;
  }
  // Timed without the lock (two threads meeting a new problem both time it; the first answer stored wins).
  ConvAlgo best = cands[0];
  double best_s = 0;
  for (int i = 0; i < n; ++i) {
    run(ctx, cands[i]);  // untimed: buffers, page faults, caches
    double s = 0;
    for (int r = 0; r < 2; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run(ctx, cands[i]);
      const double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      s = r == 0 ? d : std::min(s, d);
    }
    if (i == 0 || s < best_s) {
      best = cands[i];
      best_s = s;
    }
  }
  std::lock_guard<std::mutex> lk(cache.mu);
  return cache.map.emplace(key, best).first->second;
}

EMBER_HEADER_INLINE std::size_t conv_choice_cache_size(bool clear) {
  ConvChoiceCache& cache = ConvChoiceCache::instance();
  std::lock_guard<std::mutex> lk(cache.mu);
  if (clear) cache.map.clear();
  return cache.map.size();
}
}  // namespace detail
#endif

}  // namespace ember::cpu
