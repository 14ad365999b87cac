// ember — CUDA devices: whether CUDA is usable, how many devices there are, which one is current, and a guard that
// switches devices for a scope. Usable in every build: without EMBER_WITH_CUDA, is_available() is false.
#pragma once

#include "ember/config.hpp"
#include "ember/core/device.hpp"

#if EMBER_WITH_CUDA
#include "ember/cuda/check.hpp"
#endif

namespace ember::cuda {

/// The number of CUDA devices this process can use: 0 without a driver, without a device, or in a CPU-only build.
inline int device_count() noexcept {
#if EMBER_WITH_CUDA
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return c;
  }();
  return n;
#else
  return 0;
#endif
}

/// True when at least one CUDA device can be used (torch.cuda.is_available()).
inline bool is_available() noexcept { return device_count() > 0; }

#if EMBER_WITH_CUDA

/// Throws ember::Error unless `d` names a CUDA device that exists.
inline void check_device(Device d, const char* op) {
  EMBER_CHECK(d.is_cuda(), op, ": expected a CUDA device, got ", d.str());
  const int n = device_count();
  EMBER_CHECK(n > 0, op, ": ", d.str(), " requested but no CUDA device is available");
  EMBER_CHECK(d.index >= 0 && d.index < n, op, ": ", d.str(), " does not exist (this machine has ", n,
              " CUDA device", n == 1 ? "" : "s", ")");
}

inline int current_device() {
  int d = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

inline void set_device(int index) {
  check_device(Device::cuda(index), "cuda::set_device");
  EMBER_CUDA_CHECK(cudaSetDevice(index));
}

/// Makes a device current for a scope and restores the previous one on exit (c10's CUDAGuard).
class DeviceGuard {
 public:
  /// Makes device `index` current until the guard is destroyed (torch.cuda.device(index)).
  explicit DeviceGuard(int index) : prev_(current_device()) {
    if (index != prev_) EMBER_CUDA_CHECK(cudaSetDevice(index));
  }
  /// Makes CUDA device d current until the guard is destroyed.
  explicit DeviceGuard(Device d) : DeviceGuard(d.index) {}
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() { EMBER_CUDA_WARN(cudaSetDevice(prev_)); }

 private:
  int prev_;
};

/// Waits for all work on a device (the current one by default).
inline void synchronize(int index = -1) {
  if (index < 0) {
    EMBER_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  DeviceGuard g(index);
  EMBER_CUDA_CHECK(cudaDeviceSynchronize());
}

#endif  // EMBER_WITH_CUDA

}  // namespace ember::cuda
