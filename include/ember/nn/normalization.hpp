// ember — normalisation layers: nn::BatchNorm1d / BatchNorm2d (running statistics with momentum, batch statistics
// in training, running ones in eval; buffers running_mean, running_var, num_batches_tracked as PyTorch) and
// nn::LayerNorm.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ember/amp/policy.hpp"
#include "ember/autograd/normalization.hpp"
#include "ember/core/creation.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/detail/policy_cast.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

/// The options of nn::BatchNorm1d and nn::BatchNorm2d after num_features, with the names and order of
/// torch.nn.BatchNorm1d / BatchNorm2d (whose keyword-only `bias` is not supported):
/// ```
/// nn::BatchNorm2d bn(64, {.momentum = 0.01, .affine = false});
/// ```
struct BatchNormOptions {
  double eps = 1e-5;  ///< added to the variance before its square root, for numerical stability
  /// Weight of the new batch in the running statistics: r = (1 - momentum) r + momentum * batch_stat.
  /// std::nullopt keeps the cumulative average instead, momentum = 1 / num_batches_tracked, as PyTorch's
  /// momentum=None.
  std::optional<double> momentum = 0.1;
  bool affine = true;  ///< learn a per-channel weight (init 1) and bias (init 0)
  /// Keep running_mean and running_var (used in eval); false: batch statistics in eval too, and no buffers.
  bool track_running_stats = true;
};

/// Batch normalisation over dim 1 of inputs of rank Rank (1d: (N, C) or (N, C, L); 2d: (N, C, H, W)).
template <int Rank, amp::PrecisionPolicy P = amp::fp32>
class BatchNormT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' and running statistics' dtype.
  using compute_t = typename P::compute_t;  ///< The input's and output's dtype.

  /// nn.BatchNorm1d / BatchNorm2d(num_features, eps, momentum, affine, track_running_stats): num_features (C) > 0;
  /// weight starts at 1, bias at 0, running_mean at 0 and running_var at 1.
  explicit BatchNormT(std::int64_t num_features, const BatchNormOptions& o = {});

  /// Normalises each channel of x (N, C, ...) with the batch's statistics in training (updating the running ones)
  /// and with the running statistics in eval (batch statistics when track_running_stats is off); the identity once
  /// nn::fuse_conv_bn folded the layer into the convolution before it.
  Tensor<compute_t> forward(const Tensor<compute_t>& x) const;
  /// forward(x).
  Tensor<compute_t> operator()(const Tensor<compute_t>& x) const { return forward(x); }

  /// What a forward pass does before normalising: in training with running statistics, counts the batch
  /// (num_batches_tracked += 1). Returns the running statistics' update factor: momentum, or 1 / (batches seen)
  /// for the cumulative average (momentum = None).
  double count_batch() const;

  std::int64_t num_features;  ///< The channels C (dim 1 of the input).
  BatchNormOptions options;   ///< The options the layer was built with.
  ///@{
  /// (C): the affine scale and shift (parameters); undefined unless affine.
  Tensor<param_t> weight, bias;                // (C), undefined unless affine
  ///@}
  ///@{
  /// (C): the running statistics used in eval (buffers); undefined unless track_running_stats.
  Tensor<param_t> running_mean, running_var;   // (C), undefined unless track_running_stats
  ///@}
  /// (): the training batches counted so far (a buffer, for momentum = None); undefined unless track_running_stats.
  Tensor<std::int64_t> num_batches_tracked;    // ()
};

template <int Rank, amp::PrecisionPolicy P>
EMBER_COLD BatchNormT<Rank, P>::BatchNormT(std::int64_t num_features, const BatchNormOptions& o)
    : Module(Rank == 2 ? "BatchNorm2d" : "BatchNorm1d"), num_features(num_features), options(o) {
  EMBER_CHECK(num_features > 0, type_name(), ": num_features must be positive, got ", num_features);
  set_setting("eps", o.eps);
  if (o.affine) {
    weight = ones<param_t>(Shape{num_features});
    bias = zeros<param_t>(Shape{num_features});
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
  if (o.track_running_stats) {
    running_mean = zeros<param_t>(Shape{num_features});
    running_var = ones<param_t>(Shape{num_features});
    num_batches_tracked = zeros<std::int64_t>(Shape{});
    register_buffer("running_mean", running_mean);
    register_buffer("running_var", running_var);
    register_buffer("num_batches_tracked", num_batches_tracked);
  }
  set_extra_repr([num_features, o]() EMBER_COLD {
    return std::to_string(num_features) + ", eps=" + std::to_string(o.eps) +
           ", momentum=" + (o.momentum ? std::to_string(*o.momentum) : std::string("None")) +
           ", affine=" + (o.affine ? "True" : "False") +
           ", track_running_stats=" + (o.track_running_stats ? "True" : "False");
  });
}

template <int Rank, amp::PrecisionPolicy P>
auto BatchNormT<Rank, P>::forward(const Tensor<compute_t>& x) const -> Tensor<compute_t> {
  if (nn::folded(*this)) return x;  // nn::fuse_conv_bn moved this normalisation into the layer before it
  if constexpr (Rank == 2) {
    EMBER_CHECK(x.dim() == 4, "BatchNorm2d: expected a 4-D input (N, C, H, W), got shape ", x.shape().str());
  } else {
    EMBER_CHECK(x.dim() == 2 || x.dim() == 3, "BatchNorm1d: expected a 2-D or 3-D input (N, C) or (N, C, L), "
                "got shape ", x.shape().str());
  }
  EMBER_CHECK(x.size(1) == num_features, type_name(), ": expected ", num_features, " channels (dim 1), got shape ",
              x.shape().str());
  const bool use_batch = is_training() || !options.track_running_stats;
  const double factor = count_batch();
  if constexpr (std::is_same_v<param_t, compute_t> || ops::BatchNormParam<param_t, compute_t>) {
    // Mixed precision (fp32 parameters, 16-bit activations) included: the kernel reads the 16-bit values, computes
    // in float with the float statistics and parameters, and writes the 16-bit output; the parameters' gradients
    // come back in float (PyTorch's mixed-type batch norm).
    return ember::batch_norm(x, running_mean, running_var, weight, bias, use_batch, factor, options.eps);
  } else {
    // Other pairs (e.g. double parameters): normalise in the parameters' precision, return the compute type.
    Tensor<param_t> xf = cast<param_t>(x);
    Tensor<param_t> y = ember::batch_norm(xf, running_mean, running_var, weight, bias, use_batch, factor,
                                          options.eps);
    return cast<compute_t>(y);
  }
}

template <int Rank, amp::PrecisionPolicy P>
double BatchNormT<Rank, P>::count_batch() const {
  double factor = options.momentum.value_or(0.0);
  if (is_training() && options.track_running_stats) {
    Tensor<std::int64_t> n = num_batches_tracked;
    std::int64_t count = 0;
    const std::int64_t before = n.device().is_cpu() ? n.data()[0] : n.item();
    // A count loaded from a file may be anything: negative, it would divide by zero below; at the int64 limit, the
    // increment would overflow.
    EMBER_CHECK(before >= 0 && before < (std::int64_t(1) << 62), type_name(), ": num_batches_tracked is ", before,
                ", expected a count in [0, 2^62) (a corrupt state dict?)");
    count = before + 1;
    if (n.device().is_cpu()) {
      n.data()[0] = count;
      n.bump_version();
    } else {  // a buffer moved to a GPU by Module::to: the count was read back, the new one is written (8 bytes each
              // way, plain copies: no element-wise kernel, so a TU not compiled by nvcc can train too)
      n.copy_(full<std::int64_t>(Shape{}, count));
    }
    if (!options.momentum) factor = 1.0 / double(count);
  }
  return factor;
}

/// torch.nn.BatchNorm1d / BatchNorm2d under a precision policy (`nn::BatchNorm2dT<amp::bf16_mixed>`), named as the
/// other layers' policy forms are (LinearT, Conv2dT, LayerNormT, EmbeddingT).
template <amp::PrecisionPolicy P = amp::fp32>
using BatchNorm1dT = BatchNormT<1, P>;
template <amp::PrecisionPolicy P = amp::fp32>
using BatchNorm2dT = BatchNormT<2, P>;
using BatchNorm1d = BatchNorm1dT<>;
using BatchNorm2d = BatchNorm2dT<>;

/// Layer normalisation over the trailing normalized_shape dims, with elementwise affine parameters.
template <amp::PrecisionPolicy P = amp::fp32>
class LayerNormT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' dtype.
  using compute_t = typename P::compute_t;  ///< The input's and output's dtype.

  /// bias = false: an affine weight without a bias (torch.nn.LayerNorm(bias=False)).
  explicit LayerNormT(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  /// Normalisation over the last dim, of size `features` (nn.LayerNorm(features)).
  explicit LayerNormT(std::int64_t features, double eps = 1e-5, bool elementwise_affine = true, bool bias = true)
      : LayerNormT(Shape{features}, eps, elementwise_affine, bias) {}

  /// Normalises x over its trailing normalized_shape dims (which must match), then scales and shifts.
  Tensor<compute_t> forward(const Tensor<compute_t>& x) const;
  /// forward(x).
  Tensor<compute_t> operator()(const Tensor<compute_t>& x) const { return forward(x); }

  Shape normalized_shape;  ///< The trailing dims normalised over (PyTorch's normalized_shape).
  double eps;              ///< Added to the variance before its square root.
  ///@{
  /// normalized_shape: the elementwise scale (init 1) and shift (init 0); undefined without elementwise_affine
  /// (bias: also with bias = false).
  Tensor<param_t> weight, bias;  // normalized_shape; undefined without elementwise_affine (bias: or with bias = false)
  ///@}
};

template <amp::PrecisionPolicy P>
EMBER_COLD LayerNormT<P>::LayerNormT(Shape normalized_shape, double eps, bool elementwise_affine, bool has_bias)
    : Module("LayerNorm"), normalized_shape(normalized_shape), eps(eps) {
  EMBER_CHECK(normalized_shape.n > 0 && normalized_shape.numel() > 0, "nn::LayerNorm: normalized_shape must be "
              "non-empty, got ", normalized_shape.str());
  if (elementwise_affine) {
    weight = ones<param_t>(normalized_shape);
    register_parameter("weight", weight);
    if (has_bias) {
      bias = zeros<param_t>(normalized_shape);
      register_parameter("bias", bias);
    }
  }
  set_extra_repr([normalized_shape, eps, elementwise_affine]() EMBER_COLD {
    return normalized_shape.str() + ", eps=" + std::to_string(eps) +
           ", elementwise_affine=" + (elementwise_affine ? "True" : "False");
  });
}

template <amp::PrecisionPolicy P>
auto LayerNormT<P>::forward(const Tensor<compute_t>& x) const -> Tensor<compute_t> {
  return ember::layer_norm(x, normalized_shape, detail::to_compute<compute_t>(weight),
                           detail::to_compute<compute_t>(bias), eps);
}

using LayerNorm = LayerNormT<>;

}  // namespace ember::nn
