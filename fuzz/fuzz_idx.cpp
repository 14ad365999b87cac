// libFuzzer target: the IDX decoder (plain or gzip-compressed) on arbitrary bytes. Every input must either decode
// or throw ember::Error; a gzip'd input is never inflated past the size its header declares (plus one byte).
#include <cstddef>
#include <cstdint>

#include "ember/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    ember::data::detail::gunzip_bytes_inflated = 0;
    const ember::Tensor<std::uint8_t> t = ember::data::decode_idx({data, size}, "fuzz");
    if (t.numel() > std::int64_t(ember::data::detail::kMaxIdxBytes)) __builtin_trap();
    // Decoded from gzip: exactly the header and the data were inflated, nothing more.
    const std::size_t whole = 4 + 4 * std::size_t(t.dim()) + std::size_t(t.numel());
    if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b && ember::data::detail::gunzip_bytes_inflated != whole)
      __builtin_trap();
  } catch (const ember::Error&) {
  }
  return 0;
}
