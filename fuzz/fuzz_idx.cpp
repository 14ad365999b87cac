// libFuzzer target: the IDX decoder (plain or gzip-compressed) on arbitrary bytes. Every input must either decode
// or throw ember::Error.
#include <cstddef>
#include <cstdint>

#include "ember/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ember::Tensor<std::uint8_t> t = ember::data::decode_idx({data, size}, "fuzz");
    if (t.numel() > std::int64_t(ember::data::detail::kMaxIdxBytes)) __builtin_trap();
  } catch (const ember::Error&) {
  }
  return 0;
}
