// ember — copying tensors between devices without autograd: a contiguous copy of a tensor on another device,
// gathering strided views on the way. Host <-> CUDA and CUDA <-> CUDA copies go through the hook that cuda/copy.hpp
// sets (core/storage.hpp, detail::CudaCopyPart); Tensor::to, cpu(), cuda(), copy_, item(), to_vector() and printing
// build on this (autograd/tensor_ops.hpp adds the gradient of to()).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/storage.hpp"
#include "ember/core/tensor.hpp"

namespace ember::detail {

/// Writes the elements of a CPU tensor (any strides) in row-major order to `out`.
template <class T>
void gather_host(const Tensor<T>& t, T* out) {
  const std::int64_t n = t.numel();
  if (n == 0) return;
  const T* base = t.data();
  if (t.is_contiguous()) {
    std::memcpy(static_cast<void*>(out), static_cast<const void*>(base), std::size_t(n) * sizeof(T));
    return;
  }
  const int nd = t.dim();
  const std::int64_t inner = nd ? t.shape()[nd - 1] : 1, inner_stride = nd ? t.strides()[nd - 1] : 1;
  std::int64_t idx[kMaxDims] = {};
  std::int64_t off = 0;
  for (std::int64_t done = 0; done < n; done += inner) {
    for (std::int64_t i = 0; i < inner; ++i) out[done + i] = base[off + i * inner_stride];
    for (int d = nd - 2; d >= 0; --d) {  // next row
      off += t.strides()[d];
      if (++idx[d] < t.shape()[d]) break;
      off -= t.strides()[d] * t.shape()[d];
      idx[d] = 0;
    }
  }
}

/// An uninitialised contiguous tensor in page-locked host memory (needs the CUDA backend).
template <class T>
Tensor<T> empty_pinned(const Shape& shape) {
  auto p = std::make_shared<TensorImpl<T>>();
  p->storage = make_pinned_storage(std::size_t(shape.numel()) * sizeof(T));
  p->sizes = shape;
  p->strides = contiguous_strides(shape);
  return Tensor<T>(std::move(p));
}

/// A contiguous copy of a CUDA tensor's elements on the host: the bytes the view spans are copied, then gathered.
template <class T>
Tensor<T> stage_to_host(const Tensor<T>& t) {
  Tensor<T> out = empty<T>(t.shape());
  if (t.numel() == 0) return out;
  std::int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int d = 0; d < t.dim(); ++d) {
    const std::int64_t ext = (t.shape()[d] - 1) * t.strides()[d];
    if (ext < 0) lo += ext;
    else hi += ext;
  }
  Tensor<T> span = empty<T>(Shape{hi - lo + 1});
  copy_bytes(span.storage(), 0, t.storage(), std::size_t(lo) * sizeof(T), std::size_t(hi - lo + 1) * sizeof(T));
  gather_host(span.as_strided_raw(t.shape(), t.strides(), t.storage_offset() - lo), out.data());
  return out;
}

/// A contiguous copy of t on device d, without autograd (t itself when it is already a contiguous tensor on d).
/// non_blocking: a copy from pinned host memory to a GPU, or from a GPU into (newly allocated) pinned host memory, is
/// asynchronous on the current stream; synchronise the stream before reading a host result.
template <class T>
Tensor<T> copy_to_device(const Tensor<T>& t, Device d, bool non_blocking) {
  EMBER_CHECK(t.defined(), "to: the tensor is undefined");
  if (t.device() == d && t.is_contiguous()) return t;
  EMBER_CHECK((t.device().is_cpu() && d.is_cpu()) || part<CudaCopyPart>() != nullptr,
              "to: cannot copy a tensor of shape ", t.shape().str(), " (", dtype_name<T>(), ") from ", t.device().str(), " to ", d.str(), ": ",
              no_cuda_backend());
  Tensor<T> src = t;
  if (!src.is_contiguous()) {
    if (src.device().is_cpu()) {
      Tensor<T> c = empty<T>(src.shape());
      gather_host(src, c.data());
      src = c;
    } else {
      src = stage_to_host(src);  // a strided CUDA view: staged through the host
    }
    if (src.device() == d) return src;
  }
  const bool pinned_out =
      d.is_cpu() && non_blocking && src.device().is_cuda() && part<PinnedAllocatorPart>() != nullptr;
  Tensor<T> out = pinned_out ? empty_pinned<T>(src.shape()) : empty<T>(src.shape(), d);
  copy_bytes(out.storage(), 0, src.storage(), std::size_t(src.storage_offset()) * sizeof(T),
             std::size_t(src.numel()) * sizeof(T), non_blocking);
  return out;
}

}  // namespace ember::detail
