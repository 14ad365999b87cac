// ember — configuration: version, host/device macros, the error type and EMBER_CHECK.
// Everything in ember includes this header; it includes nothing of ember.
#pragma once

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

// Build-mode macros: every EMBER_* macro that selects what is compiled, in one list. "Who" says who defines it.
//
// Defined by the user or a CMake target (the default applies when nobody does):
//   EMBER_WITH_CUDA       1: CUDA code paths compiled in. Default: 1 under nvcc, else 0 (below). Who: the
//                         ember::cuda target (=1), or the user.
//   EMBER_WITH_CUDNN      1: CUDA conv, pooling, batch norm and softmax run through cuDNN (with EMBER_WITH_CUDA
//                         and cudnn.h found). Default: undefined (those ops on CUDA tensors are errors that say so).
//                         Who: the ember::cudnn target, or the user (then link -lcudnn).
//   EMBER_WITH_NCCL       1 in TUs that link ember::nccl, for user code to test; ember's headers do not read it
//                         (dist/nccl.hpp needs only nccl.h, EMBER_HAVE_NCCL below). Who: the ember::nccl target.
//   EMBER_WITH_MPI        1 in TUs that link ember::mpi, for user code to test (example 08 does); ember's headers
//                         do not read it. Who: the ember::mpi target.
//   EMBER_WITH_IMAGE      1: <ember/data.hpp> includes the image decoding (libjpeg-turbo, libspng). Default:
//                         undefined. Who: the ember::image target, or the user (then link -ljpeg -lspng).
//   EMBER_HOST_ONLY       1: every tensor of the TU is on the CPU (Tensor::device() is a constant; CUDA branches
//                         drop out). Default: 1 without EMBER_WITH_CUDA and ember::precompiled, else 0 (below).
//                         Who: the user; ember's tests set 0. One value for every TU of a program.
//   EMBER_PRECOMPILED     the TU links ember::precompiled: the listed instantiations and the EMBER_HEADER_INLINE
//                         bodies are extern (below). Default: undefined (header-only). Who: the ember::precompiled
//                         target (INTERFACE).
//   EMBER_PRECOMPILED_IO  with EMBER_PRECOMPILED: <ember/io.hpp>'s file code is in the library too. Who: the
//                         ember::precompiled target (always).
//   EMBER_PRECOMPILED_BUILD, EMBER_PRECOMPILED_PART (0, 1)
//                         the library's own TUs, src/precompiled_<part>.cpp (through src/precompiled.inc); never a
//                         user's. They derive EMBER_PRECOMPILED_EXTERN(_0, _1), EMBER_HEADER_INLINE,
//                         EMBER_HEADER_BODIES, EMBER_IO_INLINE and EMBER_IO_BODIES (below).
//   EMBER_DEBUG_CHECKS    1: the losses' debug checks (nll_loss's log-probability check). Default: 0 with NDEBUG,
//                         else 1 (nn/loss.hpp). Who: the user.
//   EMBER_GEMM_EIGEN      defined: the CPU GEMM uses Eigen instead of ember's packed kernels. Default: undefined
//                         (cpu/detail/gemm_kernel.hpp). Who: the user; tests/check_headers.sh compiles with it.
//   EMBER_GEMM_NO_AVX512  defined: the AVX2 GEMM kernel on an AVX-512 target. Default: undefined. Who: the user;
//                         the tests' ember_tests_gemm_avx2 binary.
//
// Derived by ember's headers from the compiler's target and the headers found (read them; never define them):
//   EMBER_HAVE_CUDNN, EMBER_HAVE_NCCL   cudnn.h / nccl.h found (cuda/check.hpp, __has_include).
//   EMBER_USE_CUDNN       EMBER_WITH_CUDA && EMBER_HAVE_CUDNN && EMBER_WITH_CUDNN: CUDA tensors go through cuDNN
//                         (cuda/cudnn.hpp).
//   EMBER_CUDA_EXECUTOR   EMBER_WITH_CUDA under nvcc: the CUDA element-wise executor and reductions are compiled in
//                         (ops/elementwise.hpp); without it, element-wise ops on CUDA tensors are errors.
//   EMBER_CUDA_LOSS       the same for the CUDA loss kernels (ops/loss.hpp).
//   EMBER_HAS_ZLIB        zlib.h found: gzip'd IDX files are read (data/idx.hpp).
//   EMBER_HAS_F16C, EMBER_F16_BUILTIN_BIT_CAST   F16C conversions; __builtin_bit_cast available (core/float16.hpp).
//   EMBER_CPU_X86         an x86 host compiler: cpuid (cpu/isa.hpp).
//   EMBER_GEMM_PACKED, EMBER_GEMM_AVX512, EMBER_GEMM_AVX2, EMBER_GEMM_AMX   which CPU GEMM kernel the target
//                         allows (cpu/detail/gemm_kernel.hpp, gemm_amx.hpp).
//   EMBER_QGEMM_VNNI512, EMBER_QGEMM_VNNI256, EMBER_QGEMM_AVX2   the int8 GEMM's kernels (cpu/qgemm.hpp).
//   EMBER_CONV_DIRECT, EMBER_POOL_AVX512   AVX-512 direct convolution and pooling (cpu/conv_direct.hpp,
//                         cpu/pool.hpp).
// Tests and benchmarks have a few of their own (EMBER_TEST_*, EMBER_SOURCE_DIR, EMBER_BENCH_DIR), set by their
// CMakeLists.txt.

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

// Code a program runs once or rarely (constructors of layers, optimizers and data loaders, state dicts, checkpoint
// files, printing): the compiler optimises it for size and spends less time compiling it (header-only, every TU
// that uses it compiles it). What only such code calls may be optimised for size too (a layer's weight init); the
// kernels that the training step also calls are not.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define EMBER_COLD __attribute__((cold))
#else
#define EMBER_COLD
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

// Opt-in precompilation (CMake target ember::precompiled, README "Building fast"): under EMBER_PRECOMPILED the
// instantiations listed at the end of <ember/ember.hpp> and <ember/data.hpp> are declared extern; the library's
// sources (src/precompiled_*.cpp) define EMBER_PRECOMPILED_BUILD and compile them. CPU only.
#if defined(EMBER_PRECOMPILED) || defined(EMBER_PRECOMPILED_BUILD)
#if EMBER_WITH_CUDA
#error "ember::precompiled is built without CUDA; a TU that uses ember::cuda compiles ember header-only"
#endif
// The library is compiled as several TUs (src/precompiled_*.cpp) so that a parallel build compiles them side by
// side: each defines EMBER_PRECOMPILED_PART (0 when it is not given) and instantiates only its part's list, declaring
// the other parts' lists extern as users do. Part 0 also holds the bodies of the non-template functions (below).
// EMBER_PRECOMPILED_EXTERN_<k> is empty in the TU of part k and `extern` everywhere else; EMBER_PRECOMPILED_EXTERN
// is part 0's.
#if defined(EMBER_PRECOMPILED_BUILD) && !defined(EMBER_PRECOMPILED_PART)
#define EMBER_PRECOMPILED_PART 0
#endif
#if defined(EMBER_PRECOMPILED_BUILD) && EMBER_PRECOMPILED_PART == 0
#define EMBER_PRECOMPILED_EXTERN_0
#else
#define EMBER_PRECOMPILED_EXTERN_0 extern
#endif
#if defined(EMBER_PRECOMPILED_BUILD) && EMBER_PRECOMPILED_PART == 1
#define EMBER_PRECOMPILED_EXTERN_1
#else
#define EMBER_PRECOMPILED_EXTERN_1 extern
#endif
#define EMBER_PRECOMPILED_EXTERN EMBER_PRECOMPILED_EXTERN_0
#endif

// EMBER_HOST_ONLY: 1 when every tensor a TU handles lives on the CPU, so that Tensor::device() is the constant
// Device::cpu() and the optimiser drops each op's CUDA branch and what only that branch calls (a sixth of the
// object code of bench/compile_time/cnn_fmnist.cpp: the unfused fallbacks, the device copies and staging). The
// default is 1 in a TU without EMBER_WITH_CUDA, where no CUDA allocator exists, and 0 with EMBER_WITH_CUDA and
// with ember::precompiled (built once with 0: ember's tests are among its users). A TU with EMBER_HOST_ONLY=1 that
// meets a tensor on another device anyway (memory labelled so by from_blob, or a backend installed by hand) throws
// ember::Error from device(): it never runs a CPU loop over device memory. Like EMBER_WITH_CUDA, one value for
// every TU of a program; ember's tests set 0 (they stand in for a CUDA backend on the host).
#ifndef EMBER_HOST_ONLY
#if EMBER_WITH_CUDA || defined(EMBER_PRECOMPILED) || defined(EMBER_PRECOMPILED_BUILD)
#define EMBER_HOST_ONLY 0
#else
#define EMBER_HOST_ONLY 1
#endif
#endif
#if EMBER_HOST_ONLY && EMBER_WITH_CUDA
#error "EMBER_HOST_ONLY=1 with EMBER_WITH_CUDA: a TU with the CUDA backend handles CUDA tensors"
#endif
#if EMBER_HOST_ONLY && (defined(EMBER_PRECOMPILED) || defined(EMBER_PRECOMPILED_BUILD))
#error "EMBER_HOST_ONLY=1 with ember::precompiled, which is built with EMBER_HOST_ONLY=0"
#endif

// The same switch for the larger non-template functions (file parsing, shape checks and their messages, the autograd
// engine's graph walk, module bookkeeping, the thread pool's machinery, schedulers, transforms): each is declared
// EMBER_HEADER_INLINE and its body sits in an `#if EMBER_HEADER_BODIES` block. Header-only, EMBER_HEADER_INLINE is
// `inline` and the bodies are compiled in every TU that uses them. Under EMBER_PRECOMPILED the bodies are skipped
// (the TU calls the library's copies); the library's part 0 (EMBER_PRECOMPILED_BUILD) compiles them as ordinary,
// non-inline definitions. Every TU of a program that links ember::precompiled must therefore see EMBER_PRECOMPILED,
// as CMake's usage requirement arranges.
// EMBER_DEFERRED (on a declaration) and EMBER_DEFERRED_DEF (on the definition that follows a declaration) mark an
// EMBER_HEADER_INLINE function whose body instantiates much (every dtype of the state variant, whole layers) while
// few programs call it. Header-only, it is then a template with an unused, defaulted parameter: its body and what
// the body instantiates are compiled only in the TUs that call it, not in every TU that includes the header (a
// non-template inline body instantiates what it uses wherever it is parsed). Calls are unchanged. With
// ember::precompiled it stays an ordinary function, compiled once in the library.
#if defined(EMBER_PRECOMPILED_BUILD) || defined(EMBER_PRECOMPILED)
#define EMBER_DEFERRED
#define EMBER_DEFERRED_DEF
#else
#define EMBER_DEFERRED template <class = void>
#define EMBER_DEFERRED_DEF template <class>
#endif
#if defined(EMBER_PRECOMPILED_BUILD)
#define EMBER_HEADER_INLINE
#if EMBER_PRECOMPILED_PART == 0
#define EMBER_HEADER_BODIES 1
#else
#define EMBER_HEADER_BODIES 0
#endif
#elif defined(EMBER_PRECOMPILED)
#define EMBER_HEADER_INLINE
#define EMBER_HEADER_BODIES 0
#else
#define EMBER_HEADER_INLINE inline
#define EMBER_HEADER_BODIES 1
#endif
// <ember/io.hpp> takes part only when the library was built with it (CMake always defines EMBER_PRECOMPILED_IO for
// ember::precompiled; a library compiled by hand without it leaves io header-only in every mode).
#if defined(EMBER_PRECOMPILED) && !defined(EMBER_PRECOMPILED_BUILD) && !defined(EMBER_PRECOMPILED_IO)
#define EMBER_IO_INLINE inline
#define EMBER_IO_BODIES 1
#else
#define EMBER_IO_INLINE EMBER_HEADER_INLINE
#define EMBER_IO_BODIES EMBER_HEADER_BODIES
#endif

namespace ember {

/// The one exception type ember throws for user errors. The message names the op, the shapes, dtypes or devices
/// involved, and what was expected.
class Error : public std::runtime_error {
 public:
  /// An error with message `what` (what() returns it).
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// Error messages are built by ONE non-template function: the parts (strings, numbers) travel as a list of tagged
// values, so the many EMBER_CHECK sites do not each instantiate a stream formatter of their own argument types.
struct MsgPart {
  enum Kind : unsigned char { CStr, Str, Int, UInt, Dbl, Chr, Bool } kind;
  union {
    const char* s;
    const std::string* str;
    long long i;
    unsigned long long u;
    double d;
    char c;
    bool b;
  };
  MsgPart(const char* x) : kind(CStr), s(x) {}
  MsgPart(const std::string& x) : kind(Str), str(&x) {}
  MsgPart(char x) : kind(Chr), c(x) {}
  MsgPart(bool x) : kind(Bool), b(x) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_signed_v<T>, int> = 0>
  MsgPart(T x) : kind(Int), i(x) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_unsigned_v<T>, int> = 0>
  MsgPart(T x) : kind(UInt), u(x) {}
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  MsgPart(T x) : kind(Dbl), d(double(x)) {}
};

// Types a MsgPart prints exactly as an ostream does (character types other than char print as characters, so
// they, like every other type, take the general path).
template <class T>
constexpr bool is_msg_integer() {
  if constexpr (std::is_integral_v<T>)
    return sizeof(T) > 1 && !std::is_same_v<T, wchar_t> && !std::is_same_v<T, char16_t> &&
           !std::is_same_v<T, char32_t>;
  else
    return false;
}
template <class T>
inline constexpr bool is_msg_part_v =
    std::is_same_v<T, char> || std::is_same_v<T, bool> || std::is_same_v<T, float> || std::is_same_v<T, double> ||
    is_msg_integer<T>() ||
    std::is_same_v<T, std::string> || std::is_same_v<T, const char*> ||
    std::is_same_v<T, char*> || (std::is_array_v<T> && std::is_same_v<std::remove_cv_t<std::remove_extent_t<T>>, char>);

[[gnu::cold, gnu::noinline]] inline std::string concat_parts(std::initializer_list<MsgPart> parts) {
  std::ostringstream os;
  for (const MsgPart& p : parts) {
    switch (p.kind) {
      case MsgPart::CStr: os << p.s; break;
      case MsgPart::Str: os << *p.str; break;
      case MsgPart::Int: os << p.i; break;
      case MsgPart::UInt: os << p.u; break;
      case MsgPart::Dbl: os << p.d; break;
      case MsgPart::Chr: os << p.c; break;
      case MsgPart::Bool: os << p.b; break;
    }
  }
  return os.str();
}

/// The concatenation of the parts as an ostream prints them.
template <class... Args>
std::string concat(const Args&... args) {
  if constexpr ((is_msg_part_v<Args> && ...)) {
    return concat_parts({MsgPart(args)...});
  } else {
    std::ostringstream os;
    (os << ... << args);
    return os.str();
  }
}

// EMBER_CHECK's failure path, out of line and cold: a check site only lists its parts and makes one call (no
// exception object, string or unwinding code of its own).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_parts(std::initializer_list<MsgPart> parts) {
  throw Error(concat_parts(parts));
}
template <class... Args>
[[noreturn, gnu::cold, gnu::noinline]] void throw_concat(const Args&... args) {
  throw Error(concat(args...));
}
/// Throws ember::Error with the concatenation of the parts as an ostream prints them.
template <class... Args>
[[noreturn]] EMBER_INLINE void fail(const Args&... args) {
  if constexpr ((is_msg_part_v<Args> && ...))
    throw_parts({MsgPart(args)...});
  else
    throw_concat(args...);
}

/// Text read from a file (tensor names, keys, metadata), made safe to quote in an error message: in double
/// quotes, with `"`, `\` and every byte that is not printable ASCII escaped (`\n`, `\t`, `\xNN`), so no terminal
/// escape sequence reaches the user's terminal; longer than `max_chars`, it is cut and says how long it was.
/// (Quoting for a human reader, not an encoding: JSON that a program reads is written by append_json_string,
/// core/json.hpp.)
[[gnu::cold, gnu::noinline]] inline std::string quote_untrusted(std::string_view s, std::size_t max_chars = 80) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  const std::size_t n = s.size() < max_chars ? s.size() : max_chars;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += char(c);
        } else {
          out += "\\x";
          out += hex[c >> 4];
          out += hex[c & 15];
        }
    }
  }
  out += '"';
  if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}
}  // namespace detail

}  // namespace ember

/// Throws ember::Error with the concatenation of the message parts when `cond` is false.
#define EMBER_CHECK(cond, ...)                                    \
  do {                                                            \
    if (!(cond)) [[unlikely]] ::ember::detail::fail(__VA_ARGS__); \
  } while (0)

namespace ember::detail {
/// The whole of `s` as base-10 digits, nothing else (no sign, no spaces, no trailing text), at most `max`. The one
/// reader of whole numbers from outside (the environment, a peer's reply, a file's metadata), rather than atoi or
/// strtoull, which read "8x" as 8, garbage as 0 and "-1" as 2^64 - 1.
inline bool parse_uint(std::string_view s, unsigned long long& out,
                       unsigned long long max = 18446744073709551615ull) noexcept {
  if (s.empty()) return false;
  unsigned long long v = 0;
  for (const char ch : s) {
    const unsigned long long d = static_cast<unsigned char>(ch) - static_cast<unsigned long long>('0');
    if (d > 9 || v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

/// The whole of `s` as a base-10 integer: an optional sign and digits, nothing else (no spaces, no trailing text),
/// within long long.
inline bool parse_int(std::string_view s, long long& out) noexcept {
  const bool neg = !s.empty() && s[0] == '-';
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  unsigned long long v = 0;
  if (!parse_uint(s, v, neg ? 9223372036854775808ull : 9223372036854775807ull)) return false;
  out = !neg ? static_cast<long long>(v) : v == 9223372036854775808ull ? -9223372036854775807LL - 1
                                                                       : -static_cast<long long>(v);
  return true;
}

/// The whole of `s` as one floating-point number in strtod's syntax (so "inf" and "nan" too), nothing before or
/// after it; callers check the range they need. The reader of the decimal numbers ember writes as text (a
/// checkpoint's counters and scores).
inline bool parse_double(const std::string& s, double& out) noexcept {
  if (s.empty() || s.front() == ' ' || (s.front() >= '\t' && s.front() <= '\r')) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (!end || *end != '\0') return false;
  out = v;
  return true;
}

}  // namespace ember::detail

namespace ember {
/// The strict readers of numbers (all of the text, digits after an optional sign for parse_int, digits only for
/// parse_uint, in range; one strtod number for parse_double) that ember uses for text from outside, for programs
/// that read numbers too.
using detail::parse_double;
using detail::parse_int;
using detail::parse_uint;
}  // namespace ember

namespace ember::detail {
/// The integer in environment variable `name`, or `fallback` when it is unset or empty. Anything but a whole number
/// in [lo, hi] is an ember::Error naming `who` (the part of ember that reads it), the variable, what it holds and
/// the range.
[[gnu::cold]] inline long long env_int(const char* who, const char* name, long long fallback, long long lo,
                                       long long hi) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  long long v = 0;
  EMBER_CHECK(parse_int(s, v) && v >= lo && v <= hi, who, ": environment variable ", name, " is ",
              quote_untrusted(s), ", not an integer in [", lo, ", ", hi, "]");
  return v;
}
}  // namespace ember::detail
