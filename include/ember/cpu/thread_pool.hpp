// ember — the CPU thread pool: persistent workers that split a range into chunks; the calling thread works too.
// Small ranges never touch the pool. A worker that finishes a loop polls for the next one for a short while
// (EMBER_SPIN_US microseconds, 200 by default, yielding its core to anything else runnable) before it sleeps: a
// sleeping worker takes tens of microseconds to wake, as long as a small GEMM's whole half.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ember/config.hpp"

namespace ember::cpu {

/// The process's worker threads, which run ember's parallel CPU loops (PyTorch's intra-op thread pool). The
/// caller's thread takes part in every loop; idle workers poll briefly, then sleep.
class ThreadPool {
 public:
  /// The pool, started on first use with default_threads() threads.
  EMBER_HEADER_INLINE static ThreadPool& instance();
  /// The thread count a new pool gets: EMBER_NUM_THREADS when set (1 to 4096), else the hardware's thread count.
  static int default_threads() {
    const long long n = ember::detail::env_int("cpu::ThreadPool", "EMBER_NUM_THREADS", 0, 1, 4096);
    return n > 0 ? int(n) : int(std::max(1u, std::thread::hardware_concurrency()));
  }
  /// How long an idle worker polls for the next loop before it sleeps (EMBER_SPIN_US, 0 to 100000 µs).
  static std::int64_t default_spin_ns() {
    return std::int64_t(ember::detail::env_int("cpu::ThreadPool", "EMBER_SPIN_US", 200, 0, 100000)) * 1000;
  }

  /// How many threads (including the caller) run parallel loops (torch.get_num_threads()).
  int num_threads() const { return nthreads_.load(std::memory_order_relaxed); }

  /// Sets how many threads (including the caller) run parallel loops.
  void set_num_threads(int n) {
    n = std::max(1, n);
    std::unique_lock<std::mutex> lk(run_mu_);
    stop_workers();
    nthreads_.store(n, std::memory_order_relaxed);
    start_workers();
  }

  /// Calls fn(chunk_begin, chunk_end) over [begin, end) split into chunks of at least `grain`, on all threads.
  /// Chunk boundaries depend only on (begin, end, grain, thread count). Exceptions reach the caller.
  template <class F>
  void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const F& fn) {
    const std::int64_t n = end - begin;
    if (n <= 0) return;
    if (runs_serially(n, grain)) {
      fn(begin, end);
      return;
    }
    // The pool's machinery is one non-template function; each caller adds only this trampoline.
    run_parallel(begin, end, grain, [](const void* f, std::int64_t a, std::int64_t b) { (*static_cast<const F*>(f))(a, b); },
                 &fn);
  }

 private:
  using RangeFn = void (*)(const void*, std::int64_t, std::int64_t);

  struct Job {
    RangeFn call = nullptr;
    const void* fn = nullptr;
    std::int64_t begin = 0, end = 0, step = 0;
    std::int64_t nchunks = 0;
    std::atomic<std::int64_t> next{0}, done{0};
    std::atomic<int> active{0};
    std::exception_ptr error;
    std::mutex err_mu;
  };

  bool runs_serially(std::int64_t n, std::int64_t grain) const {
    const std::int64_t maxchunks = (n + grain - 1) / std::max<std::int64_t>(grain, 1);
    return nthreads_.load(std::memory_order_relaxed) == 1 || maxchunks < 2 || in_worker();
  }

  // Defined below, noinline (header-only, the callers' trampolines stay small). Its declaration here carries neither
  // inline nor noinline: GCC warns when a declaration with one is followed by one with the other.
  void run_parallel(std::int64_t begin, std::int64_t end, std::int64_t grain, RangeFn call, const void* fn);

  explicit ThreadPool(int n) : nthreads_(n), spin_ns_(default_spin_ns()) { start_workers(); }

  static bool& in_worker() {
    thread_local bool w = false;
    return w;
  }

  static void work(Job& job) {
    for (;;) {
      const std::int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
      if (c >= job.nchunks) break;
      try {
        const std::int64_t a = job.begin + c * job.step, b = std::min(job.end, a + job.step);
        if (a < b) job.call(job.fn, a, b);
      } catch (...) {
        std::lock_guard<std::mutex> lk(job.err_mu);
        if (!job.error) job.error = std::current_exception();
      }
      job.done.fetch_add(1, std::memory_order_release);
    }
  }

  // Polls until a loop newer than `seen` is posted, quit is asked, or spin_ns_ pass; true if one was seen. Every
  // 64 polls it yields (so another runnable thread gets the core) and reads the clock.
  bool spin_for_job(std::uint64_t seen) const {
    if (spin_ns_ <= 0) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns_);
    for (unsigned i = 1;; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen || quit_.load(std::memory_order_relaxed)) return true;
      if (i % 64 == 0) {
        std::this_thread::yield();
        if (std::chrono::steady_clock::now() >= until) return false;
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }

  void start_workers() {
    quit_.store(false, std::memory_order_relaxed);
    for (int i = 1, n = nthreads_.load(std::memory_order_relaxed); i < n; ++i)
      workers_.emplace_back([this] {
        in_worker() = true;
        std::uint64_t seen = generation_.load(std::memory_order_relaxed);
        for (;;) {
          Job* job = nullptr;
          spin_for_job(seen);
          {
            std::unique_lock<std::mutex> lk(mu_);
            auto ready = [&] {
              return quit_.load(std::memory_order_relaxed) ||
                     (job_ != nullptr && generation_.load(std::memory_order_relaxed) != seen);
            };
            if (!ready()) {
              ++sleepers_;
              cv_.wait(lk, ready);
              --sleepers_;
            }
            if (quit_.load(std::memory_order_relaxed)) return;
            seen = generation_.load(std::memory_order_relaxed);
            job = job_;
            job->active.fetch_add(1, std::memory_order_acq_rel);
          }
          work(*job);
          job->active.fetch_sub(1, std::memory_order_acq_rel);
        }
      });
  }
  void stop_workers() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_.store(true, std::memory_order_relaxed);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  // Written under run_mu_ (set_num_threads); read without it by the serial-or-parallel test of every loop, and by
  // num_threads(). A loop that saw a stale count only splits differently: run_parallel works under run_mu_.
  std::atomic<int> nthreads_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_;
  const std::int64_t spin_ns_;
  // job_, generation_'s changes and sleepers_ are under mu_; generation_ and quit_ are also polled without it.
  Job* job_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> quit_{false};
  int sleepers_ = 0;
};

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE ThreadPool& ThreadPool::instance() {
  static ThreadPool* p = new ThreadPool(default_threads());  // never destroyed: workers may run at exit
  return *p;
}

[[gnu::noinline]] EMBER_HEADER_INLINE void ThreadPool::run_parallel(std::int64_t begin, std::int64_t end,
                                                                   std::int64_t grain, RangeFn call, const void* fn) {
  const std::int64_t n = end - begin;
  const std::int64_t maxchunks = (n + grain - 1) / std::max<std::int64_t>(grain, 1);
  std::unique_lock<std::mutex> run(run_mu_);  // one parallel loop at a time; nested calls run serially
  const std::int64_t nchunks = std::min<std::int64_t>(maxchunks, nthreads_.load(std::memory_order_relaxed) * 4);
  Job job;
  job.call = call;
  job.fn = fn;
  job.begin = begin;
  job.end = end;
  job.step = (n + nchunks - 1) / nchunks;
  job.nchunks = nchunks;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &job;
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;  // a worker still polling sees the new generation by itself
  }
  if (wake) cv_.notify_all();
  // The caller works too; a parallel_for nested in its chunks must run serially, as in the workers (taking
  // run_mu_ again would deadlock).
  in_worker() = true;
  work(job);
  in_worker() = false;
  // Wait for workers to finish the chunks they took.
  while (job.done.load(std::memory_order_acquire) < nchunks) std::this_thread::yield();
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = nullptr;
  }
  while (job.active.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  if (job.error) std::rethrow_exception(job.error);
}
#endif

inline void set_num_threads(int n) { ThreadPool::instance().set_num_threads(n); }
inline int get_num_threads() { return ThreadPool::instance().num_threads(); }

template <class F>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const F& fn) {
  ThreadPool::instance().parallel_for(begin, end, grain, fn);
}

}  // namespace ember::cpu
