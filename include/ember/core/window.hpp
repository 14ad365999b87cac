// ember — the geometry of a 2-D sliding window (convolution and pooling), one type for both devices: the CPU
// kernels' geometries (cpu::ConvGeometry, cpu::PoolGeometry) and cuDNN's descriptors (cuda::ConvParams,
// cuda::PoolParams, the algorithm cache's cuda::ConvProblem) all carry a Window2d. ops/window.hpp holds the user's
// options (Conv2dOptions, Pool2dOptions) and the output-size rule.
#pragma once

#include <cstdint>

namespace ember {

/// Kernel extent, stride, padding (added on both sides) and dilation of a 2-D window, each as (height, width).
struct Window2d {
  ///@{
  /// The kernel's height and width.
  std::int64_t kh = 1, kw = 1;  // kernel
  ///@}
  ///@{
  /// The stride along the height and the width.
  std::int64_t sh = 1, sw = 1;  // stride
  ///@}
  ///@{
  /// The padding added on both sides, along the height and the width.
  std::int64_t ph = 0, pw = 0;  // padding
  ///@}
  ///@{
  /// The dilation (spacing of the kernel's taps) along the height and the width.
  std::int64_t dh = 1, dw = 1;  // dilation
  ///@}
};

}  // namespace ember
