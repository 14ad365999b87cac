// ember — Storage: a reference-counted block of bytes on one device, plus the version counter that autograd
// uses to detect in-place changes of saved tensors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>

#include "ember/config.hpp"
#include "ember/core/allocator.hpp"
#include "ember/core/device.hpp"
#include "ember/core/optional_part.hpp"

namespace ember {

namespace detail {
/// Whether an InferenceMode guard (autograd/grad_mode.hpp) is alive on this thread.
inline bool& inference_mode_flag() {
  thread_local bool on = false;
  return on;
}
}  // namespace detail

/// A block of memory that tensors view (PyTorch's `UntypedStorage`): shared, through Storage, by every tensor and
/// view over it, and given back to its allocator (or its deleter) when the last one goes.
struct StorageImpl {
  void* data = nullptr;                       ///< The first byte.
  std::size_t nbytes = 0;                     ///< The size in bytes.
  Device device;                              ///< Where the memory is.
  Allocator* allocator = nullptr;             ///< Who frees it; null for memory ember does not own.
  std::function<void(void*)> deleter;         ///< from_blob's optional deleter (memory ember does not own).
  std::atomic<std::uint64_t> version{0};      ///< Bumped by every in-place write (Tensor::version()).
  /// Allocated under InferenceMode: no version counter, and autograd refuses to save or differentiate it.
  const bool inference = detail::inference_mode_flag();

  /// n bytes from allocator a.
  StorageImpl(std::size_t n, Allocator& a) : data(a.allocate(n)), nbytes(n), device(a.device()), allocator(&a) {}
  /// Memory ember does not own (from_blob): n bytes at p on device d, passed to del (when set) at the end.
  StorageImpl(void* p, std::size_t n, Device d, std::function<void(void*)> del)
      : data(p), nbytes(n), device(d), deleter(std::move(del)) {}
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;
  ~StorageImpl() {
    if (allocator) allocator->deallocate(data, nbytes);
    else if (deleter) deleter(data);
  }
};

using Storage = std::shared_ptr<StorageImpl>;

// The optional parts (core/optional_part.hpp) that cuda/ installs when one of its headers is included (core never
// includes CUDA headers). Absent in a build without ember's CUDA backend, where the functions below give an error
// that says so.
namespace detail {
/// The caching allocator of CUDA device i (cuda/allocator.hpp).
struct CudaAllocatorPart {
  using Entry = Allocator* (*)(int device_index);
};
/// The caching allocator of page-locked (pinned) host memory, for Tensor::pin_memory (cuda/pinned.hpp).
struct PinnedAllocatorPart {
  using Entry = Allocator* (*)();
};
/// Whether host memory at p is page-locked, also when ember did not allocate it (cuda/pinned.hpp).
struct PinnedQueryPart {
  using Entry = bool (*)(const void* p);
};
/// Copies `nbytes` from src's bytes at `src_offset` to dst's at `dst_offset` when either storage is on a CUDA
/// device (cuda/copy.hpp). The copy runs on the current stream of the CUDA device involved. It has finished when the
/// entry returns unless `non_blocking` and the host side is pinned memory (or both sides are on CUDA devices): then
/// it is asynchronous, and the entry keeps the host storage alive until the copy is done.
struct CudaCopyPart {
  using Entry = void (*)(const Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
                         std::size_t nbytes, bool non_blocking);
};

inline const char* no_cuda_backend() {
  return "this program was built without ember's CUDA backend (compile with nvcc, or define EMBER_WITH_CUDA=1, "
         "include <ember/ember.hpp> and link ember::cuda)";
}

/// Tensor::device()'s error under EMBER_HOST_ONLY (config.hpp) for a tensor that is not on the CPU.
[[noreturn, gnu::cold, gnu::noinline]] inline void device_in_host_only_tu(Device d) {
  throw Error(concat("a tensor on ", d.str(), " reached a translation unit compiled with EMBER_HOST_ONLY=1 (the "
                     "default without EMBER_WITH_CUDA), where every tensor is on the CPU; compile every TU of a "
                     "program that handles CUDA tensors with EMBER_WITH_CUDA=1 (link ember::cuda)"));
}
}  // namespace detail

/// The allocator for a device.
inline Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return CpuCachingAllocator::instance();
  EMBER_CHECK(detail::part<detail::CudaAllocatorPart>() != nullptr, "allocate on ", d.str(), ": ",
              detail::no_cuda_backend());
  return *detail::part<detail::CudaAllocatorPart>()(d.index);
}

EMBER_HEADER_INLINE Storage make_storage(std::size_t nbytes, Device d);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Storage make_storage(std::size_t nbytes, Device d) {
  return std::make_shared<StorageImpl>(nbytes, allocator_for(d));
}
#endif

/// Host storage in page-locked memory (device cpu), from which copies to a GPU can be asynchronous.
EMBER_HEADER_INLINE Storage make_pinned_storage(std::size_t nbytes);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE Storage make_pinned_storage(std::size_t nbytes) {
  EMBER_CHECK(detail::part<detail::PinnedAllocatorPart>() != nullptr, "pin_memory: ", detail::no_cuda_backend());
  return std::make_shared<StorageImpl>(nbytes, *detail::part<detail::PinnedAllocatorPart>()());
}
#endif

/// True for host storage in page-locked memory (from the pinned allocator, or foreign memory CUDA reports as such).
inline bool is_pinned(const StorageImpl& s) {
  if (!s.device.is_cpu() || s.data == nullptr) return false;
  if (const auto pinned = detail::part<detail::PinnedAllocatorPart>(); pinned && s.allocator == pinned()) return true;
  if (s.allocator) return false;  // ember's own pageable memory
  const auto query = detail::part<detail::PinnedQueryPart>();
  return query && query(s.data);
}

/// Copies `nbytes` bytes between two storages on any devices (see detail::CudaCopyPart for the CUDA cases).
EMBER_HEADER_INLINE void copy_bytes(const Storage& dst, std::size_t dst_offset, const Storage& src,
                                    std::size_t src_offset, std::size_t nbytes, bool non_blocking = false);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void copy_bytes(const Storage& dst, std::size_t dst_offset, const Storage& src,
                                    std::size_t src_offset, std::size_t nbytes, bool non_blocking) {
  if (nbytes == 0) return;
  // (Written so that no sum can wrap around.)
  EMBER_CHECK(nbytes <= dst->nbytes && dst_offset <= dst->nbytes - nbytes && nbytes <= src->nbytes &&
                  src_offset <= src->nbytes - nbytes,
              "copy of ", nbytes,
              " bytes: out of the bounds of the storages (", src->nbytes, " bytes on ", src->device.str(), " to ",
              dst->nbytes, " bytes on ", dst->device.str(), ")");
  if (dst->device.is_cpu() && src->device.is_cpu()) {
    std::memcpy(static_cast<char*>(dst->data) + dst_offset, static_cast<const char*>(src->data) + src_offset, nbytes);
    return;
  }
  EMBER_CHECK(detail::part<detail::CudaCopyPart>() != nullptr, "copy from ", src->device.str(), " to ",
              dst->device.str(), ": ", detail::no_cuda_backend());
  detail::part<detail::CudaCopyPart>()(dst, dst_offset, src, src_offset, nbytes, non_blocking);
}
#endif

}  // namespace ember
