// ember — non-temporal ("streaming") stores for large element-wise outputs. An ordinary store to a line not in cache
// first reads the line from memory (write-allocate), so a pass writing a fresh output moves its bytes twice: once read,
// once written back. A streaming store writes whole lines through the write-combining buffers without reading them
// and without keeping them in cache. That pays when the output is too large to stay in the last-level cache for
// whoever reads it next, and costs when it would have stayed. It is off by default: on the one machine measured (a
// 2-core Zen 5 guest) paired runs put it between 0.88x and 1.09x of ordinary stores, no gain beyond the noise
// (bench/RESULTS.md). Turned on (EMBER_STREAM_STORES=1, or cpu::set_streaming_stores with a threshold), the executor
// streams a fresh output only from the size of the last-level cache up, only in passes that run on more than one thread (one
// core does not use the memory's bandwidth up, and there the buffer's extra copy cost more than the saved reads),
// and only for memory-bound expressions (expr::memory_bound_v: with an elementary function the pass is bound by
// arithmetic, and streaming made it slower). Measured on Zen 5: bench/RESULTS.md.
//
// The executor computes a block of values into an L1-resident buffer with its ordinary loop (the output's base
// pointer rebased onto the buffer), then stream_copy moves the block out (cpu/executor.hpp,
// AssignBody::run_streamed); each thread fences its streaming stores before its part of the pass ends (they are
// weakly ordered: without the fence another thread could read stale lines).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ember/config.hpp"

#if defined(__unix__)
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define EMBER_STREAM_X86 1
#else
#define EMBER_STREAM_X86 0
#endif

namespace ember::cpu {
namespace detail::stream {

/// Bytes of one block computed into the buffer before it is streamed out: a few KiB, well inside L1.
inline constexpr std::size_t kBlockBytes = 8192;

/// The last-level cache's size in bytes, read once: Linux's sysfs view of cpu0's caches (the highest level that
/// is unified or data), else the C library's, else 32 MiB. (sysfs is preferred: in virtual machines the C library's
/// CPUID reading can report a whole host package's L3.)
inline std::int64_t last_level_cache_bytes() {
  static const std::int64_t bytes = [] {
    std::int64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 16; ++i) {
      char path[96];
      auto read = [&](const char* leaf, char* out, int cap) {
        std::snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/%s", i, leaf);
        std::FILE* f = std::fopen(path, "r");
        if (!f) return false;
        const bool ok = std::fgets(out, cap, f) != nullptr;
        std::fclose(f);
        return ok;
      };
      char level[16] = {}, type[32] = {}, size[32] = {};
      if (!read("level", level, sizeof level)) break;
      if (!read("type", type, sizeof type) || !read("size", size, sizeof size)) continue;
      if (std::strncmp(type, "Instruction", 11) == 0) continue;
      char* end = nullptr;
      const long long lv = std::strtoll(level, &end, 10);
      const long long n = std::strtoll(size, &end, 10);
      if (n <= 0 || n > (1ll << 40)) continue;
      const std::int64_t b = *end == 'K' ? n << 10 : *end == 'M' ? n << 20 : *end == 'G' ? n << 30 : n;
      if (lv > best_level || (lv == best_level && b > best)) best_level = int(lv), best = b;
    }
#if defined(_SC_LEVEL3_CACHE_SIZE)
    if (best <= 0) best = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    return best > 0 ? best : std::int64_t(32) << 20;
  }();
  return bytes;
}

/// The output size from which a fresh output is streamed: -2 until first asked; -1 never.
inline std::atomic<std::int64_t>& min_bytes_state() {
  static std::atomic<std::int64_t> s{-2};
  return s;
}

/// How many passes have streamed their output (what the tests read to know the streaming path ran).
inline std::atomic<std::uint64_t>& streamed_passes() {
  static std::atomic<std::uint64_t> n{0};
  return n;
}

/// dst[0, bytes) = src[0, bytes): whole 64-byte lines of dst with streaming stores, the unaligned head and tail with
/// ordinary ones. src is any alignment (it is the L1 buffer).
inline void stream_copy(void* dst, const void* src, std::size_t bytes) {
#if EMBER_STREAM_X86
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const std::size_t mis = reinterpret_cast<std::uintptr_t>(d) & 63;
  std::size_t head = mis ? 64 - mis : 0;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32)));
#else
    for (int k = 0; k < 64; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + k)));
#endif
  }
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// The pointer p with p[i] == buf[i - s]: so a loop over indices [s, s + n) writes a block buffer of n elements.
/// The address is computed in integers; it lies outside any object and is only ever indexed back into buf, which
/// GCC and Clang compile as the plain address arithmetic it is on the flat address spaces where streaming stores
/// exist (this is not the letter of ISO C++, which leaves pointers outside an object undefined).
template <class T>
inline T* rebased(T* buf, std::int64_t s) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(buf) - static_cast<std::uintptr_t>(s) * sizeof(T));
}

/// Orders this thread's streaming stores before what it does next (the end of its part of a pass).
inline void fence() {
#if EMBER_STREAM_X86
  _mm_sfence();
#endif
}

}  // namespace detail::stream

/// Whether this build can stream (x86-64; elsewhere stream_copy is a plain copy and nothing streams).
inline constexpr bool kStreamingStores = EMBER_STREAM_X86 != 0;

/// The size in bytes from which an element-wise pass writing a fresh, dense output uses streaming stores; -1 when
/// they are off, the default. EMBER_STREAM_STORES=1 in the environment turns them on at the first ask, from the
/// last-level cache's size (an output that large is out of cache by the time anyone reads it); 0 (or unset) keeps
/// them off. Outputs written in place are never streamed (their lines are read anyway).
inline std::int64_t streaming_store_min_bytes() {
  auto& st = detail::stream::min_bytes_state();
  std::int64_t v = st.load(std::memory_order_relaxed);
  if (v == -2) {
    const char* e = std::getenv("EMBER_STREAM_STORES");
    const bool off = !kStreamingStores || !(e && e[0] == '1' && e[1] == '\0');
    EMBER_CHECK(!e || !*e || ((e[0] == '0' || e[0] == '1') && e[1] == '\0'),
                "cpu::streaming_store_min_bytes: environment variable EMBER_STREAM_STORES is ",
                ember::detail::quote_untrusted(e), ", not 0 or 1");
    std::int64_t want = off ? -1 : detail::stream::last_level_cache_bytes();
    if (!st.compare_exchange_strong(v, want)) want = v;
    v = want;
  }
  return v;
}

/// Streams fresh outputs of at least `min_bytes` bytes from now on (0: every one that meets the other conditions
/// above, which the tests use; detail::stream::last_level_cache_bytes() is what EMBER_STREAM_STORES=1 sets);
/// set_streaming_stores(-1) turns streaming off again.
inline void set_streaming_stores(std::int64_t min_bytes) {
  EMBER_CHECK(min_bytes >= -1, "cpu::set_streaming_stores: min_bytes is ", min_bytes, ", expected -1 (off) or >= 0");
  detail::stream::min_bytes_state().store(kStreamingStores ? min_bytes : -1);
}

}  // namespace ember::cpu
