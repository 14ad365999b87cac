// ember — configuration: version, host/device macros, the error type and EMBER_CHECK.
// Everything in ember includes this header; it includes nothing of ember.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#define EMBER_VERSION_MAJOR 0
#define EMBER_VERSION_MINOR 1
#define EMBER_VERSION_PATCH 0

// One vocabulary for code that runs on the host and on the device.
#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__
#define EMBER_DEVICE __device__
#else
#define EMBER_HOST_DEVICE
#define EMBER_DEVICE
#endif

#if defined(__GNUC__) || defined(__clang__)
#define EMBER_INLINE inline __attribute__((always_inline))
#define EMBER_RESTRICT __restrict__
#else
#define EMBER_INLINE inline
#define EMBER_RESTRICT
#endif

// Inner loops of the executors: GCC vectorises them at -O2 too (its -O2 cost model skips loops that need a
// runtime alias check, which every fused loop does).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define EMBER_VECTORIZE __attribute__((noinline, optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define EMBER_VECTORIZE
#endif

// EMBER_WITH_CUDA: 1 when CUDA code paths are compiled in. The build system defines it when it finds a CUDA
// toolkit; a translation unit compiled by nvcc always has it.
#ifndef EMBER_WITH_CUDA
#if defined(__CUDACC__)
#define EMBER_WITH_CUDA 1
#else
#define EMBER_WITH_CUDA 0
#endif
#endif

namespace ember {

/// The one exception type ember throws for user errors. The message names the op, the shapes, dtypes or devices
/// involved, and what was expected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ember

/// Throws ember::Error with the concatenation of the message parts when `cond` is false.
#define EMBER_CHECK(cond, ...)                                             \
  do {                                                                     \
    if (!(cond)) [[unlikely]] throw ::ember::Error(::ember::detail::concat(__VA_ARGS__)); \
  } while (0)
