// ember — the tensors of files (safetensors, checkpoints): io::AnyTensor and io::TensorMap, which are
// ember::AnyTensor and ember::StateDict (core/state_dict.hpp), the metadata beside them, and the copy of a tensor's
// elements into a file's bytes.
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
#include "ember/core/state_dict.hpp"
#include "ember/core/tensor.hpp"

namespace ember::io {

static_assert(std::endian::native == std::endian::little,
              "ember::io writes little-endian files by copying memory; big-endian hosts are not supported");

/// A tensor of one of ember's dtypes, chosen at run time (ember::AnyTensor, core/state_dict.hpp).
using ember::AnyTensor;
/// Tensors by name, sorted by name (so files written from it are reproducible): a state dict.
using TensorMap = ember::StateDict;
/// String key/value pairs stored beside the tensors.
using Metadata = std::map<std::string, std::string>;

using ember::get_as;
using ember::scalar_type;
using ember::shape_of;

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
