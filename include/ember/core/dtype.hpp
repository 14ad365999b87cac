// ember — element types: which C++ types a Tensor may hold, their names, and the type math is done in.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ember/config.hpp"
#include "ember/core/float16.hpp"

namespace ember {

/// Runtime tag of an element type; used for messages, printing and file formats, never for dispatch.
enum class ScalarType : std::uint8_t { Float, Double, Int32, Int64, UInt8, Bool, Half, BFloat16, Int8 };

template <class T>
struct dtype_traits;  // only the types below are tensor element types

#define EMBER_DTYPE(T, TAG, NAME, FLOATING, COMPUTE)              \
  template <>                                                       \
  struct dtype_traits<T> {                                          \
    static constexpr ScalarType tag = ScalarType::TAG;              \
    static constexpr const char* name = NAME;                       \
    static constexpr bool is_floating = FLOATING;                   \
    using compute_type = COMPUTE; /* the type element math uses */ \
  };
EMBER_DTYPE(float, Float, "float32", true, float)
EMBER_DTYPE(double, Double, "float64", true, double)
EMBER_DTYPE(std::int32_t, Int32, "int32", false, std::int32_t)
EMBER_DTYPE(std::int64_t, Int64, "int64", false, std::int64_t)
EMBER_DTYPE(std::uint8_t, UInt8, "uint8", false, std::uint8_t)
EMBER_DTYPE(std::int8_t, Int8, "int8", false, std::int8_t)  // quantized weights (quant/)
EMBER_DTYPE(bool, Bool, "bool", false, bool)
EMBER_DTYPE(half, Half, "float16", true, float)
EMBER_DTYPE(bfloat16, BFloat16, "bfloat16", true, float)
#undef EMBER_DTYPE

/// True for the element types a Tensor may hold.
template <class T>
concept Dtype = requires { dtype_traits<T>::tag; };

template <class T>
inline constexpr bool is_floating_v = dtype_traits<T>::is_floating;

/// The type element-wise math runs in: half and bfloat16 compute in float ("fp16 storage, fp32 math").
template <class T>
using compute_t = typename dtype_traits<T>::compute_type;

template <class T>
constexpr const char* dtype_name() {
  return dtype_traits<T>::name;
}

inline const char* dtype_name(ScalarType s) {
  constexpr const char* names[] = {"float32", "float64", "int32", "int64", "uint8", "bool", "float16", "bfloat16", "int8"};
  return names[static_cast<int>(s)];
}

/// Converts between element types (through float for the 16-bit types).
template <class To, class From>
EMBER_HOST_DEVICE EMBER_INLINE To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<float>(v) != 0.0f;
  } else if constexpr (std::is_same_v<From, half> || std::is_same_v<From, bfloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace ember
