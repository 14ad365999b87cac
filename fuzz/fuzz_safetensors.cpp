// libFuzzer target: the safetensors reader on arbitrary bytes. Every input must either parse or throw
// ember::Error; anything else (a crash, a sanitizer report, another exception type) is a bug, and so is an error
// message that passes a control byte (or any byte outside printable ASCII) from the file through unescaped.
// The seeds include hostile files (nesting 100 000 deep, NUL in the header, duplicate keys, thousands of tensors)
// up to 256 KB: run with -max_len=262144 so they are not truncated.
#include <cstddef>
#include <cstdint>

#include "ember/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ember::io::SafeTensors f = ember::io::parse_safetensors({data, size}, "fuzz");
    // Round trip what parsed: it must serialize and parse to the same tensors.
    const auto bytes = ember::io::serialize_safetensors(f.tensors, f.metadata);
    const ember::io::SafeTensors g = ember::io::parse_safetensors(bytes, "fuzz-roundtrip");
    if (g.tensors.size() != f.tensors.size() || g.metadata != f.metadata) __builtin_trap();
  } catch (const ember::Error& e) {
    for (const char* p = e.what(); *p; ++p)
      if (static_cast<unsigned char>(*p) < 0x20 || static_cast<unsigned char>(*p) >= 0x7f) __builtin_trap();
  }
  return 0;
}
