// ember — Storage: a reference-counted block of bytes on one device, plus the version counter that autograd
// uses to detect in-place changes of saved tensors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "ember/config.hpp"
#include "ember/core/allocator.hpp"
#include "ember/core/device.hpp"

namespace ember {

struct StorageImpl {
  void* data = nullptr;
  std::size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;             // null for memory ember does not own
  std::function<void(void*)> deleter;         // from_blob's optional deleter
  std::atomic<std::uint64_t> version{0};      // bumped by every in-place write

  StorageImpl(std::size_t n, Allocator& a) : data(a.allocate(n)), nbytes(n), device(a.device()), allocator(&a) {}
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

namespace detail {
/// Set by cuda/ when it is compiled in: the caching allocator of CUDA device i.
inline Allocator* (*cuda_allocator)(int device_index) = nullptr;
}  // namespace detail

/// The allocator for a device.
inline Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return CpuCachingAllocator::instance();
  EMBER_CHECK(detail::cuda_allocator != nullptr, "allocate on ", d.str(),
              ": this program was built without ember's CUDA backend (compile with nvcc and link ember::cuda)");
  return *detail::cuda_allocator(d.index);
}

inline Storage make_storage(std::size_t nbytes, Device d) {
  return std::make_shared<StorageImpl>(nbytes, allocator_for(d));
}

}  // namespace ember
