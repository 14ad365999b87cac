// ember — gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_), in place on the gradients.
#pragma once

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/expr/reducer.hpp"
#include "ember/ops/elementwise.hpp"

namespace ember::optim {

namespace detail {
/// The norm_type-th power of a gradient's norm (its max |g| for infinity) as a 0-d double on its device: one
/// reduction in double on either device (CUDA gradients need an nvcc translation unit, like every element-wise op
/// on CUDA tensors).
template <class T>
Tensor<double> grad_norm_power(const Tensor<T>& g, double norm_type) {
  constexpr const char* op = "clip_grad_norm_";
#if !EMBER_CUDA_EXECUTOR
  if (g.device().is_cuda()) ops::detail::no_cuda_executor(op, g.device());  // before the result's allocation fails
#endif
  Shape ones;
  for (int d = 0; d < g.dim(); ++d) ones.push_back(1);
  Tensor<double> out = empty<double>(ones, g.device());
  const auto a = abs(cast<double>(g));
  if (std::isinf(norm_type)) ops::reduce<expr::ExtremumR<double, false>>(out, a, op);
  else if (norm_type == 2.0) ops::reduce<expr::SumR<double>>(out, square(cast<double>(g)), op);
  else if (norm_type == 1.0) ops::reduce<expr::SumR<double>>(out, a, op);
  else ops::reduce<expr::SumR<double>>(out, pow(a, norm_type), op);
  return out.view(Shape{});
}
}  // namespace detail

/// Scales all gradients together so that their joint norm (the norm of the per-parameter norms; norm_type may be
/// infinity) is at most max_norm, and returns the norm before clipping. A non-finite norm is an error when
/// error_if_nonfinite, else the gradients are scaled by it as PyTorch does (and become NaN). Each gradient's part is
/// reduced in double on its device (all of them queued before one small read each), and the gradients are scaled
/// there; CUDA gradients need the calling translation unit to be compiled by nvcc.
template <class T>
double clip_grad_norm_(const std::vector<Tensor<T>>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false) {
  EMBER_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive (or infinity), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  double total = 0;
  bool nan = false;
  std::vector<Tensor<double>> parts;  // 0-d partial results, read once all are queued
  {
    NoGradGuard ng;
    for (const Tensor<T>& p : params)
      if (p.has_meta() && p.grad().defined()) parts.push_back(detail::grad_norm_power(p.grad(), norm_type));
  }
  for (const Tensor<double>& t : parts) {
    const double v = t.item();
    nan = nan || std::isnan(v);
    total = inf ? std::max(total, v) : total + v;
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
