// ember — creating tensors: empty, zeros, ones, full, arange, linspace, eye, from data, from_blob, random.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

/// An uninitialised contiguous tensor.
template <class T = float>
Tensor<T> empty(const Shape& shape, Device device = Device::cpu()) {
  for (auto s : shape) EMBER_CHECK(s >= 0, "empty: negative size in shape ", shape.str());
  EMBER_CHECK(shape.numel() <= std::int64_t((std::size_t(1) << 62) / sizeof(T)), "empty: shape ", shape.str(),
              " has too many elements for one tensor of ", dtype_name<T>());
  auto p = std::make_shared<TensorImpl<T>>();
  p->storage = make_storage(std::size_t(shape.numel()) * sizeof(T), device);
  p->sizes = shape;
  p->strides = contiguous_strides(shape);
  return Tensor<T>(std::move(p));
}

template <class T, class U>
Tensor<T> empty_like(const Tensor<U>& t) {
  return empty<T>(t.shape(), t.device());
}
template <class T>
Tensor<T> empty_like(const Tensor<T>& t) {
  return empty<T>(t.shape(), t.device());
}

template <class T = float>
Tensor<T> full(const Shape& shape, T value, Device device = Device::cpu()) {
  Tensor<T> t = empty<T>(shape, device);
  t.fill_(value);
  return t;
}
template <class T = float>
Tensor<T> zeros(const Shape& shape, Device device = Device::cpu()) {
  Tensor<T> t = empty<T>(shape, device);
  if (device.is_cpu()) std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.numel()) * sizeof(T));
  else t.zero_();
  return t;
}
template <class T = float>
Tensor<T> ones(const Shape& shape, Device device = Device::cpu()) {
  return full<T>(shape, T(1), device);
}
template <class T>
Tensor<T> zeros_like(const Tensor<T>& t) {
  return zeros<T>(t.shape(), t.device());
}
template <class T>
Tensor<T> ones_like(const Tensor<T>& t) {
  return ones<T>(t.shape(), t.device());
}

/// A copy of `values` with the given shape (Shape{} is 0-d and takes one value).
template <class T>
Tensor<T> from_vector(const std::vector<T>& values, const Shape& shape) {
  EMBER_CHECK(shape.numel() == std::int64_t(values.size()), "from_vector: ", values.size(),
              " values do not fill shape ", shape.str());
  Tensor<T> t = empty<T>(shape);
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < values.size(); ++i) t.data()[i] = values[i];
  } else {
    std::memcpy(static_cast<void*>(t.data()), values.data(), values.size() * sizeof(T));
  }
  return t;
}
/// A 1-d copy of `values` (like torch.tensor of a list, also for a single value).
template <class T>
Tensor<T> from_vector(const std::vector<T>& values) {
  return from_vector<T>(values, Shape{std::int64_t(values.size())});
}

/// Tensors from (nested) braces: tensor<float>({1, 2}), tensor<float>({{1, 2}, {3, 4}}).
template <class T>
Tensor<T> tensor(std::initializer_list<T> v) {
  return from_vector<T>(std::vector<T>(v), Shape{std::int64_t(v.size())});
}
template <class T>
Tensor<T> tensor(std::initializer_list<std::initializer_list<T>> v) {
  std::vector<T> flat;
  const std::size_t cols = v.size() ? v.begin()->size() : 0;
  for (auto& row : v) {
    EMBER_CHECK(row.size() == cols, "tensor: ragged nested list (rows of ", cols, " and ", row.size(), ")");
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return from_vector<T>(flat, Shape{std::int64_t(v.size()), std::int64_t(cols)});
}
template <class T>
Tensor<T> tensor(std::initializer_list<std::initializer_list<std::initializer_list<T>>> v) {
  std::vector<T> flat;
  std::int64_t d1 = v.size() ? std::int64_t(v.begin()->size()) : 0, d2 = -1;
  for (auto& m : v) {
    EMBER_CHECK(std::int64_t(m.size()) == d1, "tensor: ragged nested list");
    for (auto& row : m) {
      if (d2 < 0) d2 = std::int64_t(row.size());
      EMBER_CHECK(std::int64_t(row.size()) == d2, "tensor: ragged nested list");
      flat.insert(flat.end(), row.begin(), row.end());
    }
  }
  return from_vector<T>(flat, Shape{std::int64_t(v.size()), d1, d2 < 0 ? 0 : d2});
}
/// A 0-d tensor holding one value.
template <class T>
Tensor<T> scalar_tensor(T v) {
  return from_vector<T>(std::vector<T>{v}, Shape{});
}

/// Wraps memory ember does not own, without copying. `deleter` (optional) runs when the last view dies.
template <class T>
Tensor<T> from_blob(T* data, const Shape& shape, std::function<void(void*)> deleter = {},
                    Device device = Device::cpu()) {
  return from_blob(data, shape, contiguous_strides(shape), std::move(deleter), device);
}
template <class T>
Tensor<T> from_blob(T* data, const Shape& shape, const Shape& strides, std::function<void(void*)> deleter = {},
                    Device device = Device::cpu()) {
  EMBER_CHECK(data != nullptr || shape.numel() == 0, "from_blob: null data for shape ", shape.str());
  EMBER_CHECK(strides.n == shape.n, "from_blob: strides ", strides.str(), " do not match shape ", shape.str());
  auto p = std::make_shared<TensorImpl<T>>();
  p->storage = std::make_shared<StorageImpl>(data, std::size_t(shape.numel()) * sizeof(T), device, std::move(deleter));
  p->sizes = shape;
  p->strides = strides;
  return Tensor<T>(std::move(p));
}

/// start, start+step, ... < end (as torch.arange).
template <class T = float>
Tensor<T> arange(double start, double end, double step = 1) {
  EMBER_CHECK(step != 0, "arange: step must be nonzero");
  const double n = std::ceil((end - start) / step);
  EMBER_CHECK(n >= 0, "arange: the range [", start, ", ", end, ") is empty in the direction of step ", step);
  Tensor<T> t = empty<T>(Shape{std::int64_t(n)});
  for (std::int64_t i = 0; i < std::int64_t(n); ++i) t.data()[i] = convert<T>(start + double(i) * step);
  return t;
}
template <class T = float>
Tensor<T> arange(double end) {
  return arange<T>(0, end, 1);
}

/// n evenly spaced values from start to end inclusive.
template <class T = float>
Tensor<T> linspace(double start, double end, std::int64_t n) {
  EMBER_CHECK(n >= 0, "linspace: number of steps must be non-negative, got ", n);
  Tensor<T> t = empty<T>(Shape{n});
  const double step = n > 1 ? (end - start) / double(n - 1) : 0;
  // Symmetric evaluation, as PyTorch does, so both ends are exact; one step is just `start`, as in PyTorch.
  for (std::int64_t i = 0; i < n; ++i)
    t.data()[i] = convert<T>(n == 1 || i < n / 2 ? start + step * double(i) : end - step * double(n - 1 - i));
  return t;
}

/// Identity matrix (n, m).
template <class T = float>
Tensor<T> eye(std::int64_t n, std::int64_t m = -1) {
  if (m < 0) m = n;
  Tensor<T> t = zeros<T>(Shape{n, m});
  for (std::int64_t i = 0; i < std::min(n, m); ++i) t.data()[i * m + i] = T(1);
  return t;
}

namespace detail {
// Fills a contiguous CPU tensor from the generator: f(u32[4], out, count) writes up to 4 values per block.
template <class T, class F>
Tensor<T> random_fill(const Shape& shape, Generator& g, F f) {
  Tensor<T> t = empty<T>(shape);
  const std::int64_t n = t.numel();
  const std::uint64_t nblocks = std::uint64_t((n + 3) / 4);
  const std::uint64_t base = g.reserve(nblocks);
  T* out = t.data();
  for (std::uint64_t b = 0; b < nblocks; ++b) {
    std::uint32_t r[4];
    Generator::block(g.seed(), base + b, r);
    const std::int64_t i0 = std::int64_t(b) * 4;
    f(r, out + i0, std::min<std::int64_t>(4, n - i0));
  }
  return t;
}
}  // namespace detail

/// Uniform in [0, 1).
template <class T = float>
Tensor<T> rand(const Shape& shape, Generator& g = default_generator()) {
  static_assert(is_floating_v<T>, "rand: T must be a floating type");
  return detail::random_fill<T>(shape, g, [](const std::uint32_t* r, T* o, std::int64_t k) {
    for (std::int64_t i = 0; i < k; ++i) {
      if constexpr (std::is_same_v<T, double>) o[i] = Generator::to_unit_double(r[i], r[(i + 1) & 3]);
      else o[i] = convert<T>(Generator::to_unit_float(r[i]));
    }
  });
}

/// Standard normal (Box–Muller on two uniforms per pair of outputs).
template <class T = float>
Tensor<T> randn(const Shape& shape, Generator& g = default_generator()) {
  static_assert(is_floating_v<T>, "randn: T must be a floating type");
  return detail::random_fill<T>(shape, g, [](const std::uint32_t* r, T* o, std::int64_t k) {
    for (int p = 0; p < 2; ++p) {
      const double u1 = (double(r[2 * p]) + 1.0) * (1.0 / 4294967297.0);  // (0, 1]
      const double u2 = double(r[2 * p + 1]) * (1.0 / 4294967296.0);
      const double rad = std::sqrt(-2.0 * std::log(u1)), th = 6.283185307179586 * u2;
      if (2 * p < k) o[2 * p] = convert<T>(rad * std::cos(th));
      if (2 * p + 1 < k) o[2 * p + 1] = convert<T>(rad * std::sin(th));
    }
  });
}

/// Uniform integers in [low, high).
template <class T = std::int64_t>
Tensor<T> randint(std::int64_t low, std::int64_t high, const Shape& shape, Generator& g = default_generator()) {
  EMBER_CHECK(high > low, "randint: expected low < high, got [", low, ", ", high, ")");
  const std::uint64_t range = std::uint64_t(high - low);
  return detail::random_fill<T>(shape, g, [=](const std::uint32_t* r, T* o, std::int64_t k) {
    for (std::int64_t i = 0; i < k; ++i) {
      const std::uint64_t x = (std::uint64_t(r[i]) << 32) | r[(i + 1) & 3];
      o[i] = convert<T>(low + std::int64_t(x % range));
    }
  });
}

/// 1 with probability p, else 0.
template <class T = float>
Tensor<T> bernoulli(const Shape& shape, double p, Generator& g = default_generator()) {
  EMBER_CHECK(p >= 0 && p <= 1, "bernoulli: probability must be in [0, 1], got ", p);
  return detail::random_fill<T>(shape, g, [=](const std::uint32_t* r, T* o, std::int64_t k) {
    for (std::int64_t i = 0; i < k; ++i) o[i] = convert<T>(double(r[i]) * (1.0 / 4294967296.0) < p ? 1 : 0);
  });
}

}  // namespace ember
