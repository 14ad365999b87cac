// ember — AnyTensor, a tensor of any ember dtype chosen at run time, and the state dict: name -> AnyTensor, the form
// modules, optimizers, schedulers and the loss scaler save and load, and what files hold (io::TensorMap, safetensors,
// checkpoints, nn::StateDict all name these types).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

/// A tensor of one of ember's dtypes, chosen at run time: the value of a state dict and of a file's tensor map.
/// A module holds floating tensors and int64 ones (nn::Module's parameters and buffers); a state dict may carry
/// any dtype, and Module::load_state_dict names the key and both dtypes of an entry it cannot take.
using AnyTensor = std::variant<Tensor<float>, Tensor<double>, Tensor<half>, Tensor<bfloat16>, Tensor<std::int32_t>,
                               Tensor<std::int64_t>, Tensor<std::uint8_t>, Tensor<std::int8_t>, Tensor<bool>>;
/// The former name of AnyTensor (state dicts once held fewer dtypes than files).
using StateTensor = AnyTensor;
/// Fully qualified name -> tensor, ordered by name (so files written from it are reproducible).
using StateDict = std::map<std::string, AnyTensor>;

/// The dtype of an AnyTensor.
inline ScalarType scalar_type(const AnyTensor& t) {
  return std::visit([](const auto& x) { return dtype_traits<typename std::decay_t<decltype(x)>::value_type>::tag; },
                    t);
}
/// The shape of an AnyTensor.
inline Shape shape_of(const AnyTensor& t) {
  return std::visit([](const auto& x) { return x.shape(); }, t);
}

/// The tensor of dtype T stored in `t`; an error names `what` and both dtypes when it holds another one.
template <class T>
Tensor<T> get_as(const AnyTensor& t, const std::string& what) {
  const Tensor<T>* p = std::get_if<Tensor<T>>(&t);
  EMBER_CHECK(p != nullptr, what, " has dtype ", dtype_name(scalar_type(t)), ", not the ", dtype_name<T>(),
              " requested");
  return *p;
}

/// The dtype and shape of a tensor held in a variant (an AnyTensor, or a module's slot), for messages.
template <class... T>
std::string describe(const std::variant<Tensor<T>...>& t) {
  return std::visit(
      [](const auto& x) {
        using V = typename std::remove_cvref_t<decltype(x)>::value_type;
        return std::string(dtype_name<V>()) + (x.defined() ? " " + x.shape().str() : std::string(" (undefined)"));
      },
      t);
}

/// The value of a one-element float64 entry (how optimizers and the loss scaler save their scalars); a missing
/// key or another dtype or size is an error naming `op` (e.g. "optim::SGD") and the key.
inline double read_scalar(const StateDict& sd, const std::string& key, const char* op) {
  const auto it = sd.find(key);
  EMBER_CHECK(it != sd.end(), op, "::load_state_dict: missing key '", key, "'");
  const auto* t = std::get_if<Tensor<double>>(&it->second);
  EMBER_CHECK(t && t->numel() == 1, op, "::load_state_dict: '", key, "' must be a one-element float64 tensor, got ",
              describe(it->second));
  return t->item();
}

/// A count saved as a one-element float64 entry (a step, an epoch): a non-negative integer of at most 9e15 (exact in
/// a double), else an error naming `op` and the key. A count from a file is never converted unchecked.
inline std::int64_t read_count(const StateDict& sd, const std::string& key, const char* op) {
  const double v = read_scalar(sd, key, op);
  EMBER_CHECK(v >= 0 && v <= 9.0e15 && v == std::floor(v), op, "::load_state_dict: ", key,
              " must be a non-negative integer, got ", v);
  return std::int64_t(v);
}

}  // namespace ember
