// ember — the safetensors header: the JSON text between a safetensors file's 8-byte length and its data,
// {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ..., "__metadata__": {"key": "value"}}.
// Its dtype names, the grammar the reader checks as core/json.hpp's reader tokenises (SafetensorsHeaderParser) and
// the string escaping of the writer. The file around it (length, data, tiling) is io/safetensors.hpp.
//
// (The JSON reader, the writer's string escaping and the header grammar are compiled in every mode,
// ember::precompiled included: they are small, and ember's tests drive them directly.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/json.hpp"
#include "ember/core/shape.hpp"
#include "ember/io/any_tensor.hpp"

namespace ember::io::detail {
using ember::detail::quote_untrusted;

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
    case ScalarType::Int8: return "I8";
    case ScalarType::Bool: return "BOOL";
  }
  return "?";
}
inline std::size_t dtype_size(ScalarType t) {
  switch (t) {
    case ScalarType::Float: case ScalarType::Int32: return 4;
    case ScalarType::Double: case ScalarType::Int64: return 8;
    case ScalarType::Half: case ScalarType::BFloat16: return 2;
    case ScalarType::UInt8: case ScalarType::Int8: case ScalarType::Bool: return 1;
  }
  return 0;
}
inline bool parse_safetensors_dtype(const std::string& s, ScalarType& out) {
  for (ScalarType t : {ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16,
                       ScalarType::Int32, ScalarType::Int64, ScalarType::UInt8, ScalarType::Int8, ScalarType::Bool})
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

/// The byte offset of the first control character in a tensor name (C0: below U+0020; DEL; C1: U+0080..U+009F,
/// UTF-8 0xc2 0x80..0x9f), or npos. Names become dictionary keys, state-dict paths and parts of file names and
/// messages elsewhere, so neither the reader nor the writer accepts one (JSON itself would, escaped).
inline std::size_t control_char_in_name(std::string_view name) {
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) return i;
    if (c == 0xc2 && i + 1 < name.size() && static_cast<unsigned char>(name[i + 1]) < 0xa0 &&
        static_cast<unsigned char>(name[i + 1]) >= 0x80)
      return i;
  }
  return std::string_view::npos;
}

/// Appends s to out as a JSON string of a safetensors header (ember::detail::append_json_string). JSON text is UTF-8,
/// so s must be valid UTF-8; otherwise an ember::Error names it (`what` and the quoted `name`) and the first bad byte.
EMBER_COLD inline void append_header_string(std::string& out, std::string_view s, const char* what,
                                            std::string_view name) {
  if (const std::size_t at = ember::detail::invalid_utf8_at(s); at != std::string_view::npos) {
    static constexpr char hex[] = "0123456789abcdef";
    const auto c = static_cast<unsigned char>(s[at]);
    const std::string byte = {'0', 'x', hex[c >> 4], hex[c & 15]};
    EMBER_CHECK(false, "safetensors: ", what, " ", quote_untrusted(name),
                " is not valid UTF-8 (an invalid sequence starts with byte ", byte, " at offset ", at,
                "); safetensors headers are JSON, whose text is UTF-8");
  }
  ember::detail::append_json_string(out, s);
}

/// SAX handler for the safetensors header: checks the grammar while JsonSax (core/json.hpp) tokenises, in one pass, and
/// collects the entries and metadata without building a document. The grammar allows nesting three deep
/// ({"name": {"shape": [1, 2]}}): anything deeper, or any value of the wrong kind, is rejected at its first byte,
/// so neither time nor memory depends on what a hostile file nests. Duplicate keys are found with a hash set per
/// object (a field mask for the tensor entries), so parsing is linear in the header size.
class SafetensorsHeaderParser {
 public:
  explicit SafetensorsHeaderParser(const std::string& file) : file_(file) {}

  std::vector<SafeEntry> entries;
  Metadata metadata;
  bool complete() const { return at_ == At::Done; }

  // JsonSax's callbacks. Each returns true (go on) or throws ember::Error.
  bool null() { return scalar("null"); }
  bool boolean(bool b) { return scalar(b ? "true" : "false"); }
  bool number_integer(std::int64_t v) { return scalar(std::to_string(v)); }
  EMBER_COLD bool number_unsigned(std::uint64_t v) {
    if (at_ == At::Shape) {
      if (ndims_ < std::uint64_t(kMaxDims)) shape_[ndims_] = v;
      ++ndims_;  // counted, not stored, beyond ember's limit: memory stays bounded
      return true;
    }
    if (at_ == At::Offsets) {
      EMBER_CHECK(noffsets_ < 2, tensor_what(), ": data_offsets must be two non-negative integers [begin, end]");
      offsets_[noffsets_++] = v;
      return true;
    }
    return scalar(std::to_string(v));
  }
  bool number_float(const std::string& text) { return scalar(text, /*quote=*/false); }
  EMBER_COLD bool string(const std::string& v) {
    if (at_ == At::Meta) {
      metadata.emplace(key_, v);
      return true;
    }
    if (at_ == At::Tensor && field_ == kDtype) {
      EMBER_CHECK(parse_safetensors_dtype(v, dtype_), tensor_what(), " has dtype ", quote_untrusted(v),
                  "; ember reads F32, F64, F16, BF16, I32, I64, U8, I8 and BOOL");
      return true;
    }
    return scalar(v, /*quote=*/true, "a string ");
  }

  EMBER_COLD bool start_object() {
    switch (at_) {
      case At::Start: at_ = At::Top; return true;
      case At::Top:
        if (key_ == "__metadata__") {
          at_ = At::Meta;
        } else {
          at_ = At::Tensor;
          fields_ = 0;
          field_ = 0;
          ndims_ = 0;
          noffsets_ = 0;
        }
        return true;
      default: return scalar("an object");
    }
  }
  EMBER_COLD bool key(const std::string& k) {
    switch (at_) {
      case At::Top:
        EMBER_CHECK(names_.insert(k).second, where(), ": the header has the key ", quote_untrusted(k), " twice");
        if (const std::size_t at = control_char_in_name(k); at != std::string::npos)
          EMBER_CHECK(false, where(), ": tensor name ", quote_untrusted(k), " has a control character at byte ", at,
                      "; names must be printable (control characters are refused)");
        key_ = k;
        return true;
      case At::Meta:
        EMBER_CHECK(metadata.count(k) == 0, where(), ": the header has the key ", quote_untrusted(k),
                    " twice in __metadata__");
        key_ = k;
        return true;
      case At::Tensor: {
        field_ = k == "dtype" ? kDtype : k == "shape" ? kShape : k == "data_offsets" ? kOffsets : 0;
        EMBER_CHECK(field_ != 0, tensor_what(),
                    " must be an object with exactly dtype, shape and data_offsets (it has ", quote_untrusted(k), ")");
        EMBER_CHECK((fields_ & field_) == 0, where(), ": the header has the key ", quote_untrusted(k),
                    " twice in tensor ", quote_untrusted(key_));
        fields_ |= field_;
        return true;
      }
      default: return true;  // unreachable: keys occur only in objects, and only those above are accepted
    }
  }
  EMBER_COLD bool end_object() {
    switch (at_) {
      case At::Top: at_ = At::Done; return true;
      case At::Meta: at_ = At::Top; return true;
      case At::Tensor:
        EMBER_CHECK(fields_ == (kDtype | kShape | kOffsets), tensor_what(),
                    " must be an object with exactly dtype, shape and data_offsets");
        finish_entry();
        at_ = At::Top;
        return true;
      default: return true;
    }
  }
  EMBER_COLD bool start_array() {
    if (at_ == At::Tensor && field_ == kShape) {
      at_ = At::Shape;
      return true;
    }
    if (at_ == At::Tensor && field_ == kOffsets) {
      at_ = At::Offsets;
      return true;
    }
    return scalar("an array");
  }
  EMBER_COLD bool end_array() {
    at_ = At::Tensor;  // only Shape and Offsets accept an array
    return true;
  }

 private:
  enum class At { Start, Top, Meta, Tensor, Shape, Offsets, Done };
  static constexpr unsigned kDtype = 1, kShape = 2, kOffsets = 4;

  std::string where() const { return "safetensors: '" + file_ + "'"; }
  std::string tensor_what() const { return where() + ": tensor " + quote_untrusted(key_); }

  /// A value (or the start of an object or array) where the grammar does not allow it: the error says what was
  /// expected there. `text` describes the value: a literal, or file text to quote.
  EMBER_COLD bool scalar(const std::string& text, bool quote = false, const char* kind = "") {
    const std::string got = kind + (quote ? quote_untrusted(text) : bounded(text));
    switch (at_) {
      case At::Start: EMBER_CHECK(false, where(), ": the header is not a JSON object"); break;
      case At::Top:
        EMBER_CHECK(key_ != "__metadata__", where(), ": __metadata__ must be an object of strings");
        EMBER_CHECK(false, tensor_what(), " must be an object with exactly dtype, shape and data_offsets");
        break;
      case At::Meta:
        EMBER_CHECK(false, where(), ": __metadata__ value of ", quote_untrusted(key_), " is not a string");
        break;
      case At::Tensor:
        EMBER_CHECK(field_ != kDtype, tensor_what(), ": dtype is not a string");
        EMBER_CHECK(field_ != kShape, tensor_what(), ": shape is not an array");
        EMBER_CHECK(false, tensor_what(), ": data_offsets must be two non-negative integers [begin, end]");
        break;
      case At::Shape:
        EMBER_CHECK(false, tensor_what(), ": shape entries must be non-negative integers, got ", got);
        break;
      case At::Offsets:
        EMBER_CHECK(false, tensor_what(), ": data_offsets must be two non-negative integers [begin, end]");
        break;
      case At::Done: break;
    }
    return false;
  }
  /// Unquoted file text (a number as written) with non-printable bytes escaped and the length bounded.
  static std::string bounded(const std::string& text) {
    const std::string q = quote_untrusted(text);
    const std::size_t close = q.find('"', 1);  // numbers and literals hold no quote
    return q.substr(1, close - 1) + q.substr(close + 1);
  }

  /// Checks one complete entry: dtype, shape (rank, size without overflow), data offsets.
  EMBER_COLD void finish_entry() {
    SafeEntry e{key_, dtype_, {}, 0, 0};
    EMBER_CHECK(ndims_ <= std::uint64_t(kMaxDims), tensor_what(), " has ", ndims_, " dims; ember supports at most ",
                kMaxDims);
    // The byte count. The product of the non-zero extents (the largest stride, in bytes) must fit in int64 too:
    // a zero-size dim beside huge ones holds no data but its strides would still overflow.
    const std::uint64_t esize = dtype_size(e.dtype);
    std::uint64_t span = esize, bytes = esize;
    for (std::uint64_t d = 0; d < ndims_; ++d) {
      const std::uint64_t s = shape_[d];
      EMBER_CHECK(s <= std::uint64_t(INT64_MAX), tensor_what(), ": shape entry ", s, " is too large");
      e.shape.push_back(std::int64_t(s));
      EMBER_CHECK(s <= 1 || span <= std::uint64_t(INT64_MAX) / s, tensor_what(), ": shape ", e.shape.str(),
                  "... overflows a 64-bit byte count");
      if (s > 1) span *= s;
      bytes *= s;  // <= span
    }
    EMBER_CHECK(noffsets_ == 2, tensor_what(), ": data_offsets must be two non-negative integers [begin, end]");
    e.begin = offsets_[0];
    e.end = offsets_[1];
    EMBER_CHECK(e.begin <= e.end && e.end <= data_size, tensor_what(), ": data_offsets [", e.begin, ", ", e.end,
                "] are outside the data section of ", data_size, " bytes");
    EMBER_CHECK(e.end - e.begin == bytes, tensor_what(), ": ", safetensors_dtype(e.dtype), " ", e.shape.str(), " is ",
                bytes, " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
    entries.push_back(std::move(e));
  }

 public:
  std::uint64_t data_size = 0;  ///< bytes after the header, for the offset checks

 private:
  const std::string& file_;
  At at_ = At::Start;
  std::unordered_set<std::string> names_;  // the top-level keys so far
  std::string key_;                        // the current top-level (or metadata) key
  unsigned fields_ = 0, field_ = 0;        // tensor entry: the fields seen, the field whose value comes next
  ScalarType dtype_ = ScalarType::Float;
  std::uint64_t shape_[kMaxDims] = {};
  std::uint64_t ndims_ = 0;
  std::uint64_t offsets_[2] = {0, 0};
  int noffsets_ = 0;
};

}  // namespace ember::io::detail
