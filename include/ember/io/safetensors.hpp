// ember — safetensors files, the tensor format of PyTorch and Hugging Face: an 8-byte little-endian header length
// N, N bytes of JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data, offsets relative to its start.
//
// Reading validates everything before touching the data: the header length is bounded and inside the file, the
// JSON is an object with exactly those fields per tensor (no duplicate keys), dtypes are known, shapes are
// non-negative, dtype size x shape = byte count without overflow, offsets lie in the data and tile it exactly
// (contiguous, no overlap, no hole), bool bytes are 0 or 1. A hostile file gives an ember::Error, never a crash or a
// read outside the file. The header's grammar is io/safetensors_header.hpp; its JSON is read and written by ember's
// own code (core/json.hpp, no JSON library).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/atomic_file.hpp"
#include "ember/io/safetensors_header.hpp"

namespace ember::io {

/// The contents of a safetensors file: tensors by name and the optional string metadata.
struct SafeTensors {
  TensorMap tensors;  ///< The tensors by name.
  Metadata metadata;  ///< The header's `__metadata__` strings.

  /// Whether the file has a tensor `name`.
  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  /// The tensor `name` as dtype T; an error when it is missing or has another dtype.
  template <class T>
  Tensor<T> get(const std::string& name) const {
    auto it = tensors.find(name);
    EMBER_CHECK(it != tensors.end(), "safetensors: no tensor named ", ember::detail::quote_untrusted(name),
                " (the file has ", tensors.size(), " tensors)");
    return get_as<T>(it->second, "safetensors: tensor " + ember::detail::quote_untrusted(name));
  }
};

namespace detail {
#if EMBER_IO_BODIES
template <class T>
EMBER_COLD AnyTensor make_tensor(const SafeEntry& e, const unsigned char* data, const std::string& file) {
  Tensor<T> t = empty<T>(e.shape);
  const std::size_t n = std::size_t(e.end - e.begin);
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < n; ++i)
      EMBER_CHECK(data[i] <= 1, "safetensors: '", file, "': tensor ", quote_untrusted(e.name), " (BOOL) holds byte ",
                  int(data[i]), " at element ", i, "; booleans must be 0 or 1");
  }
  if (n) std::memcpy(static_cast<void*>(t.data()), data, n);
  return t;
}
#endif

EMBER_IO_INLINE std::vector<unsigned char> read_file(const std::string& path, const char* what);
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE std::vector<unsigned char> read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  EMBER_CHECK(f.good(), what, ": cannot open '", path, "'");
  f.seekg(0, std::ios::end);
  const std::streamoff n = f.tellg();
  EMBER_CHECK(n >= 0, what, ": cannot determine the size of '", path, "'");
  f.seekg(0, std::ios::beg);
  std::vector<unsigned char> bytes(static_cast<std::size_t>(n));
  if (n > 0) f.read(reinterpret_cast<char*>(bytes.data()), n);
  EMBER_CHECK(n == 0 || f.good(), what, ": error reading '", path, "'");
  return bytes;
}
#endif

}  // namespace detail

/// Decodes a safetensors file held in memory; `name` appears in errors.
EMBER_IO_INLINE SafeTensors parse_safetensors(std::span<const unsigned char> file,
                                              const std::string& name = "<memory>");
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE SafeTensors parse_safetensors(std::span<const unsigned char> file, const std::string& name) {
  EMBER_CHECK(file.size() >= 8, "safetensors: '", name, "' is ", file.size(),
              " bytes, too short for the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[std::size_t(i)];
  EMBER_CHECK(n <= detail::kMaxSafetensorsHeader, "safetensors: '", name, "' declares a header of ", n,
              " bytes, more than the limit of ", detail::kMaxSafetensorsHeader);
  EMBER_CHECK(n <= file.size() - 8, "safetensors: '", name, "' declares a header of ", n, " bytes but has only ",
              file.size() - 8, " bytes after the length (truncated?)");
  const char* hb = reinterpret_cast<const char*>(file.data() + 8);
  const std::span<const unsigned char> data = file.subspan(8 + std::size_t(n));

  // The header is one JSON object, padded with spaces at the end, as the reference implementation requires (a JSON
  // library would stop at a NUL byte or allow other whitespace around the object).
  if (const void* nul = std::memchr(hb, 0, std::size_t(n)))
    EMBER_CHECK(false, "safetensors: '", name, "': the header has a NUL byte at offset ",
                static_cast<const char*>(nul) - hb, " of the header; only spaces may pad it");
  EMBER_CHECK(n > 0 && hb[0] == '{', "safetensors: '", name,
              "': the header is not a JSON object (it must start with '{', as the reference implementation requires)");
  std::size_t end = std::size_t(n);
  while (end > 0 && hb[end - 1] == ' ') --end;

  detail::SafetensorsHeaderParser header(name);
  header.data_size = data.size();
  const std::string where = "safetensors: '" + name + "'";
  ember::detail::JsonSax<detail::SafetensorsHeaderParser>(hb, hb + end, header, where).run();
  EMBER_CHECK(header.complete(), where, ": the header is not valid JSON");
  // JSON allows other whitespace after the object.
  EMBER_CHECK(hb[end - 1] == '}', "safetensors: '", name, "': the header has ",
              detail::quote_untrusted(std::string_view(hb + end - 1, 1)),
              " after its JSON object; only spaces (0x20) may follow it");

  SafeTensors out;
  out.metadata = std::move(header.metadata);
  std::vector<detail::SafeEntry>& entries = header.entries;
  // The tensors tile the data section exactly.
  std::vector<const detail::SafeEntry*> order;
  order.reserve(entries.size());
  for (auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  for (auto* e : order) {
    EMBER_CHECK(e->begin == at, "safetensors: '", name, "': tensor ", detail::quote_untrusted(e->name),
                " starts at byte ", e->begin, " of the data, expected ", at,
                e->begin < at ? " (it overlaps the previous tensor)" : " (a gap)");
    at = e->end;
  }
  EMBER_CHECK(at == data.size(), "safetensors: '", name, "': the tensors cover ", at, " bytes of the ", data.size(),
              "-byte data section; the rest is not indexed");

  for (auto& e : entries) {
    const unsigned char* p = data.data() + e.begin;
    AnyTensor t;
    switch (e.dtype) {
      case ScalarType::Float: t = detail::make_tensor<float>(e, p, name); break;
      case ScalarType::Double: t = detail::make_tensor<double>(e, p, name); break;
      case ScalarType::Half: t = detail::make_tensor<half>(e, p, name); break;
      case ScalarType::BFloat16: t = detail::make_tensor<bfloat16>(e, p, name); break;
      case ScalarType::Int32: t = detail::make_tensor<std::int32_t>(e, p, name); break;
      case ScalarType::Int64: t = detail::make_tensor<std::int64_t>(e, p, name); break;
      case ScalarType::UInt8: t = detail::make_tensor<std::uint8_t>(e, p, name); break;
      case ScalarType::Int8: t = detail::make_tensor<std::int8_t>(e, p, name); break;
      case ScalarType::Bool: t = detail::make_tensor<bool>(e, p, name); break;
    }
    out.tensors.emplace(std::move(e.name), std::move(t));
  }
  return out;
}
#endif

/// Encodes tensors (CPU, any strides) and metadata as a safetensors file. Tensors are laid out by decreasing
/// element size, then name, so each starts aligned to its element size (the header is padded to 8 bytes).
EMBER_IO_INLINE std::vector<unsigned char> serialize_safetensors(const TensorMap& tensors,
                                                                 const Metadata& metadata = {});
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE std::vector<unsigned char> serialize_safetensors(const TensorMap& tensors, const Metadata& metadata) {
  std::vector<std::pair<std::string, const AnyTensor*>> order;
  for (auto& [k, t] : tensors) {
    EMBER_CHECK(k != "__metadata__", "safetensors: a tensor may not be named __metadata__");
    EMBER_CHECK(detail::control_char_in_name(k) == std::string::npos, "safetensors: tensor name ",
                detail::quote_untrusted(k), " has a control character; names must be printable");
    const bool defined = std::visit([](const auto& x) { return x.defined(); }, t);
    EMBER_CHECK(defined, "safetensors: tensor ", detail::quote_untrusted(k), " is undefined");
    const bool cpu = std::visit([](const auto& x) { return x.device().is_cpu(); }, t);
    EMBER_CHECK(cpu, "safetensors: tensor ", detail::quote_untrusted(k), " is on ",
                std::visit([](const auto& x) { return x.device().str(); }, t), "; move it to the CPU first");
    order.emplace_back(k, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return detail::dtype_size(scalar_type(*a.second)) > detail::dtype_size(scalar_type(*b.second));
  });
  // The header: one JSON object, keys in byte order ("__metadata__" among the names), no spaces, each tensor's
  // fields in byte order too: what a JSON library writes for the same object, so files are byte for byte as before.
  std::vector<std::pair<std::string_view, std::string>> fields;  // (key, the value's JSON text)
  fields.reserve(order.size() + 1);
  if (!metadata.empty()) {
    std::string v = "{";
    for (auto& [k, x] : metadata) {
      if (v.size() > 1) v += ',';
      detail::append_header_string(v, k, "metadata key", k);
      v += ':';
      detail::append_header_string(v, x, "the value of metadata key", k);
    }
    v += '}';
    fields.emplace_back("__metadata__", std::move(v));
  }
  std::uint64_t at = 0;
  for (auto& [k, t] : order) {
    const ScalarType st = scalar_type(*t);
    const Shape s = shape_of(*t);
    const std::uint64_t nb = std::uint64_t(s.numel()) * detail::dtype_size(st);
    std::string v = "{\"data_offsets\":[";
    v += std::to_string(at);
    v += ',';
    v += std::to_string(at + nb);
    v += "],\"dtype\":\"";
    v += detail::safetensors_dtype(st);
    v += "\",\"shape\":[";
    for (int d = 0; d < s.n; ++d) {
      if (d) v += ',';
      v += std::to_string(s[d]);
    }
    v += "]}";
    fields.emplace_back(k, std::move(v));
    at += nb;
  }
  std::sort(fields.begin(), fields.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string h = "{";
  for (auto& [k, v] : fields) {
    if (h.size() > 1) h += ',';
    detail::append_header_string(h, k, "tensor name", k);
    h += ':';
    h += v;
  }
  h += '}';
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::vector<unsigned char> out(8 + h.size() + at);
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = static_cast<unsigned char>(std::uint64_t(h.size()) >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  unsigned char* p = out.data() + 8 + h.size();
  for (auto& [k, t] : order) {
    std::visit(
        [&](const auto& x) {
          using T = typename std::decay_t<decltype(x)>::value_type;
          detail::copy_elements(x, p);
          p += std::size_t(x.numel()) * sizeof(T);
        },
        *t);
  }
  return out;
}
#endif

/// Writes a safetensors file atomically (see atomic_write): a crash leaves the previous file intact.
EMBER_COLD inline void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {}) {
  const std::vector<unsigned char> bytes = serialize_safetensors(tensors, metadata);
  atomic_write(path, bytes);
}

/// Reads a safetensors file (as written by ember, or by Python's safetensors with PyTorch or NumPy).
EMBER_COLD inline SafeTensors load_safetensors(const std::string& path) {
  const std::vector<unsigned char> bytes = detail::read_file(path, "load_safetensors");
  return parse_safetensors(bytes, path);
}

}  // namespace ember::io
