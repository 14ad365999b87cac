// ember — one-line performance hints on stderr: said once per process and topic, when ember sees a program run
// slower than it could for a reason the user can change (kernels compiled below the CPU's tier, int8 without the
// CPU's dot-product instructions, a data loader that keeps the model waiting). Off with EMBER_HINTS=0 or
// set_hints(false); hints never change what a program computes.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "ember/config.hpp"

namespace ember {

namespace detail {
/// -1: not read from the environment yet; 0: off; 1: on.
inline std::atomic<int>& hints_flag() {
  static std::atomic<int> f{-1};
  return f;
}
}  // namespace detail

/// Turns the hints off (or on again) for this process; EMBER_HINTS=0 in the environment turns them off at start.
inline void set_hints(bool on) { detail::hints_flag().store(on ? 1 : 0); }

/// Whether hints are printed.
inline bool hints_enabled() {
  int f = detail::hints_flag().load(std::memory_order_relaxed);
  if (f < 0) {
    const char* e = std::getenv("EMBER_HINTS");
    f = (e && (std::string(e) == "0" || std::string(e) == "off" || std::string(e) == "false")) ? 0 : 1;
    int expected = -1;
    detail::hints_flag().compare_exchange_strong(expected, f);
    f = detail::hints_flag().load();
  }
  return f == 1;
}

/// Prints "ember: hint: <text> (EMBER_HINTS=0 silences hints)" on stderr the first time `topic` is hinted in this
/// process, while hints are on; returns whether it printed.
[[gnu::cold, gnu::noinline]] inline bool hint(const std::string& topic, const std::string& text) {
  if (!hints_enabled()) return false;
  static std::mutex mu;
  static std::set<std::string> said;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!said.insert(topic).second) return false;
  }
  std::fprintf(stderr, "ember: hint: %s (EMBER_HINTS=0 silences hints)\n", text.c_str());
  return true;
}

}  // namespace ember
