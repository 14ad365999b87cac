// ember — gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_), in place on the gradients.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/expr/nodes.hpp"

namespace ember::optim {

/// Scales all gradients together so that their joint norm (the norm of the per-parameter norms; norm_type may be
/// infinity) is at most max_norm, and returns the norm before clipping. A non-finite norm is an error when
/// error_if_nonfinite, else the gradients are scaled by it as PyTorch does (and become NaN).
template <class T>
double clip_grad_norm_(const std::vector<Tensor<T>>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false) {
  EMBER_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive (or infinity), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  double total = 0;
  bool nan = false;
  for (const Tensor<T>& p : params) {
    if (!p.has_meta() || !p.grad().defined()) continue;
    p.grad().check_cpu("clip_grad_norm_");
    const Tensor<T> g = p.grad().contiguous();
    const T* d = g.data();
    const std::int64_t n = g.numel();
    for (std::int64_t i = 0; i < n; ++i) {
      const double a = std::fabs(double(d[i]));
      nan = nan || std::isnan(a);
      if (inf) total = std::max(total, a);
      else total += norm_type == 2.0 ? a * a : std::pow(a, norm_type);
    }
  }
  if (!inf) total = norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  if (nan) total = std::numeric_limits<double>::quiet_NaN();
  EMBER_CHECK(!(error_if_nonfinite && !std::isfinite(total)), "clip_grad_norm_: the total norm of order ", norm_type,
              " of the gradients is non-finite (", total, "), so it cannot be clipped; set error_if_nonfinite = "
              "false to scale by it anyway");
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0 || std::isnan(coef)) {
    NoGradGuard ng;
    for (const Tensor<T>& p : params) {
      if (!p.has_meta() || !p.grad().defined()) continue;
      Tensor<T>& g = p.grad();
      g *= T(coef);
    }
  }
  return total;
}

/// Clamps every gradient element to [-clip_value, clip_value].
template <class T>
void clip_grad_value_(const std::vector<Tensor<T>>& params, double clip_value) {
  EMBER_CHECK(clip_value >= 0, "clip_grad_value_: clip_value must be non-negative, got ", clip_value);
  NoGradGuard ng;
  for (const Tensor<T>& p : params) {
    if (!p.has_meta() || !p.grad().defined()) continue;
    Tensor<T>& g = p.grad();
    g = clamp(g, -clip_value, clip_value);
  }
}

}  // namespace ember::optim
