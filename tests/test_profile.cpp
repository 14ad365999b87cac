// The profiler's Chrome trace (profile/profiler.hpp) read back with ember's JSON reader (core/json.hpp): every
// event's fields, names with quotes, backslashes and control characters byte for byte. (The schedule, the summary
// table and the Trainer's ranges: test_train.cpp.)
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ember/core/json.hpp"
#include "ember/profile/profiler.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

// The trace's events as the reader hands them over: one map of field -> value text per event object.
struct TraceReader {
  std::vector<std::map<std::string, std::string>> events;
  int depth = 0;
  bool in_events = false;
  std::string key_;
  std::vector<std::string> top_keys;
  void put(const std::string& v) {
    if (depth == 2 && in_events) events.back()[key_] = v;
    if (depth == 1 && key_ == "displayTimeUnit") top_keys.push_back("displayTimeUnit=" + v);
  }
  void null() { put("null"); }
  void boolean(bool b) { put(b ? "true" : "false"); }
  void number_unsigned(std::uint64_t v) { put(std::to_string(v)); }
  void number_integer(std::int64_t v) { put(std::to_string(v)); }
  void number_float(const std::string& text) { put(text); }
  void string(const std::string& s) { put("\"" + s); }  // marked as a string
  void key(const std::string& k) { key_ = k; }
  void start_object() {
    ++depth;
    if (depth == 2 && in_events) events.emplace_back();
  }
  void end_object() { --depth; }
  void start_array() {
    if (depth == 1 && key_ == "traceEvents") in_events = true;
  }
  void end_array() {
    if (depth == 1) in_events = false;
  }
};

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path temp_trace() {
  return fs::temp_directory_path() / ("ember_test_profile_" + std::to_string(::getpid()) + ".json");
}

// Names a user may give a range (string literals: the profiler keeps the pointers).
constexpr const char* kNames[] = {"plain", "quote\"d", "back\\slash", "tab\tnew\nline\rcr",
                                  "\x01\x1b[31mred\x1f", "caf\xc3\xa9 \xf0\x9f\x98\x80", "del\x7f"};
constexpr const char* kCategories[] = {"op", "cat\"\\\b\f", "op", "data", "\x02", "backward", "copy"};

}  // namespace

TEST_CASE("Profiler: the Chrome trace reads back with ember's JSON reader, hostile names byte for byte") {
  profile::Profiler prof;
  prof.start();
  for (std::size_t i = 0; i < std::size(kNames); ++i) {
    profile::Range r(kNames[i], kCategories[i]);
  }
  prof.stop();
  REQUIRE(prof.events().size() == std::size(kNames));
  const fs::path path = temp_trace();
  prof.export_chrome_trace(path.string());
  const std::string text = read_text(path);
  fs::remove(path);

  TraceReader r;
  ember::detail::JsonSax<TraceReader>(text.data(), text.data() + text.size(), r, path.string(), "the trace").run();
  CHECK(r.top_keys == std::vector<std::string>{"displayTimeUnit=\"ms"});
  REQUIRE(r.events.size() == prof.events().size());
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const auto& e = r.events[i];
    const profile::Event& ev = prof.events()[i];
    INFO(i);
    CHECK(e.size() == 7);
    CHECK(e.at("name") == "\"" + std::string(ev.name));
    CHECK(e.at("cat") == "\"" + std::string(ev.category));
    CHECK(e.at("ph") == "\"X");
    CHECK(e.at("pid") == std::to_string(::getpid()));
    CHECK(e.at("tid") == std::to_string(ev.thread));
    CHECK(std::stod(e.at("ts")) >= 0);
    CHECK(std::stod(e.at("dur")) >= 0);
  }
  // Every name recorded, in the order the ranges ended.
  for (std::size_t i = 0; i < std::size(kNames); ++i) CHECK(r.events[i].at("name") == "\"" + std::string(kNames[i]));
  // The bytes as the trace has always written them: control characters as \u00xx (never \n or \t), the rest as is.
  CHECK(text.find(R"({"name": "tab\u0009new\u000aline\u000dcr", "cat": "data", "ph": "X", "ts": )") !=
        std::string::npos);
  CHECK(text.find(R"("name": "\u0001\u001b[31mred\u001f", "cat": "\u0002")") != std::string::npos);
  CHECK(text.find(R"("name": "quote\"d", "cat": "cat\"\\\u0008\u000c")") != std::string::npos);
  CHECK(text.find("\"name\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"") != std::string::npos);
  CHECK(text.find("\"name\": \"del\x7f\"") != std::string::npos);
  CHECK(text.rfind("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n{\"name\": \"plain\", \"cat\": \"op\"", 0) == 0);
  CHECK(text.ends_with("}\n]}\n"));
}

TEST_CASE("Profiler: a range name that is not UTF-8 is written as it is; strict JSON readers refuse the trace") {
  profile::Profiler prof;
  prof.start();
  { profile::Range r("bad\xff name"); }
  prof.stop();
  const fs::path path = temp_trace();
  prof.export_chrome_trace(path.string());
  const std::string text = read_text(path);
  fs::remove(path);
  CHECK(text.find("\"name\": \"bad\xff name\", \"cat\": \"op\"") != std::string::npos);
  TraceReader r;
  try {
    ember::detail::JsonSax<TraceReader>(text.data(), text.data() + text.size(), r, "trace", "the trace").run();
    FAIL("the reader accepted a trace that is not UTF-8");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("invalid UTF-8 in a string") != std::string::npos);
  }
}
