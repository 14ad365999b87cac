// ember — the allocator interface and the CPU caching allocator (64-byte aligned blocks kept in size-class
// free lists, so a training loop's repeated same-size allocations never reach the system allocator).
#pragma once

#include <atomic>
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
  /// A block of at least nbytes, aligned for any element type (nullptr for 0 bytes); throws ember::Error when out
  /// of memory.
  virtual void* allocate(std::size_t nbytes) = 0;
  /// Gives back a block from allocate(); nbytes is the size it was asked for.
  virtual void deallocate(void* p, std::size_t nbytes) = 0;
  /// The device the blocks live on (pinned host memory is Device::cpu()).
  virtual Device device() const = 0;
};

/// Counters of a caching allocator. `system_allocs` counts calls that reached the system allocator.
struct AllocatorStats {
  std::uint64_t system_allocs = 0;  ///< blocks obtained from the system
  std::uint64_t system_frees = 0;   ///< blocks returned to the system
  std::uint64_t cache_hits = 0;     ///< allocations served from the free lists
  std::size_t bytes_in_use = 0;     ///< bytes handed out and not yet returned
  std::size_t bytes_cached = 0;     ///< bytes held in free lists
  std::size_t peak_in_use = 0;      ///< see CpuCachingAllocator: sampled, not exact, for the CPU allocator
};

/// 64-byte aligned CPU memory through size-class free lists. Sizes are rounded up to a class (64-byte steps
/// below 4 KiB, then four classes per power of two), so a freed block serves the next request of its class.
///
/// Two levels, as in tcmalloc: every thread has its own small cache of blocks up to 64 KiB (at most
/// `kThreadBinBytes` per size class), guarded by a lock only that thread normally takes, so data-loader workers
/// and the thread pool do not queue on one mutex for their per-sample tensors; behind it, one shared pool under a
/// mutex, which thread caches refill from and spill to half a size class at a time, and which serves larger
/// blocks directly. The whole cache holds at most about `cache_limit()` bytes (the shared pool enforces it; the
/// thread caches add at most ~10 MiB per thread); beyond it, freed blocks go back to the system.
///
/// Statistics are exact whenever no other thread is allocating: counters live with each thread cache and are
/// summed by stats(). `peak_in_use` is sampled when blocks move through the shared pool and in stats(), so a
/// peak reached and left entirely inside thread caches may be missed.
class CpuCachingAllocator final : public Allocator {
 public:
  static constexpr std::size_t kAlignment = 64;  ///< Every block's alignment in bytes (a cache line, an AVX-512 load).
  static constexpr std::size_t kThreadCacheMax = std::size_t(64) << 10;  ///< largest class thread caches keep
  static constexpr std::size_t kThreadBinBytes = std::size_t(128) << 10;  ///< bytes per class per thread
  static constexpr int kBins = 80;                                         ///< classes up to kThreadCacheMax
  static constexpr int kMaxPerBin = 64;  ///< the most blocks one thread cache keeps per class

  /// The process's CPU allocator, which every CPU tensor's storage comes from.
  static CpuCachingAllocator& instance() {
    static CpuCachingAllocator* a = new CpuCachingAllocator();  // never destroyed: tensors may outlive statics
    return *a;
  }

  /// The size a request of n bytes is rounded up to: 64-byte steps up to 4 KiB, then four classes per power of two.
  static std::size_t size_class(std::size_t n) {
    if (n == 0) n = 1;
    if (n <= 4096) return (n + 63) & ~std::size_t(63);
    int hi = 63 - __builtin_clzll(n - 1);  // 2^hi < n <= 2^(hi+1)
    const std::size_t step = std::size_t(1) << (hi - 2);  // four classes in (2^hi, 2^(hi+1)]
    return (n + step - 1) / step * step;
  }

  /// The thread-cache bin of a class no larger than kThreadCacheMax: 64 bins of 64-byte steps up to 4 KiB, then
  /// four per power of two up to 64 KiB.
  static constexpr int bin_of(std::size_t cls) {
    if (cls <= 4096) return int(cls / 64) - 1;
    const int hi = 63 - __builtin_clzll(cls - 1);
    const std::size_t step = std::size_t(1) << (hi - 2);
    return 64 + (hi - 12) * 4 + int(cls / step) - 5;
  }
  /// How many blocks of a class one thread cache keeps.
  static constexpr int bin_capacity(std::size_t cls) {
    const std::size_t n = kThreadBinBytes / cls;
    return n < 2 ? 2 : n > std::size_t(kMaxPerBin) ? kMaxPerBin : int(n);
  }

  EMBER_HEADER_INLINE void* allocate(std::size_t nbytes) override;

  EMBER_HEADER_INLINE void deallocate(void* p, std::size_t nbytes) override;

  Device device() const override { return Device::cpu(); }

  /// Returns every cached block, of the shared pool and of every thread cache, to the system.
  EMBER_HEADER_INLINE void empty_cache();

  /// The counters, summed over the shared pool and every thread cache.
  EMBER_HEADER_INLINE AllocatorStats stats() const;
  /// Restarts peak_in_use from the bytes in use now.
  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    peak_ = total_in_use();
  }
  /// The most bytes the shared pool keeps cached (set_cache_limit).
  std::size_t cache_limit() const { return limit_.load(std::memory_order_relaxed); }
  /// Caps the bytes the shared pool keeps (0 turns caching off: thread caches are bypassed too).
  EMBER_HEADER_INLINE void set_cache_limit(std::size_t bytes);

 private:
  // One thread's cache. Its owner takes `busy` on every visit (uncontended: a cache line nobody else writes);
  // stats() and empty_cache() take it too. Counters are written only under it and read relaxed.
  struct ThreadCache {
    std::atomic<bool> busy{false};
    std::atomic<std::int64_t> in_use{0}, cached{0}, hits{0};
    std::uint8_t n[kBins] = {};
    void* slot[kBins][kMaxPerBin];
    void lock() {
      while (busy.exchange(true, std::memory_order_acquire))
        while (busy.load(std::memory_order_relaxed)) {
        }
    }
    void unlock() { busy.store(false, std::memory_order_release); }
  };

  // Destroyed at thread exit: returns the thread's blocks and counters to the shared pool.
  struct CacheOwner {
    ThreadCache* tc = nullptr;
    ~CacheOwner() {
      if (tc) instance().retire(tc);
      dead = true;
      current = nullptr;
    }
  };
  static thread_local ThreadCache* current;
  static thread_local bool dead;
  static thread_local CacheOwner owner;

  static void bump(std::atomic<std::int64_t>& c, std::int64_t d) {
    c.store(c.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  static constexpr std::size_t bin_size(int b) {
    if (b < 64) return std::size_t(b + 1) * 64;
    const int hi = 12 + (b - 64) / 4;
    return (std::size_t(1) << (hi - 2)) * std::size_t((b - 64) % 4 + 5);
  }

  ThreadCache* thread_cache() {
    if (limit_.load(std::memory_order_relaxed) == 0) [[unlikely]] return nullptr;
    if (ThreadCache* tc = current) [[likely]] return tc;
    if (dead) return nullptr;
    auto* tc = new ThreadCache();
    {
      std::lock_guard<std::mutex> lk(mu_);
      caches_.push_back(tc);
    }
    owner.tc = tc;  // first use of `owner` in this thread registers its destructor
    current = tc;
    return tc;
  }

  EMBER_HEADER_INLINE void retire(ThreadCache* tc);

  // Takes up to half a bin's worth of blocks of class sz from the shared pool: one is returned, the rest go to
  // the thread cache. Reaches the system when the pool has none.
  EMBER_HEADER_INLINE void* refill_and_allocate(ThreadCache* tc, int b, std::size_t sz, std::size_t nbytes);

  EMBER_HEADER_INLINE void* shared_allocate(std::size_t sz, std::size_t nbytes);

  EMBER_HEADER_INLINE void* system_allocate(std::size_t sz, std::size_t nbytes);

  // Under mu_: keeps a free block in the shared pool, or frees it when the pool is at its limit.
  void put_shared(void* p, std::size_t sz) {
    if (std::size_t(cached_) + sz <= limit_.load(std::memory_order_relaxed)) {
      free_[sz].push_back(p);
      cached_ += std::int64_t(sz);
      return;
    }
    system_frees_++;
    std::free(p);
  }

  // Under mu_.
  std::int64_t total_in_use() const {
    std::int64_t s = in_use_;
    for (const ThreadCache* tc : caches_) s += tc->in_use.load(std::memory_order_relaxed);
    return s;
  }
  void sample_peak() const {
    const std::int64_t s = total_in_use();
    if (s > peak_) peak_ = s;
  }

  CpuCachingAllocator() {
    const long long mb = detail::env_int("CpuCachingAllocator", "EMBER_CPU_CACHE_LIMIT_MB", 8 << 10, 0, 1LL << 30);
    limit_ = std::size_t(mb) << 20;
  }

  mutable std::mutex mu_;  // guards everything below except limit_
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::vector<ThreadCache*> caches_;
  std::uint64_t system_allocs_ = 0, system_frees_ = 0, hits_ = 0;
  std::int64_t in_use_ = 0, cached_ = 0;  // the shared pool's part; thread caches hold the rest
  mutable std::int64_t peak_ = 0;
  std::atomic<std::size_t> limit_{std::size_t(8) << 30};
};

// The allocator's larger members, compiled once with ember::precompiled.
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void* CpuCachingAllocator::allocate(std::size_t nbytes) {
  const std::size_t sz = size_class(nbytes);
  if (sz <= kThreadCacheMax)
    if (ThreadCache* tc = thread_cache()) {
      const int b = bin_of(sz);
      tc->lock();
      if (tc->n[b] > 0) {
        void* p = tc->slot[b][--tc->n[b]];
        bump(tc->hits, 1);
        bump(tc->in_use, std::int64_t(sz));
        bump(tc->cached, -std::int64_t(sz));
        tc->unlock();
        return p;
      }
      tc->unlock();
      return refill_and_allocate(tc, b, sz, nbytes);
    }
  return shared_allocate(sz, nbytes);
}

EMBER_HEADER_INLINE void CpuCachingAllocator::deallocate(void* p, std::size_t nbytes) {
  if (!p) return;
  const std::size_t sz = size_class(nbytes);
  if (sz <= kThreadCacheMax)
    if (ThreadCache* tc = thread_cache()) {
      const int b = bin_of(sz), cap = bin_capacity(sz);
      tc->lock();
      bump(tc->in_use, -std::int64_t(sz));
      if (tc->n[b] < cap) {
        tc->slot[b][tc->n[b]++] = p;
        bump(tc->cached, std::int64_t(sz));
        tc->unlock();
        return;
      }
      // The bin is full: this block and half the bin go to the shared pool in one visit.
      void* spill[kMaxPerBin / 2 + 1];
      int m = 0;
      spill[m++] = p;
      for (int k = 0; k < cap / 2; ++k) spill[m++] = tc->slot[b][--tc->n[b]];
      bump(tc->cached, -std::int64_t(sz) * (m - 1));
      tc->unlock();
      std::lock_guard<std::mutex> lk(mu_);
      for (int k = 0; k < m; ++k) put_shared(spill[k], sz);
      sample_peak();
      return;
    }
  std::lock_guard<std::mutex> lk(mu_);
  in_use_ -= std::int64_t(sz);
  put_shared(p, sz);
}

EMBER_HEADER_INLINE void CpuCachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lk(mu_);
  for (ThreadCache* tc : caches_) {
    tc->lock();
    for (int b = 0; b < kBins; ++b) {
      const std::size_t sz = bin_size(b);
      for (int k = 0; k < tc->n[b]; ++k) {
        std::free(tc->slot[b][k]);
        system_frees_++;
      }
      bump(tc->cached, -std::int64_t(sz) * tc->n[b]);
      tc->n[b] = 0;
    }
    tc->unlock();
  }
  for (auto& [sz, v] : free_)
    for (void* p : v) {
      std::free(p);
      system_frees_++;
    }
  free_.clear();
  cached_ = 0;
}

EMBER_HEADER_INLINE AllocatorStats CpuCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::int64_t in_use = in_use_, cached = cached_;
  std::uint64_t hits = hits_;
  for (const ThreadCache* tc : caches_) {
    in_use += tc->in_use.load(std::memory_order_relaxed);
    cached += tc->cached.load(std::memory_order_relaxed);
    hits += std::uint64_t(tc->hits.load(std::memory_order_relaxed));
  }
  if (in_use > peak_) peak_ = in_use;
  AllocatorStats s;
  s.system_allocs = system_allocs_;
  s.system_frees = system_frees_;
  s.cache_hits = hits;
  s.bytes_in_use = std::size_t(in_use);
  s.bytes_cached = std::size_t(cached);
  s.peak_in_use = std::size_t(peak_);
  return s;
}

EMBER_HEADER_INLINE void CpuCachingAllocator::set_cache_limit(std::size_t bytes) {
  limit_.store(bytes, std::memory_order_relaxed);
  bool over;
  {
    std::lock_guard<std::mutex> lk(mu_);
    over = std::size_t(cached_) > bytes || bytes == 0;
  }
  if (over) empty_cache();
}

EMBER_HEADER_INLINE void CpuCachingAllocator::retire(ThreadCache* tc) {
  std::lock_guard<std::mutex> lk(mu_);
  tc->lock();
  for (int b = 0; b < kBins; ++b) {
    const std::size_t sz = bin_size(b);
    cached_ -= std::int64_t(sz) * tc->n[b];  // put_shared adds them back (or frees them)
    for (int k = 0; k < tc->n[b]; ++k) put_shared(tc->slot[b][k], sz);
  }
  cached_ += tc->cached.load(std::memory_order_relaxed);
  in_use_ += tc->in_use.load(std::memory_order_relaxed);
  hits_ += std::uint64_t(tc->hits.load(std::memory_order_relaxed));
  tc->unlock();
  for (auto it = caches_.begin(); it != caches_.end(); ++it)
    if (*it == tc) {
      caches_.erase(it);
      break;
    }
  delete tc;
}

EMBER_HEADER_INLINE void* CpuCachingAllocator::refill_and_allocate(ThreadCache* tc, int b, std::size_t sz,
                                                                  std::size_t nbytes) {
  void* got[kMaxPerBin / 2];
  int m = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(sz);
    if (it != free_.end()) {
      const int want = bin_capacity(sz) / 2;
      while (m < want && !it->second.empty()) {
        got[m++] = it->second.back();
        it->second.pop_back();
      }
    }
    if (m > 0) {
      cached_ -= std::int64_t(sz) * m;
      hits_++;
      in_use_ += std::int64_t(sz);
      sample_peak();
    }
  }
  if (m == 0) return system_allocate(sz, nbytes);
  if (m > 1) {
    tc->lock();
    for (int k = 1; k < m; ++k) tc->slot[b][tc->n[b]++] = got[k];
    bump(tc->cached, std::int64_t(sz) * (m - 1));
    tc->unlock();
  }
  return got[0];
}

EMBER_HEADER_INLINE void* CpuCachingAllocator::shared_allocate(std::size_t sz, std::size_t nbytes) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = free_.find(sz);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      hits_++;
      cached_ -= std::int64_t(sz);
      in_use_ += std::int64_t(sz);
      sample_peak();
      return p;
    }
  }
  return system_allocate(sz, nbytes);
}

EMBER_HEADER_INLINE void* CpuCachingAllocator::system_allocate(std::size_t sz, std::size_t nbytes) {
  void* p = std::aligned_alloc(kAlignment, sz);
  if (!p) {
    empty_cache();
    p = std::aligned_alloc(kAlignment, sz);
  }
  EMBER_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes");
  std::lock_guard<std::mutex> lk(mu_);
  system_allocs_++;
  in_use_ += std::int64_t(sz);
  sample_peak();
  return p;
}
#endif

inline thread_local CpuCachingAllocator::ThreadCache* CpuCachingAllocator::current = nullptr;
inline thread_local bool CpuCachingAllocator::dead = false;
inline thread_local CpuCachingAllocator::CacheOwner CpuCachingAllocator::owner;

}  // namespace ember
