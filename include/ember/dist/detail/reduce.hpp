// ember — the element-wise reductions of the CPU collectives: dst = dst op src over a run of elements, one
// vectorisable loop per (dtype, op), chosen at run time (a collective's buffer carries its dtype as a tag), and the
// conversions of the 16-bit float types to and from float, in which they are reduced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/float16.hpp"
#include "ember/dist/work.hpp"

namespace ember::dist::detail {

template <class T>
struct SumF {
  T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct ProdF {
  T operator()(T a, T b) const { return a * b; }
};
template <class T>
struct MaxF {  // NaN wins, as torch.maximum
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
};
template <class T>
struct MinF {
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
};

/// out[i] = f(base[i], src[i]); out may be base.
template <class T, class F>
EMBER_VECTORIZE void combine_run(T* out, const T* base, const T* EMBER_RESTRICT src, std::size_t n, F f) {
  for (std::size_t i = 0; i < n; ++i) out[i] = f(base[i], src[i]);
}
/// out[i] = (base[i] + src[i]) * scale: the last step of an average.
template <class T>
EMBER_VECTORIZE void sum_scale_run(T* out, const T* base, const T* EMBER_RESTRICT src, std::size_t n, T scale) {
  for (std::size_t i = 0; i < n; ++i) out[i] = (base[i] + src[i]) * scale;
}

template <class T>
void combine_typed(void* out, const void* base, const void* src, std::size_t n, ReduceOp op, double scale) {
  T* o = static_cast<T*>(out);
  const T* b = static_cast<const T*>(base);
  const T* s = static_cast<const T*>(src);
  switch (op) {
    case ReduceOp::Sum: combine_run(o, b, s, n, SumF<T>{}); break;
    case ReduceOp::Avg:
      if constexpr (std::is_floating_point_v<T>) {
        if (scale != 1.0) sum_scale_run(o, b, s, n, T(scale));
        else combine_run(o, b, s, n, SumF<T>{});
      }
      break;
    case ReduceOp::Product: combine_run(o, b, s, n, ProdF<T>{}); break;
    case ReduceOp::Max: combine_run(o, b, s, n, MaxF<T>{}); break;
    case ReduceOp::Min: combine_run(o, b, s, n, MinF<T>{}); break;
  }
}

/// out = base op src over n elements of dtype t (bool: or for Sum/Max, and for Product/Min); for Avg the sum is
/// multiplied by `scale` (pass 1 for the steps before the last). out may equal base. 16-bit floats never get here:
/// they are reduced in float.
inline void combine(void* out, const void* base, const void* src, std::size_t n, ScalarType t, ReduceOp op,
                    double scale) {
  switch (t) {
    case ScalarType::Float: combine_typed<float>(out, base, src, n, op, scale); break;
    case ScalarType::Double: combine_typed<double>(out, base, src, n, op, scale); break;
    case ScalarType::Int32: combine_typed<std::int32_t>(out, base, src, n, op, scale); break;
    case ScalarType::Int64: combine_typed<std::int64_t>(out, base, src, n, op, scale); break;
    case ScalarType::UInt8: combine_typed<std::uint8_t>(out, base, src, n, op, scale); break;
    case ScalarType::Int8: combine_typed<std::int8_t>(out, base, src, n, op, scale); break;
    case ScalarType::Bool: {
      const bool any = op == ReduceOp::Sum || op == ReduceOp::Max;
      auto* o = static_cast<std::uint8_t*>(out);
      const auto* b = static_cast<const std::uint8_t*>(base);
      const auto* s = static_cast<const std::uint8_t*>(src);
      for (std::size_t i = 0; i < n; ++i) o[i] = any ? std::uint8_t(b[i] | s[i]) : std::uint8_t(b[i] & s[i]);
      break;
    }
    case ScalarType::Half:
    case ScalarType::BFloat16: break;
  }
}

/// x *= scale over n elements (float or double).
inline void scale_in_place(void* x, std::size_t n, ScalarType t, double scale) {
  if (t == ScalarType::Float) {
    float* p = static_cast<float*>(x);
    const float s = float(scale);
    for (std::size_t i = 0; i < n; ++i) p[i] *= s;
  } else if (t == ScalarType::Double) {
    double* p = static_cast<double*>(x);
    for (std::size_t i = 0; i < n; ++i) p[i] *= scale;
  }
}

template <class H>
EMBER_VECTORIZE void widen_run(float* EMBER_RESTRICT out, const H* EMBER_RESTRICT in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
template <class H>
EMBER_VECTORIZE void narrow_run(H* EMBER_RESTRICT out, const float* EMBER_RESTRICT in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = H(in[i]);
}
/// float copies of n half or bfloat16 values, and back (rounding to nearest even).
inline void widen(float* out, const void* in, std::size_t n, ScalarType t) {
  if (t == ScalarType::Half) widen_run(out, static_cast<const half*>(in), n);
  else widen_run(out, static_cast<const bfloat16*>(in), n);
}
inline void narrow(void* out, const float* in, std::size_t n, ScalarType t) {
  if (t == ScalarType::Half) narrow_run(static_cast<half*>(out), in, n);
  else narrow_run(static_cast<bfloat16*>(out), in, n);
}

}  // namespace ember::dist::detail
