// ember — the state dict: name -> tensor of any state dtype, the form modules, optimizers, schedulers and the loss
// scaler save and load (nn::StateDict names the same type).
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

/// A tensor of any of the dtypes a state dict can hold.
using StateTensor = std::variant<Tensor<float>, Tensor<double>, Tensor<half>, Tensor<bfloat16>, Tensor<std::int64_t>>;
/// Fully qualified name -> tensor, ordered by name.
using StateDict = std::map<std::string, StateTensor>;

/// The dtype and shape of a StateTensor, for messages.
inline std::string describe(const StateTensor& t) {
  return std::visit(
      [](const auto& x) {
        using T = typename std::remove_cvref_t<decltype(x)>::value_type;
        return std::string(dtype_name<T>()) + (x.defined() ? " " + x.shape().str() : std::string(" (undefined)"));
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
