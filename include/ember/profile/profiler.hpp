// ember — the profiler: named time ranges recorded per thread (every forward op and backward node by name,
// optimizer steps, data-loader waits, collectives, host/device copies), written as a Chrome trace (open it in
// Perfetto or chrome://tracing) and summarised as a table of the top ops by self time.
//
//   profile::Profiler prof({.wait = 1, .warmup = 1, .active = 3});   // torch.profiler.schedule's phases
//   prof.start();
//   for (...) { train_step(); prof.step(); }
//   prof.stop();
//   prof.export_chrome_trace("trace.json");
//   std::puts(prof.table(15).c_str());
//
// The ranges themselves are ember/profile/range.hpp (what the ops include). One profiler records at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/atomic_file.hpp"
#include "ember/core/json.hpp"
#include "ember/profile/range.hpp"

namespace ember::profile {

/// The options of profile::Profiler: torch.profiler.schedule(wait, warmup, active, repeat)'s phases, in steps
/// (Profiler::step() ends one), one cycle being wait + warmup + active steps. The default records everything from
/// start() to stop(), as torch.profiler.profile without a schedule.
/// ```
/// profile::Profiler prof({.wait = 1, .warmup = 1, .active = 3});
/// ```
struct ProfilerOptions {
  int wait = 0;    ///< steps at the start of each cycle that are not recorded
  /// Steps after `wait` that are not recorded either (ember's recorder needs no warm-up; the phase keeps schedules
  /// portable).
  int warmup = 0;
  int active = 0;  ///< steps recorded in each cycle; 0: no schedule, everything from start() to stop() is recorded
  int repeat = 1;  ///< cycles; 0: for ever (PyTorch's default is 0)
};

/// One row of the summary: an op's calls, the time inside it (total) and inside it but not in a range nested in it
/// on the same thread (self).
struct OpStats {
  std::string name;        ///< the range's name (an op, a backward node, "optimizer.step", ...)
  std::string category;    ///< its category in the trace
  std::int64_t calls = 0;  ///< how many times it ran while recording
  double total_us = 0;     ///< microseconds inside it, nested ranges included
  double self_us = 0;      ///< microseconds inside it but not in a range nested in it on the same thread
};

/// Records ember's ops and your own profile::Range scopes over a schedule of steps (torch.profiler.profile with
/// torch.profiler.schedule): per-op totals (key_averages) and a Chrome trace. One profiler runs at a time.
class Profiler {
 public:
  /// A profiler with schedule `o` (wait, warmup, active, repeat: each >= 0); nothing is recorded before start().
  explicit Profiler(ProfilerOptions o = {}) : o_(o) {
    EMBER_CHECK(o.wait >= 0 && o.warmup >= 0 && o.active >= 0 && o.repeat >= 0, "profile::Profiler: wait, warmup, "
                "active and repeat must be non-negative, got ", o.wait, ", ", o.warmup, ", ", o.active, ", ", o.repeat);
  }
  ~Profiler() {
    if (started_) stop();
  }
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  /// Starts the schedule at step 0 (PyTorch's prof.start()); an error when another profiler is running.
  void start() {
    EMBER_CHECK(!started_, "profile::Profiler::start: already started");
    EMBER_CHECK(!owner().exchange(true), "profile::Profiler::start: another profiler is running (one at a time)");
    started_ = true;
    step_ = 0;
    drain(false);  // whatever was recorded before belongs to nobody
    set_phase();
  }
  /// Ends a step: advances the schedule (and, while recording, records the step as "ProfilerStep#<n>").
  void step() {
    EMBER_CHECK(started_, "profile::Profiler::step: not started");
    const std::int64_t t = now_ns();
    if (recording_) {
      record("ProfilerStep", "step", step_t0_, t);
      drain(true);
    }
    ++step_;
    set_phase();
  }
  /// Stops recording (PyTorch's prof.stop()); the destructor stops a started profiler too.
  void stop() {
    if (!started_) return;
    if (recording_) drain(true);
    detail::g_recording.store(false);
    recording_ = false;
    started_ = false;
    owner().store(false);
  }
  /// Whether start() was called and stop() not yet.
  bool started() const { return started_; }
  /// Whether the schedule is in an active step now.
  bool recording() const { return recording_; }
  /// The recorded ranges, in the order their threads recorded them.
  const std::vector<Event>& events() const { return events_; }
  /// Drops the recorded ranges.
  void clear() { events_.clear(); }

  /// Per-op totals, by self time, largest first.
  std::vector<OpStats> key_averages() const {
    std::map<std::pair<std::string, std::string>, OpStats> by;
    const std::vector<double> self = self_times();
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      OpStats& s = by[{e.name, e.category}];
      s.name = e.name;
      s.category = e.category;
      ++s.calls;
      s.total_us += double(e.end_ns - e.begin_ns) * 1e-3;
      s.self_us += self[i];
    }
    std::vector<OpStats> out;
    for (auto& [k, v] : by) out.push_back(v);
    std::stable_sort(out.begin(), out.end(), [](const OpStats& a, const OpStats& b) { return a.self_us > b.self_us; });
    return out;
  }

  /// The top `rows` ops by self time as a text table (steps excluded; their share is what the percentages use).
  std::string table(std::size_t rows = 20) const {
    std::vector<OpStats> all = key_averages();
    double step_us = 0, self_sum = 0;
    for (const auto& s : all) {
      if (s.category == "step") step_us += s.total_us;
      else self_sum += s.self_us;
    }
    const double base = step_us > 0 ? step_us : self_sum;
    char buf[256];
    std::string t;
    std::snprintf(buf, sizeof buf, "%-28s %-11s %8s %12s %7s %12s %12s\n", "name", "category", "calls", "self ms",
                  "self %", "total ms", "avg us");
    t += buf;
    t += std::string(96, '-') + "\n";
    std::size_t n = 0;
    for (const auto& s : all) {
      if (s.category == "step") continue;
      if (n++ == rows) break;
      std::snprintf(buf, sizeof buf, "%-28.28s %-11.11s %8lld %12.3f %6.1f%% %12.3f %12.2f\n", s.name.c_str(),
                    s.category.c_str(), (long long)s.calls, s.self_us * 1e-3, base > 0 ? 100.0 * s.self_us / base : 0.0,
                    s.total_us * 1e-3, s.total_us / double(s.calls));
      t += buf;
    }
    std::snprintf(buf, sizeof buf, "%zu ranges; %s %.3f ms\n", events_.size(),
                  step_us > 0 ? "profiled steps" : "self time in all", base * 1e-3);
    return t + buf;
  }

  /// The ranges as Chrome trace events (complete events, microseconds), written atomically. Names are JSON strings
  /// with every control character as `\u00xx`; their other bytes are written as they are (so a name that is not
  /// UTF-8 gives a trace that strict JSON readers refuse).
  void export_chrome_trace(const std::string& path) const {
    std::string j = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    const int pid = int(::getpid());
    std::int64_t t0 = events_.empty() ? 0 : events_[0].begin_ns;
    for (const Event& e : events_) t0 = std::min(t0, e.begin_ns);
    char buf[160];
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const Event& e = events_[i];
      j += "{\"name\": ";
      ember::detail::append_json_string(j, e.name, /*short_escapes=*/false);
      j += ", \"cat\": ";
      ember::detail::append_json_string(j, e.category, /*short_escapes=*/false);
      j += ", \"ph\": \"X\"";
      std::snprintf(buf, sizeof buf, ", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %u}",
                    double(e.begin_ns - t0) * 1e-3, double(e.end_ns - e.begin_ns) * 1e-3, pid, e.thread);
      j += buf;
      j += i + 1 < events_.size() ? ",\n" : "\n";
    }
    j += "]}\n";
    atomic_write(path, std::span(reinterpret_cast<const unsigned char*>(j.data()), j.size()));
  }

 private:
  static std::atomic<bool>& owner() {
    static std::atomic<bool> o{false};
    return o;
  }
  /// Recording in the current step? wait, warmup, active, then again (repeat times).
  void set_phase() {
    bool on = true;
    if (o_.active > 0) {
      const int cycle = o_.wait + o_.warmup + o_.active;
      const std::int64_t k = step_ / cycle, at = step_ % cycle;
      on = (o_.repeat == 0 || k < o_.repeat) && at >= o_.wait + o_.warmup;
    }
    recording_ = on;
    detail::g_recording.store(on);
    step_t0_ = now_ns();
  }

  /// Moves every thread's events here (keep = false: drops them).
  void drain(bool keep) {
    detail::Registry& r = detail::registry();
    std::lock_guard<std::mutex> g(r.m);
    for (auto& b : r.buffers) {
      std::lock_guard<std::mutex> gb(b->m);
      if (keep) events_.insert(events_.end(), b->events.begin(), b->events.end());
      b->events.clear();
    }
    // Buffers of threads that have ended (only the registry holds them) go; their ids are not reused.
    std::erase_if(r.buffers, [](const std::shared_ptr<detail::ThreadBuffer>& b) { return b.use_count() == 1; });
  }

  /// Each event's time minus its direct children's (ranges nest per thread: RAII scopes).
  std::vector<double> self_times() const {
    std::vector<std::size_t> order(events_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const Event &x = events_[a], &y = events_[b];
      if (x.thread != y.thread) return x.thread < y.thread;
      if (x.begin_ns != y.begin_ns) return x.begin_ns < y.begin_ns;
      return x.end_ns > y.end_ns;  // the enclosing range first
    });
    std::vector<double> self(events_.size());
    for (std::size_t i = 0; i < events_.size(); ++i) self[i] = double(events_[i].end_ns - events_[i].begin_ns) * 1e-3;
    std::vector<std::size_t> stack;
    std::uint32_t thread = ~0u;
    for (std::size_t i : order) {
      const Event& e = events_[i];
      if (e.thread != thread) stack.clear(), thread = e.thread;
      while (!stack.empty() && events_[stack.back()].end_ns <= e.begin_ns) stack.pop_back();
      if (!stack.empty()) self[stack.back()] -= double(e.end_ns - e.begin_ns) * 1e-3;
      stack.push_back(i);
    }
    return self;
  }

  ProfilerOptions o_;
  bool started_ = false, recording_ = false;
  std::int64_t step_ = 0, step_t0_ = 0;
  std::vector<Event> events_;
};

}  // namespace ember::profile
