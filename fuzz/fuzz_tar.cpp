// libFuzzer target: the tar reader (data/tar.hpp) on arbitrary bytes, then WebDataset's split of every member name
// into key and field. Every input must either be accepted or throw ember::Error, and every member must lie inside
// the input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ember/data/tar.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const ember::data::TarView t({data, size}, "fuzz", {.max_members = 4096, .max_name_bytes = 4096,
                                                         .max_extended_header_bytes = 65536});
    std::size_t total = 0;
    for (const ember::data::TarMember& m : t.members()) {
      const auto d = t.data(m);
      if (d.size() != m.size || d.data() < data || d.data() + d.size() > data + size) __builtin_trap();
      total += d.size();
      std::string_view key, field;
      if (ember::data::detail::webdataset_split(m.name, key, field) && key.size() + field.size() + 1 != m.name.size())
        __builtin_trap();
      (void)ember::data::detail::webdataset_meta(m.name);
    }
    if (total > size) __builtin_trap();
  } catch (const ember::Error&) {
  }
  return 0;
}
