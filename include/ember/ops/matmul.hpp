// ember — matrix products without autograd: shape checks, then dispatch to the device's GEMM.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/gemm.hpp"
#include "ember/expr/nodes.hpp"

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
}  // namespace detail

/// c (m, n) = a (m, k) @ b (k, n), or c += a @ b. c must be contiguous.
template <class T>
void mm_into(const Tensor<T>& c, const Tensor<T>& a, const Tensor<T>& b, bool accumulate = false) {
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  EMBER_CHECK(a.shape()[1] == b.shape()[0], "mm: shapes ", a.shape().str(), " and ", b.shape().str(),
              " cannot be multiplied (", a.shape()[1], " != ", b.shape()[0], ")");
  EMBER_CHECK(a.device() == b.device(), "mm: operands are on different devices (", a.device().str(), " and ",
              b.device().str(), ")");
  EMBER_CHECK(a.device().is_cpu(), "mm: the CPU GEMM got tensors on ", a.device().str());
  const std::int64_t m = a.shape()[0], k = a.shape()[1], n = b.shape()[1];
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    Tensor<T> ka, kb;
    const auto av = detail::mat_view(a, ka), bv = detail::mat_view(b, kb);
    cpu::gemm<T>(m, n, k, av, bv, c.data(), n, accumulate);
  } else {
    static_assert(is_floating_v<T>, "mm: floating-point tensors only");
    // 16-bit types: fp32 math, rounded once at the end.
    Tensor<float> af = cast<float>(a), bf = cast<float>(b), cf = empty<float>(Shape{m, n});
    if (accumulate) cf = cast<float>(c);
    mm_into(cf, af, bf, accumulate);
    cpu::assign(c, cast<T>(cf), "mm");
  }
  c.bump_version();
}

template <class T>
Tensor<T> mm(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected 2-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  Tensor<T> c = empty<T>(Shape{a.shape()[0], b.shape()[1]}, a.device());
  mm_into(c, a, b);
  return c;
}

/// c (B, m, n) = a (B, m, k) @ b (B, k, n); batches run in parallel when each is small.
template <class T>
Tensor<T> bmm(const Tensor<T>& a, const Tensor<T>& b) {
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected 3-D tensors, got shapes ", a.shape().str(), " and ",
              b.shape().str());
  EMBER_CHECK(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1], "bmm: shapes ", a.shape().str(), " and ",
              b.shape().str(), " cannot be multiplied");
  const std::int64_t B = a.shape()[0], m = a.shape()[1], n = b.shape()[2];
  Tensor<T> c = empty<T>(Shape{B, m, n}, a.device());
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

}  // namespace ember::ops
