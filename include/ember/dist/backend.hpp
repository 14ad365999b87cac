// ember — the interface every backend implements (shm, tcp, mpi, nccl) and the machinery they share: a progress
// thread per group that runs the queued collectives in call order (so a collective started from a gradient hook
// overlaps the rest of backward), the reduction of 16-bit floats in float, and the group's broken state: after a
// failure every later collective fails at once with the first error, and the peers are told so they fail too.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/storage.hpp"
#include "ember/dist/detail/reduce.hpp"
#include "ember/dist/socket.hpp"
#include "ember/dist/work.hpp"
#include "ember/profile/range.hpp"

namespace ember::dist::detail {

/// One collective call, type-erased. all_gather: `in` is this rank's part, `out` world parts; reduce_scatter: `in`
/// world parts, `out` this rank's; the others use `out` only (in place).
struct Request {
  CollectiveKind kind = CollectiveKind::AllReduce;
  Buffer out, in;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
};

class Collectives;

/// How long a rank waiting in a collective keeps polling before it sleeps (microseconds), for the collective running
/// on this thread: long when the caller waits for it anyway (an inline collective), short on the progress thread,
/// whose polling would take a core from the computation it is meant to overlap. EMBER_DIST_SPIN_US overrides both.
inline int& spin_budget_us() {
  thread_local int us = 200;
  return us;
}
inline int spin_override_us() {
  static const int v = [] {
    return int(ember::detail::env_int("dist", "EMBER_DIST_SPIN_US", -1, 0, 1000000));
  }();
  return v;
}

/// Which collective of which group a channel serves; the message prefix ("dist::all_reduce (rank 1 of 3, tcp)") is
/// only formed when an error needs it.
struct CallContext {
  const Collectives* group = nullptr;
  CollectiveKind kind = CollectiveKind::AllReduce;
  inline std::string str() const;
};

class Collectives {
 public:
  Collectives(int rank, int world, std::chrono::milliseconds timeout)
      : rank_(rank), world_(world), timeout_ms_(timeout.count()) {}
  virtual ~Collectives() = default;
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }
  /// (Any thread, at any time: the collectives that start afterwards use it.)
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_.store(t.count()); }
  virtual const char* name() const = 0;
  /// Whether this backend takes tensors on device d (the CPU backends: CPU tensors).
  virtual bool handles(Device d) const { return d.is_cpu(); }

  /// Queues the collective on the progress thread (the NCCL backend enqueues on its stream instead). A small one
  /// (at most inline_bytes(), 64 KiB by default or EMBER_DIST_INLINE_BYTES) that finds nothing queued or running
  /// runs at once on the calling thread instead, which saves two thread hand-offs (tens of microseconds): its Work
  /// is complete when submit returns.
  virtual Work submit(Request r) {
    // The inline path takes no lock: `running_` is the right to execute, `queued_` mirrors the queue's length. The
    // progress thread takes `running_` before it pops a job, so a job popped but not started is never overtaken.
    // (Both atomics are sequentially consistent: release_running's store-then-load against the progress thread's
    // increment-then-compare-exchange must not lose a wake-up.)
    if (r.out.bytes() + r.in.bytes() <= inline_bytes_ && queued_.load() == 0) {
      bool idle = false;
      if (running_.compare_exchange_strong(idle, true)) {
        if (queued_.load() == 0) {
          std::exception_ptr err;
          const int spin = spin_budget_us();
          spin_budget_us() = spin_override_us() >= 0 ? spin_override_us() : 2000;
          try {
            execute(r);
          } catch (...) {
            err = std::current_exception();
          }
          spin_budget_us() = spin;
          release_running();
          if (!err) return Work(completed());
          auto st = std::make_shared<WorkState>();
          st->finish(err);
          return Work(st);
        }
        release_running();  // something was queued meanwhile: queue behind it
      }
    }
    auto st = std::make_shared<WorkState>();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!thread_.joinable()) thread_ = std::thread([this] { progress_loop(); });
      queue_.emplace_back(std::move(r), st);
      queued_.fetch_add(1);
    }
    cv_.notify_all();
    return Work(st);
  }
  std::size_t inline_bytes() const { return inline_bytes_; }
  void set_inline_bytes(std::size_t n) { inline_bytes_ = n; }

  /// "dist::all_reduce (rank 1 of 3, tcp)".
  std::string context(CollectiveKind k) const {
    return std::string("dist::") + collective_name(k) + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(world_) + ", " + name() + ")";
  }

 protected:
  // The collectives themselves, on the progress thread, for world >= 2 and dtypes other than half/bfloat16 where
  // a reduction is involved (those arrive as float). `seq` counts the group's collectives.
  virtual void all_reduce(const Buffer& b, ReduceOp op, Deadline d, std::uint64_t seq) = 0;
  virtual void broadcast(const Buffer& b, int root, Deadline d, std::uint64_t seq) = 0;
  virtual void all_gather(const Buffer& out, const Buffer& in, Deadline d, std::uint64_t seq) = 0;
  virtual void reduce_scatter(const Buffer& out, const Buffer& in, ReduceOp op, Deadline d, std::uint64_t seq) = 0;
  virtual void barrier(Deadline d, std::uint64_t seq) = 0;
  /// Makes the peers' collectives fail soon (closes connections, raises a shared flag) and leaves `why` for them.
  virtual void abort_peers(const std::string& why) noexcept = 0;

  /// Stops the progress thread, failing what is still queued; derived destructors call it first.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Runs one request (also used directly by backends without a progress thread).
  inline void execute(const Request& r);

  int rank_, world_;
  std::atomic<std::chrono::milliseconds::rep> timeout_ms_;

 private:
  /// The state every successful inline collective shares (done, no error; never changed again).
  static const std::shared_ptr<WorkState>& completed() {
    static const std::shared_ptr<WorkState> s = [] {
      auto w = std::make_shared<WorkState>();
      w->done = true;
      return w;
    }();
    return s;
  }
  static std::size_t default_inline_bytes() {
    return std::size_t(ember::detail::env_int("dist", "EMBER_DIST_INLINE_BYTES", 64 << 10, 0, 1LL << 40));
  }
  // Gives up the right to execute; wakes the progress thread if a job waits for it.
  void release_running() {
    running_.store(false);
    if (queued_.load() > 0) {
      { std::lock_guard<std::mutex> lk(mu_); }  // (the progress thread is in its wait, or will see running_ false)
      cv_.notify_all();
    }
  }
  void progress_loop() {
    spin_budget_us() = spin_override_us() >= 0 ? spin_override_us() : 200;
    for (;;) {
      std::pair<Request, std::shared_ptr<WorkState>> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] {
          if (queue_.empty()) return stopping_;
          bool idle = false;
          return stopping_ || running_.compare_exchange_strong(idle, true);
        });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1);
        if (stopping_) {
          lk.unlock();
          job.second->finish(std::make_exception_ptr(
              Error(context(job.first.kind) + ": the process group was destroyed before this collective ran")));
          continue;
        }
      }
      std::exception_ptr err;
      try {
        execute(job.first);
      } catch (...) {
        err = std::current_exception();
      }
      job.first = Request{};  // drop the tensors before the waiter wakes up
      release_running();
      job.second->finish(err);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Request, std::shared_ptr<WorkState>>> queue_;
  std::thread thread_;
  bool stopping_ = false;
  std::atomic<bool> running_{false};  // a collective is executing (on the progress thread or inline)
  std::atomic<int> queued_{0};        // queue_.size(), readable without the lock
  std::size_t inline_bytes_ = default_inline_bytes();
  std::uint64_t seq_ = 0;
  std::string broken_;  // the first failure; set once (progress thread only)
};

inline std::string CallContext::str() const { return group->context(kind); }

inline void Collectives::execute(const Request& r) {
  if (!broken_.empty())
    throw Error(context(r.kind) + ": the process group is broken since an earlier collective failed (" + broken_ +
                "); create a new group");
  const std::uint64_t seq = seq_++;
  profile::Range range(collective_name(r.kind), "collective");  // on the thread that runs it
  const Deadline d = deadline_in(timeout());
  try {
    const bool narrow16 = r.out.dtype == ScalarType::Half || r.out.dtype == ScalarType::BFloat16;
    const bool reduces = r.kind == CollectiveKind::AllReduce || r.kind == CollectiveKind::ReduceScatter;
    if (world_ == 1) {  // nothing to exchange; reduce_scatter and all_gather copy, Avg of one value is itself
      if ((r.kind == CollectiveKind::AllGather || r.kind == CollectiveKind::ReduceScatter) && r.out.data != r.in.data &&
          r.out.bytes() > 0) {
        if (r.out.device.is_cpu() && r.in.device.is_cpu()) {
          std::memcpy(r.out.data, r.in.data, r.out.bytes());
        } else {  // CUDA tensors (this backend takes every device): a device copy on non-owning views
          const std::size_t n = r.out.bytes();
          copy_bytes(std::make_shared<StorageImpl>(r.out.data, n, r.out.device, nullptr), 0,
                     std::make_shared<StorageImpl>(r.in.data, n, r.in.device, nullptr), 0, n);
        }
      }
      return;
    }
    if (narrow16 && reduces) {
      // Reduced in float: widen, reduce, round once at the end.
      auto wide = [](const Buffer& b) {
        Buffer w{nullptr, b.numel, ScalarType::Float, b.device, make_storage(std::size_t(b.numel) * 4, Device::cpu())};
        w.data = w.keep->data;
        widen(static_cast<float*>(w.data), b.data, std::size_t(b.numel), b.dtype);
        return w;
      };
      if (r.kind == CollectiveKind::AllReduce) {
        Buffer w = wide(r.out);
        all_reduce(w, r.op, d, seq);
        narrow(r.out.data, static_cast<const float*>(w.data), std::size_t(w.numel), r.out.dtype);
      } else {
        Buffer wi = wide(r.in);
        Buffer wo{nullptr, r.out.numel, ScalarType::Float, r.out.device,
                  make_storage(std::size_t(r.out.numel) * 4, Device::cpu())};
        wo.data = wo.keep->data;
        reduce_scatter(wo, wi, r.op, d, seq);
        narrow(r.out.data, static_cast<const float*>(wo.data), std::size_t(wo.numel), r.out.dtype);
      }
      return;
    }
    switch (r.kind) {
      case CollectiveKind::AllReduce: all_reduce(r.out, r.op, d, seq); break;
      case CollectiveKind::Broadcast: broadcast(r.out, r.root, d, seq); break;
      case CollectiveKind::AllGather: all_gather(r.out, r.in, d, seq); break;
      case CollectiveKind::ReduceScatter: reduce_scatter(r.out, r.in, r.op, d, seq); break;
      case CollectiveKind::Barrier: barrier(d, seq); break;
    }
  } catch (const std::exception& e) {
    broken_ = e.what();
    abort_peers(e.what());
    throw;
  }
}

}  // namespace ember::dist::detail
