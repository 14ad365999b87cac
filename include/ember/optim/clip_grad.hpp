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
/// The norm_type-th power of a CUDA gradient's norm (its max |g| for infinity) as a 0-d double on its device,
/// reduced on the device (needs an nvcc translation unit, like every element-wise op on CUDA tensors).
template <class T>
Tensor<double> grad_norm_power_device(const Tensor<T>& g, double norm_type) {
  constexpr const char* op = "clip_grad_norm_";
  if constexpr (!EMBER_CUDA_EXECUTOR) ops::detail::no_cuda_executor(op, g.device());
  Shape ones;
  for (int d = 0; d < g.dim(); ++d) ones.push_back(1);
  Tensor<double> out = empty<double>(ones, g.device());
  if (std::isinf(norm_type)) ops::reduce<expr::ExtremumR<double, false>>(out, abs(g), op);
  else if (norm_type == 2.0) ops::reduce<expr::SumR<double>>(out, g * g, op);
  else if (norm_type == 1.0) ops::reduce<expr::SumR<double>>(out, abs(g), op);
  else ops::reduce<expr::SumR<double>>(out, pow(abs(g), T(norm_type)), op);
  return out.view(Shape{});
}
}  // namespace detail

/// Scales all gradients together so that their joint norm (the norm of the per-parameter norms; norm_type may be
/// infinity) is at most max_norm, and returns the norm before clipping. A non-finite norm is an error when
/// error_if_nonfinite, else the gradients are scaled by it as PyTorch does (and become NaN). CPU gradients are
/// summed in double on the host; CUDA gradients are reduced on their device (one small copy back per gradient)
/// and scaled there, which needs the calling translation unit to be compiled by nvcc.
template <class T>
double clip_grad_norm_(const std::vector<Tensor<T>>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false) {
  EMBER_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive (or infinity), got ", norm_type);
  const bool inf = std::isinf(norm_type);
  double total = 0;
  bool nan = false;
  std::vector<Tensor<double>> on_device;  // 0-d partial results of CUDA gradients, read once all are queued
  for (const Tensor<T>& p : params) {
    if (!p.has_meta() || !p.grad().defined()) continue;
    if (!p.grad().device().is_cpu()) {
      on_device.push_back(detail::grad_norm_power_device(p.grad(), norm_type));
      continue;
    }
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
  for (const Tensor<double>& t : on_device) {
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
