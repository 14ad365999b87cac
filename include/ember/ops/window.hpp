// ember — options of the sliding-window ops (convolution and pooling), named as in PyTorch, and the output
// size rules they share.
#pragma once

#include <cstdint>
#include <string>

#include "ember/config.hpp"

namespace ember {

/// A (height, width) pair; one number means both, as PyTorch's `int or (int, int)` arguments.
struct Size2 {
  std::int64_t h = 0, w = 0;
  Size2() = default;
  Size2(std::int64_t v) : h(v), w(v) {}  // NOLINT: implicit on purpose (`.padding = 1`)
  Size2(std::int64_t h_, std::int64_t w_) : h(h_), w(w_) {}
  /// "(3, 3)", as error messages print it.
  std::string str() const { return "(" + std::to_string(h) + ", " + std::to_string(w) + ")"; }
  friend bool operator==(const Size2& a, const Size2& b) { return a.h == b.h && a.w == b.w; }
};

/// torch.nn.functional.conv2d's options: `conv2d(x, w, b, {.stride = 2, .padding = 1})`.
struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;  ///< zeros added on both sides
  Size2 dilation = 1;
  std::int64_t groups = 1;  ///< in and out channels split into this many independent groups
};

/// Options of max_pool2d and avg_pool2d.
struct Pool2dOptions {
  Size2 stride = 0;  ///< 0 = same as the kernel, as PyTorch
  Size2 padding = 0;  ///< implicit -inf (max) or zero (avg) padding on both sides; at most half the kernel
  Size2 dilation = 1;  ///< max pool only
  bool ceil_mode = false;  ///< round the output size up (a last window may start in the right/bottom padding)
  bool count_include_pad = true;  ///< avg pool only: padded zeros count in the divisor
};

namespace detail {
/// Output extent of a window op along one dim (PyTorch's rule): windows of effective size d*(k-1)+1 with stride
/// s over the input padded by p on both sides; with ceil_mode the last window may be partial but must start
/// inside the input or the left padding.
inline std::int64_t window_out_size(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d,
                                    bool ceil_mode) {
  const std::int64_t span = in + 2 * p - d * (k - 1) - 1;
  if (span < 0) return 0;
  std::int64_t out = (span + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}
}  // namespace detail

}  // namespace ember
