// ember — the caching CUDA device allocator: one per device, so a training loop's repeated allocations are served
// from cached blocks and stop reaching cudaMalloc after the first iteration. Including this header registers it with
// core/storage.hpp (detail::CudaAllocatorPart), which makes `empty<float>(shape, Device::cuda(0))` work.
//
// The bookkeeping (512-byte rounding, small/large pools, per-stream free lists, splitting and merging) is
// cuda/detail/block_pool.hpp. A block is allocated for the current stream of its device and, once freed, serves only
// later requests on that stream; memory used on another stream too is declared with cuda::record_stream. When cudaMalloc fails, the cached segments are freed and the allocation retried once;
// if that fails too, ember::Error names the request, the device, its free/total memory and what ember reserved.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

#include "ember/core/allocator.hpp"
#include "ember/core/storage.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cuda/check.hpp"
#include "ember/cuda/detail/block_pool.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"

namespace ember::cuda {

namespace detail {
/// "1.50 GiB", "512.00 KiB", "100 bytes": sizes in error messages.
inline std::string format_bytes(std::size_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu bytes", n);
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

/// cudaMalloc/cudaFree and events on one device.
struct DeviceMemory {
  using Event = cudaEvent_t;
  int device = 0;
  void* raw_alloc(std::size_t n) const {
    DeviceGuard g(device);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    EMBER_CUDA_CHECK(e);
    return p;
  }
  void raw_free(void* p) const noexcept {
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    EMBER_CUDA_WARN(cudaSetDevice(device));
    EMBER_CUDA_WARN(cudaFree(p));
    EMBER_CUDA_WARN(cudaSetDevice(prev));
  }
  // Events for record_stream; a failure is reported and yields a null event, which counts as completed.
  Event record_event(StreamId stream) const noexcept {
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    EMBER_CUDA_WARN(cudaSetDevice(device));
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      EMBER_CUDA_WARN(cudaGetLastError());
      e = nullptr;
    } else if (cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)) != cudaSuccess) {
      EMBER_CUDA_WARN(cudaGetLastError());
      EMBER_CUDA_WARN(cudaEventDestroy(e));
      e = nullptr;
    }
    EMBER_CUDA_WARN(cudaSetDevice(prev));
    return e;
  }
  bool event_done(Event e) const noexcept {
    if (!e) return true;
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    EMBER_CUDA_WARN(r);
    return true;
  }
  void wait_event(Event e) const noexcept {
    if (e) EMBER_CUDA_WARN(cudaEventSynchronize(e));
  }
  void release_event(Event e) const noexcept {
    if (e) EMBER_CUDA_WARN(cudaEventDestroy(e));
  }
};
}  // namespace detail

/// The caching allocator of one CUDA device (see the top of this header). Get it with CudaCachingAllocator::get(i).
class CudaCachingAllocator final : public Allocator {
 public:
  /// The allocator of device `index` (created on first use, never destroyed: tensors may outlive statics).
  static CudaCachingAllocator& get(int index) {
    check_device(Device::cuda(index), "CUDA allocator");
    static std::array<std::atomic<CudaCachingAllocator*>, kMaxDevices> all{};
    static std::mutex mu;
    CudaCachingAllocator* a = all[std::size_t(index)].load(std::memory_order_acquire);
    if (a) return *a;
    std::lock_guard<std::mutex> lk(mu);
    a = all[std::size_t(index)].load(std::memory_order_relaxed);
    if (!a) {
      a = new CudaCachingAllocator(index);
      all[std::size_t(index)].store(a, std::memory_order_release);
    }
    return *a;
  }
  /// A block of at least `nbytes` for the current stream of this device (nullptr for 0 bytes, as PyTorch).
  void* allocate(std::size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const auto stream = reinterpret_cast<detail::StreamId>(current_stream(device_).handle());
    void* p = pool_.allocate(nbytes, stream);
    if (!p) throw Error(out_of_memory_message(nbytes));
    return p;
  }
  /// Returns the block to the cache (reused once the work of every stream that used it is done).
  void deallocate(void* p, std::size_t) override { pool_.deallocate(p); }
  /// The allocator's CUDA device.
  Device device() const override { return Device::cuda(device_); }

  /// Frees every cached segment of this device (cudaFree).
  void empty_cache() { pool_.empty_cache(); }
  /// The counters, as torch.cuda.memory_stats (allocated and reserved bytes, peaks, cudaMalloc calls, OOMs).
  MemoryStats stats() const { return pool_.stats(); }
  /// Restarts the peaks from the current values (torch.cuda.reset_peak_memory_stats).
  void reset_peak() { pool_.reset_peak(); }
  /// Marks the block at p as used by work on `stream` too: once freed, it is reused only after that work (see
  /// cuda::record_stream). False when p is not a live block of this allocator.
  bool record_stream(void* p, const Stream& stream) {
    return pool_.record_stream(p, reinterpret_cast<detail::StreamId>(stream.handle()));
  }
  /// Freed blocks not reusable yet because other streams (record_stream) may still be using them.
  std::size_t blocks_waiting_for_streams() const { return pool_.blocks_waiting_for_streams(); }
  /// The rounded size of the block at p (0 when p is not a block of this allocator).
  std::size_t block_size(const void* p) const { return pool_.block_size(p); }

 private:
  explicit CudaCachingAllocator(int index) : device_(index), pool_(detail::DeviceMemory{index}) {}

  std::string out_of_memory_message(std::size_t nbytes) {
    std::size_t free_b = 0, total_b = 0;
    {
      DeviceGuard g(device_);
      if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    }
    const MemoryStats s = pool_.stats();
    return ::ember::detail::concat(
        "CUDA out of memory: tried to allocate ", detail::format_bytes(nbytes), " (", nbytes, " bytes) on cuda:",
        device_, ", which has ", detail::format_bytes(free_b), " free of ", detail::format_bytes(total_b),
        " total; ember has reserved ", detail::format_bytes(s.reserved_bytes), " (",
        detail::format_bytes(s.allocated_bytes), " allocated to tensors) after freeing its cache");
  }

  int device_;
  detail::BlockPool<detail::DeviceMemory> pool_;
};

/// Frees the cached (unused) device memory of every device back to CUDA, so other processes can use it
/// (torch.cuda.empty_cache). Tensors still alive keep their memory.
inline void empty_cache() {
  for (int i = 0; i < device_count() && i < kMaxDevices; ++i) CudaCachingAllocator::get(i).empty_cache();
}
/// The allocator's counters for device `index` (the current device by default).
inline MemoryStats memory_stats(int index = -1) {
  return CudaCachingAllocator::get(index < 0 ? current_device() : index).stats();
}
/// Bytes held by tensors on a device (torch.cuda.memory_allocated).
inline std::size_t memory_allocated(int index = -1) { return memory_stats(index).allocated_bytes; }
/// Bytes ember obtained from CUDA on a device, in use or cached (torch.cuda.memory_reserved).
inline std::size_t memory_reserved(int index = -1) { return memory_stats(index).reserved_bytes; }
/// The peak of memory_allocated since the start or the last reset_peak_memory_stats.
inline std::size_t max_memory_allocated(int index = -1) { return memory_stats(index).peak_allocated_bytes; }
/// Restarts the peaks (allocated and reserved) at the current values.
inline void reset_peak_memory_stats(int index = -1) {
  CudaCachingAllocator::get(index < 0 ? current_device() : index).reset_peak();
}

/// Tells the allocator that the tensor's memory is used by work queued on `stream` (not the stream it was allocated
/// for), as PyTorch's Tensor.record_stream: when the tensor is freed, its block is not handed out again until the
/// work queued on `stream` up to the free has finished. A no-op for memory the allocator does not own.
inline void record_stream(const Storage& storage, const Stream& stream) {
  EMBER_CHECK(storage && storage->device.is_cuda(), "record_stream: expected CUDA memory, got memory on ",
              storage ? storage->device.str() : std::string("(none)"));
  EMBER_CHECK(storage->device.index == stream.device_index(), "record_stream: the memory is on ",
              storage->device.str(), " but the stream on cuda:", stream.device_index());
  auto& a = CudaCachingAllocator::get(storage->device.index);
  if (storage->allocator == &a && storage->data) a.record_stream(storage->data, stream);
}
template <class T>
void record_stream(const Tensor<T>& t, const Stream& stream) {
  record_stream(t.storage(), stream);
}

namespace detail {
inline Allocator* device_allocator(int index) { return &CudaCachingAllocator::get(index); }
/// Registers the allocator with core when this header is included (before main runs).
inline const bool device_allocator_registered =
    ::ember::detail::provide<::ember::detail::CudaAllocatorPart>(&device_allocator);
}  // namespace detail

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
