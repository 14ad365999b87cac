// ember — JSON, read and written by ember's own code (no JSON library): the safetensors header (io/) and the
// profiler's Chrome trace (profile/) use it, and through safetensors' metadata every checkpoint. The reader is a
// strict RFC 8259 parser that builds no document: it hands each value to a handler, which checks its own grammar as
// the values arrive, so reading a hostile text costs time linear in its length and memory bounded by the handler.
// The writer is the string escaping (the structure around the strings is each writer's own: a few fixed fields).
//
// (Not to be confused with ember::detail::quote_untrusted in config.hpp: that quotes untrusted text for an error
// message a human reads, escaping every byte a terminal could act on; this writes JSON a program reads.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ember/config.hpp"

namespace ember::detail {

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

/// The offset of the first byte of s that does not begin a valid UTF-8 sequence (utf8_sequence), or npos when s is
/// valid UTF-8 throughout.
inline std::size_t invalid_utf8_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = utf8_sequence(p + i, s.size() - i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

/// Appends s to out as a JSON string: in double quotes, with `"`, `\` and the control characters below U+0020
/// escaped and every other byte as it is (DEL and bytes >= 0x80 included), as JSON libraries write it. With
/// short_escapes the control characters \b, \t, \n, \f and \r take their two-byte forms, the others (and, without
/// it, all of them) `\u00xx`. JSON text is UTF-8: a caller that may hold other bytes checks s with invalid_utf8_at
/// first (copied as they are, such bytes make the text invalid JSON; a strict reader, JsonSax included, refuses it).
EMBER_COLD inline void append_json_string(std::string& out, std::string_view s, bool short_escapes = true) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20) {
      out += ch;
    } else if (short_escapes && (c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r')) {
      out += '\\';
      out += c == '\b' ? 'b' : c == '\t' ? 't' : c == '\n' ? 'n' : c == '\f' ? 'f' : 'r';
    } else {
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  out += '"';
}

/// A strict JSON reader (RFC 8259) that hands each value to a handler as it reads it, building no document: the
/// handler checks its grammar at each call and throws at the first value out of place, so what a hostile text nests
/// never costs more than the handler's grammar allows; the reader itself stops at 64 levels of nesting. Strings are
/// checked to be UTF-8 and unescaped (`\uXXXX` surrogate pairs into one code point; a lone surrogate is an error).
/// Numbers follow JSON's grammar; an integer reaches the handler as unsigned or signed 64-bit when it fits, any other
/// number as its text. Errors name the byte offset and quote what was read (escaped, bounded). Time is linear in the
/// text's length; memory is the last string read.
///
/// The handler's calls, in document order (return values are ignored; a handler stops the reader by throwing):
/// null(), boolean(bool), number_unsigned(std::uint64_t), number_integer(std::int64_t) (negative integers),
/// number_float(const std::string& text), string(const std::string&), key(const std::string&), start_object(),
/// end_object(), start_array(), end_array(). io::detail::SafetensorsHeaderParser is one.
template <class Handler>
class JsonSax {
 public:
  /// Reads [begin, end) into h. Errors start with `where` (e.g. "safetensors: 'model.safetensors'") and call the
  /// text `text` (e.g. "the header").
  JsonSax(const char* begin, const char* end, Handler& h, const std::string& where, const char* text = "the header")
      : b_(begin), p_(begin), e_(end), h_(h), where_(where), text_(text) {}
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
    throw Error(concat(where_, ": ", text_, " is not valid JSON (", what, " at byte ", from - b_, " of ", text_,
                       "; last read: ", quote_untrusted(std::string_view(from, std::size_t(to - from)), 240), ")"));
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
  const char* text_;
  std::string tok_;  // the last string read (reused)
};

}  // namespace ember::detail
