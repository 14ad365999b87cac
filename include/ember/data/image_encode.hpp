// ember — image encoding, for the tools that write image datasets: JPEG through libjpeg-turbo's compressor (packing
// shards at a maximum side length, cutting photo windows) and PNG through libspng (lossless, e.g. Fashion-MNIST as PNG
// files). Errors are ember::Error, never libjpeg's exit(). Link ember::image.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <spng.h>

#include "ember/config.hpp"

namespace ember::data {

namespace detail {
struct JpegEncodeError {
  jpeg_error_mgr mgr;  // first: cinfo->err points at it
  std::jmp_buf jump;
  char text[JMSG_LENGTH_MAX] = {};
};
inline void jpeg_encode_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegEncodeError*>(c->err);
  (*c->err->format_message)(c, e->text);
  std::longjmp(e->jump, 1);
}

// The libjpeg calls of encode_jpeg, with the error handler armed (no object with a destructor in this frame).
inline bool jpeg_compress_guarded(jpeg_compress_struct& ci, JpegEncodeError& err, const std::uint8_t* px,
                                  std::int64_t H, std::int64_t W, int C, int quality, unsigned char** out,
                                  unsigned long* size) {
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_compress(&ci);
    return false;
  }
  jpeg_create_compress(&ci);
  jpeg_mem_dest(&ci, out, size);
  ci.image_width = JDIMENSION(W);
  ci.image_height = JDIMENSION(H);
  ci.input_components = C;
  ci.in_color_space = C == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&ci);
  jpeg_set_quality(&ci, quality, TRUE);
  ci.dct_method = JDCT_ISLOW;
  jpeg_start_compress(&ci, TRUE);
  while (ci.next_scanline < ci.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(px + std::size_t(ci.next_scanline) * std::size_t(W) * std::size_t(C));
    jpeg_write_scanlines(&ci, &row, 1);
  }
  jpeg_finish_compress(&ci);
  jpeg_destroy_compress(&ci);
  return true;
}
}  // namespace detail

/// Encodes an (H, W, C) image of bytes (C = 1 or 3) as a baseline JPEG of the given quality (1-100), 4:2:0 for colour
/// as cjpeg's default.
inline std::vector<unsigned char> encode_jpeg(const std::uint8_t* px, std::int64_t H, std::int64_t W, int C,
                                              int quality = 90) {
  EMBER_CHECK(C == 1 || C == 3, "encode_jpeg: 1 or 3 channels, got ", C);
  EMBER_CHECK(H > 0 && W > 0 && H <= 65500 && W <= 65500, "encode_jpeg: a ", W, "x", H,
              " image is outside JPEG's 1..65500 pixels a side");
  EMBER_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality must be in [1, 100], got ", quality);
  jpeg_compress_struct ci{};
  detail::JpegEncodeError err{};
  ci.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = &detail::jpeg_encode_error_exit;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const bool ok = detail::jpeg_compress_guarded(ci, err, px, H, W, C, quality, &buf, &size);
  std::vector<unsigned char> out;
  if (ok) out.assign(buf, buf + size);
  std::free(buf);  // jpeg_mem_dest's buffer (malloc'd)
  EMBER_CHECK(ok, "encode_jpeg: libjpeg failed: ", err.text);
  return out;
}

/// Encodes an (H, W, C) image of bytes (C = 1 or 3) as an 8-bit PNG.
inline std::vector<unsigned char> encode_png(const std::uint8_t* px, std::int64_t H, std::int64_t W, int C) {
  EMBER_CHECK(C == 1 || C == 3, "encode_png: 1 or 3 channels, got ", C);
  EMBER_CHECK(H > 0 && W > 0 && H <= 0x7fffffff && W <= 0x7fffffff, "encode_png: a ", W, "x", H, " image");
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  EMBER_CHECK(ctx != nullptr, "encode_png: libspng could not create an encoder");
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = std::uint32_t(W);
  ihdr.height = std::uint32_t(H);
  ihdr.bit_depth = 8;
  ihdr.color_type = C == 1 ? SPNG_COLOR_TYPE_GRAYSCALE : SPNG_COLOR_TYPE_TRUECOLOR;
  int ret = spng_set_ihdr(ctx, &ihdr);
  if (ret == 0)
    ret = spng_encode_image(ctx, px, std::size_t(H) * std::size_t(W) * std::size_t(C), SPNG_FMT_PNG,
                            SPNG_ENCODE_FINALIZE);
  std::vector<unsigned char> out;
  if (ret == 0) {
    std::size_t len = 0;
    int err = 0;
    void* buf = spng_get_png_buffer(ctx, &len, &err);
    ret = err;
    if (buf && err == 0) out.assign(static_cast<unsigned char*>(buf), static_cast<unsigned char*>(buf) + len);
    std::free(buf);
  }
  spng_ctx_free(ctx);
  EMBER_CHECK(ret == 0, "encode_png: libspng failed: ", spng_strerror(ret));
  return out;
}

}  // namespace ember::data
