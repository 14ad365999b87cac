// JSON (core/json.hpp): the writer's string escaping, read back by the reader byte for byte, in both of its styles;
// the reader's numbers, nesting bound and refusals. (The safetensors header grammar on top of it: test_io.cpp.)
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ember/core/json.hpp"

using ember::detail::append_json_string;
using ember::detail::invalid_utf8_at;

namespace {

// Records every value the reader hands over, one token per call ("s:" strings, "k:" keys, "u:", "i:", "f:"
// numbers, and the structure), so a test compares what was read with what was written.
struct Tokens {
  std::vector<std::string> t;
  void null() { t.push_back("null"); }
  void boolean(bool b) { t.push_back(b ? "true" : "false"); }
  void number_unsigned(std::uint64_t v) { t.push_back("u:" + std::to_string(v)); }
  void number_integer(std::int64_t v) { t.push_back("i:" + std::to_string(v)); }
  void number_float(const std::string& text) { t.push_back("f:" + text); }
  void string(const std::string& s) { t.push_back("s:" + s); }
  void key(const std::string& k) { t.push_back("k:" + k); }
  void start_object() { t.push_back("{"); }
  void end_object() { t.push_back("}"); }
  void start_array() { t.push_back("["); }
  void end_array() { t.push_back("]"); }
};

std::vector<std::string> read(const std::string& text) {
  Tokens h;
  const std::string where = "test";
  ember::detail::JsonSax<Tokens>(text.data(), text.data() + text.size(), h, where, "the text").run();
  return h.t;
}

std::string error_of(const std::string& text) {
  try {
    read(text);
  } catch (const ember::Error& e) {
    return e.what();
  }
  return "";
}

std::string json(std::string_view s, bool short_escapes = true) {
  std::string out;
  append_json_string(out, s, short_escapes);
  return out;
}

// Strings a hostile file or a user's range name may hold.
std::vector<std::string> hostile_strings() {
  std::vector<std::string> out = {"",
                                  "plain",
                                  "\"quoted\"",
                                  "back\\slash\\",
                                  "\\\"",
                                  "\\u0041 is not an escape here",
                                  "slash / stays",
                                  "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf",  // 2, 3 and 4 bytes
                                  "del \x7f stays",
                                  std::string("nul \0 inside", 12)};
  std::string controls;
  for (int c = 0; c < 0x20; ++c) controls += char(c);
  out.push_back(controls);
  return out;
}

}  // namespace

TEST_CASE("JSON writer: quotes, backslashes and control characters are escaped, the reader gives back every byte") {
  for (const bool short_escapes : {true, false}) {
    for (const std::string& s : hostile_strings()) {
      const std::string text = json(s, short_escapes);
      INFO(text);
      REQUIRE(invalid_utf8_at(s) == std::string_view::npos);
      // A JSON string holds no raw control character, and only escaped quotes.
      for (std::size_t i = 0; i < text.size(); ++i) CHECK(static_cast<unsigned char>(text[i]) >= 0x20);
      const std::vector<std::string> back = read(text);
      REQUIRE(back.size() == 1);
      CHECK(back[0] == "s:" + s);
      // ... also as a key and inside an array.
      CHECK(read("{" + text + ":[" + text + "," + text + "]}") ==
            std::vector<std::string>{"{", "k:" + s, "[", "s:" + s, "s:" + s, "]", "}"});
    }
  }
  // The two styles: the short forms JSON libraries write (the safetensors header), or \u00xx for every control
  // character (the profiler's Chrome trace); lowercase hex in both.
  CHECK(json("a\"b\\c") == R"("a\"b\\c")");
  CHECK(json("\b\t\n\f\r") == R"("\b\t\n\f\r")");
  CHECK(json("\b\t\n\f\r", false) == R"("\u0008\u0009\u000a\u000c\u000d")");
  CHECK(json(std::string("\0\x01\x1b\x1f", 4)) == R"("\u0000\u0001\u001b\u001f")");
  CHECK(json(std::string("\0\x01\x1b\x1f", 4), false) == R"("\u0000\u0001\u001b\u001f")");
  CHECK(json("/\x7f\xc3\xa9") == "\"/\x7f\xc3\xa9\"");
  // Appends: what out held stays.
  std::string out = "x:";
  append_json_string(out, "y");
  CHECK(out == "x:\"y\"");
}

TEST_CASE("JSON writer: bytes that are not UTF-8 are copied as they are, found by invalid_utf8_at, refused by the reader") {
  struct Case {
    std::string s;
    std::size_t at;
  };
  const std::vector<Case> cases = {{"ok\xff", 2},           {"\x80", 0},
                                   {"a\xc3", 1},            {"\xc0\xaf", 0},   // overlong '/'
                                   {"x\xed\xa0\x80", 1},    // a surrogate
                                   {"\xf4\x90\x80\x80", 0},  // above U+10FFFF
                                   {"\xe2\x82", 0},          {"\xc3\xa9\xc3", 2}};
  for (const Case& c : cases) {
    INFO(ember::detail::quote_untrusted(c.s));
    CHECK(invalid_utf8_at(c.s) == c.at);
    const std::string text = json(c.s);
    CHECK(text == "\"" + c.s + "\"");  // as the profiler always wrote them; safetensors checks first and refuses
    CHECK(error_of(text).find("invalid UTF-8 in a string") != std::string::npos);
  }
  CHECK(invalid_utf8_at("") == std::string_view::npos);
  CHECK(invalid_utf8_at("\xf0\x9f\x98\x80") == std::string_view::npos);
}

TEST_CASE("JSON reader: escapes, numbers and literals") {
  CHECK(read(R"("\u00e9\ud83d\ude00\/\b")") == std::vector<std::string>{"s:\xc3\xa9\xf0\x9f\x98\x80/\b"});
  CHECK(read(" [0, 18446744073709551615, 18446744073709551616, -1, -9223372036854775808, -9223372036854775809, "
             "1.5, -2e3, 1E+2, true, false, null] ") ==
        std::vector<std::string>{"[", "u:0", "u:18446744073709551615", "f:18446744073709551616", "i:-1",
                                 "i:-9223372036854775808", "f:-9223372036854775809", "f:1.5", "f:-2e3", "f:1E+2",
                                 "true", "false", "null", "]"});
  for (const char* bad : {"01", "-", "1.", ".5", "1e", "+1", "tru", "nul", "[1,]", "{\"a\"}", "{\"a\":1,}", "\"\\x\"",
                          "\"\\ud800\"", "\"\\udc00\"", "\"\\u12\"", "\"open", "[1] 2", "", "\"\t\""}) {
    INFO(bad);
    const std::string msg = error_of(bad);
    CHECK(msg.find("test: the text is not valid JSON (") == 0);
    CHECK(msg.find(" of the text; last read: ") != std::string::npos);
  }
}

TEST_CASE("JSON reader: nesting stops at 64 levels, at the first byte past them") {
  const auto nested = [](int depth) { return std::string(std::size_t(depth), '[') + std::string(std::size_t(depth), ']'); };
  CHECK(read(nested(64)).size() == 128);
  CHECK(error_of(nested(65)).find("nesting deeper than 64 levels at byte 64 of the text") != std::string::npos);
  // A hostile depth costs no more: the reader stops at byte 64 of a million-deep text.
  CHECK(error_of(nested(1000000)).find("at byte 64 ") != std::string::npos);
  std::string objects;
  for (int i = 0; i < 65; ++i) objects += "{\"a\":";
  objects += "1" + std::string(65, '}');
  CHECK(error_of(objects).find("nesting deeper than 64 levels") != std::string::npos);
}
