// ember — the allocator interface and the CPU caching allocator (64-byte aligned blocks kept in size-class
// free lists, so a training loop's repeated same-size allocations never reach the system allocator).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/device.hpp"

namespace ember {

/// Where Storage gets its bytes. Implementations: the CPU caching allocator here; the CUDA caching and pinned
/// host allocators live in cuda/.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t nbytes) = 0;
  virtual void deallocate(void* p, std::size_t nbytes) = 0;
  virtual Device device() const = 0;
};

/// Counters of a caching allocator. `system_allocs` counts calls that reached the system allocator.
struct AllocatorStats {
  std::uint64_t system_allocs = 0;  ///< blocks obtained from the system
  std::uint64_t system_frees = 0;   ///< blocks returned to the system
  std::uint64_t cache_hits = 0;     ///< allocations served from the free lists
  std::size_t bytes_in_use = 0;     ///< bytes handed out and not yet returned
  std::size_t bytes_cached = 0;     ///< bytes held in free lists
  std::size_t peak_in_use = 0;
};

/// 64-byte aligned CPU memory through size-class free lists. Sizes are rounded up to a class (64-byte steps
/// below 4 KiB, then four classes per power of two), so a freed block serves the next request of its class.
/// Thread-safe (data-loader workers allocate too). The cache holds at most `cache_limit()` bytes; beyond it,
/// freed blocks go back to the system.
class CpuCachingAllocator final : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;

  static CpuCachingAllocator& instance() {
    static CpuCachingAllocator* a = new CpuCachingAllocator();  // never destroyed: tensors may outlive statics
    return *a;
  }

  static std::size_t size_class(std::size_t n) {
    if (n == 0) n = 1;
    if (n <= 4096) return (n + 63) & ~std::size_t(63);
    int hi = 63 - __builtin_clzll(n - 1);  // 2^hi < n <= 2^(hi+1)
    const std::size_t step = std::size_t(1) << (hi - 2);  // four classes in (2^hi, 2^(hi+1)]
    return (n + step - 1) / step * step;
  }

  void* allocate(std::size_t nbytes) override {
    const std::size_t sz = size_class(nbytes);
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_.find(sz);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cache_hits++;
        stats_.bytes_cached -= sz;
        note_use(sz);
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, sz);
    if (!p) {
      empty_cache();
      p = std::aligned_alloc(kAlignment, sz);
    }
    EMBER_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes");
    std::lock_guard<std::mutex> lk(mu_);
    stats_.system_allocs++;
    note_use(sz);
    return p;
  }

  void deallocate(void* p, std::size_t nbytes) override {
    if (!p) return;
    const std::size_t sz = size_class(nbytes);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.bytes_in_use -= sz;
    if (stats_.bytes_cached + sz <= limit_) {
      free_[sz].push_back(p);
      stats_.bytes_cached += sz;
      return;
    }
    stats_.system_frees++;
    std::free(p);
  }

  Device device() const override { return Device::cpu(); }

  /// Returns every cached block to the system.
  void empty_cache() {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [sz, v] : free_)
      for (void* p : v) {
        std::free(p);
        stats_.system_frees++;
      }
    free_.clear();
    stats_.bytes_cached = 0;
  }

  AllocatorStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.peak_in_use = stats_.bytes_in_use;
  }
  std::size_t cache_limit() const { return limit_; }
  void set_cache_limit(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      limit_ = bytes;
    }
    if (stats_.bytes_cached > bytes) empty_cache();
  }

 private:
  CpuCachingAllocator() {
    if (const char* s = std::getenv("EMBER_CPU_CACHE_LIMIT_MB")) limit_ = std::size_t(std::atoll(s)) << 20;
  }
  void note_use(std::size_t sz) {
    stats_.bytes_in_use += sz;
    if (stats_.bytes_in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.bytes_in_use;
  }

  mutable std::mutex mu_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  AllocatorStats stats_;
  std::size_t limit_ = std::size_t(8) << 30;
};

}  // namespace ember
