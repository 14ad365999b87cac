// ember — the IDX file format of (Fashion-)MNIST: a big-endian header (two zero bytes, an element type, the
// number of dims, then one uint32 extent per dim) followed by the elements. Files may be gzip-compressed;
// decompression uses zlib when <zlib.h> is available (ember::ember links ZLIB::ZLIB when CMake finds it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
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
inline std::vector<std::uint8_t> read_file_bytes(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  EMBER_CHECK(f.good(), what, ": cannot open '", path, "'");
  f.seekg(0, std::ios::end);
  const std::streamoff n = f.tellg();
  EMBER_CHECK(n >= 0, what, ": cannot determine the size of '", path, "'");
  f.seekg(0, std::ios::beg);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n));
  if (n > 0) f.read(reinterpret_cast<char*>(bytes.data()), n);
  EMBER_CHECK(f.good() || (n == 0), what, ": error reading '", path, "'");
  return bytes;
}

inline bool is_gzip(std::span<const std::uint8_t> b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

/// Inflates a gzip stream (concatenated members are allowed, as gunzip allows them), at most `limit` bytes.
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> in, const std::string& name,
                                        std::size_t limit = kMaxIdxBytes) {
#if EMBER_HAS_ZLIB
  std::vector<std::uint8_t> out;
  z_stream zs{};
  EMBER_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, "read_idx: zlib inflateInit2 failed for '", name, "'");
  std::size_t consumed = 0;
  std::uint8_t chunk[1 << 16];
  auto fail = [&](const std::string& why) {
    inflateEnd(&zs);
    EMBER_CHECK(false, "read_idx: '", name, "' ", why);
  };
  for (;;) {
    const std::size_t avail = in.size() - consumed;
    zs.next_in = const_cast<Bytef*>(in.data() + consumed);
    zs.avail_in = static_cast<uInt>(avail > (std::size_t(1) << 30) ? (std::size_t(1) << 30) : avail);
    const uInt before_in = zs.avail_in;
    zs.next_out = chunk;
    zs.avail_out = sizeof(chunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    consumed += before_in - zs.avail_in;
    const std::size_t produced = sizeof(chunk) - zs.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
      fail(std::string("is not a valid gzip stream (zlib: ") + (zs.msg ? zs.msg : "error " + std::to_string(rc)) +
           ")");
    if (out.size() + produced > limit) fail("decompresses to more than " + std::to_string(limit) + " bytes");
    out.insert(out.end(), chunk, chunk + produced);
    if (rc == Z_STREAM_END) {
      // Another gzip member may follow (gunzip concatenates them); anything else after the last one is ignored.
      if (consumed == in.size() || !is_gzip(in.subspan(consumed))) break;
      inflateReset(&zs);
    } else if (rc == Z_BUF_ERROR) {
      fail("is a truncated gzip stream (its " + std::to_string(in.size()) +
           " compressed bytes end before the stream does)");
    }
  }
  inflateEnd(&zs);
  return out;
#else
  (void)in;
  (void)limit;
  EMBER_CHECK(false, "read_idx: '", name, "' is gzip-compressed, but ember was compiled without zlib (install "
              "zlib1g-dev and link ZLIB::ZLIB, or decompress the file with gunzip)");
  return {};
#endif
}

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

/// Parses an IDX image of unsigned bytes (already decompressed) into a tensor of its shape. `name` appears in
/// errors. Validates the magic number (two zero bytes, element type 0x08, 1 to 8 dims), the extents (no zero-size
/// product overflow) and that the data is exactly as long as the header says (truncated or over-long files fail).
inline Tensor<std::uint8_t> parse_idx(std::span<const std::uint8_t> b, const std::string& name = "<memory>") {
  EMBER_CHECK(b.size() >= 4, "read_idx: '", name, "' is too short for an IDX header (", b.size(),
              " bytes, expected at least 4)");
  EMBER_CHECK(b[0] == 0 && b[1] == 0, "read_idx: '", name, "' is not an IDX file (magic number starts with bytes ",
              detail::hex_byte(b[0]), " ", detail::hex_byte(b[1]), ", expected 0x00 0x00)");
  const unsigned type = b[2], ndim = b[3];
  EMBER_CHECK(type == 0x08, "read_idx: '", name, "' holds IDX element type ", detail::hex_byte(type), " (",
              detail::idx_type_name(type), "); read_idx reads unsigned bytes (type 0x08)");
  EMBER_CHECK(ndim >= 1 && ndim <= unsigned(kMaxDims), "read_idx: '", name, "' declares ", ndim,
              " dimensions; expected 1 to ", kMaxDims);
  const std::size_t header = 4 + 4 * std::size_t(ndim);
  EMBER_CHECK(b.size() >= header, "read_idx: '", name, "' is truncated inside its header (", b.size(),
              " bytes, the header of ", ndim, " dims needs ", header, ")");
  // The extents, their product (the byte count) and the product of the non-zero extents (the largest stride),
  // both bounded: a zero-size dim beside huge ones would still give strides that overflow.
  Shape shape;
  std::uint64_t count = 1, span = 1;
  bool too_big = false;
  for (unsigned i = 0; i < ndim; ++i) {
    const std::uint32_t d = detail::be32(b.data() + 4 + 4 * i);
    shape.push_back(std::int64_t(d));
    if (d > 1 && span > detail::kMaxIdxBytes / d) too_big = true;
    if (d > 1) span *= d;
    count *= d;  // <= span, so it does not overflow while span is bounded
  }
  EMBER_CHECK(!too_big, "read_idx: '", name, "' declares shape ", shape.str(), ", more than ",
              detail::kMaxIdxBytes, " elements");
  const std::size_t have = b.size() - header;
  EMBER_CHECK(have >= count, "read_idx: '", name, "' is truncated: shape ", shape.str(), " needs ", count,
              " bytes of data after the header, the file has ", have);
  EMBER_CHECK(have == count, "read_idx: '", name, "' has ", have - count, " bytes after the ", count,
              " bytes of data its header (shape ", shape.str(), ") describes");
  Tensor<std::uint8_t> t = empty<std::uint8_t>(shape);
  if (count) std::memcpy(t.data(), b.data() + header, count);
  return t;
}

/// Decodes an IDX file held in memory, gzip-compressed (detected by its magic bytes) or plain.
inline Tensor<std::uint8_t> decode_idx(std::span<const std::uint8_t> bytes, const std::string& name = "<memory>") {
  if (detail::is_gzip(bytes)) {
    const std::vector<std::uint8_t> raw = detail::gunzip(bytes, name);
    return parse_idx(raw, name);
  }
  return parse_idx(bytes, name);
}

/// Reads an IDX file of unsigned bytes (MNIST, Fashion-MNIST), gzip-compressed or plain, into a tensor of the shape
/// its header declares: (N, 28, 28) for images, (N) for labels.
inline Tensor<std::uint8_t> read_idx(const std::string& path) {
  const std::vector<std::uint8_t> bytes = detail::read_file_bytes(path, "read_idx");
  return decode_idx(bytes, path);
}

}  // namespace ember::data
