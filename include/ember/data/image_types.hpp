// ember — the vocabulary of image decoding (data/image.hpp): what a file's header says, the limits a decoder holds
// untrusted files to, and a decoded 8-bit image. No library dependency: datasets and transforms use these types
// without including libjpeg or libspng.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ember/config.hpp"

namespace ember::data {

enum class ImageFormat { unknown, jpeg, png };

inline const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::jpeg: return "JPEG";
    case ImageFormat::png: return "PNG";
    default: return "unknown";
  }
}

/// What an image file's header says.
struct ImageInfo {
  ImageFormat format = ImageFormat::unknown;  ///< JPEG, PNG, or unknown.
  ///@{
  /// The image's size in pixels.
  std::int64_t width = 0, height = 0;
  ///@}
  int channels = 0;          ///< components stored in the file (1 grey, 2 grey + alpha, 3 colour, 4 RGBA or CMYK)
  int bit_depth = 8;         ///< bits per sample (PNG: 1 to 16; JPEG: 8)
  bool progressive = false;  ///< a progressive JPEG or an interlaced (Adam7) PNG
};

/// Limits that every decoded file is held to: files are untrusted, and a small file can declare a huge image.
struct ImageDecodeOptions {
  /// Most pixels (width * height) an image may declare; checked on the header, before any allocation for the
  /// image. The default is PIL's Image.MAX_IMAGE_PIXELS (above it PIL warns of a decompression bomb).
  std::uint64_t max_pixels = 89'478'485;
  std::size_t max_file_bytes = std::size_t(1) << 30;  ///< largest encoded file read or decoded
  int max_jpeg_scans = 1000;  ///< progressive JPEG scans (a file of thousands of tiny scans is a CPU bomb)
  /// PNG: largest ancillary chunk (iCCP, zTXt, iTXt, ...) and total memory of the chunks libspng keeps.
  std::size_t max_png_chunk_bytes = std::size_t(16) << 20;
};

/// A decoded 8-bit image, or a window of one: `height` rows of width * channels interleaved samples, `stride` bytes
/// apart. The pixel (x, y) of the (scaled) full image is at data[(y - y0) * stride + (x - x0) * channels].
struct DecodedImage {
  const std::uint8_t* data = nullptr;  ///< The first sample of the first row.
  ///@{
  /// The window's size in pixels.
  std::int64_t width = 0, height = 0;
  ///@}
  int channels = 0;           ///< Interleaved samples per pixel (1 grey, 3 RGB).
  std::ptrdiff_t stride = 0;  ///< Bytes from one row to the next.
  ///@{
  /// Where the window starts in the full (scaled) image.
  std::int64_t x0 = 0, y0 = 0;                  // where the window starts in the full (scaled) image
  ///@}
  ///@{
  /// The full image at the decoded scale.
  std::int64_t full_width = 0, full_height = 0;  // the full image at the decoded scale
  ///@}
};

namespace detail {
/// Refuses a header whose dimensions are zero or whose pixel count exceeds the limit.
inline void check_image_size(const ImageInfo& info, std::string_view name, const ImageDecodeOptions& opt) {
  EMBER_CHECK(info.width > 0 && info.height > 0, "decode_image: ", ember::detail::quote_untrusted(name, 4096),
              " declares an empty image (", info.width, "x", info.height, ")");
  const std::uint64_t px = std::uint64_t(info.width) * std::uint64_t(info.height);
  EMBER_CHECK(px <= opt.max_pixels, "decode_image: ", ember::detail::quote_untrusted(name, 4096), " declares a ",
              info.width, "x", info.height, " ", image_format_name(info.format), " image (", px,
              " pixels), more than the limit of ", opt.max_pixels,
              " (ImageDecodeOptions::max_pixels; a decompression bomb?)");
}

/// round(a * b / 255) for 8-bit a and b, as Pillow's MULDIV255.
constexpr int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return (t + (t >> 8)) >> 8;
}

/// Greyscale from RGB by ITU-R 601-2 luma, in Pillow's fixed point (its convert("L")).
constexpr std::uint8_t rgb_to_luma(int r, int g, int b) {
  return std::uint8_t((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}
}  // namespace detail

}  // namespace ember::data
