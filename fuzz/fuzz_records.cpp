// libFuzzer target: the packed record file reader on arbitrary bytes (validation, then every record read with
// its checksum). Every input must either be accepted or throw ember::Error.
#include <cstddef>
#include <cstdint>

#include "ember/data/record_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ember::data::RecordView v({data, size}, "fuzz");
    std::size_t total = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      try {
        const auto r = v.record(i);
        if (r.data() < data || r.data() + r.size() > data + size) __builtin_trap();  // never outside the input
        total += r.size();
      } catch (const ember::Error&) {
      }
    }
    if (total > size) __builtin_trap();
  } catch (const ember::Error&) {
  }
  return 0;
}
