// ember — image decoding: JPEG (libjpeg-turbo) and PNG (libspng) files to 8-bit RGB or greyscale, with the two
// ways of skipping work that make a data loader fast on real photos: decoding a JPEG at 1/2, 1/4 or 1/8 of its size
// in the DCT, and decoding only the window a crop needs.
//
//   data::ImageDecoder dec;                              // one per thread, reused for every image
//   const data::ImageInfo& info = dec.open(bytes, path); // the header: format, size, channels
//   data::DecodedImage img = dec.decode({.scale_denom = 2, .x0 = 10, .y0 = 20, .width = 200, .height = 150});
//   Tensor<std::uint8_t> hwc = data::read_image("cat.jpg");  // (H, W, 3), whole image
//
// Files are untrusted: every failure (not an image, truncated, corrupt, a declared size over
// ImageDecodeOptions::max_pixels, a huge PNG chunk) is an ember::Error naming the file. The format is told by the
// file's first bytes, not its name. Link ember::image (libjpeg and libspng).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/image_jpeg.hpp"
#include "ember/data/image_png.hpp"
#include "ember/data/image_types.hpp"

namespace ember::data {

/// The format of an encoded image, from its first bytes (JPEG: FF D8 FF; PNG: its 8-byte signature).
inline ImageFormat sniff_image_format(std::span<const unsigned char> b) {
  if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::jpeg;
  static constexpr unsigned char png[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (b.size() >= 8 && std::memcmp(b.data(), png, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

/// What to decode of an open image.
struct DecodeWindow {
  int channels = 3;     ///< 3: RGB; 1: greyscale (a colour JPEG's luma as libjpeg computes it, else ITU-R 601-2)
  int scale_denom = 1;  ///< JPEG: decode at 1/1, 1/2, 1/4 or 1/8 of the size (PNG: must be 1)
  ///@{
  /// The window, in pixels of the scaled image; width or height 0: every column or row. A JPEG window starts at the
  /// MCU boundary at or left of x0 and may be wider (DecodedImage::x0 and width say what was decoded); a PNG window
  /// has every column.
  std::int64_t x0 = 0, y0 = 0, width = 0, height = 0;
  ///@}
};

/// The largest JPEG DCT scale 1/d (d = 8, 4, 2, 1) at which a box of box_w x box_h pixels still has at least
/// out_w x out_h pixels: decoding at 1/d then leaves only a downscale of less than 2x to the resampler.
inline int jpeg_scale_for(double box_w, double box_h, std::int64_t out_w, std::int64_t out_h) {
  for (int d = 8; d > 1; d /= 2)
    if (box_w / d >= double(out_w) && box_h / d >= double(out_h)) return d;
  return 1;
}

/// Decodes JPEG and PNG files held in memory. Holds the libjpeg state and the pixel buffers, reused from image to
/// image (in the steady state no allocation of ember's; libjpeg and libspng allocate their per-image working memory
/// themselves). Not thread-safe: one per thread (thread_image_decoder()).
class ImageDecoder {
 public:
  /// A decoder holding every file to the limits `opt`.
  explicit ImageDecoder(ImageDecodeOptions opt = {}) : opt_(opt) {}

  /// Reads the header of `file` and checks it against the limits; `name` (a path) appears in errors. The bytes must
  /// stay valid until decode() returns.
  const ImageInfo& open(std::span<const unsigned char> file, std::string_view name) {
    jpeg_.abort();
    png_.abort();
    info_ = ImageInfo{};
    switch (sniff_image_format(file)) {
      case ImageFormat::jpeg: info_ = jpeg_.open(file, name, opt_); break;
      case ImageFormat::png: info_ = png_.open(file, name, opt_); break;
      default: {
        const std::size_t n = file.size() < 8 ? file.size() : 8;
        EMBER_CHECK(false, "decode_image: ", ember::detail::quote_untrusted(name, 4096), " (", file.size(),
                    " bytes) is neither a JPEG nor a PNG file: it starts with ",
                    ember::detail::quote_untrusted(std::string_view(reinterpret_cast<const char*>(file.data()), n)));
      }
    }
    return info_;
  }

  /// Decodes (a window of) the open image. The result points into the decoder's buffer, valid until the next
  /// decode() or open().
  DecodedImage decode(const DecodeWindow& w = {}) {
    if (info_.format == ImageFormat::jpeg)
      return jpeg_.decode(w.channels, w.scale_denom, w.x0, w.y0, w.width, w.height, out_, scratch_);
    EMBER_CHECK(info_.format == ImageFormat::png, "decode_image: no image open (call open() first)");
    EMBER_CHECK(w.scale_denom == 1, "decode_image: a PNG decodes at full size only (scale 1/", w.scale_denom, ")");
    return png_.decode(w.channels, w.y0, w.height, out_, scratch_);
  }

  /// The header of the image last opened.
  const ImageInfo& info() const { return info_; }
  /// The limits files are held to.
  const ImageDecodeOptions& options() const { return opt_; }
  /// Changes the limits (for the next open()).
  void set_options(const ImageDecodeOptions& o) { opt_ = o; }

 private:
  ImageDecodeOptions opt_;
  ImageInfo info_;
  detail::JpegDecoder jpeg_;
  detail::PngDecoder png_;
  std::vector<std::uint8_t> out_, scratch_;
};

/// This thread's decoder (DataLoader workers each get their own), with the default limits.
inline ImageDecoder& thread_image_decoder() {
  thread_local ImageDecoder d;
  return d;
}

/// Reads the file at `path` into `buf` (resized to the file's size; its capacity is kept between calls). Files over
/// max_bytes are refused before reading; `what` names the caller in errors.
inline void read_file_into(const std::string& path, std::vector<unsigned char>& buf, std::size_t max_bytes,
                           const char* what) {
  // O_NONBLOCK: opening a FIFO (a hostile folder's "image.jpg") must not wait for a writer; it fails below as not a
  // regular file. (Reads of regular files ignore the flag.)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw Error(ember::detail::concat(what, ": cannot open ", ember::detail::quote_untrusted(path, 4096), ": ",
                                      std::strerror(err)));
  }
  struct stat st {};
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = ember::detail::concat("cannot stat it: ", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    error = "it is not a regular file";
  } else if (std::uint64_t(st.st_size) > max_bytes) {
    error = ember::detail::concat("it is ", std::uint64_t(st.st_size), " bytes, more than the limit of ", max_bytes);
  } else {
    buf.resize(std::size_t(st.st_size));
    std::size_t got = 0;
    while (got < buf.size()) {
      const ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = n < 0 ? ember::detail::concat("read failed: ", std::strerror(errno))
                      : std::string("it shrank while being read");
        break;
      }
      got += std::size_t(n);
    }
  }
  ::close(fd);
  if (!error.empty())
    throw Error(ember::detail::concat(what, ": cannot read ", ember::detail::quote_untrusted(path, 4096), ": ", error));
}

/// Decodes a whole image held in memory into a (H, W, channels) tensor of bytes.
inline Tensor<std::uint8_t> decode_image(std::span<const unsigned char> file, std::string_view name = "<memory>",
                                         int channels = 3, ImageDecoder& dec = thread_image_decoder()) {
  dec.open(file, name);
  const DecodedImage d = dec.decode({.channels = channels});
  Tensor<std::uint8_t> t = empty<std::uint8_t>(Shape{d.height, d.width, std::int64_t(channels)});
  for (std::int64_t r = 0; r < d.height; ++r)
    std::memcpy(t.data() + r * d.width * channels, d.data + r * d.stride, std::size_t(d.width * channels));
  return t;
}

/// Reads and decodes the image file at `path` into a (H, W, channels) tensor of bytes.
inline Tensor<std::uint8_t> read_image(const std::string& path, int channels = 3,
                                       ImageDecoder& dec = thread_image_decoder()) {
  std::vector<unsigned char> bytes;
  read_file_into(path, bytes, dec.options().max_file_bytes, "read_image");
  return decode_image(bytes, path, channels, dec);
}

}  // namespace ember::data
