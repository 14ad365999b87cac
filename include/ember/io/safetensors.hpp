// ember — safetensors files, the tensor format of PyTorch and Hugging Face: an 8-byte little-endian header length
// N, N bytes of JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data, offsets relative to its start.
//
// Reading validates everything before touching the data: the header length is bounded and inside the file, the
// JSON is an object with exactly those fields per tensor (no duplicate keys), dtypes are known, shapes are
// non-negative, dtype size x shape = byte count without overflow, offsets lie in the data and tile it exactly
// (contiguous, no overlap, no hole), bool bytes are 0 or 1. A hostile file gives an ember::Error, never a crash or a
// read outside the file. The JSON is read and written by ember's own code (no JSON library).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/atomic_file.hpp"

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

// (The JSON reader, the writer's string escaping and the header grammar are compiled in every mode,
// ember::precompiled included: they are small, and ember's tests drive them directly.)
/// The length of the UTF-8 sequence at p (avail bytes readable), or 0 when the bytes there are not one (RFC 3629:
/// no overlong forms, no surrogates, nothing above U+10FFFF).
inline std::size_t utf8_sequence(const unsigned char* p, std::size_t avail) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  // The sequence's length and the range its second byte must fall in (the first byte's row of RFC 3629's table);
  // the others are continuation bytes 0x80-0xbf.
  std::size_t len = 0;
  unsigned lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c == 0xe0) len = 3, lo = 0xa0;
  else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) len = 3;
  else if (c == 0xed) len = 3, hi = 0x9f;
  else if (c == 0xf0) len = 4, lo = 0x90;
  else if (c >= 0xf1 && c <= 0xf3) len = 4;
  else if (c == 0xf4) len = 4, hi = 0x8f;
  if (len == 0 || len > avail) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const unsigned b = p[k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) return 0;
  }
  return len;
}

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

/// Appends s to out as a JSON string: in double quotes, with `"`, `\` and the control characters escaped (\b, \t,
/// \n, \f, \r, else \u00xx) and every other byte as it is, as JSON libraries write it. JSON text is UTF-8, so s
/// must be valid UTF-8; otherwise an ember::Error names it (`what` and the quoted `name`) and the first bad byte.
EMBER_COLD inline void append_json_string(std::string& out, std::string_view s, const char* what, std::string_view name) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t len = utf8_sequence(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i);
      if (len == 0) {
        const std::string byte = {'0', 'x', hex[c >> 4], hex[c & 15]};
        EMBER_CHECK(false, "safetensors: ", what, " ", quote_untrusted(name),
                    " is not valid UTF-8 (an invalid sequence starts with byte ", byte, " at offset ", i,
                    "); safetensors headers are JSON, whose text is UTF-8");
      }
      out.append(s.data() + i, len);
      i += len;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += char(c);
        }
    }
    ++i;
  }
  out += '"';
}

/// A strict JSON reader (RFC 8259) that hands each value to a handler as it reads it, building no document: the
/// handler (SafetensorsHeaderParser) checks its grammar at each call and throws at the first value out of place,
/// so what a hostile header nests never costs more than the grammar allows; the reader itself stops at 64 levels.
/// Strings are checked to be UTF-8 and unescaped (\uXXXX surrogate pairs into one code point; a lone surrogate
/// is an error). Numbers follow JSON's grammar; an integer reaches the handler as unsigned or signed 64-bit when it
/// fits, any other number as its text. Errors name the byte offset and quote what was read (escaped, bounded).
template <class Handler>
class JsonSax {
 public:
  JsonSax(const char* begin, const char* end, Handler& h, const std::string& where)
      : b_(begin), p_(begin), e_(end), h_(h), where_(where) {}
  /// Reads one JSON value spanning the input, whitespace around it allowed.
  EMBER_COLD void run() {
    ws();
    value(0);
    ws();
    if (p_ != e_) fail("text after the JSON value", p_, p_ + 1);
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const char* what, const char* from, const char* to) const {
    if (to > e_) to = e_;
    throw Error(ember::detail::concat(where_, ": the header is not valid JSON (", what, " at byte ", from - b_,
                                      " of the header; last read: ",
                                      quote_untrusted(std::string_view(from, std::size_t(to - from)), 240), ")"));
  }
  void ws() {
    while (p_ != e_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  static bool digit(char c) { return c >= '0' && c <= '9'; }

  EMBER_COLD void value(int depth) {
    if (p_ == e_) fail("unexpected end", p_, p_);
    switch (*p_) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"':
        string();
        h_.string(tok_);
        return;
      case 't': literal("true"); h_.boolean(true); return;
      case 'f': literal("false"); h_.boolean(false); return;
      case 'n': literal("null"); h_.null(); return;
      default:
        if (*p_ == '-' || digit(*p_)) return number();
        fail("unexpected byte", p_, p_ + 1);
    }
  }
  // The members of an object or the elements of an array, from its opening byte to its closing one: `item` reads
  // one member or element; `expected` is the error when neither ',' nor the closing byte follows one.
  template <class Item>
  EMBER_COLD void items(char close, const char* expected, const Item& item) {
    ++p_;
    ws();
    if (p_ != e_ && *p_ == close) {
      ++p_;
      return;
    }
    for (;;) {
      item();
      ws();
      if (p_ != e_ && *p_ == ',') {
        ++p_;
        ws();
        continue;
      }
      if (p_ != e_ && *p_ == close) {
        ++p_;
        return;
      }
      fail(expected, p_, p_ + 1);
    }
  }
  EMBER_COLD void object(int depth) {
    if (depth >= kMaxDepth) fail("nesting deeper than 64 levels", p_, p_ + 1);
    h_.start_object();
    items('}', "expected ',' or '}' in an object", [&] {
      if (p_ == e_ || *p_ != '"') fail("expected a key (a string)", p_, p_ + 1);
      string();
      h_.key(tok_);
      ws();
      if (p_ == e_ || *p_ != ':') fail("expected ':' after a key", p_, p_ + 1);
      ++p_;
      ws();
      value(depth + 1);
    });
    h_.end_object();
  }
  EMBER_COLD void array(int depth) {
    if (depth >= kMaxDepth) fail("nesting deeper than 64 levels", p_, p_ + 1);
    h_.start_array();
    items(']', "expected ',' or ']' in an array", [&] { value(depth + 1); });
    h_.end_array();
  }
  void literal(std::string_view word) {
    if (std::size_t(e_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      fail("invalid literal", p_, p_ + word.size());
    p_ += word.size();
  }
  EMBER_COLD void number() {
    const char* t = p_;
    const bool neg = *p_ == '-';
    if (neg) ++p_;
    if (p_ == e_ || !digit(*p_)) fail("invalid number", t, p_ + 1);
    const char* digits = p_;
    if (*p_ == '0') ++p_;  // no leading zeros: "01" ends the number after the 0
    else
      while (p_ != e_ && digit(*p_)) ++p_;
    const char* digits_end = p_;
    bool integral = true;
    if (p_ != e_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ == e_ || !digit(*p_)) fail("invalid number", t, p_ + 1);
      while (p_ != e_ && digit(*p_)) ++p_;
    }
    if (p_ != e_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ != e_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == e_ || !digit(*p_)) fail("invalid number", t, p_ + 1);
      while (p_ != e_ && digit(*p_)) ++p_;
    }
    if (integral) {
      std::uint64_t v = 0;
      bool fits = true;
      for (const char* q = digits; q != digits_end && fits; ++q) {
        const unsigned d = unsigned(*q - '0');
        fits = v <= (UINT64_MAX - d) / 10;
        v = v * 10 + d;
      }
      if (fits && !neg) {
        h_.number_unsigned(v);
        return;
      }
      if (fits && v <= std::uint64_t(INT64_MAX) + 1) {
        h_.number_integer(v == std::uint64_t(INT64_MAX) + 1 ? INT64_MIN : -std::int64_t(v));
        return;
      }
    }
    h_.number_float(std::string(t, std::size_t(p_ - t)));
  }
  unsigned hex4(const char* q, const char* t) const {
    if (e_ - q < 4) fail("a \\u escape cut short", t, e_);
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = q[i];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail("a \\u escape with a non-hex digit", t, q + 4);
      u = u * 16 + unsigned(d);
    }
    return u;
  }
  void put_utf8(unsigned u) {
    if (u < 0x80) {
      tok_ += char(u);
    } else if (u < 0x800) {
      tok_ += char(0xc0 | (u >> 6));
      tok_ += char(0x80 | (u & 0x3f));
    } else if (u < 0x10000) {
      tok_ += char(0xe0 | (u >> 12));
      tok_ += char(0x80 | ((u >> 6) & 0x3f));
      tok_ += char(0x80 | (u & 0x3f));
    } else {
      tok_ += char(0xf0 | (u >> 18));
      tok_ += char(0x80 | ((u >> 12) & 0x3f));
      tok_ += char(0x80 | ((u >> 6) & 0x3f));
      tok_ += char(0x80 | (u & 0x3f));
    }
  }
  /// A string at p_ (its opening quote), unescaped into tok_.
  EMBER_COLD void string() {
    const char* t = p_;
    ++p_;
    tok_.clear();
    for (;;) {
      if (p_ == e_) fail("a string without its closing quote", t, e_);
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return;
      }
      if (c == '\\') {
        if (e_ - p_ < 2) fail("a string without its closing quote", t, e_);
        switch (p_[1]) {
          case '"': tok_ += '"'; break;
          case '\\': tok_ += '\\'; break;
          case '/': tok_ += '/'; break;
          case 'b': tok_ += '\b'; break;
          case 'f': tok_ += '\f'; break;
          case 'n': tok_ += '\n'; break;
          case 'r': tok_ += '\r'; break;
          case 't': tok_ += '\t'; break;
          case 'u': {
            unsigned u = hex4(p_ + 2, t);
            p_ += 6;
            if (u >= 0xdc00 && u <= 0xdfff) fail("a lone low surrogate", t, p_);
            if (u >= 0xd800 && u <= 0xdbff) {
              if (e_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') fail("a high surrogate without its low one", t, p_);
              const unsigned low = hex4(p_ + 2, t);
              p_ += 6;
              if (low < 0xdc00 || low > 0xdfff) fail("a high surrogate without its low one", t, p_);
              u = 0x10000 + ((u - 0xd800) << 10) + (low - 0xdc00);
            }
            put_utf8(u);
            continue;
          }
          default: fail("an invalid escape", t, p_ + 2);
        }
        p_ += 2;
        continue;
      }
      if (c < 0x20) fail("an unescaped control character in a string", t, p_ + 1);
      if (c < 0x80) {
        tok_ += char(c);
        ++p_;
        continue;
      }
      const std::size_t n = utf8_sequence(reinterpret_cast<const unsigned char*>(p_), std::size_t(e_ - p_));
      if (n == 0) fail("invalid UTF-8 in a string", t, p_ + 1);
      tok_.append(p_, n);
      p_ += n;
    }
  }

  const char *b_, *p_, *e_;
  Handler& h_;
  const std::string& where_;
  std::string tok_;  // the last string read (reused)
};

/// SAX handler for the safetensors header: checks the grammar while the JSON library tokenises, in one pass, and
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
  detail::JsonSax<detail::SafetensorsHeaderParser>(hb, hb + end, header, where).run();
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
      detail::append_json_string(v, k, "metadata key", k);
      v += ':';
      detail::append_json_string(v, x, "the value of metadata key", k);
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
    detail::append_json_string(h, k, "tensor name", k);
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
