// ember — AnyTensor: a tensor of any ember dtype, for files that hold tensors of several dtypes (safetensors,
// checkpoints), and TensorMap, a name -> tensor map such as a state_dict.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <variant>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"

namespace ember::io {

static_assert(std::endian::native == std::endian::little,
              "ember::io writes little-endian files by copying memory; big-endian hosts are not supported");

/// A tensor of one of ember's dtypes, chosen at run time.
using AnyTensor = std::variant<Tensor<float>, Tensor<double>, Tensor<half>, Tensor<bfloat16>, Tensor<std::int32_t>,
                               Tensor<std::int64_t>, Tensor<std::uint8_t>, Tensor<std::int8_t>, Tensor<bool>>;
/// Tensors by name, sorted by name (so files written from it are reproducible).
using TensorMap = std::map<std::string, AnyTensor>;
/// String key/value pairs stored beside the tensors.
using Metadata = std::map<std::string, std::string>;

/// The dtype of an AnyTensor.
inline ScalarType scalar_type(const AnyTensor& t) {
  return std::visit([](const auto& x) { return dtype_traits<typename std::decay_t<decltype(x)>::value_type>::tag; },
                    t);
}
inline Shape shape_of(const AnyTensor& t) {
  return std::visit([](const auto& x) { return x.shape(); }, t);
}

/// The tensor of dtype T stored in `t`; an error names `what` and both dtypes when it holds another one.
template <class T>
Tensor<T> get_as(const AnyTensor& t, const std::string& what) {
  const Tensor<T>* p = std::get_if<Tensor<T>>(&t);
  EMBER_CHECK(p != nullptr, what, " has dtype ", dtype_name(scalar_type(t)), ", not the ", dtype_name<T>(),
              " requested");
  return *p;
}

namespace detail {
/// Copies the elements of `src` (any strides, CPU) in row-major order to `dst` as raw bytes.
template <class T>
void copy_elements(const Tensor<T>& src, unsigned char* dst) {
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const T* s = src.data();
  if (src.is_contiguous()) {
    std::memcpy(dst, static_cast<const void*>(s), std::size_t(n) * sizeof(T));
    return;
  }
  const int nd = src.dim();
  std::int64_t idx[kMaxDims] = {};
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + std::size_t(i) * sizeof(T), static_cast<const void*>(s + off), sizeof(T));
    for (int d = nd - 1; d >= 0; --d) {
      off += src.strides()[d];
      if (++idx[d] < src.shape()[d]) break;
      off -= src.strides()[d] * src.shape()[d];
      idx[d] = 0;
    }
  }
}
}  // namespace detail

}  // namespace ember::io
