// ember — int8 Linear and Conv2d for post-training quantization (CPU): the converted layer (its int8 weight, scales,
// bias, the calibrated input scale and zero point, the fused activation and pool), its checks, and the calls of the
// int8 kernels of cpu/qlinear.hpp and cpu/qconv.hpp (which describe the arithmetic). Activations travel between
// layers in float32: each quantized layer quantizes its own input; a NaN input is an error. These layers compute no
// gradients: quantized models are for inference.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ember/autograd/tensor_ops.hpp"
#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/hint.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/isa.hpp"
#include "ember/cpu/qconv.hpp"
#include "ember/cpu/qgemm.hpp"
#include "ember/cpu/qlinear.hpp"
#include "ember/ops/window.hpp"
#include "ember/quant/observer.hpp"

namespace ember::quant {

/// Largest GEMM depth whose int32 sums cannot overflow (255 · 128 per product).
inline constexpr std::int64_t kMaxDepth = 2147483647LL / (255 * 128);

namespace detail {
/// Said once when an int8 layer is prepared in a build without VNNI dot products (vpdpbusd), where the int8 kernels
/// run on AVX2's vpmaddubsw, at half the VNNI kernels' rate or less: either the CPU has VNNI and the build does not
/// use it, or the CPU has none. (Example 04's int8 CNN in an x86-64-v3 build ran 1.87x its fused float32 model
/// on a Zen 4, bench/RESULTS.md; an int8 Linear or a convolution of fewer than 4 input channels gains less.)
[[gnu::cold, gnu::noinline]] inline void hint_int8_without_vnni() {
  hint("int8-vnni", cpu::has_vnni(cpu::read_cpuid()) ? "int8 layers run the AVX2 kernel: this CPU has VNNI dot-product instructions but the "
                               "program was compiled without them; compile with -march=native"
                             : "this CPU has no VNNI dot-product instructions (AVX512-VNNI or AVX-VNNI): int8 layers "
                               "run the slower AVX2 kernels; measure against float32 before deploying");
}
}  // namespace detail

/// A Linear or Conv2d converted to int8. The kernels' operands (cpu::q::Int8Operands: out, depth, zp_u8, the
/// per-channel constants, the packed weight) are derived by prepare().
struct QuantizedLayer : cpu::q::Int8Operands {
  bool conv = false;  ///< A Conv2d (else a Linear).
  std::string name;   ///< The layer's name, for messages.
  /// (O, I) or (O, C/groups, kh, kw): round(w / weight_scale[o]) in [-127, 127].
  Tensor<std::int8_t> weight;
  Tensor<float> weight_scale;           ///< (O): the per-output-channel weight scales.
  Tensor<float> bias;                   ///< (O): float, zeros for a layer without bias.
  QParams input;                        ///< The input's scale and zero point in input_dtype.
  QDtype input_dtype = QDtype::quint8;  ///< How the input is quantized.
  Activation act = Activation::none;    ///< The fused activation (nn::fuse_conv_bn).
  bool pool = false;                    ///< Conv only: a fused 2x2 max pool (stride 2, floor) after the activation.
  Conv2dOptions conv_options;           ///< Conv only: stride, padding, dilation, groups.

  /// Checks the tensors and derives the kernel operands; call after setting the fields above.
  void prepare() {
    const char* what = conv ? "quant::QuantizedConv2d" : "quant::QuantizedLinear";
    EMBER_CHECK(weight.defined() && weight.device().is_cpu() && weight.dim() == (conv ? 4 : 2), what, " '", name,
                "': expected a ", conv ? 4 : 2, "-D int8 weight on the CPU, got ",
                weight.defined() ? weight.shape().str() : std::string("an undefined tensor"));
    out = weight.size(0);
    depth = weight.numel() / std::max<std::int64_t>(out, 1);
    if (!EMBER_QGEMM_VNNI512 && !EMBER_QGEMM_VNNI256) detail::hint_int8_without_vnni();
    if (cpu::is_heavy_act(act)) cpu::enable_act_epilogues<float>();  // the forward reads GELU's or SiLU's loops
    EMBER_CHECK(out > 0 && depth > 0 && depth <= kMaxDepth, what, " '", name, "': weight ", weight.shape().str(),
                " has a GEMM depth of ", depth, "; int8 layers take 1 to ", kMaxDepth,
                " (int32 sums must not overflow)");
    EMBER_CHECK(weight_scale.defined() && weight_scale.shape() == Shape{out} && bias.defined() &&
                    bias.shape() == Shape{out},
                what, " '", name, "': weight_scale and bias must have shape [", out, "], got ",
                weight_scale.defined() ? weight_scale.shape().str() : "undefined", " and ",
                bias.defined() ? bias.shape().str() : "undefined");
    // Scales from a file: the forward divides by the input scale, so its reciprocal must be finite as well.
    EMBER_CHECK(std::isfinite(input.scale) && input.scale > 0 && std::isfinite(1.0f / input.scale) &&
                    input.zero_point >= qmin(input_dtype) &&
                    input.zero_point <= qmax(input_dtype),
                what, " '", name, "': input scale ", input.scale, " and zero point ", input.zero_point,
                " are not valid for ", input_dtype == QDtype::quint8 ? "quint8" : "qint8");
    if (conv)
      EMBER_CHECK(conv_options.groups >= 1 && out % conv_options.groups == 0, what, " '", name, "': ", out,
                  " output channels do not split into ", conv_options.groups, " groups");
    zp_u8 = input.zero_point + (input_dtype == QDtype::qint8 ? 128 : 0);
    kp = cpu::q::round_up(depth, 4);
    const Tensor<std::int8_t> w = weight.contiguous();
    const Tensor<float> ws = weight_scale.contiguous(), bs = bias.contiguous();
    cpu::q::prepare_channels(*this, w.data(), ws.data(), bs.data(), input.scale, what, name);
    if (conv)
      cpu::q::prepare_conv_weight(*this, w.data(), weight.size(1), weight.size(2) * weight.size(3),
                                  conv_options.groups);
    else
      cpu::q::pack_b(w.data(), depth, out, depth, packed);
  }
};

namespace detail {

/// The kernels' epilogue of a call of q.
inline cpu::q::Int8Epilogue epilogue(const QuantizedLayer& q, const Tensor<float>& bias) {
  cpu::q::Int8Epilogue e;
  e.input_scale = q.input.scale;
  e.bias = bias.data();
  e.act = q.act;
  e.pool = q.pool;
  return e;
}

inline void check_input(const QuantizedLayer& q, const Tensor<float>& x, const char* op) {
  EMBER_CHECK(x.defined() && x.device().is_cpu(), op, " '", q.name, "': int8 layers run on the CPU; the input is ",
              x.defined() ? "on " + x.device().str() : std::string("undefined"));
}

[[noreturn]] inline void nan_input(const QuantizedLayer& q, const Tensor<float>& x, const char* op) {
  throw Error(std::string(op) + " '" + q.name + "': the input " + x.shape().str() +
              " holds NaN, which has no int8 value");
}

}  // namespace detail

/// x (..., in_features) float -> (..., out_features) float, computed in int8.
inline Tensor<float> quantized_linear(const QuantizedLayer& q, const Tensor<float>& x,
                                      cpu::q::Path path = cpu::q::best_path()) {
  const char* op = "quant::QuantizedLinear";
  detail::check_input(q, x, op);
  EMBER_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) == q.depth, op, " '", q.name, "': expected an input (..., ",
              q.depth, "), got ", x.shape().str());
  const Tensor<float> xc = x.contiguous();
  const std::int64_t K = q.depth, O = q.out, M = xc.numel() / K;
  Shape ys = x.shape();
  ys[x.dim() - 1] = O;
  Tensor<float> y = empty<float>(ys);
  const Tensor<float> b = q.bias.contiguous();
  if (cpu::q::linear_forward(q, detail::epilogue(q, b), xc.data(), M, y.data(), path)) detail::nan_input(q, x, op);
  return y;
}

/// x (N, C, H, W) or (C, H, W) float -> the convolution's output, computed in int8.
inline Tensor<float> quantized_conv2d(const QuantizedLayer& q, const Tensor<float>& x,
                                      cpu::q::Path path = cpu::q::best_path()) {
  const char* op = "quant::QuantizedConv2d";
  detail::check_input(q, x, op);
  if (x.dim() == 3) return quantized_conv2d(q, x.unsqueeze(0), path).squeeze(0);
  const Conv2dOptions& o = q.conv_options;
  const std::int64_t G = o.groups;
  EMBER_CHECK(x.dim() == 4 && x.size(1) == q.weight.size(1) * G, op, " '", q.name,
              "': expected an input (N, ", q.weight.size(1) * G, ", H, W) for weight ", q.weight.shape().str(),
              " with groups=", G, ", got ", x.shape().str());
  cpu::ConvGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.o = q.out;
  static_cast<Window2d&>(g) = window2d(Size2(q.weight.size(2), q.weight.size(3)), o.stride, o.padding, o.dilation);
  g.groups = G;
  const std::int64_t eh = g.dh * (g.kh - 1) + 1, ew = g.dw * (g.kw - 1) + 1;
  EMBER_CHECK(eh <= g.h + 2 * g.ph && ew <= g.w + 2 * g.pw, op, " '", q.name, "': kernel ", Size2(eh, ew).str(),
              " is larger than the padded input (input ", x.shape().str(), ", padding ", o.padding.str(), ")");
  g.oh = ember::detail::window_out_size(g.h, g.kh, g.sh, g.ph, g.dh, false);
  g.ow = ember::detail::window_out_size(g.w, g.kw, g.sw, g.pw, g.dw, false);
  if (q.pool)
    EMBER_CHECK(g.oh >= 2 && g.ow >= 2, op, " '", q.name, "': a fused 2x2 max pool needs an output of at least 2x2, got ",
                g.oh, "x", g.ow);
  const Tensor<float> xc = x.contiguous(), b = q.bias.contiguous();
#if EMBER_QCONV_DIRECT
  if (cpu::q::conv_direct_runs(path) && !q.blocked.empty()) {
    Tensor<float> y = empty<float>(q.pool ? Shape{g.n, g.o, g.oh / 2, g.ow / 2} : Shape{g.n, g.o, g.oh, g.ow});
    if (cpu::q::detail::conv2d_direct(q, detail::epilogue(q, b), xc.data(), g, y.data(), path))
      detail::nan_input(q, x, op);
    return y;
  }
#endif

  const Tensor<float> y = cpu::q::conv2d_forward(q, detail::epilogue(q, b), g, xc.data(), path);
  if (!y.defined()) detail::nan_input(q, x, op);
  return y;
}

}  // namespace ember::quant
