// ember — matrix products without autograd: shape checks, then dispatch to the device's GEMM.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/gemm.hpp"
#include "ember/cpu/linear.hpp"
#include "ember/expr/activation.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/profile/range.hpp"

#if EMBER_WITH_CUDA
#include "ember/cuda/blas.hpp"
#endif

namespace ember::ops {

namespace detail {
// A matrix view of a 2-D tensor with a unit stride, copying when it has none.
template <class T>
cpu::MatView<T> mat_view(const Tensor<T>& t, Tensor<T>& keep) {
  const std::int64_t r = t.shape()[0], c = t.shape()[1], rs = t.strides()[0], cs = t.strides()[1];
  const bool broadcast = (rs == 0 && r > 1) || (cs == 0 && c > 1);
  if (!broadcast && (cs == 1 || c == 1)) return {t.data(), std::max(rs, c), 1};  // row-major
  if (!broadcast && (rs == 1 || r == 1)) return {t.data(), 1, std::max(cs, r)};  // column-major (a transpose)
  keep = empty<T>(t.shape());
  cpu::assign(keep, expr::TensorLeaf<T, false>{&t}, "matmul");
  return {keep.data(), c, 1};
}

inline void check_same_device(const char* op, Device a, Device b, const char* what = "operands") {
  EMBER_CHECK(a == b, op, ": ", what, " are on different devices (", a.str(), " and ", b.str(), ")");
}

#if EMBER_WITH_CUDA
/// t itself when one of its last two dims has a unit stride (and neither is broadcast), else a contiguous copy;
/// as a cuBLAS operand (rows x cols) of each of its batch entries.
template <class T>
cuda::BlasMat<T> blas_view(const Tensor<T>& t, Tensor<T>& keep) {
  const int d = t.dim();
  const std::int64_t r = t.size(d - 2), c = t.size(d - 1), rs = t.strides()[d - 2], cs = t.strides()[d - 1];
  const std::int64_t bs = d == 3 ? t.strides()[0] : 0;
  const bool broadcast = (rs == 0 && r > 1) || (cs == 0 && c > 1);
  if (!broadcast && (cs == 1 || c == 1)) return {t.data(), std::max(rs, c), 1, bs};
  if (!broadcast && (rs == 1 || r == 1)) return {t.data(), 1, std::max(cs, r), bs};
  keep = t.detach().contiguous();
  return {keep.data(), c, 1, d == 3 ? r * c : 0};
}

/// The CUDA half of mm_into / bmm: c (B, m, n) or (m, n), rows contiguous, = a @ b (+ c).
template <class T>
void cuda_gemm(const char* op, const Tensor<T>& c, const Tensor<T>& a, const Tensor<T>& b, bool accumulate) {
  static_assert(is_floating_v<T>, "matmul: floating-point tensors only");
  check_same_device(op, c.device(), a.device(), "the output and the operands");
  cuda::check_device(a.device(), op);
  const int d = a.dim();
  const std::int64_t m = a.size(d - 2), k = a.size(d - 1), n = b.size(d - 1), B = d == 3 ? a.size(0) : 1;
  EMBER_CHECK(c.strides()[c.dim() - 1] == 1 || n <= 1, op, ": the output must have contiguous rows");
  cuda::DeviceGuard guard(a.device());
  Tensor<T> ka, kb;
  const cuda::BlasMat<T> av = blas_view(a, ka), bv = blas_view(b, kb);
  const std::int64_t ldc = std::max<std::int64_t>(c.strides()[c.dim() - 2], std::max<std::int64_t>(n, 1));
  cuda::gemm<T>(B, m, n, k, av, bv, c.data(), ldc, d == 3 ? c.strides()[0] : 0, accumulate);
}
#endif
}  // namespace detail

/// c (m, n) = a (m, k) @ b (k, n), or c += a @ b. c must be contiguous.
template <class T>
void mm_into(const Tensor<T>& c, const Tensor<T>& a, const Tensor<T>& b, bool accumulate = false) {
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  EMBER_CHECK(a.shape()[1] == b.shape()[0], "mm: shapes ", a.shape().str(), " and ", b.shape().str(),
              " cannot be multiplied (", a.shape()[1], " != ", b.shape()[0], ")");
  detail::check_same_device("mm", a.device(), b.device());
  if (a.device().is_cuda()) {
#if EMBER_WITH_CUDA
    detail::cuda_gemm("mm", c, a, b, accumulate);
    c.bump_version();
    return;
#else
    EMBER_CHECK(false, "mm: tensors on ", a.device().str(), " in a program built without CUDA (EMBER_WITH_CUDA)");
#endif
  }
  detail::check_same_device("mm", c.device(), a.device(), "the output and the operands");
  static_assert(is_floating_v<T>, "mm: floating-point tensors only");
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  // half and bfloat16 are converted to fp32 while the GEMM packs its blocks and accumulate in fp32; c is rounded
  // once.
  Tensor<T> ka, kb;
  const auto av = detail::mat_view(a, ka), bv = detail::mat_view(b, kb);
  cpu::gemm<T>(m, n, k, av, bv, c.data(), n, accumulate);
  c.bump_version();
}

template <class T>
Tensor<T> mm(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_PROFILE_RANGE("mm");
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  Tensor<T> c = empty<T>(Shape{a.shape()[0], b.shape()[1]}, a.device());
  mm_into(c, a, b);
  return c;
}

/// c (B, m, n) = a (B, m, k) @ b (B, k, n); batches run in parallel when each is small.
template <class T>
Tensor<T> bmm(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_PROFILE_RANGE("bmm");
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  EMBER_CHECK(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1], "bmm: shapes ", a.shape().str(), " and ",
              b.shape().str(), " cannot be multiplied");
  detail::check_same_device("bmm", a.device(), b.device());
  const std::int64_t B = a.shape()[0], m = a.shape()[1], n = b.shape()[2];
  Tensor<T> c = empty<T>(Shape{B, m, n}, a.device());
  if (a.device().is_cuda()) {
#if EMBER_WITH_CUDA
    detail::cuda_gemm("bmm", c, a, b, false);
    return c;
#else
    EMBER_CHECK(false, "bmm: tensors on ", a.device().str(), " in a program built without CUDA (EMBER_WITH_CUDA)");
#endif
  }
  const double flops = 2.0 * double(m) * double(n) * double(a.shape()[2]);
  auto one = [&](std::int64_t i) { mm_into(c.select(0, i), a.select(0, i), b.select(0, i)); };
  if (flops >= 4e6 || B == 1) {
    for (std::int64_t i = 0; i < B; ++i) one(i);
  } else {
    cpu::parallel_for(0, B, 1, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) one(i);
    });
  }
  return c;
}

/// The activation ops::linear applies to its output was ops::LinearAct: it is ember::Activation (none, relu, gelu,
/// gelu_tanh, silu; expr/activation.hpp).
using LinearAct [[deprecated("ops::LinearAct is ember::Activation (expr/activation.hpp)")]] = Activation;

namespace detail {
/// y = act(y + b) (b broadcast along the rows of y; either may be absent) in one element-wise pass.
template <class T, class Assign>
void bias_act_(Tensor<T>& y, const Tensor<T>& b, Activation act, const Assign& assign) {
  auto with = [&](const auto& v) {
    visit_activation(act, [&](auto op) {
      if constexpr (!std::is_same_v<decltype(op), ops_table::Identity>) assign(expr::make_unary(op, v));
      // none: only reached for y + b (without a bias and an activation there is nothing to do)
      else if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(v)>, Tensor<T>>) assign(v);
    });
  };
  if (b.defined()) with(y + b);
  else if (act != Activation::none) with(y);
}
}  // namespace detail

namespace detail {
/// The body of ops::linear (below) for callers whose activation's CPU loops are enabled already: none or relu, or
/// one that nn::fuse_conv_bn moved into a layer (its fold enables GELU's and SiLU's). A layer's forward calls this,
/// so a program that fuses nothing does not compile the GELU and SiLU loops.
template <class T>
Tensor<T> linear_enabled(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b, Activation act) {
  EMBER_PROFILE_RANGE("linear");
  static_assert(is_floating_v<T>, "linear: floating-point tensors only");
  EMBER_CHECK(w.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got ", w.shape().str());
  EMBER_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), "linear: input of shape ", x.shape().str(),
              " does not match weight of shape ", w.shape().str(), " (expected last dim ", w.size(1), ")");
  detail::check_same_device("linear", x.device(), w.device(), "input and weight");
  if (b.defined()) {
    EMBER_CHECK(b.dim() == 1 && b.numel() == w.size(0), "linear: bias of shape ", b.shape().str(),
                " does not match ", w.size(0), " output features");
    detail::check_same_device("linear", x.device(), b.device(), "input and bias");
  }
  const std::int64_t K = w.size(1), N = w.size(0);
  const Tensor<T> x2 = x.detach().reshape({-1, K});
  const Tensor<T> bd = b.defined() ? b.detach() : b;  // no autograd record, whatever the caller's tensors need
  Shape out(x.shape().begin(), x.shape().end() - 1);
  out.push_back(N);
  if (x.device().is_cuda()) {
#if EMBER_WITH_CUDA
    cuda::check_device(x.device(), "linear");
    cuda::DeviceGuard guard(x.device());
    const std::int64_t M = x2.size(0);
    if (b.defined() && M > 0 && N > 0 && K > 0) {
      Tensor<T> y = empty<T>(Shape{M, N}, x.device());
      Tensor<T> kx, kw;
      const Tensor<T> bc = bd.is_contiguous() ? bd : bd.contiguous();
      const cuda::Epilogue e = act == Activation::relu        ? cuda::Epilogue::bias_relu
                               : act == Activation::gelu_tanh ? cuda::Epilogue::bias_gelu_tanh
                                                             : cuda::Epilogue::bias;
      // cuBLASLt has no epilogue for the erf GELU or SiLU: those take the GEMM + one fused pass below, and so does
      // gelu_tanh in fp64, whose cuBLASLt epilogue is not accurate to fp64 (2e-9 relative, cuBLAS 13.0 on an H200).
      constexpr bool lt_gelu = !std::is_same_v<T, double>;
      if ((act == Activation::none || act == Activation::relu || (lt_gelu && act == Activation::gelu_tanh)) &&
          cuda::linear_epilogue<T>(M, N, K, detail::blas_view(x2, kx), detail::blas_view(w, kw), bc.data(), y.data(),
                                   e, x.device()))
        return y.view(out);
    }
    Tensor<T> y = ops::mm(x2, w.detach().t());
    detail::bias_act_(y, bd, act, [&](const auto& e) { ember::detail::TensorOps<T>::template assign<0>(y, e); });
    return y.view(out);
#else
    EMBER_CHECK(false, "linear: tensors on ", x.device().str(), " in a program built without CUDA (EMBER_WITH_CUDA)");
#endif
  }
  // CPU: the GEMM in blocks of rows with the bias and activation (cpu/linear.hpp).
  const std::int64_t M = x2.size(0);
  Tensor<T> y = empty<T>(Shape{M, N}, x.device());
  if (M == 0 || N == 0) return y.view(out);
  Tensor<T> ka, kb;
  const auto av = detail::mat_view(x2, ka), bv = detail::mat_view(Tensor<T>(w.detach().t()), kb);
  const Tensor<T> bc = bd.defined() && !bd.is_contiguous() ? bd.contiguous() : bd;
  cpu::linear_forward<T>(M, N, K, av, bv, bc.defined() ? bc.data() : nullptr, act, y.data());
  return y.view(out);
}
}  // namespace detail

/// y (..., out) = act(x (..., in) @ w (out, in)^T + b (out)), without autograd (b may be undefined). On CUDA with a
/// bias this is one cuBLASLt call with the bias and the activation applied in the GEMM's epilogue; otherwise (CPU,
/// no bias, or no cuBLASLt kernel for the problem) a GEMM followed by one fused element-wise pass.
template <class T>
Tensor<T> linear(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b = Tensor<T>(),
                 Activation act = Activation::none) {
  if (cpu::is_heavy_act(act)) cpu::enable_act_epilogues<T>();
  return detail::linear_enabled(x, w, b, act);
}

/// The gradients linear_backward computes (undefined where not asked for).
template <class T>
struct LinearGrads {
  ///@{
  /// The gradients of the input, the weight and the bias.
  Tensor<T> input, weight, bias;
  ///@}
};

/// The gradients of y = act(x @ w^T + b) (ops::linear) on the CPU, act none or relu, from gy (the shape of y): one
/// pass forms gz = gy * act'(y) and the bias gradient (the column sums of gz, accumulated in
/// cpu::bias_grad_acc_t), then input = gz @ w and weight = gz^T @ x, each one GEMM that writes its result in the
/// layout of x and of w. x (of shape x_shape) is read only for the weight's gradient, w only for the input's, y
/// (the layer's output) only for ReLU's derivative; the others may be undefined.
template <class T>
LinearGrads<T> linear_backward(const Tensor<T>& gy, const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& y,
                               Activation act, const Shape& x_shape, bool want_input, bool want_weight,
                               bool want_bias) {
  EMBER_PROFILE_RANGE("linear_backward");
  static_assert(is_floating_v<T>, "linear_backward: floating-point tensors only");
  EMBER_CHECK(act == Activation::none || act == Activation::relu, "linear_backward: activation ", activation_name(act),
              " is not fused in training (only none and relu are)");
  EMBER_CHECK(gy.device().is_cpu(), "linear_backward: CPU tensors only, got a gradient on ", gy.device().str());
  EMBER_CHECK(x_shape.n >= 1 && gy.dim() == x_shape.n, "linear_backward: gradient of shape ", gy.shape().str(),
              " does not match an input of shape ", x_shape.str());
  const std::int64_t K = x_shape[x_shape.n - 1], N = gy.size(-1);
  std::int64_t M = 1;
  for (int d = 0; d + 1 < x_shape.n; ++d) M *= x_shape[d];
  EMBER_CHECK(gy.numel() == M * N, "linear_backward: gradient of shape ", gy.shape().str(),
              " does not match an input of shape ", x_shape.str());
  EMBER_CHECK(!want_input || (w.defined() && w.dim() == 2 && w.size(0) == N && w.size(1) == K),
              "linear_backward: the input's gradient needs the weight (", N, ", ", K, ")");
  EMBER_CHECK(!want_weight || (x.defined() && x.shape() == x_shape),
              "linear_backward: the weight's gradient needs the input ", x_shape.str());
  Tensor<T> g2 = gy.detach().reshape({M, N});
  if (!g2.is_contiguous()) g2 = g2.contiguous();
  Tensor<T> gz = g2;
  using A = cpu::bias_grad_acc_t<T>;
  const Tensor<A> db = want_bias ? empty<A>(Shape{N}) : Tensor<A>();  // from the caching allocator
  if (act != Activation::none) {
    Tensor<T> s = y.detach().reshape({M, N});
    if (!s.is_contiguous()) s = s.contiguous();
    gz = empty<T>(Shape{M, N});
    cpu::linear_act_grad(g2.data(), s.data(), gz.data(), M, N, act, want_bias ? db.data() : nullptr);
  } else if (want_bias) {
    cpu::linear_act_grad(g2.data(), static_cast<const T*>(nullptr), static_cast<T*>(nullptr), M, N, act, db.data());
  }
  LinearGrads<T> r;
  if (want_bias) {
    r.bias = empty<T>(Shape{N});
    cpu::round_bias_grad(db.data(), N, r.bias.data());
  }
  if (want_input) {
    Tensor<T> kw;
    r.input = empty<T>(Shape{M, K});
    cpu::gemm<T>(M, K, N, cpu::MatView<T>{gz.data(), N, 1}, detail::mat_view(w.detach(), kw), r.input.data(), K);
    r.input = r.input.view(x_shape);
  }
  if (want_weight) {
    const Tensor<T> x2 = x.detach().reshape({M, K});
    Tensor<T> kx;
    r.weight = empty<T>(Shape{N, K});
    cpu::gemm<T>(N, K, M, cpu::MatView<T>{gz.data(), 1, N}, detail::mat_view(x2, kx), r.weight.data(), K);
  }
  return r;
}

}  // namespace ember::ops
