// ember — the IDX file format of (Fashion-)MNIST: a big-endian header (two zero bytes, an element type, the
// number of dims, then one uint32 extent per dim) followed by the elements. Files may be gzip-compressed;
// decompression uses zlib when <zlib.h> is available (ember::ember links ZLIB::ZLIB when CMake finds it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"

#if __has_include(<zlib.h>)
#include <zlib.h>
#define EMBER_HAS_ZLIB 1
#else
#define EMBER_HAS_ZLIB 0
#endif

namespace ember::data {

namespace detail {

/// Largest decompressed size read_idx accepts (a guard against decompression bombs): 4 GiB.
inline constexpr std::size_t kMaxIdxBytes = std::size_t(4) << 30;

inline const char* idx_type_name(unsigned t) {
  switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

/// The whole file as bytes; `what` names the caller in errors.
EMBER_HEADER_INLINE std::vector<std::uint8_t> read_file_bytes(const std::string& path, const char* what);

inline bool is_gzip(std::span<const std::uint8_t> b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

/// Test hook: the bytes the last gzip inflation on this thread produced (tests check that a bomb is cut short).
inline thread_local std::size_t gunzip_bytes_inflated = 0;

/// Inflates a gzip stream (concatenated members are allowed, as gunzip allows them) on demand: inflate_to(out, n)
/// appends to `out` until it holds n bytes or the stream ends, so a caller that knows how much it expects never
/// inflates more than that (plus the byte that shows there is more). Memory grows with what the stream really
/// holds, never with what a header claims.
class GzipInflater {
 public:
  EMBER_HEADER_INLINE GzipInflater(std::span<const std::uint8_t> in, std::string name);
  GzipInflater(const GzipInflater&) = delete;
  GzipInflater& operator=(const GzipInflater&) = delete;
#if EMBER_HAS_ZLIB
  ~GzipInflater() { inflateEnd(&zs_); }
#endif

  /// Appends inflated bytes to `out` until out.size() == n or the stream ends (then done() is true).
  EMBER_HEADER_INLINE void inflate_to(std::vector<std::uint8_t>& out, std::size_t n);
  /// Whether the stream has ended (nothing more will be appended).
  bool done() const { return done_; }

 private:
  static constexpr std::size_t kMaxChunk = std::size_t(1) << 30;  // fits uInt
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(ember::detail::concat("read_idx: ", ember::detail::quote_untrusted(name_, 4096), " ", why));
  }
  std::span<const std::uint8_t> in_;
  std::string name_;
  std::size_t consumed_ = 0;
  bool done_ = false;
#if EMBER_HAS_ZLIB
  z_stream zs_{};
#endif
};

/// Inflates a whole gzip stream (concatenated members are allowed), at most `limit` bytes.
EMBER_HEADER_INLINE std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> in, const std::string& name,
                                                     std::size_t limit = kMaxIdxBytes);

/// "0x1f": a byte in hex, for messages.
inline std::string hex_byte(unsigned v) {
  const char* digits = "0123456789abcdef";
  std::string s = "0x";
  if (v > 0xF) s += digits[(v >> 4) & 0xF];
  s += digits[v & 0xF];
  return s;
}

inline std::uint32_t be32(const std::uint8_t* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
}

}  // namespace detail

namespace detail {

/// An IDX header: its size in bytes, the shape it declares and the byte count of that shape.
struct IdxHeader {
  std::size_t size = 0;
  Shape shape;
  std::size_t count = 0;
};

/// Validates the IDX header at the start of `b` (the magic number: two zero bytes, element type 0x08, 1 to 8 dims;
/// the extents: no zero-size product overflow). `b` must hold the whole header; data may follow or not.
EMBER_HEADER_INLINE IdxHeader parse_idx_header(std::span<const std::uint8_t> b, const std::string& name);

}  // namespace detail

/// Parses an IDX image of unsigned bytes (already decompressed) into a tensor of its shape. `name` appears in
/// errors. Validates the magic number (two zero bytes, element type 0x08, 1 to 8 dims), the extents (no zero-size
/// product overflow) and that the data is exactly as long as the header says (truncated or over-long files fail).
EMBER_HEADER_INLINE Tensor<std::uint8_t> parse_idx(std::span<const std::uint8_t> b,
                                                   const std::string& name = "<memory>");

/// Decodes an IDX file held in memory, gzip-compressed (detected by its magic bytes) or plain. A compressed file is
/// inflated only as far as its header says it reaches, plus one byte to see whether more follows: a small file that
/// inflates to gigabytes (a decompression bomb) is rejected after inflating the size its header declares.
EMBER_HEADER_INLINE Tensor<std::uint8_t> decode_idx(std::span<const std::uint8_t> bytes,
                                                    const std::string& name = "<memory>");

/// Reads an IDX file of unsigned bytes (MNIST, Fashion-MNIST), gzip-compressed or plain, into a tensor of the shape
/// its header declares: (N, 28, 28) for images, (N) for labels.
inline Tensor<std::uint8_t> read_idx(const std::string& path) {
  const std::vector<std::uint8_t> bytes = detail::read_file_bytes(path, "read_idx");
  return decode_idx(bytes, path);
}


#if EMBER_HEADER_BODIES
namespace detail {

EMBER_HEADER_INLINE std::vector<std::uint8_t> read_file_bytes(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  EMBER_CHECK(f.good(), what, ": cannot open ", ember::detail::quote_untrusted(path, 4096));
  f.seekg(0, std::ios::end);
  const std::streamoff n = f.tellg();
  EMBER_CHECK(n >= 0, what, ": cannot determine the size of ", ember::detail::quote_untrusted(path, 4096));
  f.seekg(0, std::ios::beg);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n));
  if (n > 0) f.read(reinterpret_cast<char*>(bytes.data()), n);
  EMBER_CHECK(f.good() || (n == 0), what, ": error reading ", ember::detail::quote_untrusted(path, 4096));
  return bytes;
}

EMBER_HEADER_INLINE GzipInflater::GzipInflater(std::span<const std::uint8_t> in, std::string name)
                                               : in_(in), name_(std::move(name)) {
#if EMBER_HAS_ZLIB
  gunzip_bytes_inflated = 0;
  EMBER_CHECK(inflateInit2(&zs_, 15 + 16) == Z_OK, "read_idx: zlib inflateInit2 failed for ",
              ember::detail::quote_untrusted(name_, 4096));
#else
  EMBER_CHECK(false, "read_idx: ", ember::detail::quote_untrusted(name_, 4096),
              " is gzip-compressed, but ember was compiled without zlib (install zlib1g-dev and link ZLIB::ZLIB, "
              "or decompress the file with gunzip)");
#endif
}

EMBER_COLD EMBER_HEADER_INLINE void GzipInflater::inflate_to(std::vector<std::uint8_t>& out, std::size_t n) {
#if EMBER_HAS_ZLIB
  while (!done_ && out.size() < n) {
    // Grow geometrically, but never past n: the output holds what was inflated, not what was promised.
    const std::size_t have = out.size();
    const std::size_t grow = std::min(n - have, std::max<std::size_t>(have, std::size_t(1) << 16));
    out.resize(have + grow);
    std::size_t produced = 0;
    while (!done_ && produced < grow) {
      const std::size_t avail = in_.size() - consumed_;
      const std::size_t want = grow - produced;
      zs_.next_in = const_cast<Bytef*>(in_.data() + consumed_);
      zs_.avail_in = static_cast<uInt>(std::min(avail, kMaxChunk));
      zs_.next_out = out.data() + have + produced;
      zs_.avail_out = static_cast<uInt>(std::min(want, kMaxChunk));
      const uInt in_before = zs_.avail_in, out_before = zs_.avail_out;
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      consumed_ += in_before - zs_.avail_in;
      produced += out_before - zs_.avail_out;
      gunzip_bytes_inflated += out_before - zs_.avail_out;
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        fail(std::string("is not a valid gzip stream (zlib: ") +
             (zs_.msg ? zs_.msg : "error " + std::to_string(rc)) + ")");
      if (rc == Z_STREAM_END) {
        // Another gzip member may follow (gunzip concatenates them); anything else after the last one is ignored.
        if (consumed_ == in_.size() || !is_gzip(in_.subspan(consumed_))) done_ = true;
        else inflateReset(&zs_);
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0 && consumed_ == in_.size()) {
        fail("is a truncated gzip stream (its " + std::to_string(in_.size()) +
             " compressed bytes end before the stream does)");
      }
    }
    out.resize(have + produced);
  }
#else
  (void)out;
  (void)n;
#endif
}

EMBER_HEADER_INLINE std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> in, const std::string& name,
                                                     std::size_t limit) {
  GzipInflater z(in, name);
  std::vector<std::uint8_t> out;
  z.inflate_to(out, limit + 1);
  EMBER_CHECK(out.size() <= limit, "read_idx: ", ember::detail::quote_untrusted(name, 4096),
              " decompresses to more than ", limit, " bytes");
  return out;
}

}  // namespace detail

namespace detail {
EMBER_HEADER_INLINE IdxHeader parse_idx_header(std::span<const std::uint8_t> b, const std::string& name) {
  const std::string q = ember::detail::quote_untrusted(name, 4096);
  EMBER_CHECK(b.size() >= 4, "read_idx: ", q, " is too short for an IDX header (", b.size(),
              " bytes, expected at least 4)");
  EMBER_CHECK(b[0] == 0 && b[1] == 0, "read_idx: ", q, " is not an IDX file (magic number starts with bytes ",
              hex_byte(b[0]), " ", hex_byte(b[1]), ", expected 0x00 0x00)");
  const unsigned type = b[2], ndim = b[3];
  EMBER_CHECK(type == 0x08, "read_idx: ", q, " holds IDX element type ", hex_byte(type), " (", idx_type_name(type),
              "); read_idx reads unsigned bytes (type 0x08)");
  EMBER_CHECK(ndim >= 1 && ndim <= unsigned(kMaxDims), "read_idx: ", q, " declares ", ndim,
              " dimensions; expected 1 to ", kMaxDims);
  IdxHeader h;
  h.size = 4 + 4 * std::size_t(ndim);
  EMBER_CHECK(b.size() >= h.size, "read_idx: ", q, " is truncated inside its header (", b.size(),
              " bytes, the header of ", ndim, " dims needs ", h.size, ")");
  // The extents, their product (the byte count) and the product of the non-zero extents (the largest stride),
  // both bounded: a zero-size dim beside huge ones would still give strides that overflow.
  std::uint64_t count = 1, span = 1;
  bool too_big = false;
  for (unsigned i = 0; i < ndim; ++i) {
    const std::uint32_t d = be32(b.data() + 4 + 4 * i);
    h.shape.push_back(std::int64_t(d));
    if (d > 1 && span > kMaxIdxBytes / d) too_big = true;
    if (d > 1) span *= d;
    count *= d;  // <= span, so it does not overflow while span is bounded
  }
  EMBER_CHECK(!too_big, "read_idx: ", q, " declares shape ", h.shape.str(), ", more than ", kMaxIdxBytes,
              " elements");
  h.count = std::size_t(count);
  return h;
}
}  // namespace detail

EMBER_HEADER_INLINE Tensor<std::uint8_t> parse_idx(std::span<const std::uint8_t> b, const std::string& name) {
  const detail::IdxHeader h = detail::parse_idx_header(b, name);
  const std::size_t have = b.size() - h.size;
  EMBER_CHECK(have >= h.count, "read_idx: ", ember::detail::quote_untrusted(name, 4096), " is truncated: shape ",
              h.shape.str(), " needs ", h.count, " bytes of data after the header, the file has ", have);
  EMBER_CHECK(have == h.count, "read_idx: ", ember::detail::quote_untrusted(name, 4096), " has ", have - h.count,
              " bytes after the ", h.count, " bytes of data its header (shape ", h.shape.str(), ") describes");
  Tensor<std::uint8_t> t = empty<std::uint8_t>(h.shape);
  if (h.count) std::memcpy(t.data(), b.data() + h.size, h.count);
  return t;
}

EMBER_COLD EMBER_HEADER_INLINE Tensor<std::uint8_t> decode_idx(std::span<const std::uint8_t> bytes, const std::string& name) {
  if (!detail::is_gzip(bytes)) return parse_idx(bytes, name);
  detail::GzipInflater z(bytes, name);
  std::vector<std::uint8_t> raw;
  z.inflate_to(raw, 4);                                   // magic number and dim count
  if (raw.size() == 4) z.inflate_to(raw, 4 + 4 * std::size_t(raw[3]));  // the extents (at most 1020 bytes)
  const detail::IdxHeader h = detail::parse_idx_header(raw, name);
  const std::size_t expected = h.size + h.count;
  z.inflate_to(raw, expected + 1);
  EMBER_CHECK(raw.size() <= expected, "read_idx: ", ember::detail::quote_untrusted(name, 4096),
              " decompresses to more than the ", expected, " bytes its IDX header describes (", h.size,
              " bytes of header, then ", h.count, " bytes of data for shape ", h.shape.str(),
              "); inflating stopped there: the file is corrupt or a decompression bomb");
  return parse_idx(raw, name);
}
#endif  // EMBER_HEADER_BODIES

}  // namespace ember::data
