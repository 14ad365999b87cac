// ember — CRC-32C (Castagnoli), the checksum of packed record files: the SSE4.2 instruction where the target has
// it, else a table. crc32c("123456789") == 0xE3069283.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace ember::data::detail {

inline const std::array<std::uint32_t, 256>& crc32c_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

/// Extends a running CRC-32C (start with 0) over n bytes.
inline std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
#if defined(__SSE4_2__)
  std::uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
  }
  c = std::uint32_t(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
#else
  const auto& t = crc32c_table();
  for (; n > 0; --n, ++p) c = t[(c ^ *p) & 0xFFu] ^ (c >> 8);
#endif
  return ~c;
}

}  // namespace ember::data::detail
