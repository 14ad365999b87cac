// ember — the bookkeeping of the caching device allocator, without any CUDA call: size rounding, the small and large
// pools, free lists per stream, splitting cached segments and merging free neighbours. The raw memory comes from a
// Backend (cudaMalloc/cudaFree in cuda/allocator.hpp; a fake in the tests), so all of this runs in a CPU test.
//
// Policy (close to PyTorch's CUDACachingAllocator):
//   - every request is rounded up to a multiple of 512 bytes (kMinBlockSize), so blocks stay 512-byte aligned;
//   - requests of at most 1 MiB (kSmallSize) are served by the small pool, whose segments are 2 MiB (kSmallSegment)
//     and are split into 512-byte-granular blocks;
//   - larger requests are served by the large pool, whose segments are the request rounded up to a multiple of
//     2 MiB (kLargeRound); a cached large block is split only when the remainder exceeds 1 MiB;
//   - a free block belongs to the stream it was allocated on and serves only requests on that stream (work queued on
//     that stream before the free is ordered before any later use, so no event is needed);
//   - a block used on other streams too (record_stream, as PyTorch's Tensor.record_stream) is not reused when freed
//     until an event recorded on each of those streams at the free has completed; allocations and empty_cache() poll
//     these events, and a failing allocation waits for them before it retries;
//   - freeing a block merges it with free neighbours of its segment; only whole free segments go back to the backend
//     (empty_cache(), or once when an allocation fails, before retrying).
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <tuple>
#include <algorithm>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ember::cuda {

/// Counters of a caching allocator (device or pinned host memory), as torch.cuda.memory_stats reports them.
struct MemoryStats {
  std::size_t allocated_bytes = 0;       ///< bytes in blocks handed out and not yet freed (rounded sizes)
  std::size_t reserved_bytes = 0;        ///< bytes obtained from CUDA (segments), allocated or cached
  std::size_t peak_allocated_bytes = 0;  ///< maximum of allocated_bytes since the start or reset_peak_memory_stats
  std::size_t peak_reserved_bytes = 0;   ///< maximum of reserved_bytes since the start or reset_peak_memory_stats
  std::uint64_t num_allocs = 0;          ///< allocation requests served
  std::uint64_t num_cuda_mallocs = 0;    ///< calls that reached CUDA's allocator (cudaMalloc / cudaHostAlloc)
  std::uint64_t num_cuda_frees = 0;      ///< calls that returned memory to CUDA (cudaFree / cudaFreeHost)
  std::uint64_t cache_hits = 0;          ///< requests served from cached blocks, without reaching CUDA
  std::uint64_t num_alloc_retries = 0;   ///< times the cache was emptied to retry a failed allocation
  std::uint64_t num_ooms = 0;            ///< allocations that failed even after the retry
};

namespace detail {

inline constexpr std::size_t kMinBlockSize = 512;
inline constexpr std::size_t kSmallSize = std::size_t(1) << 20;
inline constexpr std::size_t kSmallSegment = std::size_t(2) << 20;
inline constexpr std::size_t kLargeRound = std::size_t(2) << 20;
inline constexpr std::size_t kMaxRequest = std::size_t(1) << 60;

/// Streams are told apart by their handle as an integer (0 is the default stream).
using StreamId = std::uintptr_t;

/// Block bookkeeping over a Backend with `void* raw_alloc(std::size_t)` (nullptr when out of memory),
/// `void raw_free(void*)`, and events for record_stream: a type `Event`, `Event record_event(StreamId)`,
/// `bool event_done(Event)`, `void wait_event(Event)` and `void release_event(Event)` (none of them may throw).
/// Thread-safe.
template <class Backend>
class BlockPool {
 public:
  explicit BlockPool(Backend backend = {}) : backend_(std::move(backend)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  /// Returns the cached segments; blocks still allocated are left to the backend (the device pools live forever).
  ~BlockPool() {
    process_events_locked(true);
    release_cached_locked();
    for (auto& [p, b] : live_) delete b;
  }

  /// The size a request of n bytes occupies: n rounded up to a multiple of 512 (at least 512).
  static constexpr std::size_t round_size(std::size_t n) {
    return n < kMinBlockSize ? kMinBlockSize : (n + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
  }
  /// The size of a new segment for a block of `rounded` bytes.
  static constexpr std::size_t segment_size(std::size_t rounded) {
    return rounded <= kSmallSize ? kSmallSegment : (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
  }

  /// A block of at least n bytes for use on `stream`, or nullptr when the backend has no memory left even after the
  /// cached segments were returned to it.
  void* allocate(std::size_t n, StreamId stream) {
    if (n > kMaxRequest) {  // no device has this much; rounding it would overflow
      std::lock_guard<std::mutex> lk(mu_);
      stats_.num_ooms++;
      return nullptr;
    }
    const std::size_t size = round_size(n);
    const bool small = size <= kSmallSize;
    std::lock_guard<std::mutex> lk(mu_);
    process_events_locked(false);
    FreeSet& pool = small ? free_small_ : free_large_;
    Block key{nullptr, size, stream, small};
    Block* b = nullptr;
    if (auto it = pool.lower_bound(&key); it != pool.end() && (*it)->stream == stream) {
      b = *it;
      pool.erase(it);
      stats_.cache_hits++;
    } else {
      const std::size_t seg = segment_size(size);
      void* p = backend_.raw_alloc(seg);
      if (!p) {
        stats_.num_alloc_retries++;
        process_events_locked(true);  // blocks waiting for other streams: wait for them, then free them too
        release_cached_locked();
        p = backend_.raw_alloc(seg);
        if (!p) {
          stats_.num_ooms++;
          return nullptr;
        }
      }
      stats_.num_cuda_mallocs++;
      stats_.reserved_bytes += seg;
      if (stats_.reserved_bytes > stats_.peak_reserved_bytes) stats_.peak_reserved_bytes = stats_.reserved_bytes;
      b = new Block{static_cast<char*>(p), seg, stream, small};
    }
    // Split off the tail when it is worth keeping as a block of its own.
    const std::size_t rest = b->size - size;
    if (small ? rest >= kMinBlockSize : rest > kSmallSize) {
      Block* r = new Block{b->ptr + size, rest, stream, small};
      r->prev = b;
      r->next = b->next;
      if (b->next) b->next->prev = r;
      b->next = r;
      b->size = size;
      pool.insert(r);
    }
    b->allocated = true;
    live_.emplace(b->ptr, b);
    stats_.num_allocs++;
    stats_.allocated_bytes += b->size;
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes) stats_.peak_allocated_bytes = stats_.allocated_bytes;
    return b->ptr;
  }

  /// Marks the block at p as used by work queued on `stream` (besides the stream it was allocated for): when it is
  /// freed, it is reused only after that work. Returns false when p is not a live block of this pool.
  bool record_stream(void* p, StreamId stream) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return false;
    Block* b = it->second;
    if (stream != b->stream && std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end())
      b->uses.push_back(stream);
    return true;
  }

  /// Returns a block to its stream's free list, merged with free neighbours (after the events of the other streams
  /// that used it have completed). Unknown pointers are reported on stderr and ignored (this runs in destructors).
  void deallocate(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "ember: CUDA caching allocator: free of %p, which it did not allocate (ignored)\n", p);
      return;
    }
    Block* b = it->second;
    live_.erase(it);
    if (!b->uses.empty()) {
      for (StreamId s : b->uses) pending_.push_back({backend_.record_event(s), b});
      b->waiting = int(b->uses.size());
      b->uses.clear();
      return;  // still counted as allocated until the events complete
    }
    free_block_locked(b);
  }

  /// Returns every entirely free segment to the backend.
  void empty_cache() {
    std::lock_guard<std::mutex> lk(mu_);
    process_events_locked(false);
    release_cached_locked();
  }

  MemoryStats stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.peak_allocated_bytes = stats_.allocated_bytes;
    stats_.peak_reserved_bytes = stats_.reserved_bytes;
  }
  /// The size of the block at p (its rounded size), 0 if p is not allocated here.
  std::size_t block_size(const void* p) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(const_cast<void*>(p));
    return it == live_.end() ? 0 : it->second->size;
  }
  /// Number of free (cached) blocks, over all streams and both pools.
  std::size_t cached_blocks() const {
    std::lock_guard<std::mutex> lk(mu_);
    return free_small_.size() + free_large_.size();
  }
  /// Number of freed blocks waiting for events of other streams.
  std::size_t blocks_waiting_for_streams() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<const Block*> seen;
    for (const auto& e : pending_)
      if (std::find(seen.begin(), seen.end(), e.block) == seen.end()) seen.push_back(e.block);
    return seen.size();
  }
  Backend& backend() { return backend_; }

 private:
  struct Block {
    char* ptr;
    std::size_t size;
    StreamId stream;
    bool small;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment
    Block* next = nullptr;
    std::vector<StreamId> uses{};  // other streams that used it (record_stream)
    int waiting = 0;             // events still pending after the free
  };
  struct Pending {
    typename Backend::Event event;
    Block* block;
  };

  // Frees the blocks whose events have completed (all of them, waiting for each, when `wait`).
  void process_events_locked(bool wait) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (wait) backend_.wait_event(it->event);
      else if (!backend_.event_done(it->event)) {
        ++it;
        continue;
      }
      backend_.release_event(it->event);
      Block* b = it->block;
      it = pending_.erase(it);
      if (--b->waiting == 0) free_block_locked(b);
    }
  }

  void free_block_locked(Block* b) {
    stats_.allocated_bytes -= b->size;
    b->allocated = false;
    FreeSet& pool = b->small ? free_small_ : free_large_;
    if (Block* prev = b->prev; prev && !prev->allocated) {
      pool.erase(prev);
      prev->size += b->size;
      prev->next = b->next;
      if (b->next) b->next->prev = prev;
      delete b;
      b = prev;
    }
    if (Block* next = b->next; next && !next->allocated) {
      pool.erase(next);
      b->size += next->size;
      b->next = next->next;
      if (next->next) next->next->prev = b;
      delete next;
    }
    pool.insert(b);
  }

  // Free blocks ordered by (stream, size, address): lower_bound finds the smallest fitting block of a stream.
  struct Order {
    bool operator()(const Block* a, const Block* b) const {
      return std::make_tuple(a->stream, a->size, reinterpret_cast<std::uintptr_t>(a->ptr)) <
             std::make_tuple(b->stream, b->size, reinterpret_cast<std::uintptr_t>(b->ptr));
    }
  };
  using FreeSet = std::set<Block*, Order>;

  void release_cached_locked() {
    for (FreeSet* pool : {&free_small_, &free_large_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {  // part of a segment still in use
          ++it;
          continue;
        }
        backend_.raw_free(b->ptr);
        stats_.num_cuda_frees++;
        stats_.reserved_bytes -= b->size;
        it = pool->erase(it);
        delete b;
      }
    }
  }

  Backend backend_;
  mutable std::mutex mu_;
  FreeSet free_small_, free_large_;
  std::unordered_map<void*, Block*> live_;
  std::deque<Pending> pending_;
  MemoryStats stats_;
};

}  // namespace detail
}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
