// Files: safetensors (every dtype, the file Python's safetensors writes, strict validation of hostile files),
// atomic file replacement (a crash between write and rename keeps the old file) and checkpoints (bit-exact resume).
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "process_helpers.hpp"
#include "ember/io.hpp"
#if __has_include(<nlohmann/json.hpp>)  // an independent JSON parser to compare ember's reader with
#include <nlohmann/json.hpp>
#define EMBER_TEST_NLOHMANN 1
#endif

using namespace ember;
namespace fs = std::filesystem;

#ifndef EMBER_TEST_FIXTURES
#define EMBER_TEST_FIXTURES "tests/fixtures"
#endif

namespace {

using ember_test::error_of;
using ember_test::TempDir;

using Bytes = std::vector<unsigned char>;



Bytes read_bytes(const std::string& path) { return io::detail::read_file(path, "test"); }

/// A safetensors image with the given header text and data bytes.
Bytes st_file(const std::string& header, std::size_t data_bytes = 0, unsigned char fill = 0) {
  Bytes b(8);
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) b[std::size_t(i)] = static_cast<unsigned char>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data_bytes, fill);
  return b;
}
io::SafeTensors parse(const Bytes& b) { return io::parse_safetensors(b, "f.safetensors"); }

template <class T>
std::vector<T> vec(const Tensor<T>& t) {
  return std::vector<T>(t.data(), t.data() + t.numel());
}
template <class T>
std::vector<std::uint16_t> bits16(const Tensor<T>& t) {
  std::vector<std::uint16_t> v(std::size_t(t.numel()));
  std::memcpy(v.data(), static_cast<const void*>(t.data()), v.size() * 2);
  return v;
}
template <class T>
std::vector<std::uint16_t> bits16(std::initializer_list<float> fs) {
  std::vector<std::uint16_t> v;
  for (float f : fs) {
    const T h(f);
    std::uint16_t b;
    std::memcpy(&b, &h, 2);
    v.push_back(b);
  }
  return v;
}

}  // namespace

// ---- safetensors -------------------------------------------------------------------------------------------------

TEST_CASE("safetensors: the file Python's safetensors wrote (tests/fixtures/gen_safetensors.py) loads exactly") {
  const io::SafeTensors f = io::load_safetensors(EMBER_TEST_FIXTURES "/python.safetensors");
  CHECK(f.tensors.size() == 11);
  CHECK(f.metadata.at("format") == "pt");
  CHECK(f.metadata.at("note") == "written by gen_safetensors.py");
  const auto f32 = f.get<float>("f32");
  CHECK(f32.shape() == Shape{2, 3});
  CHECK(vec(f32) == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});
  CHECK(vec(f.get<double>("f64")) == std::vector<double>{1.0 / 3.0, -2.5, 1e300});
  CHECK(f.get<half>("f16").shape() == Shape{2, 2});
  CHECK(bits16(f.get<half>("f16")) == bits16<half>({0.1f, -65504.0f, 6.1e-5f, 2.0f}));
  CHECK(bits16(f.get<bfloat16>("bf16")) == bits16<bfloat16>({1.0f, -3.140625f, 1e38f, 0.0078125f}));
  CHECK(vec(f.get<std::int32_t>("i32")) == std::vector<std::int32_t>{INT32_MIN, INT32_MAX, 7});
  CHECK(vec(f.get<std::int64_t>("i64")) == std::vector<std::int64_t>{INT64_MIN, INT64_MAX});
  CHECK(f.get<std::int64_t>("i64").shape() == Shape{1, 2});
  CHECK(vec(f.get<std::uint8_t>("u8")) == std::vector<std::uint8_t>{250, 251, 252, 253, 254, 255});
  CHECK(f.get<std::uint8_t>("u8").shape() == Shape{1, 2, 3});
  CHECK(vec(f.get<bool>("bool")) == std::vector<bool>{true, false, true});
  CHECK(f.get<float>("scalar").dim() == 0);
  CHECK(f.get<float>("scalar").item() == 42.0f);
  CHECK(f.get<float>("empty").shape() == Shape{0, 3});
  const auto w = f.get<float>("layer.weight");
  CHECK(w.shape() == Shape{3, 4});
  CHECK(w.data()[0] == -1.0f);
  CHECK(w.data()[11] == 1.0f);
}

TEST_CASE("safetensors: every dtype round-trips bit-exactly; strided tensors are written in row-major order") {
  Generator g(11);
  io::TensorMap m;
  m["a.f32"] = randn<float>(Shape{3, 5}, g);
  m["b.f64"] = randn<double>(Shape{4}, g);
  m["c.f16"] = randn<half>(Shape{2, 2, 2}, g);
  m["d.bf16"] = randn<bfloat16>(Shape{7}, g);
  m["e.i32"] = randint<std::int32_t>(-1000, 1000, Shape{6}, g);
  m["f.i64"] = randint<std::int64_t>(-(std::int64_t(1) << 40), std::int64_t(1) << 40, Shape{2, 3}, g);
  m["g.u8"] = randint<std::uint8_t>(0, 256, Shape{9}, g);
  m["h.bool"] = from_vector<bool>({true, false, false, true});
  m["i.scalar"] = scalar_tensor<double>(2.5);
  m["j.empty"] = empty<std::int32_t>(Shape{0, 4});
  const Tensor<float> base = randn<float>(Shape{3, 4}, g);
  m["k.transposed"] = base.transpose(0, 1);  // a strided view
  const io::Metadata meta{{"epoch", "3"}, {"who", "ember"}};

  const Bytes bytes = io::serialize_safetensors(m, meta);
  std::uint64_t hn = 0;  // the header is padded so the data starts 8-byte aligned
  for (int i = 7; i >= 0; --i) hn = (hn << 8) | bytes[std::size_t(i)];
  CHECK((8 + hn) % 8 == 0);
  const io::SafeTensors f = io::parse_safetensors(bytes);
  CHECK(f.metadata == meta);
  REQUIRE(f.tensors.size() == m.size());
  for (const auto& entry : m) {  // no structured binding: INFO's lambda captures it (clang 14 cannot)
    const auto& k = entry.first;
    const auto& t = entry.second;
    INFO(k);
    const auto& r = f.tensors.at(k);
    CHECK(io::scalar_type(r) == io::scalar_type(t));
    CHECK(io::shape_of(r) == io::shape_of(t));
    std::visit(
        [&](const auto& x) {
          using T = typename std::decay_t<decltype(x)>::value_type;
          const Tensor<T> y = std::get<Tensor<T>>(r);
          CHECK(y.is_contiguous());
          for (std::int64_t i = 0; i < x.numel(); ++i) {
            // element i of x in row-major order, read through its strides
            std::int64_t off = 0, rem = i;
            for (int d = x.dim() - 1; d >= 0; --d) {
              off += (rem % x.shape()[d]) * x.strides()[d];
              rem /= x.shape()[d];
            }
            CHECK(std::memcmp(static_cast<const void*>(x.data() + off), static_cast<const void*>(y.data() + i),
                              sizeof(T)) == 0);
          }
        },
        t);
  }
  TempDir d;
  io::save_safetensors(d / "m.safetensors", m, meta);
  CHECK(read_bytes(d / "m.safetensors") == bytes);
  CHECK(io::load_safetensors(d / "m.safetensors").metadata == meta);
}

TEST_CASE("safetensors: a file too short for the header length") {
  EXPECT_ERROR([] { parse(Bytes{1, 2, 3}); }, {"safetensors", "'f.safetensors'", "3 bytes", "too short"});
}

TEST_CASE("safetensors: a header length beyond the limit") {
  Bytes b(16, 0);
  b[7] = 0x80;  // 2^63
  EXPECT_ERROR([&] { parse(b); }, {"declares a header of", "more than the limit"});
}

TEST_CASE("safetensors: a header length beyond the end of the file") {
  Bytes b = st_file("{}");
  b[0] = 40;
  EXPECT_ERROR([&] { parse(b); }, {"header of 40 bytes", "only 2 bytes", "truncated"});
}

TEST_CASE("safetensors: a header that is not JSON") {
  EXPECT_ERROR([] { parse(st_file("{\"a\": {\"dtype\": \"U8\", \"shape\": [")); }, {"not valid JSON"});
  EXPECT_ERROR([] { parse(st_file("{\"a\" 1}")); }, {"not valid JSON"});
  EXPECT_ERROR([] { parse(st_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]} ,}", 1)); },
               {"not valid JSON"});
  EXPECT_ERROR([] { parse(st_file("")); }, {"not a JSON object"});
}

TEST_CASE("safetensors: a header that is not an object") {
  EXPECT_ERROR([] { parse(st_file("[1, 2]")); }, {"not a JSON object", "must start with '{'"});
  EXPECT_ERROR([] { parse(st_file(" {}")); }, {"not a JSON object", "must start with '{'"});
}

TEST_CASE("safetensors: a duplicate key") {
  const std::string e = R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  EXPECT_ERROR([&] { parse(st_file("{\"x\":" + e + ",\"x\":" + e + "}", 1)); }, {"key \"x\" twice"});
  EXPECT_ERROR([&] { parse(st_file(R"({"x":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1)); },
               {"key \"dtype\" twice"});
}

TEST_CASE("safetensors: an entry with missing or extra fields") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[1]}})", 1)); },
               {"tensor \"x\"", "exactly dtype, shape and data_offsets"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"y":1}})", 1)); },
               {"tensor \"x\"", "exactly"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":5})")); }, {"tensor \"x\"", "exactly"});
}

TEST_CASE("safetensors: a dtype ember does not have") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}})", 2)); },
               {"tensor \"x\"", "dtype \"U16\"", "F32, F64, F16, BF16, I32, I64, U8, I8 and BOOL"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":7,"shape":[1],"data_offsets":[0,1]}})", 1)); },
               {"dtype is not a string"});
}

TEST_CASE("safetensors: a negative, fractional or non-array shape") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})")); },
               {"shape entries must be non-negative integers", "-1"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1)); },
               {"non-negative integers"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":3,"data_offsets":[0,3]}})", 3)); },
               {"shape is not an array"});
}

TEST_CASE("safetensors: more dims than ember supports") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", 1)); },
               {"9 dims", "at most 8"});
}

TEST_CASE("safetensors: a shape whose byte count overflows") {
  EXPECT_ERROR([] {
    parse(st_file(R"({"x":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"));
  }, {"overflows"});
  // Also beside a zero-size dim: the tensor holds no data, but its strides would overflow.
  EXPECT_ERROR([] {
    parse(st_file(R"({"x":{"dtype":"F64","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})"));
  }, {"overflows"});
  CHECK(parse(st_file(R"({"x":{"dtype":"F64","shape":[0,4294967296],"data_offsets":[0,0]}})"))
            .get<double>("x")
            .numel() == 0);
}

TEST_CASE("safetensors: data offsets outside the data") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 3)); },
               {"data_offsets [0, 4]", "outside the data section of 3 bytes"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}})", 3)); },
               {"data_offsets [2, 1]"});
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1)); },
               {"data_offsets must be two non-negative integers"});
}

TEST_CASE("safetensors: a byte count that does not match dtype and shape") {
  EXPECT_ERROR([] { parse(st_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)); },
               {"tensor \"x\"", "F32 [2] is 8 bytes", "span 4"});
}

TEST_CASE("safetensors: overlapping tensors") {
  EXPECT_ERROR([] {
    parse(st_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6));
  }, {"tensor \"b\"", "starts at byte 2", "expected 4", "overlaps"});
}

TEST_CASE("safetensors: a gap between tensors") {
  EXPECT_ERROR([] {
    parse(st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                  R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})", 6));
  }, {"tensor \"b\"", "starts at byte 4", "expected 2", "gap"});
}

TEST_CASE("safetensors: data bytes no tensor indexes") {
  EXPECT_ERROR([] { parse(st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 5)); },
               {"cover 2 bytes of the 5-byte data section"});
}

TEST_CASE("safetensors: a BOOL byte that is not 0 or 1") {
  EXPECT_ERROR([] { parse(st_file(R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", 2, 7)); },
               {"tensor \"a\"", "BOOL", "byte 7", "0 or 1"});
}

TEST_CASE("safetensors: metadata that is not an object of strings") {
  EXPECT_ERROR([] { parse(st_file(R"({"__metadata__":{"k":1}})")); }, {"__metadata__ value of \"k\" is not a string"});
  EXPECT_ERROR([] { parse(st_file(R"({"__metadata__":[1]})")); }, {"__metadata__ must be an object"});
}

TEST_CASE("safetensors: asking for a missing tensor or for the wrong dtype") {
  const io::SafeTensors f = parse(st_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2));
  EXPECT_ERROR([&] { f.get<std::uint8_t>("b"); }, {"no tensor named \"b\""});
  EXPECT_ERROR([&] { f.get<float>("a"); }, {"tensor \"a\"", "dtype uint8", "float32"});
}

TEST_CASE("safetensors: writing a tensor named __metadata__ or an undefined tensor") {
  EXPECT_ERROR([] { io::serialize_safetensors({{"__metadata__", ones<float>(Shape{1})}}); },
               {"may not be named __metadata__"});
  EXPECT_ERROR([] { io::serialize_safetensors({{"w", Tensor<float>()}}); }, {"tensor \"w\" is undefined"});
}

TEST_CASE("safetensors: the header is the JSON a JSON library writes, and names must be UTF-8") {
  // Keys in byte order with __metadata__ among them, fields in byte order, no spaces; `"`, `\` and control bytes
  // (in the metadata: names may hold none) escaped, every other byte (DEL, multi-byte UTF-8, '/') as it is. The expected text is what nlohmann::json's
  // dump() wrote for these tensors (the writer before ember's own), byte for byte.
  io::TensorMap m;
  m["b"] = ones<float>(Shape{2});
  m["Z\"q\\\xc3\xa9\xf0\x9f\x98\x80/"] = zeros<std::uint8_t>(Shape{1, 0});
  m["a.x"] = scalar_tensor<double>(1.0);
  const io::Metadata meta{{"k\n", "v\t\x01\x1f\x7f\b\f\r"}, {"e", ""}};
  const Bytes bytes = io::serialize_safetensors(m, meta);
  std::uint64_t hn = 0;
  for (int i = 7; i >= 0; --i) hn = (hn << 8) | bytes[std::size_t(i)];
  std::string header(reinterpret_cast<const char*>(bytes.data() + 8), std::size_t(hn));
  while (!header.empty() && header.back() == ' ') header.pop_back();
  CHECK(header == "{\"Z\\\"q\\\\\xc3\xa9\xf0\x9f\x98\x80/\":"
                  "{\"data_offsets\":[16,16],\"dtype\":\"U8\",\"shape\":[1,0]},"
                  "\"__metadata__\":{\"e\":\"\",\"k\\n\":\"v\\t\\u0001\\u001f\x7f\\b\\f\\r\"},"
                  "\"a.x\":{\"data_offsets\":[0,8],\"dtype\":\"F64\",\"shape\":[]},"
                  "\"b\":{\"data_offsets\":[8,16],\"dtype\":\"F32\",\"shape\":[2]}}");
  const io::SafeTensors f = io::parse_safetensors(bytes);
  CHECK(f.metadata == meta);
  CHECK(f.contains("Z\"q\\\xc3\xa9\xf0\x9f\x98\x80/"));

  // Not UTF-8: a stray continuation byte, 0xff, an overlong '/', a surrogate, a code point above U+10FFFF, a
  // sequence cut short. Each is an ember::Error naming the name and the byte, not a JSON library's exception.
  for (const std::string& bad : {std::string("w\x80"), std::string("\xff"), std::string("a\xc0\xaf"),
                                 std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
                                 std::string("x\xe2\x82")}) {
    INFO(bad.size());
    EXPECT_ERROR([&] { io::serialize_safetensors({{bad, ones<float>(Shape{1})}}); },
                 {"safetensors: tensor name", "is not valid UTF-8", "at offset"});
  }
  EXPECT_ERROR([] { io::serialize_safetensors({}, {{"k", "\xc3"}}); },
               {"the value of metadata key \"k\"", "not valid UTF-8", "byte 0xc3 at offset 0"});
  EXPECT_ERROR([] { io::serialize_safetensors({}, {{"\xe0\x80\x80", "v"}}); },
               {"metadata key \"\\xe0\\x80\\x80\"", "not valid UTF-8", "byte 0xe0"});
}

TEST_CASE("safetensors: the header's JSON: escapes, numbers and what JSON forbids") {
  // Escapes: every short one, \u in both cases, a surrogate pair (U+1F600), raw UTF-8; whitespace between tokens.
  const io::SafeTensors f = parse(st_file(
      "{ \"__metadata__\" : { \"k\\u00E9\\ud83d\\ude00\" : \"\\\"\\\\\\/\\b\\f\\n\\r\\t\xc3\xa9\" } ,\n"
      "\t\"w\":{\"dtype\":\"U8\",\"shape\":[ 2 ,3 ],\"data_offsets\":[0,6]}\r}",
      6));
  CHECK(f.metadata.at("k\xc3\xa9\xf0\x9f\x98\x80") == "\"\\/\b\f\n\r\t\xc3\xa9");
  CHECK(io::shape_of(f.tensors.at("w")) == Shape{2, 3});
  // Numbers where the grammar wants non-negative integers: the value as written in the message.
  const auto shape_error = [](const std::string& number) {
    const std::string h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[" + number + "],\"data_offsets\":[0,1]}}";
    return error_of([&] { parse(st_file(h, 1)); });
  };
  for (const auto& [n, shown] : std::vector<std::pair<std::string, std::string>>{
           {"-1", "-1"}, {"-0", "0"}, {"1.0", "1.0"}, {"1e2", "1e2"}, {"18446744073709551616", "18446744073709551616"},
           {"-9223372036854775809", "-9223372036854775809"}, {"-9223372036854775808", "-9223372036854775808"}}) {
    const std::string& number = n;  // INFO's lambda captures a variable, not a structured binding (clang 14)
    INFO(number);
    CHECK(shape_error(number).find("non-negative integers, got " + shown) != std::string::npos);
  }
  // Not JSON, each at the byte where it goes wrong.
  for (const std::string bad : {"01", "1.", ".5", "-", "1e", "+1", "1e+", "tru", "nul", "[1,]", "[1 2]", "{}"}) {
    INFO(bad);
    const std::string msg = shape_error(bad);
    CHECK((msg.find("not valid JSON") != std::string::npos || msg.find("not an array") != std::string::npos ||
           msg.find("non-negative integers") != std::string::npos));
  }
  for (const std::string& key : {std::string("\x01"), std::string("\\q"), std::string("\\u12"), std::string("\\u12G4"),
                                std::string("\\udc00"), std::string("\\ud800"), std::string("\\ud800\\u0041"),
                                std::string("\xff"), std::string("\xed\xa0\x80"), std::string("\xc0\xaf"),
                                std::string("\xe2\x82")}) {
    INFO(ember::detail::quote_untrusted(key));
    const std::string msg = error_of([&] { parse(st_file("{\"__metadata__\":{\"" + key + "\":\"v\"}}")); });
    CHECK(msg.find("not valid JSON") != std::string::npos);
    CHECK(msg.find("at byte 17 of the header") != std::string::npos);  // where the string starts
  }
  for (const char* text : {"{\"a\"}", "{\"a\":}", "{,}", "{\"__metadata__\":{},}", "{\"__metadata__\":{}",
                           "{\"__metadata__\":{\"k\":\"v}}"}) {
    INFO(text);
    CHECK(error_of([&] { parse(st_file(text)); }).find("not valid JSON") != std::string::npos);
  }
}

#ifdef EMBER_TEST_NLOHMANN
// nlohmann::json's strict SAX parser feeding the same header grammar: the reader ember used before its own.
struct NlohmannToHeader {
  using json = nlohmann::json;
  io::detail::SafetensorsHeaderParser& h;
  bool null() { return h.null(); }
  bool boolean(bool b) { return h.boolean(b); }
  bool number_integer(json::number_integer_t v) { return h.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return h.number_unsigned(v); }
  bool number_float(json::number_float_t, const json::string_t& text) { return h.number_float(text); }
  bool string(json::string_t& v) { return h.string(v); }
  bool binary(json::binary_t&) { throw Error("binary"); }
  bool start_object(std::size_t) { return h.start_object(); }
  bool key(json::string_t& k) { return h.key(k); }
  bool end_object() { return h.end_object(); }
  bool start_array(std::size_t) { return h.start_array(); }
  bool end_array() { return h.end_array(); }
  template <class E>
  bool parse_error(std::size_t, const std::string&, const E&) {
    throw Error("not valid JSON");
  }
};

// What one reader made of a header: "error", or the entries and metadata it collected.
template <class Read>
std::string header_outcome(Read read) {
  const std::string name = "f";
  io::detail::SafetensorsHeaderParser h(name);
  h.data_size = std::uint64_t(1) << 40;
  try {
    read(h);
  } catch (const Error&) {
    return "error";
  }
  if (!h.complete()) return "incomplete";
  std::string r = "ok";
  for (const auto& e : h.entries)
    r += "|" + e.name + ":" + io::detail::safetensors_dtype(e.dtype) + ":" + e.shape.str() + ":" +
         std::to_string(e.begin) + "-" + std::to_string(e.end);
  for (const auto& [k, v] : h.metadata) r += "|" + k + "=" + v;
  return r;
}

TEST_CASE("safetensors: ember's JSON reader accepts exactly what nlohmann::json's strict parser accepts") {
  // Valid headers, then thousands of random edits of them (bytes replaced, inserted, deleted, from an alphabet of
  // JSON's punctuation, digits, escapes, whitespace and UTF-8 lead, continuation and invalid bytes). Both readers
  // drive the same grammar; they must agree on every input: both reject it, or both return the same contents.
  const std::vector<std::string> seeds = {
      R"({"__metadata__":{"k\u00e9":"v\ud83d\ude00","a":"\"\\\/\b\f\n\r\t"},)"
      R"("w":{"dtype":"U8","shape":[2,3],"data_offsets":[0,6]}})",
      "{ \"x\" : { \"dtype\" : \"F32\" , \"shape\" : [ ] , \"data_offsets\" : [ 6 , 10 ] } ,\n\t\"__metadata__\":{}\r}",
      "{\"a\xc3\xa9\xf0\x9f\x98\x80\":{\"shape\":[0,18446744073709551615],\"data_offsets\":[0,0],\"dtype\":\"BOOL\"}}",
      R"({"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"BF16","shape":[4],"data_offsets":[8,16]}})",
      R"({})"};
  // (No NUL: parse_safetensors rejects a header with one before any reader sees it, and nlohmann's stops there.)
  const std::string alphabet =
      "{}[]\",:\\/ \t\n\r0123456789-+.eEuabfnrtlsdDF\x7f\xc3\xa9\xed\xa0\x80\xbf\xf0\x9f\xf4\x90\xff\xc0";
  std::mt19937 rng(7);
  int agree = 0, accepted = 0;
  std::vector<std::string> disagreements;
  for (int trial = 0; trial < 30000; ++trial) {
    std::string h = seeds[rng() % seeds.size()];
    const int edits = 1 + int(rng() % 3);
    for (int k = 0; k < edits && !h.empty(); ++k) {
      const std::size_t at = rng() % h.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 4) {
        case 0: h[at] = c; break;
        case 1: h.insert(h.begin() + std::ptrdiff_t(at), c); break;
        case 2: h.erase(at, 1); break;
        default: h.insert(at, h.substr(at, 1 + rng() % 8)); break;
      }
    }
    if (trial < int(seeds.size())) h = seeds[std::size_t(trial)];
    const std::string ours = header_outcome([&](io::detail::SafetensorsHeaderParser& p) {
      ember::detail::JsonSax<io::detail::SafetensorsHeaderParser>(h.data(), h.data() + h.size(), p, "f").run();
    });
    const std::string theirs = header_outcome([&](io::detail::SafetensorsHeaderParser& p) {
      NlohmannToHeader a{p};
      if (!nlohmann::json::sax_parse(h.begin(), h.end(), &a, nlohmann::json::input_format_t::json, true))
        throw Error("rejected");
    });
    if (ours == theirs) {
      ++agree;
      accepted += ours != "error";
    } else if (disagreements.size() < 5) {
      disagreements.push_back(ember::detail::quote_untrusted(h, 400) + " ember: " + ours + " nlohmann: " + theirs);
    }
  }
  std::string all;
  for (const auto& d : disagreements) all += d + "\n";
  INFO(all);
  INFO("accepted " << accepted);
  CHECK(disagreements.empty());
  CHECK(agree == 30000);
  CHECK(accepted > 600);  // many edited headers stay valid: the comparison covers acceptance, not only errors
}
#endif

TEST_CASE("safetensors: a missing file") {
  EXPECT_ERROR([] { io::load_safetensors("/nonexistent/x.safetensors"); },
               {"load_safetensors", "cannot open", "/nonexistent/x.safetensors"});
}

namespace {
/// True when `s` holds a byte that a terminal could interpret (control characters, DEL, bytes >= 0x80).
bool has_raw_control(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c < 0x20 || c >= 0x7f;
  });
}
std::string tensor_entry(const char* dtype, std::uint64_t n, std::uint64_t at) {
  return std::string("{\"dtype\":\"") + dtype + "\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" +
         std::to_string(at) + "," + std::to_string(at + n) + "]}";
}
}  // namespace

TEST_CASE("safetensors: a shape nested 100000 deep is an error, not a stack overflow") {
  const std::size_t depth = 100000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  EXPECT_ERROR([&] { parse(st_file(R"({"x":{"dtype":"U8","shape":)" + nested + R"(,"data_offsets":[0,0]}})")); },
               {"tensor \"x\"", "shape entries must be non-negative integers", "an array"});
  // ... and anywhere else in the header.
  EXPECT_ERROR([&] { parse(st_file(R"({"x":)" + nested + "}")); },
               {"tensor \"x\"", "must be an object with exactly dtype, shape and data_offsets"});
  EXPECT_ERROR([&] { parse(st_file(R"({"x":{"dtype":)" + nested + "}}")); }, {"dtype is not a string"});
  EXPECT_ERROR([&] { parse(st_file(R"({"x":{"data_offsets":)" + nested + "}}")); },
               {"data_offsets must be two non-negative integers"});
  EXPECT_ERROR([&] { parse(st_file(R"({"__metadata__":{"k":)" + nested + "}}")); },
               {"__metadata__ value of \"k\" is not a string"});
  EXPECT_ERROR([&] { parse(st_file(R"({"__metadata__":)" + nested + "}")); },
               {"__metadata__ must be an object of strings"});
  std::string deep_objects;
  for (std::size_t i = 0; i < depth; ++i) deep_objects += "{\"a\":";
  deep_objects += "1" + std::string(depth, '}');
  EXPECT_ERROR([&] { parse(st_file(deep_objects)); }, {"tensor \"a\""});
  EXPECT_ERROR([&] { parse(st_file("{\"x\":" + deep_objects + "}")); }, {"tensor \"x\"", "exactly dtype"});
}

TEST_CASE("safetensors: a NUL byte in the header") {
  // Bytes after a NUL must not be ignored: "{}\0{...}" is not an empty file.
  std::string h = std::string("{}") + '\0' + "{\"x\":" + tensor_entry("U8", 1, 0) + "}";
  EXPECT_ERROR([&] { parse(st_file(h, 1)); }, {"'f.safetensors'", "NUL byte at offset 2 of the header"});
  h = "{\"a" + std::string(1, '\0') + "b\":" + tensor_entry("U8", 1, 0) + "}";
  EXPECT_ERROR([&] { parse(st_file(h, 1)); }, {"NUL byte at offset 3"});
  EXPECT_ERROR([&] { parse(st_file(std::string("{}  ") + '\0' + "   ")); }, {"NUL byte at offset 4"});
}

TEST_CASE("safetensors: only spaces may follow the header's JSON object") {
  for (const char* tail : {"\n", "\t", "\r", " x", "}", " {}", "  \n  ", "\x1b[31m"}) {
    INFO("tail: " << ember::detail::quote_untrusted(tail));
    const std::string msg = error_of([&] { parse(st_file(std::string("{}") + tail)); });
    CHECK(msg.find("'f.safetensors'") != std::string::npos);
    CHECK((msg.find("only spaces") != std::string::npos || msg.find("not valid JSON") != std::string::npos));
    CHECK(!has_raw_control(msg));
  }
  // Trailing spaces (the padding writers add so the data is aligned) are fine.
  CHECK(parse(st_file("{}      ")).tensors.empty());
  const io::SafeTensors f = parse(st_file("{\"x\":" + tensor_entry("U8", 2, 0) + "}       ", 2, 9));
  CHECK(vec(f.get<std::uint8_t>("x")) == std::vector<std::uint8_t>{9, 9});
}

TEST_CASE("safetensors: duplicate keys among many tensors and in the metadata") {
  const int n = 3000;
  std::string h = "{\"__metadata__\":{\"k\":\"v\"}";
  for (int i = 0; i < n; ++i) h += ",\"t" + std::to_string(i) + "\":" + tensor_entry("U8", 1, std::uint64_t(i));
  Bytes b = st_file(h + "}", std::size_t(n));
  for (int i = 0; i < n; ++i) b[b.size() - std::size_t(n) + std::size_t(i)] = static_cast<unsigned char>(i % 251);
  const io::SafeTensors f = parse(b);
  REQUIRE(f.tensors.size() == std::size_t(n));
  CHECK(f.get<std::uint8_t>("t0").data()[0] == 0);
  CHECK(f.get<std::uint8_t>("t2999").data()[0] == 2999 % 251);
  CHECK(f.metadata.at("k") == "v");
  // The same key again, at the end of the object: found, however far apart the two are.
  EXPECT_ERROR([&] { parse(st_file(h + ",\"t17\":" + tensor_entry("U8", 1, n) + "}", std::size_t(n) + 1)); },
               {"key \"t17\" twice"});
  EXPECT_ERROR([&] { parse(st_file(h + ",\"__metadata__\":{}}", std::size_t(n))); }, {"key \"__metadata__\" twice"});
  EXPECT_ERROR([] { parse(st_file(R"({"__metadata__":{"k":"1","j":"2","k":"3"}})")); }, {"key \"k\" twice"});
  // Keys that differ only after an escape are different keys; the same key spelled two ways is the same.
  EXPECT_ERROR([] { parse(st_file(R"({"__metadata__":{"k":"1","\u006b":"2"}})")); }, {"key \"k\" twice"});
}

TEST_CASE("safetensors: names, keys and strings from the file are escaped in error messages") {
  const std::string red = "\\u001b[31m";  // JSON for ESC [ 3 1 m
  const std::string esc = R"(\x1b[31m)";     // how the message shows it
  const std::string rlo = "\xe2\x80\xae";     // U+202E, printable but not ASCII
  const std::string rlo_esc = R"(\xe2\x80\xae)";
  auto check_escaped = [&](const std::function<void()>& f, const std::vector<std::string>& parts) {
    const std::string msg = error_of(f);
    INFO("message: " << ember::detail::quote_untrusted(msg, 400));
    CHECK(msg.rfind("<", 0) != 0);
    CHECK(!has_raw_control(msg));
    for (auto& p : parts) CHECK(msg.find(p) != std::string::npos);
  };
  // A tensor name with a control character is refused, and the message shows it escaped.
  check_escaped([&] { parse(st_file("{\"" + red + "w\":" + tensor_entry("U8", 1, 0) + "}", 1)); },
                {"tensor name \"" + esc + "w\"", "control character at byte 0"});
  check_escaped([&] { parse(st_file("{\"a\\u0000b\":" + tensor_entry("U8", 1, 0) + "}", 1)); },
                {"tensor name \"a\\x00b\"", "control character at byte 1"});
  check_escaped([&] { parse(st_file("{\"\\u009b31m\":" + tensor_entry("U8", 1, 0) + "}", 1)); },
                {"tensor name \"\\xc2\\x9b31m\"", "control character at byte 0"});
  EXPECT_ERROR([&] { io::serialize_safetensors({{"w\x1b[2J", ones<float>(Shape{1})}}); },
               {"safetensors: tensor name \"w\\x1b[2J\"", "control character"});
  // A printable name that is not ASCII (here a right-to-left override, U+202E) in each kind of message.
  check_escaped([&] { parse(st_file("{\"" + rlo + "w\":" + tensor_entry("U16", 1, 0) + "}", 1)); },
                {"tensor \"" + rlo_esc + "w\"", "dtype \"U16\""});
  check_escaped([&] { parse(st_file("{\"" + rlo + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}," +
                                    "\"" + rlo + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2)); },
                {"key \"" + rlo_esc + "\" twice"});
  check_escaped([&] { parse(st_file("{\"a\":" + tensor_entry("U8", 1, 0) + ",\"" + rlo + "\":" +
                                    tensor_entry("U8", 1, 2) + "}", 3)); },
                {"tensor \"" + rlo_esc + "\"", "gap"});
  check_escaped([&] { parse(st_file("{\"" + rlo + "\":" + tensor_entry("BOOL", 1, 0) + "}", 1, 5)); },
                {"tensor \"" + rlo_esc + "\"", "byte 5"});
  check_escaped([&] { parse(st_file("{\"" + rlo + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"" +
                                    red + "\":1}}", 1)); },
                {"tensor \"" + rlo_esc + "\"", "exactly dtype"});
  // A dtype string, metadata keys and values.
  check_escaped([&] { parse(st_file("{\"w\":{\"dtype\":\"" + red + "\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1)); },
                {"dtype \"" + esc + "\""});
  check_escaped([&] { parse(st_file("{\"__metadata__\":{\"" + red + "\":1}}")); },
                {"__metadata__ value of \"" + esc + "\""});
  // A shape entry that is not an integer: the number as written, bounded.
  check_escaped([&] { parse(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5e3],\"data_offsets\":[0,1]}}", 1)); },
                {"non-negative integers", "got 1.5e3"});
  check_escaped([&] {
    const std::string long_number = "1." + std::string(100000, '0');
    parse(st_file("{\"w\":{\"dtype\":\"U8\",\"shape\":[" + long_number + "],\"data_offsets\":[0,1]}}", 1));
  }, {"non-negative integers", "got 1.000", "bytes)"});
  // Raw bytes in an invalid JSON string reach the JSON library's message: escaped as well, and bounded.
  check_escaped([&] { parse(st_file("{\"\xc2\x9b" + std::string(100000, 'a') + "\x1b\":1}")); },
                {"not valid JSON", "bytes)"});
  // A name asked for by the caller that came from somewhere untrusted.
  const io::SafeTensors f = parse(st_file("{\"a\":" + tensor_entry("U8", 1, 0) + "}", 1));
  check_escaped([&] { f.get<std::uint8_t>("\x1b[31m"); }, {"no tensor named \"" + esc + "\""});
  check_escaped([&] { f.get<float>("a"); }, {"tensor \"a\"", "dtype uint8"});
  // Checkpoints: tensor names and metadata values.
  TempDir d;
  io::save_safetensors(d / "bad.ckpt", {{rlo, ones<float>(Shape{1})}},
                       {{"format", "ember-checkpoint-1"}, {"epoch", "1"}, {"step", "1"}, {"rng_seed", "1"},
                        {"rng_offset", "0"}});
  check_escaped([&] { io::load_checkpoint(d / "bad.ckpt"); },
                {"tensor \"" + rlo_esc + "\"", "none of model/, optimizer/, scheduler/"});
  io::save_safetensors(d / "bad2.ckpt", {{"model/w", ones<float>(Shape{1})}}, {{"format", "\x1b[31m"}});
  check_escaped([&] { io::load_checkpoint(d / "bad2.ckpt"); }, {"not an ember checkpoint", "\"" + esc + "\""});
  io::save_safetensors(d / "bad3.ckpt", {{"model/w", ones<float>(Shape{1})}},
                       {{"format", "ember-checkpoint-1"}, {"epoch", "\x1b[31m"}});
  check_escaped([&] { io::load_checkpoint(d / "bad3.ckpt"); }, {"'epoch' is \"" + esc + "\"", "not an integer"});
}

// ---- atomic files and checkpoints ------------------------------------------------------------------------------

namespace {
struct HookGuard {
  ~HookGuard() { io::detail::atomic_write_before_rename = nullptr; }
};
std::vector<std::string> listing(const fs::path& d) {
  std::vector<std::string> v;
  for (auto& e : fs::directory_iterator(d)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}
}  // namespace

TEST_CASE("atomic_write: a crash between writing and renaming leaves the previous file intact") {
  TempDir d;
  const std::string path = d / "ckpt.safetensors";
  io::save_safetensors(path, {{"w", full<float>(Shape{1000}, 1.0f)}}, {{"v", "old"}});
  const Bytes old = read_bytes(path);

  // A child process writes a new version and dies (_exit, no cleanup) after the temporary file is complete and
  // synced but before the rename: what a power cut or a kill at that moment leaves behind.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    io::detail::atomic_write_before_rename = [](const std::string&) { ::_exit(0); };
    io::save_safetensors(path, {{"w", full<float>(Shape{1000}, 2.0f)}}, {{"v", "new"}});
    ::_exit(3);  // not reached when the hook runs
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(read_bytes(path) == old);
  const io::SafeTensors f = io::load_safetensors(path);
  CHECK(f.metadata.at("v") == "old");
  CHECK(f.get<float>("w").data()[999] == 1.0f);
  CHECK(listing(d.path).size() == 2);  // the target and the dead writer's temporary file, which readers ignore

  // An error before the rename (here thrown by the hook) removes the temporary file and keeps the old one.
  {
    HookGuard guard;
    io::detail::atomic_write_before_rename = [](const std::string& tmp) {
      CHECK(fs::exists(tmp));
      throw std::runtime_error("disk on fire");
    };
    CHECK_THROWS_WITH(io::save_safetensors(path, {{"w", full<float>(Shape{3}, 3.0f)}}), "disk on fire");
  }
  CHECK(read_bytes(path) == old);
  // That save also removed the dead child's temporary file (stale temporary files of dead writers are cleaned up
  // on the next save to the same path), and its own temporary file is gone too.
  CHECK(listing(d.path) == std::vector<std::string>{"ckpt.safetensors"});
  // Without a crash the new file replaces the old one.
  io::save_safetensors(path, {{"w", full<float>(Shape{3}, 4.0f)}});
  CHECK(io::load_safetensors(path).get<float>("w").data()[2] == 4.0f);
}

TEST_CASE("atomic_write: a folder that does not exist") {
  const Bytes b{1, 2, 3};
  EXPECT_ERROR([&] { io::atomic_write("/nonexistent/dir/f.bin", b); }, {"atomic_write", "cannot create",
                                                                       "/nonexistent/dir/f.bin"});
}

using ember_test::dead_pid;

TEST_CASE("atomic_write: stale temporary files of dead writers are removed on the next save; live ones are kept") {
  TempDir d;
  const std::string path = d / "ckpt.safetensors";
  const std::string pre = ".ckpt.safetensors.tmp-";
  const pid_t dead = dead_pid(), dead2 = dead_pid();
  const pid_t live = ::fork();  // a writer that is still running
  REQUIRE(live >= 0);
  if (live == 0) {
    for (;;) ::pause();
  }
  const std::string D = std::to_string(dead), D2 = std::to_string(dead2), L = std::to_string(live),
                    self = std::to_string(::getpid());
  auto touch = [&](const std::string& name) { std::ofstream(d.path / name) << "a partial checkpoint"; };
  const std::vector<std::string> stale{pre + D + "-0", pre + D + "-17", pre + D2 + "-3"};
  const std::vector<std::string> kept{
      pre + L + "-0",                        // a live writer
      pre + self + "-999999",                // this process (its own writes in flight)
      pre + "0-1",                           // pid 0 is no writer (kill(0, 0) would mean the process group)
      pre + D + "-1x", pre + D + "-", pre + D, pre + D + "x-1", pre + "-" + D + "-1", pre + "123456789012-1",
      ".other.safetensors.tmp-" + D + "-0",  // another destination's
      "ckpt.safetensors.tmp-" + D + "-0",    // not hidden: not one of ours
      ".ckpt.safetensors.tmp-" + D + "-0.bak",
      "ckpt.safetensors.bak"};
  for (auto& n : stale) touch(n);
  for (auto& n : kept) touch(n);
  fs::create_directory(d.path / (pre + D + "-5"));  // a folder is never removed

  io::save_safetensors(path, {{"w", ones<float>(Shape{4})}});
  std::vector<std::string> expect = kept;
  expect.push_back("ckpt.safetensors");
  expect.push_back(pre + D + "-5");
  std::sort(expect.begin(), expect.end());
  CHECK(listing(d.path) == expect);
  CHECK(io::load_safetensors(path).get<float>("w").numel() == 4);

  // Once the live writer is gone, its file is stale too: the next save removes it.
  REQUIRE(::kill(live, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(live, &status, 0) == live);
  io::atomic_write(path, Bytes{1, 2, 3});
  expect.erase(std::find(expect.begin(), expect.end(), pre + L + "-0"));
  CHECK(listing(d.path) == expect);
  CHECK(read_bytes(path) == Bytes{1, 2, 3});
}

TEST_CASE("AtomicFile: streamed writes replace the file on commit; without commit nothing changes") {
  TempDir d;
  const std::string path = d / "records.bin";
  ember::atomic_write(path, Bytes{9});
  {
    ember::AtomicFile f(path, "RecordWriter");
    f.write(Bytes{1, 2});
    f.write("\x03", 1);
    CHECK(fs::exists(f.temp_path()));
    CHECK(read_bytes(path) == Bytes{9});  // readers still see the old file
    f.commit();
    CHECK(f.fd() == -1);
    EXPECT_ERROR([&] { f.write("x", 1); }, {"RecordWriter", "after commit"});
  }
  CHECK(read_bytes(path) == Bytes{1, 2, 3});
  std::string tmp;
  {
    ember::AtomicFile f(path);
    f.write("abc", 3);
    tmp = f.temp_path();
  }  // abandoned: e.g. an exception while writing
  CHECK(!fs::exists(tmp));
  CHECK(read_bytes(path) == Bytes{1, 2, 3});
  CHECK(listing(d.path) == std::vector<std::string>{"records.bin"});
  EXPECT_ERROR([&] { ember::AtomicFile f(d.path.string() + "/"); }, {"does not name a file"});
}

namespace {
/// A small deterministic training run with raw loops: linear regression by SGD with momentum on data drawn from
/// the generator each step. Its whole state is (w, momentum buffer, step, generator).
struct TinyTrainer {
  Tensor<float> w = zeros<float>(Shape{8});
  Tensor<float> mom = zeros<float>(Shape{8});
  std::int64_t step = 0;
  Generator g{1234};

  void train(int steps) {
    for (int s = 0; s < steps; ++s, ++step) {
      const Tensor<float> x = randn<float>(Shape{16, 8}, g), noise = randn<float>(Shape{16}, g);
      std::vector<float> grad(8, 0.0f);
      for (int i = 0; i < 16; ++i) {
        float pred = 0, target = noise.data()[i] * 0.1f;
        for (int j = 0; j < 8; ++j) {
          pred += x.data()[i * 8 + j] * w.data()[j];
          target += x.data()[i * 8 + j] * float(j + 1);
        }
        for (int j = 0; j < 8; ++j) grad[std::size_t(j)] += (pred - target) * x.data()[i * 8 + j] / 16.0f;
      }
      for (int j = 0; j < 8; ++j) {
        mom.data()[j] = 0.9f * mom.data()[j] + grad[std::size_t(j)];
        w.data()[j] -= 0.05f * mom.data()[j];
      }
    }
  }
  io::Checkpoint checkpoint() const {
    io::Checkpoint c;
    c.model["linear.weight"] = w.clone();
    c.optimizer["linear.weight.momentum_buffer"] = mom.clone();
    c.step = step;
    c.epoch = step / 4;
    c.rng = g;
    c.extra["lr"] = "0.05";
    return c;
  }
  void restore(const io::Checkpoint& c) {
    w = std::get<Tensor<float>>(c.model.at("linear.weight"));
    mom = std::get<Tensor<float>>(c.optimizer.at("linear.weight.momentum_buffer"));
    step = c.step;
    g = c.rng;
  }
};
}  // namespace

TEST_CASE("checkpoints: save, crash, resume continues bit-exactly") {
  TempDir d;
  const std::string path = d / "run.ckpt";
  TinyTrainer straight;
  straight.train(20);

  TinyTrainer first;
  first.train(10);
  io::save_checkpoint(path, first.checkpoint());
  first.train(3);  // progress after the checkpoint is lost in the "crash"

  TinyTrainer resumed;
  const io::Checkpoint c = io::load_checkpoint(path);
  CHECK(c.step == 10);
  CHECK(c.epoch == 2);
  CHECK(c.extra.at("lr") == "0.05");
  CHECK(c.rng.seed() == 1234);
  CHECK(c.rng.offset() > 0);
  resumed.restore(c);
  resumed.train(10);
  CHECK(resumed.step == straight.step);
  CHECK(resumed.g.offset() == straight.g.offset());
  CHECK(std::memcmp(resumed.w.data(), straight.w.data(), 8 * sizeof(float)) == 0);
  CHECK(std::memcmp(resumed.mom.data(), straight.mom.data(), 8 * sizeof(float)) == 0);
  // And the comparison can fail: a run that lost its generator state diverges.
  TinyTrainer wrong;
  wrong.restore(c);
  wrong.g = Generator(1234);
  wrong.train(10);
  CHECK(std::memcmp(wrong.w.data(), straight.w.data(), 8 * sizeof(float)) != 0);
}

TEST_CASE("checkpoints: a safetensors file that is not a checkpoint") {
  TempDir d;
  io::save_safetensors(d / "plain.safetensors", {{"w", ones<float>(Shape{2})}});
  EXPECT_ERROR([&] { io::load_checkpoint(d / "plain.safetensors"); },
               {"load_checkpoint", "not an ember checkpoint", "<missing>"});
}

TEST_CASE("checkpoints: a model, its AdamW and its scheduler through one state type, resumed bit-exactly") {
  TempDir d;
  auto make = [] {
    manual_seed(3);
    return nn::Sequential(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 2));
  };
  const Tensor<float> x = randn<float>({16, 4}), y = randn<float>({16, 2});
  auto train = [&](nn::Sequential& m, optim::AdamW<float>& opt, optim::LRScheduler& sched, int steps) {
    for (int i = 0; i < steps; ++i) {
      opt.zero_grad();
      nn::mse_loss(m(x), y).backward();
      opt.step();
      sched.step();
    }
  };
  nn::Sequential straight = make();
  optim::AdamW<float> opt_s(straight.parameters(), {.lr = 0.01});
  optim::CosineWarmupLR sched_s(opt_s, 3, 20);
  train(straight, opt_s, sched_s, 12);

  nn::Sequential first = make();
  optim::AdamW<float> opt_f(first.parameters(), {.lr = 0.01});
  optim::CosineWarmupLR sched_f(opt_f, 3, 20);
  train(first, opt_f, sched_f, 5);
  io::save_checkpoint(d / "run.ckpt", {.model = first.state_dict(), .optimizer = opt_f.state_dict(),
                                       .scheduler = sched_f.state_dict(), .step = 5, .rng = default_generator()});
  const io::Checkpoint c = io::load_checkpoint(d / "run.ckpt");
  nn::Sequential resumed = make();
  optim::AdamW<float> opt_r(resumed.parameters(), {.lr = 0.01});
  optim::CosineWarmupLR sched_r(opt_r, 3, 20);
  resumed.load_state_dict(c.model);
  opt_r.load_state_dict(c.optimizer);
  sched_r.load_state_dict(c.scheduler);
  CHECK(c.step == 5);
  CHECK(!c.scheduler.empty());
  train(resumed, opt_r, sched_r, 7);
  const auto a = straight.named_parameters(), b = resumed.named_parameters();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].second.to_vector() == b[i].second.to_vector());

  // A checkpoint's state dicts carry every dtype; the module that does not hold one says so at load_state_dict.
  io::save_safetensors(d / "u8.ckpt", {{"model/weight", ones<std::uint8_t>(Shape{2, 2})},
                                       {"model/bias", zeros<float>(Shape{2})}},
                       {{"format", "ember-checkpoint-1"}, {"epoch", "0"}, {"step", "0"}, {"rng_seed", "1"},
                        {"rng_offset", "0"}});
  const io::Checkpoint u8 = io::load_checkpoint(d / "u8.ckpt");
  REQUIRE(u8.model.count("weight") == 1);
  CHECK(std::get<Tensor<std::uint8_t>>(u8.model.at("weight")).to_vector() == std::vector<std::uint8_t>{1, 1, 1, 1});
  nn::Linear lin(2, 2);
  EXPECT_ERROR([&] { lin.load_state_dict(u8.model); },
               {"load_state_dict", "dtype mismatch for 'weight': the checkpoint has uint8, the module has float32"});
}

TEST_CASE("checkpoints: the one format holds the scaler, the position in the epoch and named generators") {
  TempDir d;
  Generator loader(99);
  loader.set_offset(5);
  io::Checkpoint c{.model = {{"w", Tensor<float>(ones<float>(Shape{2}))}},
                   .scaler = {{"scale", Tensor<double>(full<double>(Shape{}, 512.0))}},
                   .epoch = 3,
                   .batch_in_epoch = 7,
                   .step = 40,
                   .rng = Generator(11),
                   .generators = {{"loader", loader}},
                   .extra = {{"callback/x/y", "z"}}};
  io::save_checkpoint(d / "v2.ckpt", c);
  const io::SafeTensors raw = io::load_safetensors(d / "v2.ckpt");
  CHECK(raw.metadata.at("format") == "ember-checkpoint-2");
  const io::Checkpoint back = io::load_checkpoint(d / "v2.ckpt");
  CHECK(back.epoch == 3);
  CHECK(back.batch_in_epoch == 7);
  CHECK(back.step == 40);
  CHECK(back.rng.seed() == 11);
  REQUIRE(back.generators.count("loader") == 1);
  CHECK(back.generators.at("loader").seed() == 99);
  CHECK(back.generators.at("loader").offset() == 5);
  CHECK(std::get<Tensor<double>>(back.scaler.at("scale")).item() == 512.0);
  CHECK(back.extra.at("callback/x/y") == "z");
  // Generator names and entries are checked on both sides.
  EXPECT_ERROR([&] { io::save_checkpoint(d / "g.ckpt", {.generators = {{"a/b", Generator()}}}); },
               {"save_checkpoint", "generator name \"a/b\""});
  // (Not a structured binding: clang before 16 cannot capture one in CAPTURE's lambda.)
  for (const auto& edit : std::vector<std::pair<std::string, std::string>>{
           {"generator/loader/offset", ""}, {"generator/loader/seed", "-1"}, {"generator//seed", "1"},
           {"generator/loader/colour", "1"}, {"generator/x\x1b/seed", "1"}}) {
    const std::string& key = edit.first;
    const std::string& value = edit.second;
    CAPTURE(key);
    io::SafeTensors f = raw;
    if (value.empty()) f.metadata.erase(key);
    else f.metadata[key] = value;
    io::save_safetensors(d / "bad.ckpt", f.tensors, f.metadata);
    EXPECT_ERROR([&] { io::load_checkpoint(d / "bad.ckpt"); }, {"load_checkpoint", "bad.ckpt", "generator"});
  }
}

TEST_CASE("checkpoints: files in the two earlier formats still load (committed, tests/fixtures/checkpoints)") {
  const std::string dir = std::string(EMBER_TEST_FIXTURES) + "/checkpoints/";
  // io::save_checkpoint's ember-checkpoint-1: model, optimizer and scheduler, epoch and step.
  const io::Checkpoint a = io::load_checkpoint(dir + "io-v1.ckpt");
  CHECK(a.epoch == 1);
  CHECK(a.step == 3);
  CHECK(a.batch_in_epoch == 0);
  CHECK(a.scaler.empty());
  CHECK(a.rng.seed() == 7);
  CHECK(a.rng.offset() > 0);
  CHECK(a.extra.at("note") == "written by io");
  // The Trainer's ember-train-checkpoint-1: the scaler too, the position in the epoch, global_step.
  const io::Checkpoint b = io::load_checkpoint(dir + "train-v1.ckpt");
  CHECK(b.epoch == 1);
  CHECK(b.batch_in_epoch == 2);
  CHECK(b.step == 3);
  CHECK(b.rng.seed() == 7);
  CHECK(b.extra.at("callback/EarlyStopping/wait") == "1");
  CHECK(b.extra.at("note") == "written by the Trainer");
  // Both load into the model, optimizer and scheduler they were written from (tests/fixtures/checkpoints/gen_v1.cpp).
  for (const io::Checkpoint* c : {&a, &b}) {
    nn::Linear fc(3, 2);
    optim::SGD opt(fc.parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::StepLR sched(opt, 2, 0.5);
    fc.load_state_dict(c->model);
    opt.load_state_dict(c->optimizer);
    sched.load_state_dict(c->scheduler);
    CHECK(opt.lr(0) == doctest::Approx(0.05));  // two StepLR steps of three
    CHECK(std::get<Tensor<float>>(a.model.at("weight")).to_vector() ==
          std::get<Tensor<float>>(c->model.at("weight")).to_vector());
  }
  amp::GradScaler scaler;
  scaler.load_state_dict(b.scaler);
  CHECK(scaler.get_scale() == 1024.0);
}

TEST_CASE("checkpoints: a damaged or negative step entry") {
  TempDir d;
  io::save_safetensors(d / "bad.ckpt", {{"model/w", ones<float>(Shape{2})}},
                       {{"format", "ember-checkpoint-1"}, {"epoch", "1"}, {"step", "12x"}, {"rng_seed", "1"},
                        {"rng_offset", "0"}});
  EXPECT_ERROR([&] { io::load_checkpoint(d / "bad.ckpt"); }, {"'step' is \"12x\"", "not an integer"});

  // Epoch and step count what is done: a negative one in a file, or given to save, is an error naming both.
  io::save_safetensors(d / "neg.ckpt", {{"model/w", ones<float>(Shape{2})}},
                       {{"format", "ember-checkpoint-1"}, {"epoch", "-1"}, {"step", "12"}, {"rng_seed", "1"},
                        {"rng_offset", "0"}});
  EXPECT_ERROR([&] { io::load_checkpoint(d / "neg.ckpt"); },
               {"load_checkpoint", "neg.ckpt", "'epoch' is \"-1\"", "not an integer in [0, 9000000000000000]"});
  EXPECT_ERROR([&] { io::save_checkpoint(d / "neg2.ckpt", {.step = -5}); },
               {"save_checkpoint", "neg2.ckpt", "epoch 0, batch_in_epoch 0 and step -5", "count what is done"});
  CHECK(!std::filesystem::exists(d / "neg2.ckpt"));
  io::save_checkpoint(d / "zero.ckpt", {});  // zero is a count
  CHECK(io::load_checkpoint(d / "zero.ckpt").step == 0);
}
