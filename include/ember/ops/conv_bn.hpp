// ember — a convolution followed by a training-mode batch norm, an optional ReLU and an optional 2x2 max pool, as
// one operation on the CPU (forward and backward), without autograd: the argument checks, and the fused kernel of
// cpu/conv_bn.hpp (which describes the passes); the convolution's own backward is ops::conv2d_backward.
#pragma once

#include <cstdint>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/conv_bn.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/normalization.hpp"

namespace ember::ops {

/// The options of the fused block after the convolution (conv2d_batch_norm's last argument): the batch norm's, as
/// F.batch_norm's momentum and eps with its defaults, then which of ReLU and a 2x2 max pool follow it (ember's own):
///   auto y = conv2d_batch_norm(x, w, b, running_mean, running_var, gamma, beta, {.padding = 1}, {.relu = true});
struct ConvBnOptions {
  /// The running statistics' update factor: r = (1 - momentum) r + momentum * batch_stat (with running_mean and
  /// running_var defined); F.batch_norm's momentum.
  double momentum = 0.1;
  double eps = 1e-5;     ///< added to the batch variance before its square root; >= 0
  bool relu = false;     ///< a ReLU after the batch norm
  bool pool2 = false;    ///< then a 2x2 max pool, stride 2, floor (the output at least 2x2 before it)
};

/// What the fused forward returns and its backward needs.
template <class T>
struct ConvBnResult {
  Tensor<T> y;  ///< (N, O, oh, ow), or (N, O, oh/2, ow/2) with pool2.
  Tensor<T> z;  ///< (N, O, oh, ow): the convolution's output (the batch norm's input).
  ///@{
  /// (O): the batch statistics, mean and 1 / sqrt(var + eps).
  std::vector<double> mean, invstd;  // (O): the batch statistics
  ///@}
};

namespace detail {
template <class T, class P>
void check_conv_bn(const char* op, const Tensor<T>& x, const cpu::ConvGeometry& g, const Tensor<P>& running_mean,
                   const Tensor<P>& running_var, const Tensor<P>& weight, const Tensor<P>& bias,
                   const ConvBnOptions& bo) {
  EMBER_CHECK(x.device().is_cpu(), op, ": runs on the CPU only; the input is on ", x.device().str(),
              " (use conv2d and batch_norm there)");
  const Shape zs{g.n, g.o, g.oh, g.ow};
  check_channel_vec(running_mean, g.o, "running_mean", zs, x.device());
  check_channel_vec(running_var, g.o, "running_var", zs, x.device());
  check_channel_vec(weight, g.o, "weight", zs, x.device());
  check_channel_vec(bias, g.o, "bias", zs, x.device());
  EMBER_CHECK(running_mean.defined() == running_var.defined(), op,
              ": running_mean and running_var must be both defined or both undefined");
  EMBER_CHECK(g.n * g.oh * g.ow > 1, op, ": batch norm needs more than 1 value per channel when training, the "
              "convolution's output has shape ", zs.str());
  EMBER_CHECK(bo.eps >= 0, op, ": eps must be non-negative, got ", bo.eps);
  EMBER_CHECK(!bo.pool2 || (g.oh >= 2 && g.ow >= 2), op, ": a 2x2 max pool needs an output of at least 2x2, got ",
              g.oh, "x", g.ow);
}

}  // namespace detail

/// The training forward of conv2d(x, w, b, o) -> batch_norm (batch statistics; running statistics updated when
/// defined) -> [relu] -> [2x2 max pool], on the CPU. bn_weight / bn_bias (O) are optional, as batch_norm's; the
/// batch norm's parameters and statistics may be float for half / bfloat16 data (BatchNormParam), as batch_norm's.
template <class T, BatchNormParam<T> P = T>
ConvBnResult<T> conv2d_batch_norm_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b,
                                          const Tensor<P>& running_mean, const Tensor<P>& running_var,
                                          const Tensor<P>& bn_weight, const Tensor<P>& bn_bias,
                                          const Conv2dOptions& o, const ConvBnOptions& bo) {
  static_assert(is_floating_v<T>, "conv2d_batch_norm: floating-point tensors only");
  const char* op = "conv2d_batch_norm";
  const cpu::ConvGeometry g = conv2d_geometry(x, w, b, o);
  detail::check_conv_bn(op, x, g, running_mean, running_var, bn_weight, bn_bias, bo);
  const std::int64_t N = g.n, C = g.o;
  ConvBnResult<T> r;
  r.z = empty<T>(Shape{N, C, g.oh, g.ow});
  r.y = empty<T>(bo.pool2 ? Shape{N, C, g.oh / 2, g.ow / 2} : Shape{N, C, g.oh, g.ow});
  r.mean.assign(std::size_t(C), 0.0);
  r.invstd.assign(std::size_t(C), 0.0);
  const Tensor<T> xc = detail::dense(x), wc = detail::dense(w), bc = b.defined() ? detail::dense(b) : b;
  cpu::conv2d_batch_norm_forward<T>(g, xc.data(), wc.data(), bc.defined() ? bc.data() : nullptr, r.z.data(),
                                    r.y.data(), running_mean, running_var, bn_weight, bn_bias, bo.momentum, bo.eps,
                                    bo.relu, bo.pool2, r.mean, r.invstd);
  if (running_mean.defined()) {
    running_mean.bump_version();
    running_var.bump_version();
  }
  return r;
}

/// The gradients of the fused block; each is undefined when not asked for. P: the batch norm's parameter dtype.
template <class T, class P = T>
struct ConvBnGrads {
  ///@{
  /// The gradients of the convolution's input, weight and bias.
  Tensor<T> input, weight, bias;  // the convolution's
  ///@}
  ///@{
  /// The gradients of the batch norm's weight and bias.
  Tensor<P> bn_weight, bn_bias;   // the batch norm's
  ///@}
};

/// Gradients of conv2d_batch_norm given gy (the shape of its y), from what its forward returned (z, mean, invstd) and
/// its inputs x, w, bn_weight and bn_bias (the last two may be undefined; the ReLU's and the pool's decisions are
/// recomputed from z through the batch norm). Each gradient is computed only when its flag is set.
template <class T, BatchNormParam<T> P = T>
ConvBnGrads<T, P> conv2d_batch_norm_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& w,
                                             const Tensor<T>& z, const Tensor<P>& bn_weight, const Tensor<P>& bn_bias,
                                             const std::vector<double>& mean, const std::vector<double>& invstd,
                                             const Conv2dOptions& o, const ConvBnOptions& bo, bool need_input,
                                             bool need_weight, bool need_bias, bool need_bn_weight,
                                             bool need_bn_bias) {
  const char* op = "conv2d_batch_norm_backward";
  const cpu::ConvGeometry g = conv2d_geometry(x, w, Tensor<T>(), o);
  const std::int64_t N = g.n, C = g.o;
  const Shape zs{N, C, g.oh, g.ow};
  const Shape ys = bo.pool2 ? Shape{N, C, g.oh / 2, g.ow / 2} : zs;
  EMBER_CHECK(gy.shape() == ys, op, ": gradient of shape ", gy.shape().str(), " does not match the output shape ",
              ys.str());
  EMBER_CHECK(z.shape() == zs && z.is_contiguous(), op, ": the saved convolution output has shape ", z.shape().str(),
              ", expected a contiguous ", zs.str());
  EMBER_CHECK(gy.device().is_cpu(), op, ": the gradient is on ", gy.device().str(), ", expected the CPU");
  EMBER_CHECK(mean.size() == std::size_t(C) && invstd.size() == std::size_t(C), op, ": ", mean.size(),
              " saved means for ", C, " channels");
  ConvBnGrads<T, P> r;
  const bool need_gz = need_input || need_weight || need_bias;
  if (!(need_gz || need_bn_weight || need_bn_bias)) return r;
  const Tensor<T> gyc = detail::dense(gy);
  cpu::ConvBnNormGrads<T, P> bg = cpu::conv2d_batch_norm_backward<T, P>(g, gyc.data(), z.data(), mean, invstd, bn_weight,
                                                                    bn_bias, bo.relu, bo.pool2, need_gz, need_bn_weight,
                                                                    need_bn_bias);
  r.bn_weight = std::move(bg.dbn_weight);
  r.bn_bias = std::move(bg.dbn_bias);
  if (!need_gz) return r;
  Tensor<T> gz = std::move(bg.gz);
  Conv2dGrads<T> cg = conv2d_backward(gz, x, w, o, need_input, need_weight, need_bias);
  r.input = std::move(cg.input);
  r.weight = std::move(cg.weight);
  r.bias = std::move(cg.bias);
  return r;
}

}  // namespace ember::ops
