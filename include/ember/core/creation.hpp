// ember — creating tensors: empty, zeros, ones, full, arange, linspace, eye, from data, from_blob, random.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

namespace detail {
/// Most bytes one tensor may span (also the limit on the storage of from_blob).
inline constexpr std::int64_t kMaxTensorBytes = std::int64_t(1) << 62;

/// Checks a shape given to a creation function named `op` (the rules of checked_numel, and at most
/// kMaxTensorBytes of T, where a size of 0 counts as 1 so that every byte offset of any view stays in range);
/// returns numel.
template <class T>
std::int64_t checked_creation_numel(const Shape& shape, const char* op) {
  const std::int64_t n = checked_numel(shape, op);
  std::int64_t extent = 1;  // product of the nonzero sizes: fits, checked_numel said so
  for (auto s : shape) extent *= s > 0 ? s : 1;
  EMBER_CHECK(extent <= kMaxTensorBytes / std::int64_t(sizeof(T)), op, ": shape ", shape.str(),
              " has too many elements for one tensor of ", dtype_name<T>(), " (expected at most ",
              kMaxTensorBytes / std::int64_t(sizeof(T)), ", counting a size of 0 as 1)");
  return n;
}

/// empty(), with errors that name `op` (the creation function the user called).
template <class T>
Tensor<T> empty(const Shape& shape, Device device, const char* op) {
  const std::int64_t n = checked_creation_numel<T>(shape, op);
  auto p = std::make_shared<TensorImpl<T>>();
  p->storage = make_storage(std::size_t(n) * sizeof(T), device);
  p->sizes = shape;
  p->strides = contiguous_strides(shape);
  return Tensor<T>(std::move(p));
}
}  // namespace detail

/// An uninitialised contiguous tensor. Sizes must be >= 0, and their product (counting a 0 as 1) must fit in
/// int64 and in 2^62 bytes: so `empty({0, 1 << 62, 1 << 62})` is an error, not a tensor whose strides overflow.
template <class T = float>
Tensor<T> empty(const Shape& shape, Device device = Device::cpu()) {
  return detail::empty<T>(shape, device, "empty");
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
  Tensor<T> t = detail::empty<T>(shape, device, "full");
  t.fill_(value);
  return t;
}
template <class T = float>
Tensor<T> zeros(const Shape& shape, Device device = Device::cpu()) {
  Tensor<T> t = detail::empty<T>(shape, device, "zeros");
  if (device.is_cpu()) std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.numel()) * sizeof(T));
  else t.zero_();
  return t;
}
template <class T = float>
Tensor<T> ones(const Shape& shape, Device device = Device::cpu()) {
  Tensor<T> t = detail::empty<T>(shape, device, "ones");
  t.fill_(T(1));
  return t;
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
  EMBER_CHECK(checked_numel(shape, "from_vector") == std::int64_t(values.size()), "from_vector: ", values.size(),
              " values do not fill shape ", shape.str());
  Tensor<T> t = detail::empty<T>(shape, Device::cpu(), "from_vector");
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < values.size(); ++i) t.data()[i] = values[i];
  } else if (!values.empty()) {  // (an empty vector's data() may be null: not for memcpy)
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
/// The caller guarantees the memory holds the elements the shape (and strides) address.
template <class T>
Tensor<T> from_blob(T* data, const Shape& shape, std::function<void(void*)> deleter = {},
                    Device device = Device::cpu()) {
  detail::checked_creation_numel<T>(shape, "from_blob");  // (before the strides are formed)
  return from_blob(data, shape, contiguous_strides(shape), std::move(deleter), device);
}
template <class T>
Tensor<T> from_blob(T* data, const Shape& shape, const Shape& strides, std::function<void(void*)> deleter = {},
                    Device device = Device::cpu()) {
  const std::int64_t n = detail::checked_creation_numel<T>(shape, "from_blob");
  EMBER_CHECK(data != nullptr || n == 0, "from_blob: null data for shape ", shape.str());
  EMBER_CHECK(strides.n == shape.n, "from_blob: strides ", strides.str(), " do not match shape ", shape.str());
  // Elements spanned: 1 + the largest offset, sum of (size - 1) * stride (0 for an empty tensor). Every stride,
  // times its size, must fit too: views (unsqueeze, slice) form those products.
  std::int64_t span = n > 0 ? 1 : 0;
  bool over = false;
  for (int i = 0; i < shape.n; ++i) {
    EMBER_CHECK(strides[i] >= 0, "from_blob: negative stride ", strides[i], " in strides ", strides.str(),
                " (shape ", shape.str(), "; expected strides >= 0)");
    std::int64_t reach = 0;
    if (detail::mul_overflow(strides[i], shape[i], &reach)) over = true;
    else if (n > 0) over |= detail::add_overflow(span, reach - strides[i], &span);
  }
  EMBER_CHECK(!over && span <= detail::kMaxTensorBytes / std::int64_t(sizeof(T)), "from_blob: shape ", shape.str(),
              " with strides ", strides.str(), " spans too many elements of ", dtype_name<T>(), " (expected at most ",
              detail::kMaxTensorBytes / std::int64_t(sizeof(T)), ")");
  auto p = std::make_shared<TensorImpl<T>>();
  p->storage = std::make_shared<StorageImpl>(data, std::size_t(span) * sizeof(T), device, std::move(deleter));
  p->sizes = shape;
  p->strides = strides;
  return Tensor<T>(std::move(p));
}

/// start, start+step, ... < end (as torch.arange).
template <class T = float>
Tensor<T> arange(double start, double end, double step = 1) {
  EMBER_CHECK(std::isfinite(start) && std::isfinite(end), "arange: unsupported range [", start, ", ", end,
              ") (expected finite bounds)");
  EMBER_CHECK(step != 0 && std::isfinite(step), "arange: step must be finite and nonzero, got ", step);
  const double n = std::ceil((end - start) / step);
  EMBER_CHECK(n >= 0, "arange: the range [", start, ", ", end, ") is empty in the direction of step ", step);
  // Checked before the conversion: a double beyond int64 does not convert (undefined behaviour).
  EMBER_CHECK(n < 9223372036854775808.0, "arange: the range [", start, ", ", end, ") with step ", step, " has ", n,
              " elements, more than int64 can count");
  Tensor<T> t = detail::empty<T>(Shape{std::int64_t(n)}, Device::cpu(), "arange");
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
  Tensor<T> t = detail::empty<T>(Shape{n}, Device::cpu(), "linspace");
  const double step = n > 1 ? (end - start) / double(n - 1) : 0;
  // Symmetric evaluation, as PyTorch does, so both ends are exact; one step is just `start`, as in PyTorch.
  for (std::int64_t i = 0; i < n; ++i)
    t.data()[i] = convert<T>(n == 1 || i < n / 2 ? start + step * double(i) : end - step * double(n - 1 - i));
  return t;
}

/// Identity matrix (n, m).
template <class T = float>
Tensor<T> eye(std::int64_t n, std::int64_t m = -1) {
  EMBER_CHECK(n >= 0 && m >= -1, "eye: expected n >= 0 and m >= 0 (or m = -1 for m = n), got n = ", n, ", m = ", m);
  if (m < 0) m = n;
  Tensor<T> t = detail::empty<T>(Shape{n, m}, Device::cpu(), "eye");
  std::memset(static_cast<void*>(t.data()), 0, std::size_t(t.numel()) * sizeof(T));
  // The diagonal as a strided view (n * m elements exist, so its offsets fit; with two or more rows and columns,
  // m + 1 cannot overflow either).
  const std::int64_t k = std::min(n, m);
  if (k > 0) t.as_strided_raw(Shape{k}, Shape{k > 1 ? m + 1 : 1}, 0).fill_(T(1));
  return t;
}

namespace detail {
// Fills a contiguous CPU tensor from the generator: f(u32[4], out, count) writes up to 4 values per block.
template <class T, class F>
Tensor<T> random_fill(const Shape& shape, Generator& g, const char* op, F f) {
  Tensor<T> t = detail::empty<T>(shape, Device::cpu(), op);
  const std::int64_t n = t.numel();
  const std::uint64_t nblocks = std::uint64_t((n + 3) / 4);
  const std::uint64_t base = g.reserve(nblocks);
  T* out = t.data();
  constexpr std::uint64_t kChunk = 64;  // blocks generated together (Generator::blocks vectorises them)
  std::uint32_t r[kChunk * 4];
  for (std::uint64_t b0 = 0; b0 < nblocks; b0 += kChunk) {
    const std::uint64_t nb = std::min(kChunk, nblocks - b0);
    Generator::blocks(g.seed(), base + b0, nb, r);
    for (std::uint64_t b = 0; b < nb; ++b) {
      const std::int64_t i0 = std::int64_t(b0 + b) * 4;
      f(r + b * 4, out + i0, std::min<std::int64_t>(4, n - i0));
    }
  }
  return t;
}
}  // namespace detail

/// Uniform in [0, 1).
template <class T = float>
Tensor<T> rand(const Shape& shape, Generator& g = default_generator()) {
  static_assert(is_floating_v<T>, "rand: T must be a floating type");
  return detail::random_fill<T>(shape, g, "rand", [](const std::uint32_t* r, T* o, std::int64_t k) {
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
  return detail::random_fill<T>(shape, g, "randn", [](const std::uint32_t* r, T* o, std::int64_t k) {
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
  if constexpr (std::is_integral_v<T> && sizeof(T) < 8) {
    EMBER_CHECK(low >= std::int64_t(std::numeric_limits<T>::lowest()) &&
                    high - 1 <= std::int64_t(std::numeric_limits<T>::max()),
                "randint: the range [", low, ", ", high, ") does not fit in ", dtype_name<T>(), " (expected [",
                std::int64_t(std::numeric_limits<T>::lowest()), ", ",
                std::int64_t(std::numeric_limits<T>::max()) + 1, "))");
  }
  const std::uint64_t range = std::uint64_t(high) - std::uint64_t(low);  // (high - low may not fit in int64)
  return detail::random_fill<T>(shape, g, "randint", [=](const std::uint32_t* r, T* o, std::int64_t k) {
    for (std::int64_t i = 0; i < k; ++i) {
      const std::uint64_t x = (std::uint64_t(r[i]) << 32) | r[(i + 1) & 3];
      o[i] = convert<T>(std::int64_t(std::uint64_t(low) + x % range));  // in [low, high): wraps back into int64
    }
  });
}

/// 1 with probability p, else 0.
template <class T = float>
Tensor<T> bernoulli(const Shape& shape, double p, Generator& g = default_generator()) {
  EMBER_CHECK(p >= 0 && p <= 1, "bernoulli: probability must be in [0, 1], got ", p);
  return detail::random_fill<T>(shape, g, "bernoulli", [=](const std::uint32_t* r, T* o, std::int64_t k) {
    for (std::int64_t i = 0; i < k; ++i) o[i] = convert<T>(double(r[i]) * (1.0 / 4294967296.0) < p ? 1 : 0);
  });
}

}  // namespace ember
