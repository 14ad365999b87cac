// ember — the Dataset concept and the sample/batch types the DataLoader collates.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"

namespace ember::data {

/// A dataset: a size and random access to samples by index, like torch.utils.data.Dataset. get() must be safe to
/// call from several threads at once (DataLoader workers do), which holds for datasets that only read their data.
/// Datasets are held by value in a DataLoader, so make them cheap handles (tensors are).
template <class D>
concept Dataset = requires(const D& d, std::size_t i) {
  { d.size() } -> std::convertible_to<std::size_t>;
  d.get(i);
};

/// The sample type of a dataset.
template <Dataset D>
using sample_t = std::remove_cvref_t<decltype(std::declval<const D&>().get(std::size_t{}))>;

/// One labelled sample: an input tensor (for images (C, H, W), values in [0, 1]) and a class index.
struct Example {
  Tensor<float> data;       ///< (C, H, W) for images; any shape in general.
  std::int64_t target = 0;  ///< The class index.
};

/// A batch of Examples: the inputs stacked along a new first dim into one contiguous tensor, and the targets.
struct Batch {
  Tensor<float> data;           ///< (B, ...sample shape), contiguous.
  Tensor<std::int64_t> target;  ///< (B).
  /// The batch size B (0 for an empty batch).
  std::size_t size() const { return data.defined() ? std::size_t(data.size(0)) : 0; }
};

namespace detail {
/// Copies the elements of `src` (any strides) in row-major order to `dst` (contiguous). CPU only.
template <class T>
void copy_to_contiguous(const Tensor<T>& src, T* dst) {
  const std::int64_t n = src.numel();
  if (n == 0) return;
  const T* s = src.data();
  if (src.is_contiguous()) {
    std::memcpy(static_cast<void*>(dst), static_cast<const void*>(s), std::size_t(n) * sizeof(T));
    return;
  }
  const int nd = src.dim();
  std::int64_t idx[kMaxDims] = {};
  std::int64_t off = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    dst[i] = s[off];
    for (int d = nd - 1; d >= 0; --d) {  // odometer increment
      off += src.strides()[d];
      if (++idx[d] < src.shape()[d]) break;
      off -= src.strides()[d] * src.shape()[d];
      idx[d] = 0;
    }
  }
}
}  // namespace detail

/// Stacks Examples into a Batch (one allocation for the inputs, one for the targets). Every input must have the
/// shape of the first; `indices` (the dataset indices of the samples) only serve error messages.
EMBER_HEADER_INLINE Batch collate(const std::vector<Example>& samples, const std::vector<std::size_t>& indices = {});
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Batch collate(const std::vector<Example>& samples, const std::vector<std::size_t>& indices) {
  EMBER_CHECK(!samples.empty(), "collate: no samples to stack");
  const Shape s0 = samples[0].data.shape();
  Shape bs;
  bs.push_back(std::int64_t(samples.size()));
  for (auto e : s0) bs.push_back(e);
  Batch b{empty<float>(bs), empty<std::int64_t>(Shape{std::int64_t(samples.size())})};
  const std::int64_t per = s0.numel();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Tensor<float>& x = samples[i].data;
    EMBER_CHECK(x.defined(), "collate: sample ", i < indices.size() ? indices[i] : i, " has no data");
    EMBER_CHECK(x.shape() == s0, "collate: sample ", i < indices.size() ? indices[i] : i, " has shape ",
                x.shape().str(), ", the first sample of the batch has ", s0.str(),
                "; every sample of a batch must have the same shape");
    x.check_cpu("collate");
    detail::copy_to_contiguous(x, b.data.data() + std::int64_t(i) * per);
    b.target.data()[i] = samples[i].target;
  }
  return b;
}
#endif

}  // namespace ember::data
