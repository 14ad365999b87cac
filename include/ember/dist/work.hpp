// ember — what a collective operates on and what it returns: reduction ops, the type-erased buffer a backend sees
// (data, element count, dtype, device), and Work, the handle of an asynchronous collective.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "ember/config.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/storage.hpp"

namespace ember::dist {

/// How all_reduce and reduce_scatter combine the ranks' values (torch.distributed.ReduceOp). Avg needs a floating
/// dtype. On bool tensors Sum and Max are a logical or, Product and Min a logical and.
enum class ReduceOp : std::uint8_t { Sum, Avg, Max, Min, Product };

inline const char* reduce_op_name(ReduceOp op) {
  constexpr const char* names[] = {"sum", "avg", "max", "min", "product"};
  return names[static_cast<int>(op)];
}

/// The collective operations, for messages and the wire header.
enum class CollectiveKind : std::uint8_t { AllReduce, Broadcast, AllGather, ReduceScatter, Barrier };

inline const char* collective_name(CollectiveKind k) {
  constexpr const char* names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  return names[static_cast<int>(k)];
}

/// Bytes per element of a dtype.
inline std::size_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return 4;
    case ScalarType::Double: return 8;
    case ScalarType::Int32: return 4;
    case ScalarType::Int64: return 8;
    case ScalarType::UInt8: return 1;
    case ScalarType::Int8: return 1;
    case ScalarType::Bool: return 1;
    case ScalarType::Half: return 2;
    case ScalarType::BFloat16: return 2;
  }
  return 1;
}
inline bool is_floating(ScalarType t) {
  return t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half || t == ScalarType::BFloat16;
}

/// A contiguous run of elements as a backend sees it: a tensor's data without its type. `keep` holds the memory alive
/// while an asynchronous collective runs.
struct Buffer {
  void* data = nullptr;                  ///< The first element.
  std::int64_t numel = 0;                ///< The number of elements.
  ScalarType dtype = ScalarType::Float;  ///< Their type.
  Device device = Device::cpu();         ///< Where they are.
  Storage keep;                          ///< The tensor's storage, kept alive while the collective runs.

  /// The size in bytes.
  std::size_t bytes() const { return std::size_t(numel) * element_size(dtype); }
};

namespace detail {
/// The shared state of a Work handle.
struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  /// Run by wait() after completion, on the waiting thread (the NCCL backend orders the caller's stream after the
  /// collective here).
  std::function<void()> on_wait;
  /// A collective queued on a GPU stream (NCCL): wait() does not block the host, it orders the caller's current
  /// stream after the collective (on_wait), as PyTorch's work.wait() does; `query` says whether the GPU has finished.
  bool device_async = false;
  std::function<bool()> query;

  /// Throws the collective's error on the calling thread: an ember::Error is thrown as a copy, so the thread that
  /// stored it never shares the exception object with a waiter (whose handler may outlive the progress thread's
  /// reference to it).
  [[noreturn]] static void rethrow(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& x) {
      throw Error(x.what());
    }
  }

  void finish(std::exception_ptr e = nullptr) {
    {
      std::lock_guard<std::mutex> lk(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};
}  // namespace detail

/// The handle of a collective (torch.distributed's Work): it runs in the background, in the order the calls were
/// made; wait() blocks until it has finished and rethrows its error. Copies share the same collective.
class Work {
 public:
  Work() = default;
  /// The handle of the collective whose state is `s` (the process group makes them).
  explicit Work(std::shared_ptr<detail::WorkState> s) : s_(std::move(s)) {}

  /// Whether the handle refers to a collective (a default-constructed one does not).
  bool defined() const { return s_ != nullptr; }
  /// Whether the collective has finished, successfully or not; never blocks.
  bool is_completed() const {
    if (!s_) return true;
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      if (s_->done) return true;
    }
    return s_->device_async && s_->query && s_->query();
  }
  /// Waits until the collective has finished and rethrows its error (an ember::Error naming the collective, the
  /// ranks involved and what happened). The tensors it was given hold the result afterwards.
  void wait() const {
    if (!s_) return;
    if (s_->device_async) {
      std::exception_ptr e;
      {
        std::lock_guard<std::mutex> lk(s_->mu);
        e = s_->error;
      }
      if (e) detail::WorkState::rethrow(e);
      if (s_->on_wait) s_->on_wait();
      return;
    }
    std::exception_ptr e;
    {
      std::unique_lock<std::mutex> lk(s_->mu);
      s_->cv.wait(lk, [&] { return s_->done; });
      e = s_->error;
    }
    if (e) detail::WorkState::rethrow(e);
    if (s_->on_wait) s_->on_wait();
  }
  /// Waits at most `timeout`: true when the collective finished (wait() then returns at once).
  bool wait_for(std::chrono::milliseconds timeout) const {
    if (!s_) return true;
    std::unique_lock<std::mutex> lk(s_->mu);
    return s_->cv.wait_for(lk, timeout, [&] { return s_->done; });
  }
  /// The error of a finished collective (null if it succeeded or has not finished).
  std::exception_ptr exception() const {
    if (!s_) return nullptr;
    std::lock_guard<std::mutex> lk(s_->mu);
    return s_->error;
  }

 private:
  std::shared_ptr<detail::WorkState> s_;
};

}  // namespace ember::dist
