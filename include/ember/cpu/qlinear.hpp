// ember — CPU int8 kernels of quantized Linear layers (quant/layers.hpp converts and checks the layer): the input
// quantized per tensor (affine, the calibrated scale and zero point; a NaN is reported), multiplied by per-output-
// channel symmetric int8 weights with int32 accumulation (cpu/qgemm.hpp), and written back as float in one pass over
// each block of the product:
//   y[o] = (acc[o] - zp · Σ_k w[o][k]) · (s_x · s_w[o]) + bias[o], then the fused activation (ReLU, GELU, SiLU).
// The zero-point term is folded into a per-channel constant computed at conversion (prepare_int8). Inputs are
// quantized as PyTorch does (q = clamp(round_half_even(x · (1/s)) + zp)). The row kernels here are shared with the
// convolutions of cpu/qconv.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/qgemm.hpp"
#include "ember/cpu/thread_pool.hpp"

#if defined(__SSE2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace ember::cpu::q {

/// What the int8 kernels read of a converted Linear or Conv2d besides its activation and bias, derived once from
/// the int8 weight (prepare_int8).
struct Int8Operands {
  std::int64_t out = 0, depth = 0, kp = 0;  // output channels, GEMM depth (per group), depth padded to 4
  std::int32_t zp_u8 = 0;                   // the input zero point as uint8 (qint8 values are stored + 128)
  std::vector<float> out_scale;             // input.scale · weight_scale[o]
  std::vector<std::int32_t> zp_offset;      // -zp_u8 · Σ_k weight[o][k]
  PackedB<std::int8_t> packed;              // linear: the weight as the GEMM's packed operand
  std::vector<std::int8_t> rows;            // conv: the weight's rows, each padded to kp with zeros
  // conv with at least 4 input channels per group, in AVX512-VNNI builds: the weight for the direct kernel
  // (conv_direct), per group: blocks of 16 output channels, then groups kg = (quad, i, j) of the 4 channels
  // 4·quad.. at tap (i, j), zeros past the group's channels and outputs.
  std::int64_t quads = 0, blocks = 0;  // channel quads per group, blocks of 16 output channels per group
  std::vector<std::int8_t> blocked;
};

/// One call's input scale and epilogue: bias (out values), activation, and (conv only) a 2x2 max pool.
struct Int8Epilogue {
  float input_scale = 1;
  const float* bias = nullptr;
  Activation act = Activation::none;
  bool pool = false;
};

/// The per-channel constants of q (out, depth and zp_u8 set) from the contiguous int8 weight w (out x depth), its
/// scales ws and the bias bs (out values each): out_scale and zp_offset. Bad values are an error naming `what` and
/// the layer's `name`: a scale that is not positive and finite, a product with the input scale that overflows, a
/// bias that is not finite, a weight of -128.
inline void prepare_channels(Int8Operands& q, const std::int8_t* w, const float* ws, const float* bs,
                             float input_scale, const char* what, const std::string& name) {
  const std::int64_t out = q.out, depth = q.depth;
  q.out_scale.resize(std::size_t(out));
  q.zp_offset.resize(std::size_t(out));
  for (std::int64_t o = 0; o < out; ++o) {
    const float s = ws[o];
    EMBER_CHECK(std::isfinite(s) && s > 0, what, " '", name, "': weight_scale[", o, "] = ", s,
                " (scales must be positive and finite)");
    q.out_scale[std::size_t(o)] = input_scale * s;
    // (A product that underflows is harmless: the channel's outputs are that small. One that overflows is inf.)
    EMBER_CHECK(std::isfinite(q.out_scale[std::size_t(o)]), what, " '", name, "': input scale ", input_scale,
                " times weight_scale[", o, "] = ", s, " overflows a float");
    const float bo = bs[o];
    EMBER_CHECK(std::isfinite(bo), what, " '", name, "': bias[", o, "] = ", bo, " (must be finite)");
    std::int64_t sum = 0;
    for (std::int64_t k = 0; k < depth; ++k) {
      const std::int8_t v = w[o * depth + k];
      EMBER_CHECK(v >= -127, what, " '", name, "': weight value -128 at channel ", o,
                  "; int8 weights are symmetric in [-127, 127]");
      sum += v;
    }
    q.zp_offset[std::size_t(o)] = std::int32_t(-std::int64_t(q.zp_u8) * sum);
  }
}

/// The int8 weight of O channels of `per` values w (row-major): round(w / scale[o]) clamped to [-127, 127].
inline void quantize_weights(const float* w, const float* scale, std::int64_t O, std::int64_t per, std::int8_t* out) {
  for (std::int64_t o = 0; o < O; ++o)
    for (std::int64_t k = 0; k < per; ++k) {
      const float v = std::nearbyint(w[std::size_t(o * per + k)] / scale[std::size_t(o)]);
      out[o * per + k] = std::int8_t(std::clamp(v, -127.0f, 127.0f));
    }
}

namespace detail {

/// q[i] = clamp(round(x[i] · inv) + zp, 0, 255); returns whether x held a NaN.
inline bool quantize_u8(const float* EMBER_RESTRICT x, std::int64_t n, float inv, float zp,
                        std::uint8_t* EMBER_RESTRICT q) {
#if defined(__AVX512F__)
  // Rows are short (a feature map's width): whole vectors and one masked tail, no scalar loop.
  const __m512 vinv = _mm512_set1_ps(inv), vzp = _mm512_set1_ps(zp), lo = _mm512_setzero_ps(),
               hi = _mm512_set1_ps(255.0f);
  __mmask16 nan = 0;
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    // (the maskz forms: GCC 12 warns on the unmasked ones' undefined pass-through operand)
    __m512 r = _mm512_maskz_roundscale_ps(m, _mm512_maskz_mul_ps(m, v, vinv),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_maskz_min_ps(m, _mm512_maskz_max_ps(m, _mm512_maskz_add_ps(m, r, vzp), lo), hi);
    _mm512_mask_cvtusepi32_storeu_epi8(q + i, m, _mm512_maskz_cvtps_epu32(m, r));
  }
  return nan != 0;
#else
  int nan = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    nan |= v != v;
    const float r = std::nearbyint(v * inv) + zp;
    q[i] = std::uint8_t(std::min(255.0f, std::max(0.0f, r)));
  }
  return nan != 0;
#endif
}

/// y[j] = float(c[j] + off) · s + b for j < n, then max(·, 0) when relu.
inline void dequantize_row(const std::int32_t* EMBER_RESTRICT c, std::int64_t n, std::int32_t off, float s, float b,
                           bool relu, float* EMBER_RESTRICT y) {
#if defined(__AVX512F__)
  const __m512i voff = _mm512_set1_epi32(off);
  const __m512 vs = _mm512_set1_ps(s), vb = _mm512_set1_ps(b), zero = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1);
    const __m512i v = _mm512_add_epi32(_mm512_maskz_loadu_epi32(m, c + j), voff);
    __m512 r = _mm512_maskz_fmadd_ps(m, _mm512_maskz_cvtepi32_ps(m, v), vs, vb);
    if (relu) r = _mm512_maskz_max_ps(m, r, zero);
    _mm512_mask_storeu_ps(y + j, m, r);
  }
#else
  for (std::int64_t j = 0; j < n; ++j) {
    const float r = float(c[j] + off) * s + b;
    y[j] = relu ? std::max(r, 0.0f) : r;
  }
#endif
}
EMBER_VECTORIZE inline void dequantize_cols(const std::int32_t* EMBER_RESTRICT c, std::int64_t n,
                                            const std::int32_t* EMBER_RESTRICT off, const float* EMBER_RESTRICT s,
                                            const float* EMBER_RESTRICT b, float* EMBER_RESTRICT y) {
  for (std::int64_t j = 0; j < n; ++j) y[j] = float(c[j] + off[j]) * s[j] + b[j];
}

}  // namespace detail

/// y (M x out) = the int8 Linear q applied to the float rows x (M x depth), with e's epilogue; returns whether x held
/// a NaN (y is then not all written).
inline bool linear_forward(const Int8Operands& q, const Int8Epilogue& e, const float* x, std::int64_t M, float* y,
                           Path path) {
  const std::int64_t K = q.depth, O = q.out;
  const float inv = 1.0f / e.input_scale, zp = float(q.zp_u8);
  std::atomic<bool> saw_nan{false};
  cpu::parallel_for(0, M, 64, [&](std::int64_t m0, std::int64_t m1) {
    const Tensor<std::uint8_t> abuf = empty<std::uint8_t>(Shape{(m1 - m0) * q.kp});  // the caching allocator
    std::uint8_t* a = abuf.data();
    std::vector<std::int32_t> c(std::size_t((m1 - m0) * O));
    bool bad = false;
    for (std::int64_t m = m0; m < m1; ++m) {
      std::uint8_t* row = a + (m - m0) * q.kp;
      bad |= detail::quantize_u8(x + m * K, K, inv, zp, row);
      std::memset(row + K, 0, std::size_t(q.kp - K));
    }
    if (bad) {
      saw_nan = true;
      return;
    }
    cpu::q::gemm(a, q.kp, m1 - m0, q.packed, c.data(), O, path);
    for (std::int64_t m = m0; m < m1; ++m) {
      float* yr = y + m * O;
      detail::dequantize_cols(c.data() + (m - m0) * O, O, q.zp_offset.data(), q.out_scale.data(), e.bias, yr);
      cpu::act_(yr, O, e.act);
    }
  });
  return saw_nan;
}

}  // namespace ember::cpu::q
