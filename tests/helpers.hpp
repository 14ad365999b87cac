// Helpers shared by the test files: reading elements by hand, comparing bit patterns, evaluating an expression
// without the autograd record, restoring the thread count.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include "ember/ember.hpp"

namespace ember_test {

using namespace ember;
using i64 = std::int64_t;
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

}  // namespace ember_test
