// ember — JPEG decoding through libjpeg-turbo's libjpeg API, for ImageDecoder (data/image.hpp): the header first
// (dimensions checked against the pixel limit before libjpeg allocates for the image), then a decode that can scale
// in the DCT (1/2, 1/4, 1/8: libjpeg computes fewer coefficients) and decode only a window of the image (the MCU
// columns of jpeg_crop_scanline, the rows after jpeg_skip_scanlines). Errors never reach libjpeg's default
// error_exit (which calls exit()): a longjmp-based handler turns them, and the warnings that mean truncated or corrupt
// data, into ember::Error naming the file, as PIL refuses truncated images by default.
// Needs <jpeglib.h> (Debian: libjpeg62-turbo-dev); link libjpeg (CMake: ember::image).
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>

#include "ember/config.hpp"
#include "ember/data/image_types.hpp"

namespace ember::data::detail {

/// One libjpeg decompressor, created once and reused for every image (jpeg_abort_decompress between images keeps
/// its permanent allocations; the image's own working memory is libjpeg's per-image pool).
class JpegDecoder {
 public:
  JpegDecoder() {
    cinfo_.err = jpeg_std_error(&err_.mgr);
    err_.mgr.error_exit = &JpegDecoder::on_error;
    err_.mgr.emit_message = &JpegDecoder::on_message;
    progress_.progress_monitor = &JpegDecoder::on_progress;
    cinfo_.client_data = this;
    // jpeg_create_decompress reports failures through error_exit, which must be able to jump.
    if (setjmp(err_.jump) != 0) {
      created_ = false;
      return;
    }
    jpeg_create_decompress(&cinfo_);
    cinfo_.progress = &progress_;
    created_ = true;
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;
  ~JpegDecoder() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }

  /// Reads the header of `file` (kept in memory by the caller until decode() returns) and checks it against the
  /// limits. The decoder then holds the image open for decode().
  ImageInfo open(std::span<const unsigned char> file, std::string_view name, const ImageDecodeOptions& opt) {
    EMBER_CHECK(created_, "decode_image: libjpeg could not create a decompressor: ", err_.text);
    abort();
    name_ = name;
    opt_ = opt;
    // libjpeg's memory source takes an unsigned long size.
    EMBER_CHECK(file.size() <= opt.max_file_bytes, "decode_image: ", q(), " is ", file.size(),
                " bytes, more than the limit of ", opt.max_file_bytes, " (ImageDecodeOptions::max_file_bytes)");
    const bool ok = guarded([&] {
      jpeg_mem_src(&cinfo_, file.data(), static_cast<unsigned long>(file.size()));
      jpeg_read_header(&cinfo_, TRUE);
    });
    if (!ok) fail("invalid JPEG header");
    open_ = true;
    ImageInfo info;
    info.format = ImageFormat::jpeg;
    info.width = std::int64_t(cinfo_.image_width);
    info.height = std::int64_t(cinfo_.image_height);
    info.channels = cinfo_.num_components;
    info.progressive = cinfo_.progressive_mode != 0;
    const J_COLOR_SPACE cs = cinfo_.jpeg_color_space;
    if (cs == JCS_CMYK || cs == JCS_YCCK) {
      cmyk_ = true;
      adobe_inverted_ = cinfo_.saw_Adobe_marker != 0;
    } else {
      cmyk_ = false;
      EMBER_CHECK(cs == JCS_GRAYSCALE || cs == JCS_YCbCr || cs == JCS_RGB, "decode_image: ", q(),
                  " is a JPEG in colour space ", int(cs), " with ", cinfo_.num_components,
                  " components; supported: greyscale, YCbCr, RGB, CMYK and YCCK");
    }
    check_image_size(info, name, opt);
    info_ = info;
    return info;
  }

  /// Decodes the open image at 1/denom of its size (denom 1, 2, 4 or 8), rows [y0, y0 + h) and at least columns
  /// [x0, x0 + w) of the scaled image (w = 0: every column), as `channels` (1: greyscale, 3: RGB) 8-bit samples.
  /// The columns decoded start at an MCU boundary at or left of x0 (DecodedImage::x0 says where).
  DecodedImage decode(int channels, int denom, std::int64_t x0, std::int64_t y0, std::int64_t w, std::int64_t h,
                      std::vector<std::uint8_t>& out, std::vector<std::uint8_t>& scratch) {
    EMBER_CHECK(open_, "decode_image: no JPEG open (call open() first)");
    EMBER_CHECK(channels == 1 || channels == 3, "decode_image: channels must be 1 or 3, got ", channels);
    EMBER_CHECK(denom == 1 || denom == 2 || denom == 4 || denom == 8, "decode_image: the JPEG scale must be 1/1, "
                "1/2, 1/4 or 1/8, got 1/", denom);
    // libjpeg converts greyscale to RGB and YCbCr to greyscale itself; CMYK comes out as CMYK and is converted here.
    cinfo_.out_color_space = cmyk_ ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    cinfo_.scale_num = 1;
    cinfo_.scale_denom = unsigned(denom);
    cinfo_.dct_method = JDCT_ISLOW;  // djpeg's default: the accurate integer IDCT
    if (!guarded([&] { jpeg_calc_output_dimensions(&cinfo_); })) fail("cannot scale the JPEG");
    const std::int64_t sw = cinfo_.output_width, sh = cinfo_.output_height;
    if (w <= 0) {
      x0 = 0;
      w = sw;
    }
    if (h <= 0) {
      y0 = 0;
      h = sh;
    }
    EMBER_CHECK(x0 >= 0 && y0 >= 0 && x0 + w <= sw && y0 + h <= sh, "decode_image: the window (", x0, ", ", y0, ", ",
                w, ", ", h, ") is outside the ", sw, "x", sh, " image ", q());
    JDIMENSION cx = JDIMENSION(x0), cw = JDIMENSION(w);
    const bool crop = x0 > 0 || w < sw;
    JDIMENSION skipped = 0;
    if (!guarded([&] {
          jpeg_start_decompress(&cinfo_);
          if (crop) jpeg_crop_scanline(&cinfo_, &cx, &cw);
          if (y0 > 0) skipped = jpeg_skip_scanlines(&cinfo_, JDIMENSION(y0));
        }))
      fail("corrupt JPEG data");
    EMBER_CHECK(std::int64_t(skipped) == y0, "decode_image: ", q(), ": libjpeg skipped ", skipped, " rows of ", y0);
    const int comps = cinfo_.output_components;
    const std::size_t row = std::size_t(cw) * std::size_t(comps);
    std::vector<std::uint8_t>& raw = cmyk_ ? scratch : out;
    raw.resize(row * std::size_t(h));
    rows_.resize(std::size_t(h));
    for (std::int64_t r = 0; r < h; ++r) rows_[std::size_t(r)] = raw.data() + std::size_t(r) * row;
    JDIMENSION got = 0;
    const JDIMENSION want = JDIMENSION(h);
    if (!guarded([&] {
          while (got < want) {
            const JDIMENSION n = jpeg_read_scanlines(&cinfo_, rows_.data() + got, want - got);
            if (n == 0) break;
            got += n;
          }
          // A whole image is read to its end marker, so a file cut after its last row is an error too.
          if (got == want && std::int64_t(got) == sh) jpeg_finish_decompress(&cinfo_);
        }))
      fail("corrupt JPEG data");
    EMBER_CHECK(got == want, "decode_image: ", q(), ": libjpeg returned ", got, " of ", want, " rows");
    abort();  // a window stops early; the next open() starts from a clean state either way
    if (cmyk_) cmyk_to(raw, out, std::size_t(cw) * std::size_t(h), channels);
    DecodedImage d;
    d.data = out.data();
    d.width = std::int64_t(cw);
    d.height = h;
    d.channels = channels;
    d.stride = std::ptrdiff_t(std::size_t(cw) * std::size_t(channels));
    d.x0 = std::int64_t(cx);
    d.y0 = y0;
    d.full_width = sw;
    d.full_height = sh;
    return d;
  }

  /// Ends the open image, if any.
  void abort() {
    if (open_ && created_) jpeg_abort_decompress(&cinfo_);
    open_ = false;
  }

 private:
  struct ErrorManager {
    jpeg_error_mgr mgr;  // first: libjpeg's cinfo->err points at it
    std::jmp_buf jump;
    char text[JMSG_LENGTH_MAX] = {};
  };

  static JpegDecoder& self(j_common_ptr c) { return *static_cast<JpegDecoder*>(c->client_data); }
  static void on_error(j_common_ptr c) {
    JpegDecoder& d = self(c);
    (*c->err->format_message)(c, d.err_.text);
    std::longjmp(d.err_.jump, 1);
  }
  // Warnings (level -1) that mean the image data is truncated or corrupt end the decode; the others (extraneous
  // bytes between markers, unusual JFIF/Adobe markers) are harmless and ignored. Trace messages are ignored.
  static void on_message(j_common_ptr c, int level) {
    if (level >= 0) return;
    switch (c->err->msg_code) {
      case JWRN_JPEG_EOF:          // premature end of the file: truncated
      case JWRN_HIT_MARKER:        // premature end of a data segment
      case JWRN_HUFF_BAD_CODE:     // corrupt entropy-coded data
      case JWRN_MUST_RESYNC:
      case JWRN_NOT_SEQUENTIAL:
      case JWRN_BOGUS_PROGRESSION:
        on_error(c);
        break;
      default:
        break;
    }
  }
  // A progressive file of thousands of tiny scans makes libjpeg work for minutes on a small input.
  static void on_progress(j_common_ptr c) {
    if (!c->is_decompressor) return;
    JpegDecoder& d = self(c);
    const auto* di = reinterpret_cast<j_decompress_ptr>(c);
    if (di->input_scan_number > d.opt_.max_jpeg_scans) {
      std::snprintf(d.err_.text, sizeof(d.err_.text), "more than %d scans (ImageDecodeOptions::max_jpeg_scans)",
                    d.opt_.max_jpeg_scans);
      std::longjmp(d.err_.jump, 1);
    }
  }

  // Runs f, which calls libjpeg and holds no object with a destructor, with the error handler armed. Returns false
  // (the message in err_.text) when libjpeg failed; the decompressor is then aborted and reusable.
  template <class F>
  bool guarded(F&& f) {
    if (setjmp(err_.jump) != 0) {
      jpeg_abort_decompress(&cinfo_);
      open_ = false;
      return false;
    }
    f();
    return true;
  }
  [[noreturn]] void fail(const char* what) {
    open_ = false;
    throw Error(ember::detail::concat("decode_image: ", q(), ": ", what, ": ", err_.text));
  }
  std::string q() const { return ember::detail::quote_untrusted(name_, 4096); }

  // Pillow's CMYK to RGB (255 - C scaled by 255 - K), after undoing Adobe's inverted storage; then greyscale by
  // ITU-R 601-2 luma when one channel is wanted.
  void cmyk_to(const std::vector<std::uint8_t>& cmyk, std::vector<std::uint8_t>& out, std::size_t n, int channels) {
    out.resize(n * std::size_t(channels));
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint8_t* p = cmyk.data() + 4 * i;
      int v[4];
      for (int k = 0; k < 4; ++k) v[k] = adobe_inverted_ ? 255 - p[k] : p[k];
      const int nk = 255 - v[3];
      std::uint8_t rgb[3];
      for (int k = 0; k < 3; ++k) rgb[k] = std::uint8_t(nk - muldiv255(v[k], nk));
      if (channels == 3) {
        out[3 * i] = rgb[0];
        out[3 * i + 1] = rgb[1];
        out[3 * i + 2] = rgb[2];
      } else {
        out[i] = rgb_to_luma(rgb[0], rgb[1], rgb[2]);
      }
    }
  }

  jpeg_decompress_struct cinfo_{};
  ErrorManager err_{};
  jpeg_progress_mgr progress_{};
  std::vector<JSAMPROW> rows_;
  std::string name_;
  ImageDecodeOptions opt_;
  ImageInfo info_;
  bool created_ = false, open_ = false, cmyk_ = false, adobe_inverted_ = false;
};

}  // namespace ember::data::detail
