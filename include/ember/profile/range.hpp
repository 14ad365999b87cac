// ember — profiling ranges, the part every op includes: a Range records its scope's begin and end in the calling
// thread's buffer while a profile::Profiler (ember/profile/profiler.hpp) is recording. Off, a range costs one relaxed
// atomic load and a branch; on, two reads of the monotonic clock and a 32-byte append under the thread buffer's own,
// uncontended lock. Kept light: no <chrono>, no <filesystem>.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ember/config.hpp"

namespace ember::profile {

/// One recorded range. `name` and `category` point to string literals (or other storage that outlives the
/// profiler).
struct Event {
  const char* name;      ///< The range's name (an op's, or the one given to Range).
  const char* category;  ///< "op", "step" or the category given to Range.
  ///@{
  /// The start and end, in nanoseconds of the steady clock.
  std::int64_t begin_ns, end_ns;  ///< steady clock
  ///@}
  std::uint32_t thread;           ///< 0 for the first thread that recorded, 1 for the next, ...
};

namespace detail {
inline std::atomic<bool> g_recording{false};

struct ThreadBuffer {
  std::mutex m;
  std::vector<Event> events;
  std::uint32_t id = 0;
};
struct Registry {
  std::mutex m;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  std::uint32_t next_id = 0;
};
inline Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record while the program exits
  return *r;
}
inline ThreadBuffer& this_thread_buffer() {
  thread_local std::shared_ptr<ThreadBuffer> b = [] {
    auto nb = std::make_shared<ThreadBuffer>();
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.m);
    nb->id = r.next_id++;
    r.buffers.push_back(nb);
    return nb;
  }();
  return *b;
}
}  // namespace detail

/// The monotonic clock (std::chrono::steady_clock's on Linux), in nanoseconds.
inline std::int64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + std::int64_t(ts.tv_nsec);
}
/// Whether a profiler is recording now.
inline bool is_recording() { return detail::g_recording.load(std::memory_order_relaxed); }

/// Records a range measured elsewhere (the Trainer's data waits).
EMBER_HEADER_INLINE void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t end_ns);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void record(const char* name, const char* category, std::int64_t begin_ns, std::int64_t end_ns) {
  if (!is_recording()) return;
  detail::ThreadBuffer& b = detail::this_thread_buffer();
  std::lock_guard<std::mutex> g(b.m);
  b.events.push_back({name, category, begin_ns, end_ns, b.id});
}
#endif

/// Records the time from its construction to its destruction, when a profiler is recording.
class Range {
 public:
  /// Starts a range named `name` (a string literal, or storage that outlives the profiler), as
  /// torch.profiler.record_function(name).
  explicit Range(const char* name, const char* category = "op") noexcept {
    if (is_recording()) {
      name_ = name;
      category_ = category;
      t0_ = now_ns();
    }
  }
  ~Range() {
    if (name_) record(name_, category_, t0_, now_ns());
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  const char* name_ = nullptr;
  const char* category_ = nullptr;
  std::int64_t t0_ = 0;
};

#define EMBER_PROFILE_CONCAT_(a, b) a##b
#define EMBER_PROFILE_CONCAT(a, b) EMBER_PROFILE_CONCAT_(a, b)
/// Records the enclosing scope as a range named `name` (a string literal) of category "op".
#define EMBER_PROFILE_RANGE(name) ::ember::profile::Range EMBER_PROFILE_CONCAT(ember_profile_range_, __LINE__)(name)
/// The same with a category ("backward", "optimizer", "data", "collective", "copy", ...).
#define EMBER_PROFILE_RANGE_CAT(name, category) \
  ::ember::profile::Range EMBER_PROFILE_CONCAT(ember_profile_range_, __LINE__)(name, category)

}  // namespace ember::profile
