// ember — Device: where a tensor's memory lives. A runtime value, so a model moves with to(device).
#pragma once

#include <string>

#include "ember/config.hpp"

namespace ember {

enum class DeviceType : unsigned char { CPU, CUDA };

/// Where a tensor's memory lives (PyTorch's `torch.device`): the CPU, or CUDA device `index`.
struct Device {
  DeviceType type = DeviceType::CPU;  ///< CPU or CUDA.
  int index = 0;                      ///< The CUDA device's index (0 for the CPU).

  /// The CPU (torch.device("cpu")).
  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  /// CUDA device i (torch.device("cuda", i)).
  static constexpr Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  /// Whether this is the CPU.
  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  /// Whether this is a CUDA device.
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
  /// The same type and index.
  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  /// "cpu" or "cuda:0", as PyTorch prints devices.
  EMBER_HEADER_INLINE std::string str() const;
};

#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}
#endif

}  // namespace ember
