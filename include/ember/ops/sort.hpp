// ember — sorting, cumulative and sampling ops without autograd: the argument checks and the dispatch to the loops of
// cpu/sort.hpp or, for CUDA tensors in a translation unit compiled by nvcc, to cuda/sort.cuh (sort, the scans and
// multinomial).
#pragma once

#include <cstdint>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/sort.hpp"
#include "ember/cuda/device.hpp"
#include "ember/ops/elementwise.hpp"

#if EMBER_WITH_CUDA && defined(__CUDACC__)
#include "ember/cuda/sort.cuh"
#define EMBER_CUDA_SORT 1
#else
#define EMBER_CUDA_SORT 0
#endif

namespace ember::ops {

namespace detail {
/// x as a contiguous host tensor without autograd (a CUDA tensor is an error naming op).
template <class T>
Tensor<T> host_input(const Tensor<T>& x, const char* op) {
  x.check_cpu(op);
  return x.detach().contiguous();
}
/// x as a contiguous tensor on its device without autograd.
template <class T>
Tensor<T> scan_input(const Tensor<T>& x) {
  return dense(x.detach());
}
}  // namespace detail

/// The first k positions (along d) of each row of x in sorted order, stable (ties keep their order); NaN counts as
/// the largest value.
template <class T>
Tensor<std::int64_t> sort_indices(const Tensor<T>& x, int d, std::int64_t k, bool descending, const char* op) {
  if (x.device().is_cuda()) {
#if EMBER_CUDA_SORT
    cuda::check_device(x.device(), op);
    cuda::DeviceGuard guard(x.device());
    const Tensor<T> c = detail::scan_input(x);
    const auto s = cpu::dim_split(c.shape(), d);
    Shape os = x.shape();
    os[d] = k;
    Tensor<std::int64_t> r = empty<std::int64_t>(os, x.device());
    cuda::sort_indices(c.data(), s.outer, s.n, s.inner, k, descending, r.data(), x.device().index);
    return r;
#else
    detail::no_cuda_kernel(op, x.device(), "the sort kernels");
#endif
  }
  return cpu::sort_indices(detail::host_input(x, op), d, k, descending);
}

/// Running sums (prod: products) along d of the contiguous tensor c (detail::scan_input), on its device.
template <class T>
Tensor<T> cumulative(const Tensor<T>& c, int d, bool prod) {
  if (c.device().is_cuda()) {
#if EMBER_CUDA_SORT
    cuda::check_device(c.device(), prod ? "cumprod" : "cumsum");
    cuda::DeviceGuard guard(c.device());
    const auto s = cpu::dim_split(c.shape(), d);
    Tensor<T> r = empty<T>(c.shape(), c.device());
    cuda::cumulative(c.data(), r.data(), s.outer, s.n, s.inner, prod, c.device().index);
    return r;
#else
    detail::no_cuda_kernel(prod ? "cumprod" : "cumsum", c.device(), "the scan kernels");
#endif
  }
  c.check_cpu(prod ? "cumprod" : "cumsum");
  return cpu::cumulative(c, d, prod);
}

/// The gradient of cumulative along d for the gradient g (any layout); x and y are cumprod's contiguous input and
/// output (unused for cumsum).
template <class T>
Tensor<T> cumulative_backward(const Tensor<T>& g, const Tensor<T>& x, const Tensor<T>& y, int d, bool prod) {
  if (g.device().is_cuda()) {
#if EMBER_CUDA_SORT
    cuda::DeviceGuard guard(g.device());
    const Tensor<T> gc = detail::scan_input(g);
    const auto s = cpu::dim_split(gc.shape(), d);
    Tensor<T> gx = empty<T>(gc.shape(), gc.device());
    cuda::cumulative_backward(gc.data(), prod ? x.data() : nullptr, prod ? y.data() : nullptr, gx.data(), s.outer,
                              s.n, s.inner, prod, g.device().index);
    return gx;
#else
    (void)x, (void)y;
    detail::no_cuda_kernel(prod ? "cumprod_backward" : "cumsum_backward", g.device(), "the scan kernels");
#endif
  }
  return cpu::cumulative_backward(g.contiguous(), x, y, d, prod);
}

/// num_samples category indices per row of probs (1-D or 2-D; non-negative, finite weights with a positive sum,
/// need not sum to 1), drawn from gen: torch.multinomial. Without replacement a category is drawn at most once,
/// so num_samples may not exceed the number of categories with non-zero weight. The draws come from ember's
/// Philox stream, so they are reproducible under manual_seed but not the same numbers PyTorch draws.
template <class T>
Tensor<std::int64_t> multinomial(const Tensor<T>& probs, std::int64_t num_samples, bool replacement, Generator& gen) {
  static_assert(is_floating_v<T>, "multinomial: probs must be a floating-point tensor");
  EMBER_CHECK(probs.dim() == 1 || probs.dim() == 2, "multinomial: probs must be 1-D or 2-D, got shape ",
              probs.shape().str());
  const std::int64_t rows = probs.dim() == 2 ? probs.shape()[0] : 1, k = probs.shape()[probs.dim() - 1];
  EMBER_CHECK(k > 0, "multinomial: probs has no categories (shape ", probs.shape().str(), ")");
  EMBER_CHECK(num_samples > 0, "multinomial: num_samples must be positive, got ", num_samples);
  EMBER_CHECK(replacement || num_samples <= k, "multinomial: cannot draw ", num_samples, " samples from ", k,
              " categories without replacement");
  if (probs.device().is_cuda()) {
#if EMBER_CUDA_SORT
    // The CPU's draws from the same Philox blocks (cuda/sort.cuh): a seed gives the same samples on both devices.
    cuda::check_device(probs.device(), "multinomial");
    cuda::DeviceGuard guard(probs.device());
    const Tensor<T> p = detail::scan_input(probs);
    Tensor<std::int64_t> r =
        empty<std::int64_t>(p.dim() == 2 ? Shape{rows, num_samples} : Shape{num_samples}, probs.device());
    const std::uint64_t base = gen.reserve((std::uint64_t(rows) * std::uint64_t(num_samples) + 1) / 2);
    if (!cuda::multinomial(p.data(), rows, k, num_samples, replacement, gen.seed(), base, r.data(),
                           probs.device().index)) {
      // A row the kernel refused: the CPU's checks on a host copy name the first one, with the CPU's message.
      const Tensor<T> h = p.to(Device::cpu());
      cpu::check_multinomial_weights(h.data(), rows, k, num_samples, replacement, probs.shape());
    }
    return r;
#else
    detail::no_cuda_kernel("multinomial", probs.device(), "the sampling kernel");
#endif
  }
  const Tensor<T> p = detail::host_input(probs, "multinomial");
  return cpu::multinomial(p, rows, k, num_samples, replacement, gen, probs.shape());
}

}  // namespace ember::ops
