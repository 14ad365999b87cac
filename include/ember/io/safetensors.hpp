// ember — safetensors files, the tensor format of PyTorch and Hugging Face: an 8-byte little-endian header length
// N, N bytes of JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data, offsets relative to its start.
//
// Reading validates everything before touching the data: the header length is bounded and inside the file, the
// JSON is an object with exactly those fields per tensor (no duplicate keys), dtypes are known, shapes are
// non-negative, dtype size x shape = byte count without overflow, offsets lie in the data and tile it exactly
// (contiguous, no overlap, no hole), bool bytes are 0 or 1. A hostile file gives an ember::Error, never a crash or a
// read outside the file. Needs nlohmann/json (Debian's nlohmann-json3-dev; CMake target ember::io).
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

#include <nlohmann/json.hpp>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/atomic_file.hpp"

namespace ember::io {

/// The contents of a safetensors file: tensors by name and the optional string metadata.
struct SafeTensors {
  TensorMap tensors;
  Metadata metadata;

  bool contains(const std::string& name) const { return tensors.count(name) != 0; }
  /// The tensor `name` as dtype T; an error when it is missing or has another dtype.
  template <class T>
  Tensor<T> get(const std::string& name) const {
    auto it = tensors.find(name);
    EMBER_CHECK(it != tensors.end(), "safetensors: no tensor named '", name, "' (the file has ", tensors.size(),
                " tensors)");
    return get_as<T>(it->second, "safetensors: tensor '" + name + "'");
  }
};

namespace detail {
/// Largest header accepted, as the reference implementation's limit (100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

inline const char* safetensors_dtype(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "F32";
    case ScalarType::Double: return "F64";
    case ScalarType::Half: return "F16";
    case ScalarType::BFloat16: return "BF16";
    case ScalarType::Int32: return "I32";
    case ScalarType::Int64: return "I64";
    case ScalarType::UInt8: return "U8";
    case ScalarType::Bool: return "BOOL";
  }
  return "?";
}
inline std::size_t dtype_size(ScalarType t) {
  switch (t) {
    case ScalarType::Float: case ScalarType::Int32: return 4;
    case ScalarType::Double: case ScalarType::Int64: return 8;
    case ScalarType::Half: case ScalarType::BFloat16: return 2;
    case ScalarType::UInt8: case ScalarType::Bool: return 1;
  }
  return 0;
}
inline bool parse_safetensors_dtype(const std::string& s, ScalarType& out) {
  for (ScalarType t : {ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16,
                       ScalarType::Int32, ScalarType::Int64, ScalarType::UInt8, ScalarType::Bool})
    if (s == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

struct SafeEntry {
  std::string name;
  ScalarType dtype;
  Shape shape;
  std::uint64_t begin, end;
};

template <class T>
AnyTensor make_tensor(const SafeEntry& e, const unsigned char* data, const std::string& file) {
  Tensor<T> t = empty<T>(e.shape);
  const std::size_t n = std::size_t(e.end - e.begin);
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < n; ++i)
      EMBER_CHECK(data[i] <= 1, "safetensors: '", file, "': tensor '", e.name, "' (BOOL) holds byte ", int(data[i]),
                  " at element ", i, "; booleans must be 0 or 1");
  }
  if (n) std::memcpy(static_cast<void*>(t.data()), data, n);
  return t;
}

inline std::vector<unsigned char> read_file(const std::string& path, const char* what) {
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
}  // namespace detail

/// Decodes a safetensors file held in memory; `name` appears in errors.
inline SafeTensors parse_safetensors(std::span<const unsigned char> file, const std::string& name = "<memory>") {
  using nlohmann::json;
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

  // Parse, rejecting duplicate keys in any object (a JSON library would silently keep one of them).
  std::vector<std::vector<std::string>> keys;
  std::string duplicate;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (ev == json::parse_event_t::key && !keys.empty()) {
      const std::string k = parsed.get<std::string>();
      auto& ks = keys.back();
      if (duplicate.empty() && std::find(ks.begin(), ks.end(), k) != ks.end()) duplicate = k;
      ks.push_back(k);
    }
    return true;
  };
  json header;
  try {
    header = json::parse(hb, hb + n, cb, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    EMBER_CHECK(false, "safetensors: '", name, "': the header is not valid JSON (", e.what(), ")");
  }
  EMBER_CHECK(duplicate.empty(), "safetensors: '", name, "': the header has the key '", duplicate, "' twice");
  EMBER_CHECK(header.is_object(), "safetensors: '", name, "': the header is JSON but not an object");

  SafeTensors out;
  std::vector<detail::SafeEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      EMBER_CHECK(v.is_object(), "safetensors: '", name, "': __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        EMBER_CHECK(m.value().is_string(), "safetensors: '", name, "': __metadata__ value of '", m.key(),
                    "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "safetensors: '" + name + "': tensor '" + key + "'";
    EMBER_CHECK(v.is_object() && v.size() == 3 && v.contains("dtype") && v.contains("shape") &&
                    v.contains("data_offsets"),
                what, " must be an object with exactly dtype, shape and data_offsets");
    const json &jd = v["dtype"], &js = v["shape"], &jo = v["data_offsets"];
    EMBER_CHECK(jd.is_string(), what, ": dtype is not a string");
    detail::SafeEntry e{key, ScalarType::Float, {}, 0, 0};
    const std::string ds = jd.get<std::string>();
    EMBER_CHECK(detail::parse_safetensors_dtype(ds, e.dtype), what, " has dtype '", ds,
                "'; ember reads F32, F64, F16, BF16, I32, I64, U8 and BOOL");
    EMBER_CHECK(js.is_array(), what, ": shape is not an array");
    EMBER_CHECK(js.size() <= std::size_t(kMaxDims), what, " has ", js.size(), " dims; ember supports at most ",
                kMaxDims);
    // The byte count. The product of the non-zero extents (the largest stride, in bytes) must fit in int64 too:
    // a zero-size dim beside huge ones holds no data but its strides would still overflow.
    const std::uint64_t esize = detail::dtype_size(e.dtype);
    std::uint64_t span = esize, bytes = esize;
    for (const json& d : js) {
      EMBER_CHECK(d.is_number_unsigned(), what, ": shape entries must be non-negative integers, got ", d.dump());
      const std::uint64_t s = d.get<std::uint64_t>();
      EMBER_CHECK(s <= std::uint64_t(INT64_MAX), what, ": shape entry ", s, " is too large");
      e.shape.push_back(std::int64_t(s));
      EMBER_CHECK(s <= 1 || span <= std::uint64_t(INT64_MAX) / s, what, ": shape ", e.shape.str(),
                  "... overflows a 64-bit byte count");
      if (s > 1) span *= s;
      bytes *= s;  // <= span
    }
    EMBER_CHECK(jo.is_array() && jo.size() == 2 && jo[0].is_number_unsigned() && jo[1].is_number_unsigned(), what,
                ": data_offsets must be two non-negative integers [begin, end]");
    e.begin = jo[0].get<std::uint64_t>();
    e.end = jo[1].get<std::uint64_t>();
    EMBER_CHECK(e.begin <= e.end && e.end <= data.size(), what, ": data_offsets [", e.begin, ", ", e.end,
                "] are outside the data section of ", data.size(), " bytes");
    EMBER_CHECK(e.end - e.begin == bytes, what, ": ", ds, " ", e.shape.str(), " is ", bytes,
                " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
    entries.push_back(std::move(e));
  }
  // The tensors tile the data section exactly.
  std::vector<const detail::SafeEntry*> order;
  for (auto& e : entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  for (auto* e : order) {
    EMBER_CHECK(e->begin == at, "safetensors: '", name, "': tensor '", e->name, "' starts at byte ", e->begin,
                " of the data, expected ", at, e->begin < at ? " (it overlaps the previous tensor)" : " (a gap)");
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
      case ScalarType::Bool: t = detail::make_tensor<bool>(e, p, name); break;
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

/// Encodes tensors (CPU, any strides) and metadata as a safetensors file. Tensors are laid out by decreasing
/// element size, then name, so each starts aligned to its element size (the header is padded to 8 bytes).
inline std::vector<unsigned char> serialize_safetensors(const TensorMap& tensors, const Metadata& metadata = {}) {
  using nlohmann::json;
  std::vector<std::pair<std::string, const AnyTensor*>> order;
  for (auto& [k, t] : tensors) {
    EMBER_CHECK(k != "__metadata__", "safetensors: a tensor may not be named __metadata__");
    const bool defined = std::visit([](const auto& x) { return x.defined(); }, t);
    EMBER_CHECK(defined, "safetensors: tensor '", k, "' is undefined");
    const bool cpu = std::visit([](const auto& x) { return x.device().is_cpu(); }, t);
    EMBER_CHECK(cpu, "safetensors: tensor '", k, "' is on ",
                std::visit([](const auto& x) { return x.device().str(); }, t), "; move it to the CPU first");
    order.emplace_back(k, &t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return detail::dtype_size(scalar_type(*a.second)) > detail::dtype_size(scalar_type(*b.second));
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (auto& [k, t] : order) {
    const ScalarType st = scalar_type(*t);
    const Shape s = shape_of(*t);
    const std::uint64_t nb = std::uint64_t(s.numel()) * detail::dtype_size(st);
    header[k] = {{"dtype", detail::safetensors_dtype(st)}, {"shape", s.vec()}, {"data_offsets", {at, at + nb}}};
    at += nb;
  }
  std::string h = header.dump();
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

/// Writes a safetensors file atomically (see atomic_write): a crash leaves the previous file intact.
inline void save_safetensors(const std::string& path, const TensorMap& tensors, const Metadata& metadata = {}) {
  const std::vector<unsigned char> bytes = serialize_safetensors(tensors, metadata);
  atomic_write(path, bytes);
}

/// Reads a safetensors file (as written by ember, or by Python's safetensors with PyTorch or NumPy).
inline SafeTensors load_safetensors(const std::string& path) {
  const std::vector<unsigned char> bytes = detail::read_file(path, "load_safetensors");
  return parse_safetensors(bytes, path);
}

}  // namespace ember::io
