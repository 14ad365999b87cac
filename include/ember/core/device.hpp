// ember — Device: where a tensor's memory lives. A runtime value, so a model moves with to(device).
#pragma once

#include <string>

#include "ember/config.hpp"

namespace ember {

enum class DeviceType : unsigned char { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static constexpr Device cpu() { return {DeviceType::CPU, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::CUDA, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::CPU; }
  constexpr bool is_cuda() const { return type == DeviceType::CUDA; }
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
