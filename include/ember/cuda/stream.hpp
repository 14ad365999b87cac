// ember — CUDA streams and events. Each thread has a current stream per device (the default stream until set); ember
// launches its kernels and library calls on it. Stream and Event are shared handles, like tensors.
#pragma once

#include "ember/config.hpp"

#if EMBER_WITH_CUDA
#include <array>
#include <memory>

#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"

namespace ember::cuda {

inline constexpr int kMaxDevices = 16;

/// A CUDA stream on one device. Streams made by Stream::create are destroyed with their last handle; the default
/// stream (handle nullptr) is never destroyed.
class Stream {
 public:
  /// The default (legacy) stream of device `index`.
  static Stream default_stream(int index) { return Stream(index, nullptr); }
  /// A new non-blocking stream on device `index` (the current device by default).
  static Stream create(int index = -1, bool high_priority = false) {
    if (index < 0) index = current_device();
    DeviceGuard g(index);
    int lo = 0, hi = 0;
    EMBER_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t s = nullptr;
    EMBER_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? hi : lo));
    Stream r(index, s);
    r.owner_ = std::shared_ptr<void>(s, [index](void* p) {
      int prev = 0;
      if (cudaGetDevice(&prev) != cudaSuccess) prev = index;
      EMBER_CUDA_WARN(cudaSetDevice(index));
      EMBER_CUDA_WARN(cudaStreamDestroy(static_cast<cudaStream_t>(p)));
      EMBER_CUDA_WARN(cudaSetDevice(prev));
    });
    return r;
  }

  /// The raw cudaStream_t, for CUDA calls of your own (PyTorch's stream.cuda_stream).
  cudaStream_t handle() const { return s_; }
  /// The index of the stream's device.
  int device_index() const { return dev_; }
  /// The stream's device, Device::cuda(device_index()).
  Device device() const { return Device::cuda(dev_); }
  /// Blocks the host until all work queued on this stream is done.
  void synchronize() const { EMBER_CUDA_CHECK(cudaStreamSynchronize(s_)); }
  /// True when all work queued on this stream is done.
  bool query() const {
    const cudaError_t e = cudaStreamQuery(s_);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    EMBER_CUDA_CHECK(e);
    return true;
  }
  /// The same CUDA stream on the same device.
  friend bool operator==(const Stream& a, const Stream& b) { return a.s_ == b.s_ && a.dev_ == b.dev_; }

 private:
  Stream(int index, cudaStream_t s) : s_(s), dev_(index) {}
  cudaStream_t s_ = nullptr;
  int dev_ = 0;
  std::shared_ptr<void> owner_;
};

namespace detail {
inline std::array<Stream, kMaxDevices>& current_streams() {
  thread_local std::array<Stream, kMaxDevices> cur = [] {
    std::array<Stream, kMaxDevices> a{Stream::default_stream(0), Stream::default_stream(1), Stream::default_stream(2),
                                      Stream::default_stream(3), Stream::default_stream(4), Stream::default_stream(5),
                                      Stream::default_stream(6), Stream::default_stream(7), Stream::default_stream(8),
                                      Stream::default_stream(9), Stream::default_stream(10), Stream::default_stream(11),
                                      Stream::default_stream(12), Stream::default_stream(13), Stream::default_stream(14),
                                      Stream::default_stream(15)};
    return a;
  }();
  return cur;
}
}  // namespace detail

/// The stream ember uses on device `index` (the current device by default) in this thread.
inline Stream current_stream(int index = -1) {
  if (index < 0) index = current_device();
  EMBER_CHECK(index >= 0 && index < kMaxDevices, "cuda::current_stream: device index ", index, " out of range");
  return detail::current_streams()[index];
}

/// Makes `s` the current stream of its device in this thread.
inline void set_current_stream(const Stream& s) { detail::current_streams()[s.device_index()] = s; }

/// Makes a stream current (and its device the current device) for a scope.
class StreamGuard {
 public:
  /// Makes `s` current (and its device) until the guard is destroyed, then restores both (torch.cuda.stream(s)).
  explicit StreamGuard(const Stream& s) : dev_(s.device_index()), prev_(current_stream(s.device_index())) {
    set_current_stream(s);
  }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  ~StreamGuard() { set_current_stream(prev_); }

 private:
  DeviceGuard dev_;
  Stream prev_;
};

/// A CUDA event: marks a point in a stream; other streams or the host can wait for it, and two timed events give
/// the milliseconds between them.
class Event {
 public:
  /// A new event; timing = true lets elapsed_ms() measure between two of them (torch.cuda.Event(enable_timing)).
  explicit Event(bool timing = false) {
    cudaEvent_t e = nullptr;
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    e_ = std::shared_ptr<CUevent_st>(e, [](cudaEvent_t p) { EMBER_CUDA_WARN(cudaEventDestroy(p)); });
  }
  /// Marks the current end of stream `s`'s queued work (PyTorch's event.record(stream)).
  void record(const Stream& s) { EMBER_CUDA_CHECK(cudaEventRecord(e_.get(), s.handle())); }
  /// Marks the current end of the current stream's queued work.
  void record() { record(current_stream()); }
  /// Makes `s` wait (on the device) until the work before this event is done.
  void block(const Stream& s) const { EMBER_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), e_.get(), 0)); }
  /// Blocks the host until the work before the event is done.
  void synchronize() const { EMBER_CUDA_CHECK(cudaEventSynchronize(e_.get())); }
  /// True when the work before the event is done (without waiting).
  bool query() const {
    const cudaError_t r = cudaEventQuery(e_.get());
    if (r == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    EMBER_CUDA_CHECK(r);
    return true;
  }
  /// Milliseconds from this event to `end` (both created with timing = true and recorded).
  float elapsed_ms(const Event& end) const {
    float ms = 0;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, e_.get(), end.e_.get()));
    return ms;
  }
  /// The raw cudaEvent_t, for CUDA calls of your own.
  cudaEvent_t handle() const { return e_.get(); }

 private:
  std::shared_ptr<CUevent_st> e_;
};

}  // namespace ember::cuda

#endif  // EMBER_WITH_CUDA
