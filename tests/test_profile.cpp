// The profiler (profile/profiler.hpp, profile/range.hpp): the schedule's steps, the ops' ranges by name and their
// nesting, the summary table, the Chrome trace (read with nlohmann::json where its header is found, and with ember's
// JSON reader, core/json.hpp: every event's fields, names with quotes, backslashes and control characters byte for
// byte). (The Trainer's ranges in the trace: test_train.cpp.)
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
#include "ember/data.hpp"
#include "ember/ember.hpp"
#include "helpers.hpp"
#include "toy_training.hpp"
#if __has_include(<nlohmann/json.hpp>)  // an independent JSON parser that reads the trace as any tool would
#include <nlohmann/json.hpp>
#define EMBER_TEST_NLOHMANN 1
#endif

using namespace ember;
using namespace ember_test;
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

#ifdef EMBER_TEST_NLOHMANN
TEST_CASE("Profiler: the schedule's active steps hold the ops by name, well nested, as valid Chrome trace JSON") {
  manual_seed(6);
  Net m;
  optim::SGD opt(m.parameters(), {.lr = 0.1});
  data::DataLoader tl(Toy{24}, {.batch_size = 4});
  profile::Profiler prof({.wait = 1, .warmup = 1, .active = 2});
  prof.start();
  int step = 0;
  for (auto& b : tl) {
    CHECK(prof.recording() == (step == 2 || step == 3));
    Tensor<float> loss = nn::cross_entropy(m(flat(b.data)), b.target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    prof.step();
    ++step;
  }
  prof.stop();
  CHECK_FALSE(profile::is_recording());
  std::map<std::string, int> calls;
  for (const auto& e : prof.events()) ++calls[e.name];
  CHECK(calls["ProfilerStep"] == 2);
  CHECK(calls["linear"] == 4);  // two layers, two steps
  CHECK(calls["LinearBackward"] + calls["LinearReluBackward"] == 4);
  CHECK(calls["cross_entropy"] == 2);
  CHECK(calls["CrossEntropyBackward"] == 2);
  CHECK(calls["SGD.step"] == 2);
  CHECK(calls["DataLoader.wait"] == 2);
  // Per thread, ranges are nested or disjoint, and begin <= end.
  for (const auto& a : prof.events()) {
    CHECK(a.begin_ns <= a.end_ns);
    for (const auto& b : prof.events()) {
      if (a.thread != b.thread || &a == &b) continue;
      const bool disjoint = a.end_ns <= b.begin_ns || b.end_ns <= a.begin_ns;
      const bool nested = (a.begin_ns <= b.begin_ns && b.end_ns <= a.end_ns) ||
                          (b.begin_ns <= a.begin_ns && a.end_ns <= b.end_ns);
      CHECK((disjoint || nested));
    }
  }
  // Self time: a step's ops are inside it, so the step's self time is less than its total.
  const auto stats = prof.key_averages();
  for (const auto& s : stats) {
    CHECK(s.self_us <= s.total_us + 1e-9);
    CHECK(s.self_us >= -1e-6);
    if (s.name == "ProfilerStep") CHECK(s.self_us < s.total_us);
  }
  const std::string table = prof.table(5);
  CHECK(table.find("self ms") != std::string::npos);
  CHECK(table.find("profiled steps") != std::string::npos);
  TempDir dir;
  prof.export_chrome_trace(dir / "trace.json");
  const nlohmann::json j = nlohmann::json::parse(read_file(dir / "trace.json"));
  REQUIRE(j["traceEvents"].is_array());
  CHECK(j["traceEvents"].size() == prof.events().size());
  for (const auto& e : j["traceEvents"]) {
    CHECK(e["ph"] == "X");
    CHECK(e["dur"].get<double>() >= 0);
    CHECK(e["ts"].get<double>() >= 0);
    CHECK(e["name"].is_string());
  }
  // Off: nothing is recorded, and a second profiler cannot run beside a first.
  Tensor<float> loss =
      nn::cross_entropy(m(flat(full<float>(Shape{2, 1, 2, 2}, 0.5f))), from_vector(std::vector<std::int64_t>{0, 1}));
  loss.backward();
  CHECK(prof.events().size() == j["traceEvents"].size());
  profile::Profiler a, b;
  a.start();
  expect_error(__LINE__, [&] { b.start(); }, {"another profiler is running"});
  a.stop();
  CHECK(a.events().empty());
}
#endif
