// Shared by the CUDA twins of the element-wise, reduction and fused-backward tests (test_expr_cuda.cu,
// test_binary_cuda.cu, test_reduce_cuda.cu, test_autograd_cuda.cu; split so no one nvcc TU holds the build up) and of
// the kernel families (test_norm_cuda.cu, test_index_cuda.cu, test_sort_cuda.cu): device copies, CPU-vs-CUDA
// comparison within one rounding of the dtype, seeded random inputs, and the skip when no device is present.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using i64 = std::int64_t;
using ember_test::rd;
using f16 = ember::half;  // cuda_fp16.h declares a global ::half too
using bf16 = ember::bfloat16;

#define SKIP_WITHOUT_CUDA()                  \
  do {                                       \
    if (!ember::cuda::is_available()) {      \
      MESSAGE("skipped: no CUDA device");    \
      return;                                \
    }                                        \
  } while (0)


namespace {

const Device kDev = Device::cuda(0);

/// A device copy of a CPU tensor (contiguous).
template <class T>
Tensor<T> to_dev(const Tensor<T>& c) {
  const Tensor<T> cc = c.contiguous();
  Tensor<T> d = empty<T>(c.shape(), kDev);
  cuda::current_stream(0).synchronize();
  if (c.numel())
    EMBER_CUDA_CHECK(cudaMemcpy(d.data(), cc.data(), std::size_t(c.numel()) * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// A CPU copy of a device tensor (made contiguous on the device first, by the CUDA executor).
template <class T>
Tensor<T> to_host(const Tensor<T>& d) {
  REQUIRE(d.device() == kDev);
  const Tensor<T> dc = d.is_contiguous() ? d : d.contiguous();
  Tensor<T> c = empty<T>(d.shape());
  cuda::current_stream(0).synchronize();
  if (d.numel())
    EMBER_CUDA_CHECK(cudaMemcpy(c.data(), dc.data(), std::size_t(d.numel()) * sizeof(T), cudaMemcpyDeviceToHost));
  return c;
}

template <class T>
double val(const Tensor<T>& t, i64 i) {
  return double(static_cast<compute_t<T>>(rd(t, i)));
}

/// Relative tolerance of one rounding in T (compute in float/double, one rounding to the storage type), with
/// headroom for transcendental functions (libm on the host, CUDA's on the device).
template <class T>
double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 2e-6;
  else if constexpr (std::is_same_v<T, f16>) return 1e-3;
  else if constexpr (std::is_same_v<T, bf16>) return 8e-3;
  else return 0;
}

/// Every element of the device result equals the CPU result (within rtol·|ref| + atol; NaN matches NaN).
template <class T>
void expect_match(const Tensor<T>& cpu, const Tensor<T>& dev, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(dev.device() == kDev);
  REQUIRE(cpu.shape() == dev.shape());
  const Tensor<T> h = to_host(dev);
  i64 bad = 0;
  for (i64 i = 0; i < cpu.numel(); ++i) {
    const double a = val(cpu, i), b = val(h, i);
    const bool ok = (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= atol + rtol * std::fabs(a);
    if (!ok && bad++ < 5) FAIL_CHECK(what << ": element " << i << " cpu " << a << " cuda " << b);
  }
  CHECK(bad == 0);
}
/// With the absolute tolerance of the same size: inputs are O(1), and where a result cancels to near 0 (tanh(u) -
/// sigmoid(v), 1 + tanh(z) for z << 0) a contraction to FMA on one side moves it by about that much.
template <class T>
void expect_match(const Tensor<T>& cpu, const Tensor<T>& dev, const std::string& what) {
  expect_match(cpu, dev, tol<T>(), tol<T>(), what);
}

/// |cuda - cpu| <= tl * max(1, max |cpu|) everywhere (NaN matches NaN): for results that are sums, whose error scales
/// with the terms' size rather than with each result's.
template <class T>
void expect_close_scaled(const Tensor<T>& cpu, const Tensor<T>& dev, double tl, const std::string& what) {
  INFO(what);
  REQUIRE(dev.device() == kDev);
  REQUIRE_MESSAGE(cpu.shape() == dev.shape(), what, ": shape ", cpu.shape().str(), " vs ", dev.shape().str());
  const Tensor<T> h = to_host(dev);
  double scale = 1, worst = 0;
  i64 at = -1;
  for (i64 i = 0; i < cpu.numel(); ++i)
    if (!std::isnan(val(cpu, i))) scale = std::max(scale, std::fabs(val(cpu, i)));
  for (i64 i = 0; i < cpu.numel(); ++i) {
    const double a = val(cpu, i), b = val(h, i);
    const double e = std::isnan(a) && std::isnan(b) ? 0.0 : std::fabs(a - b);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
    }
  }
  CHECK_MESSAGE(worst <= tl * scale, what, ": max error ", worst, " at ", at, " (tolerance ", tl * scale, ", dtype ",
                std::string(dtype_name<T>()), ")");
}

/// Normal values times scale plus shift from a generator seeded with `seed`, rounded to T (on the host).
template <class T>
Tensor<T> seeded_randn(const Shape& s, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator g(seed);
  Tensor<double> x = randn<double>(s, g);
  Tensor<T> r = cast<T>(x * scale + shift);
  return r;
}

/// Evaluates an expression into a new tensor on its operands' device, without recording it for autograd (so this
/// file does not instantiate a backward kernel for every forward expression it checks).
template <class E>
auto ev(const E& e) {
  using R = typename E::value_type;
  Tensor<R> out = empty<R>(e.shape(), expr::device_of(e));
  ops::assign(out, e);
  return out;
}

template <class T>
Tensor<T> randn_t(const Shape& s) {
  return ev(cast<T>(randn<float>(s)));
}
template <class T>
Tensor<T> uniform_t(const Shape& s, double lo, double hi) {
  return ev(cast<T>(rand<float>(s) * float(hi - lo) + float(lo)));
}

/// f applied to CPU operands and to their device copies gives the same tensor.
template <class T, class F>
void same_unary(const Tensor<T>& x, F f, const std::string& what) {
  const Tensor<T> xd = to_dev(x);
  expect_match(ev(f(x)), ev(f(xd)), what);
}
template <class T, class U, class F>
void same_binary(const Tensor<T>& a, const Tensor<U>& b, F f, const std::string& what) {
  const Tensor<T> ad = to_dev(a);
  const Tensor<U> bd = to_dev(b);
  expect_match(ev(f(a, b)), ev(f(ad, bd)), what);
}

// The sizes every element-wise case runs: below one pack, a pack tail, and large enough for a full grid.
const std::vector<i64> kSizes = {1, 7, 1000, 1 << 20, (1 << 20) + 5};

}  // namespace
