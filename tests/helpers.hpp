// Helpers shared by the test files: reading elements by hand, comparing bit patterns, evaluating an expression
// without the autograd record, restoring the thread count, checking error messages, temporary directories.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "ember/ember.hpp"

namespace ember_test {

using namespace ember;
using i64 = std::int64_t;

/// Sets (or, with nullptr, unsets) an environment variable for a scope.
struct EnvGuard {
  std::string name;
  std::string old;
  bool had;
  EnvGuard(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value) ::setenv(n, value, 1);
    else ::unsetenv(n);
  }
  ~EnvGuard() {
    if (had) ::setenv(name.c_str(), old.c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

inline constexpr float kInfF = std::numeric_limits<float>::infinity();
inline constexpr float kNaNF = std::numeric_limits<float>::quiet_NaN();

/// Element i (row-major) of t, read through shape/strides/offset by hand (not by ember).
template <class T>
T rd(const Tensor<T>& t, i64 i) {
  i64 off = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.shape()[d]) * t.strides()[d];
    i /= t.shape()[d];
  }
  return t.data()[off];
}

inline Tensor<float> fvec(const std::vector<float>& v) { return from_vector(v); }

/// Evaluates an expression into a new tensor with the CPU executor (materialising without the autograd record).
template <class E>
auto run_expr(const E& e) {
  using T = typename E::value_type;
  Tensor<T> out = empty<T>(e.shape());
  cpu::assign(out, e);
  return out;
}

inline std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

/// True when every element of a and b has the same bit pattern.
inline bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  if (!(a.shape() == b.shape())) return false;
  for (i64 i = 0; i < a.numel(); ++i)
    if (bits(rd(a, i)) != bits(rd(b, i))) return false;
  return true;
}

/// Restores the thread count when a test changes it.
struct ThreadsGuard {
  int saved = cpu::get_num_threads();
  ~ThreadsGuard() { cpu::set_num_threads(saved); }
};

/// Runs f and returns the message of the ember::Error it throws (or a marker that can never match).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ember::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an ember::Error: ") + e.what() + ">";
  } catch (...) {
    return "<not an ember::Error>";
  }
  return "<no exception>";
}

/// Checks that f throws ember::Error and that its message contains every part.
inline void expect_error(int line, const std::function<void()>& f, std::initializer_list<const char*> parts) {
  const std::string msg = error_of(f);
  INFO("line " << line << ", message: " << msg);
  CHECK_MESSAGE(msg.rfind("<", 0) != 0, "expected an ember::Error");
  for (const char* p : parts) {
    INFO("expected the message to contain \"" << std::string(p) << "\"");
    CHECK(msg.find(p) != std::string::npos);
  }
}

/// A fresh directory under the system temp dir, removed with its contents at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("ember_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

/// The records of a fixture file in tests/fixtures (written by a gen_*.py script with PyTorch):
/// `name ndim d0 .. v0 v1 ..` per line. Values are read with strtod (so `nan`, `inf`, `-inf` are values); a token
/// that does not parse, a missing value or a leftover token fails the test naming the record.
class Fixtures {
 public:
  explicit Fixtures(const std::string& file) {
    std::string dir = __FILE__;
    dir = dir.substr(0, dir.find_last_of('/') + 1);
    std::ifstream in(dir + "fixtures/" + file);
    REQUIRE_MESSAGE(in.good(), "cannot open fixture file " << dir << "fixtures/" << file);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string name;
      int nd = 0;
      ss >> name >> nd;
      Shape s;
      for (int i = 0; i < nd; ++i) {
        std::int64_t d = 0;
        ss >> d;
        s.push_back(d);
      }
      REQUIRE_MESSAGE(!ss.fail(), "fixture " << file << ": malformed header of record " << name);
      std::vector<double> v(static_cast<std::size_t>(s.numel()));
      std::string tok;
      for (auto& x : v) {
        REQUIRE_MESSAGE(bool(ss >> tok), "fixture " << file << ": record " << name << " has too few values");
        char* end = nullptr;
        x = std::strtod(tok.c_str(), &end);
        REQUIRE_MESSAGE((end == tok.c_str() + tok.size() && !tok.empty()),
                        "fixture " << file << ": record " << name << ": '" << tok << "' is not a number");
      }
      REQUIRE_MESSAGE(!(ss >> tok), "fixture " << file << ": record " << name << " has values left over");
      m_[name] = from_vector<double>(v, s);
    }
  }
  Tensor<double> operator[](const std::string& k) const {
    auto it = m_.find(k);
    REQUIRE_MESSAGE(it != m_.end(), "no fixture record " << k);
    return it->second.clone();
  }
  Tensor<std::int64_t> index(const std::string& k) const {
    const Tensor<double> t = (*this)[k];
    Tensor<std::int64_t> r = empty<std::int64_t>(t.shape());
    for (std::int64_t i = 0; i < t.numel(); ++i) r.data()[i] = std::int64_t(std::llround(t.data()[i]));
    return r;
  }

 private:
  std::map<std::string, Tensor<double>> m_;
};

}  // namespace ember_test

#define EXPECT_ERROR(...) ::ember_test::expect_error(__LINE__, __VA_ARGS__)
