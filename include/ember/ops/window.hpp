// ember — options of the sliding-window ops (convolution and pooling), named as in PyTorch, the Window2d they
// describe (core/window.hpp) and the output size rules they share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ember/config.hpp"
#include "ember/core/window.hpp"

namespace ember {

/// A (height, width) pair; one number means both, as PyTorch's `int or (int, int)` arguments.
struct Size2 {
  ///@{
  /// The height and the width.
  std::int64_t h = 0, w = 0;
  ///@}
  Size2() = default;  ///< (0, 0).
  /// (v, v): `kernel_size = 3`.
  Size2(std::int64_t v) : h(v), w(v) {}  // NOLINT: implicit on purpose (`.padding = 1`)
  /// (h_, w_): `{3, 5}`.
  Size2(std::int64_t h_, std::int64_t w_) : h(h_), w(w_) {}
  /// "(3, 3)", as error messages print it.
  EMBER_COLD std::string str() const {
    // Appended piece by piece: `"(" + std::string&&` trips g++ 12's -Wrestrict false positive at -O3.
    std::string s = "(";
    s += std::to_string(h);
    s += ", ";
    s += std::to_string(w);
    s += ')';
    return s;
  }
  /// The same height and width.
  friend bool operator==(const Size2& a, const Size2& b) { return a.h == b.h && a.w == b.w; }
};

/// torch.nn.functional.conv2d's options after (input, weight, bias), in its order and with its defaults (padding is
/// a number per side; its "same" / "valid" strings are not supported); a Size2 is one value for both dims, or {h, w}:
///   auto y = conv2d(x, w, b, {.stride = 2, .padding = 1});
struct Conv2dOptions {
  Size2 stride = 1;    ///< the window's step, in input positions; >= 1
  Size2 padding = 0;   ///< zeros added on both sides of each spatial dim; >= 0
  Size2 dilation = 1;  ///< the spacing between the kernel's taps (1: adjacent); >= 1
  /// In and out channels split into this many independent groups, >= 1; both channel counts must divide by it.
  std::int64_t groups = 1;
};

/// Options of max_pool2d and avg_pool2d.
struct Pool2dOptions {
  Size2 stride = 0;  ///< 0 = same as the kernel, as PyTorch
  Size2 padding = 0;  ///< implicit -inf (max) or zero (avg) padding on both sides; at most half the kernel
  Size2 dilation = 1;  ///< max pool only
  /// Round the output size up: a last, partial window is added when it starts inside the input or the left
  /// padding, even where the (dilated) kernel is larger than the padded input, as PyTorch.
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< avg pool only: padded zeros count in the divisor
  /// avg pool only: divide every window's sum by this (non-zero) number instead of its size, as PyTorch's
  /// `divisor_override`; none = the window size (see count_include_pad).
  std::optional<std::int64_t> divisor_override = std::nullopt;
};

/// The window of a sliding-window op from its (height, width) arguments.
inline Window2d window2d(Size2 kernel, Size2 stride, Size2 padding, Size2 dilation) {
  return {.kh = kernel.h, .kw = kernel.w, .sh = stride.h, .sw = stride.w, .ph = padding.h, .pw = padding.w,
          .dh = dilation.h, .dw = dilation.w};
}

namespace detail {
/// Output extent of a window op along one dim (PyTorch's pooling_output_shape): windows of effective size
/// d*(k-1)+1 with stride s over the input padded by p on both sides, floor((in + 2p - d(k-1) - 1 [+ s - 1]) / s) + 1
/// (division rounding down, also for a negative numerator); with ceil_mode the last window may be partial, even
/// larger than the padded input, but must start inside the input or the left padding. 0 when no window fits
/// (callers report that as an error).
inline std::int64_t window_out_size(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p, std::int64_t d,
                                    bool ceil_mode) {
  const std::int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  std::int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && out > 0 && (out - 1) * s >= in + p) --out;
  return out > 0 ? out : 0;
}
}  // namespace detail

}  // namespace ember
