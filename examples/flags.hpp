// The examples' numeric command-line flags. A value is a whole number (digits after an optional sign) or a finite
// real number, with nothing before or after it, within the range the example can use. Anything else ends the
// example with a usage error (exit status 2) that names the flag, what it takes and what it got, as an unknown flag
// does. "--batch -1", "--epochs 5x" or "--lr abc" used to be read as some other number by atoi/atof.
#pragma once

#include <ember/config.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace examples {

[[noreturn]] inline void bad_flag(const char* flag, const char* what, const char* text) {
  std::fprintf(stderr, "%s: expected %s, got \"%s\"\n", flag, what, text);
  std::exit(2);
}

/// The value of `flag` as a whole number in [lo, hi], read by ember's strict parser (ember::parse_int, the one it
/// uses for its environment variables).
inline long long int_flag(const char* flag, const char* text, long long lo, long long hi) {
  long long v = 0;
  if (!ember::parse_int(text, v) || v < lo || v > hi) {
    char what[96];
    std::snprintf(what, sizeof what, "a whole number in [%lld, %lld]", lo, hi);
    bad_flag(flag, what, text);
  }
  return v;
}

/// The value of `flag` as a finite real number in [lo, hi].
inline double real_flag(const char* flag, const char* text, double lo, double hi) {
  char what[96];
  std::snprintf(what, sizeof what, "a real number in [%g, %g]", lo, hi);
  const char* digits = (*text == '+' || *text == '-') ? text + 1 : text;
  if ((*digits < '0' || *digits > '9') && *digits != '.') bad_flag(flag, what, text);  // no spaces, "nan" or "inf"
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (*end != '\0' || errno == ERANGE || !std::isfinite(v) || !(v >= lo && v <= hi)) bad_flag(flag, what, text);
  return v;
}

}  // namespace examples
