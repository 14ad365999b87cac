// ember — PNG decoding through libspng, for ImageDecoder (data/image.hpp): every colour type and bit depth to 8-bit
// RGB or greyscale (palettes expanded, alpha dropped as PIL's convert("RGB") drops it, 16-bit samples cut to their
// high byte as libspng and PIL do for 16-bit colour), interlaced images too. The header is checked against the pixel
// limit before anything is allocated for the image, and libspng's chunk limits refuse a huge iCCP, zTXt or iTXt
// chunk. A window of rows is decoded row by row and the decode stops after its last row.
// Needs <spng.h> (Debian: libspng-dev); link libspng (CMake: ember::image).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spng.h>

#include "ember/config.hpp"
#include "ember/data/image_types.hpp"

namespace ember::data::detail {

/// A libspng decoder. libspng has no way to reset a context, so each image gets a new one (a few hundred bytes and
/// zlib's inflate state); the pixel buffers are the caller's and are reused.
class PngDecoder {
 public:
  PngDecoder() = default;
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;
  ~PngDecoder() { abort(); }

  /// Reads the header of `file` (kept in memory by the caller until decode() returns) and checks it.
  ImageInfo open(std::span<const unsigned char> file, std::string_view name, const ImageDecodeOptions& opt) {
    abort();
    name_ = name;
    EMBER_CHECK(file.size() <= opt.max_file_bytes, "decode_image: ", q(), " is ", file.size(),
                " bytes, more than the limit of ", opt.max_file_bytes, " (ImageDecodeOptions::max_file_bytes)");
    ctx_ = spng_ctx_new(0);
    EMBER_CHECK(ctx_ != nullptr, "decode_image: libspng could not create a context for ", q());
    const std::uint64_t dim = std::min<std::uint64_t>(opt.max_pixels, 0x7fffffffu);
    check(spng_set_image_limits(ctx_, std::uint32_t(dim), std::uint32_t(dim)), "cannot set limits");
    check(spng_set_chunk_limits(ctx_, opt.max_png_chunk_bytes, opt.max_png_chunk_bytes), "cannot set limits");
    check(spng_set_png_buffer(ctx_, file.data(), file.size()), "cannot read");
    spng_ihdr ihdr{};
    check(spng_get_ihdr(ctx_, &ihdr), "invalid PNG header");
    ImageInfo info;
    info.format = ImageFormat::png;
    info.width = ihdr.width;
    info.height = ihdr.height;
    switch (ihdr.color_type) {
      case SPNG_COLOR_TYPE_GRAYSCALE: info.channels = 1; break;
      case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: info.channels = 2; break;
      case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: info.channels = 4; break;
      default: info.channels = 3; break;  // truecolour, indexed
    }
    gray_ = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
    info.bit_depth = ihdr.bit_depth;
    info.progressive = ihdr.interlace_method != 0;
    check_image_size(info, name, opt);
    info_ = info;
    return info;
  }

  /// Decodes rows [y0, y0 + h) (h = 0: every row) of the open image, every column, as `channels` (1: greyscale,
  /// 3: RGB) 8-bit samples into `out`.
  DecodedImage decode(int channels, std::int64_t y0, std::int64_t h, std::vector<std::uint8_t>& out,
                      std::vector<std::uint8_t>& scratch) {
    EMBER_CHECK(ctx_ != nullptr, "decode_image: no PNG open (call open() first)");
    EMBER_CHECK(channels == 1 || channels == 3, "decode_image: channels must be 1 or 3, got ", channels);
    const std::int64_t W = info_.width, H = info_.height;
    if (h <= 0) {
      y0 = 0;
      h = H;
    }
    EMBER_CHECK(y0 >= 0 && y0 + h <= H, "decode_image: rows [", y0, ", ", y0 + h, ") are outside the ", W, "x", H,
                " image ", q());
    // libspng gives greyscale directly only from greyscale of at most 8 bits; the rest goes through RGB.
    const bool direct_gray = channels == 1 && gray_ && info_.bit_depth <= 8;
    const int fmt = direct_gray ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
    const int bpp = direct_gray ? 1 : 3;
    const std::size_t row = std::size_t(W) * std::size_t(bpp);
    out.resize(row * std::size_t(h));
    if (!info_.progressive) {
      check(spng_decode_image(ctx_, nullptr, 0, fmt, SPNG_DECODE_PROGRESSIVE), "corrupt PNG data");
      scratch.resize(row);
      for (std::int64_t r = 0; r < y0 + h; ++r) {
        unsigned char* dst = r < y0 ? scratch.data() : out.data() + std::size_t(r - y0) * row;
        const int ret = spng_decode_row(ctx_, dst, row);
        if (ret == SPNG_EOI && r == H - 1) break;
        check(ret, "corrupt PNG data");
      }
    } else {  // Adam7: rows arrive pass by pass, so decode all of it
      std::size_t len = 0;
      check(spng_decoded_image_size(ctx_, fmt, &len), "corrupt PNG data");
      EMBER_CHECK(len == row * std::size_t(H), "decode_image: ", q(), ": libspng wants ", len, " bytes, expected ",
                  row * std::size_t(H));
      scratch.resize(len);
      check(spng_decode_image(ctx_, scratch.data(), len, fmt, 0), "corrupt PNG data");
      std::copy(scratch.begin() + std::ptrdiff_t(std::size_t(y0) * row),
                scratch.begin() + std::ptrdiff_t(std::size_t(y0 + h) * row), out.begin());
    }
    abort();
    if (channels == 1 && bpp == 3) {  // in place: sample i is written after samples 3i..3i+2 are read
      const std::size_t n = std::size_t(W) * std::size_t(h);
      for (std::size_t i = 0; i < n; ++i) out[i] = rgb_to_luma(out[3 * i], out[3 * i + 1], out[3 * i + 2]);
      out.resize(n);
    }
    DecodedImage d;
    d.data = out.data();
    d.width = W;
    d.height = h;
    d.channels = channels;
    d.stride = std::ptrdiff_t(std::size_t(W) * std::size_t(channels));
    d.x0 = 0;
    d.y0 = y0;
    d.full_width = W;
    d.full_height = H;
    return d;
  }

  void abort() {
    if (ctx_) spng_ctx_free(ctx_);
    ctx_ = nullptr;
  }

 private:
  void check(int ret, const char* what) {
    if (ret == 0) return;
    const std::string msg = ember::detail::concat("decode_image: ", q(), ": ", what, ": ", spng_strerror(ret));
    abort();
    throw Error(msg);
  }
  std::string q() const { return ember::detail::quote_untrusted(name_, 4096); }

  spng_ctx* ctx_ = nullptr;
  std::string name_;
  ImageInfo info_;
  bool gray_ = false;
};

}  // namespace ember::data::detail
