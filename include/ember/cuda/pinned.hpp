// ember — pinned (page-locked) host memory: a caching allocator over cudaHostAlloc, behind Tensor::pin_memory(),
// and the list of asynchronous copies still in flight. Including this header registers the allocator with core
// (core/storage.hpp: detail::PinnedAllocatorPart, detail::PinnedQueryPart).
//
// Copies from (or into) pinned memory with non_blocking = true return before the data has moved. cuda/copy.hpp then
// records an event on the copy's stream and hands the host storage to detail::PendingCopies, which holds a reference
// until the event has completed: a tensor freed by the user right after `x.to(Device::cuda(), true)` keeps its
// memory, and its block is not reused for another tensor, until the copy is done. The list is polled (cheaply,
// cudaEventQuery) by every pinned allocation and every copy; pinned_synchronize() waits for all of them.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ember/core/allocator.hpp"
#include "ember/core/storage.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/detail/block_pool.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace detail {
/// Host storages kept alive until the asynchronous copies that use them have completed.
class PendingCopies {
 public:
  static PendingCopies& instance() {
    static PendingCopies* p = new PendingCopies();  // never destroyed: storages may be released at exit
    return *p;
  }
  /// Keeps `s` alive until `done` (recorded after the copy on its stream) has completed.
  void add(Event done, Storage s) {
    std::lock_guard<std::mutex> lk(mu_);
    entries_.push_back({std::move(done), std::move(s)});
  }
  /// Releases the storages whose copies have completed. Never throws (an event in error releases its storage: the
  /// error itself surfaces at the next checked call on that stream).
  void poll() noexcept {
    std::vector<Storage> done;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (std::size_t i = 0; i < entries_.size();) {
        const cudaError_t e = cudaEventQuery(entries_[i].done.handle());
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();
          ++i;
          continue;
        }
        if (e != cudaSuccess) EMBER_CUDA_WARN(e);
        done.push_back(std::move(entries_[i].keep));
        entries_[i] = std::move(entries_.back());
        entries_.pop_back();
      }
    }
    // `done` is destroyed here, outside the lock: a storage's deallocator may allocate or poll again.
  }
  /// Waits for every pending copy, then releases their storages.
  void synchronize() {
    std::vector<Event> events;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& e : entries_) events.push_back(e.done);
    }
    for (auto& e : events) e.synchronize();
    poll();
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return entries_.size();
  }

 private:
  struct Entry {
    Event done;
    Storage keep;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};
}  // namespace detail

/// Page-locked host memory through size-class free lists (the CPU allocator's classes: 64-byte steps below 4 KiB,
/// then four per power of two), so a data loader's batches of one shape stop reaching cudaHostAlloc after the first.
/// Memory is allocated portable (pinned for every device's context). Thread-safe.
class PinnedAllocator final : public Allocator {
 public:
  /// The process's pinned allocator (what Tensor::pin_memory and DataLoader's pin_memory use).
  static PinnedAllocator& instance() {
    static PinnedAllocator* a = new PinnedAllocator();  // never destroyed: tensors may outlive statics
    return *a;
  }

  /// A pinned block of at least nbytes, from the free lists when one of its class is cached; when CUDA is out of
  /// pinned memory, waits for pending copies, empties the cache and retries once before throwing.
  void* allocate(std::size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    detail::PendingCopies::instance().poll();  // finished copies give their blocks back first
    const std::size_t sz = CpuCachingAllocator::size_class(nbytes);
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_.find(sz);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cache_hits++;
        note_alloc(sz);
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, sz, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      {
        std::lock_guard<std::mutex> lk(mu_);
        stats_.num_alloc_retries++;
      }
      detail::PendingCopies::instance().synchronize();
      empty_cache();
      e = cudaHostAlloc(&p, sz, cudaHostAllocPortable);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        std::lock_guard<std::mutex> lk(mu_);
        stats_.num_ooms++;
        throw Error(::ember::detail::concat("pinned host memory: out of memory allocating ", nbytes,
                                            " bytes (ember holds ", stats_.reserved_bytes, " bytes of pinned memory)"));
      }
    }
    EMBER_CUDA_CHECK(e);
    std::lock_guard<std::mutex> lk(mu_);
    sizes_.emplace(p, sz);
    stats_.num_cuda_mallocs++;
    stats_.reserved_bytes += sz;
    if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
    note_alloc(sz);
    return p;
  }

  /// Returns the block to its class's free list (it stays pinned, for the next request of its size).
  void deallocate(void* p, std::size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) {
      std::fprintf(stderr, "ember: pinned allocator: free of %p, which it did not allocate (ignored)\n", p);
      return;
    }
    stats_.allocated_bytes -= it->second;
    free_[it->second].push_back(p);
  }

  /// Device::cpu(): pinned memory is host memory.
  Device device() const override { return Device::cpu(); }

  /// Returns the cached (unused) pinned blocks to CUDA (cudaFreeHost).
  void empty_cache() {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [sz, v] : free_)
      for (void* p : v) {
        EMBER_CUDA_WARN(cudaFreeHost(p));
        sizes_.erase(p);
        stats_.num_cuda_frees++;
        stats_.reserved_bytes -= sz;
      }
    free_.clear();
  }
  /// The counters (bytes allocated and reserved, their peaks, cache hits, cudaHostAlloc calls, retries, OOMs).
  MemoryStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  /// Restarts the peaks from the current values.
  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }

 private:
  PinnedAllocator() = default;
  void note_alloc(std::size_t sz) {
    stats_.num_allocs++;
    stats_.allocated_bytes += sz;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, std::size_t> sizes_;              // every block ember holds -> its size class
  MemoryStats stats_;
};

/// Counters of the pinned host allocator (allocated/reserved bytes, cudaHostAlloc/cudaFreeHost calls, cache hits).
inline MemoryStats pinned_memory_stats() { return PinnedAllocator::instance().stats(); }
/// Returns the cached pinned blocks to CUDA.
inline void empty_pinned_cache() { PinnedAllocator::instance().empty_cache(); }
/// Waits for every asynchronous copy from or into pinned memory and releases the storages they kept alive.
inline void pinned_synchronize() { detail::PendingCopies::instance().synchronize(); }
/// The number of asynchronous copies whose host storage is still held (completed ones are dropped when polled).
inline std::size_t pending_copies() {
  detail::PendingCopies::instance().poll();
  return detail::PendingCopies::instance().size();
}

namespace detail {
inline Allocator* pinned_allocator() { return &PinnedAllocator::instance(); }
/// True when CUDA reports p as page-locked host memory (false without a device).
inline bool pointer_is_pinned(const void* p) {
  if (!is_available()) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeHost;
}
inline const bool pinned_allocator_registered =
    ::ember::detail::provide<::ember::detail::PinnedAllocatorPart>(&pinned_allocator) &&
    ::ember::detail::provide<::ember::detail::PinnedQueryPart>(&pointer_is_pinned);
}  // namespace detail

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
