// ember — the autograd slot of Tensor<T>: AutogradMeta (requires_grad, grad, grad_fn, a leaf's gradient sink, the
// gradient hooks), created on demand and shared by every handle to the tensor, and the members that set it up
// (requires_grad_, register_hook). The members are declared in the class (core/tensor.hpp) and defined here, after
// it; core/tensor.hpp includes this header at its end, and this header includes core/tensor.hpp, so either gives
// the whole Tensor. The autograd logic itself is in autograd/.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/storage.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

template <class T>
Tensor<T>& Tensor<T>::requires_grad_(bool on) {
  if constexpr (!is_floating_v<T>) {
    EMBER_CHECK(!on, "requires_grad_: only floating-point tensors can require gradients, this one is ",
                dtype_name<T>());
  }
  EMBER_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad; use detach() to get a "
                         "leaf from the result of an operation");
  EMBER_CHECK(!on || !is_inference() || detail::inference_mode_flag(),
              "requires_grad_: this tensor (shape ", shape().str(), ") was created under InferenceMode and cannot "
              "require gradients outside it; clone() it outside InferenceMode to get a normal tensor");
  meta().requires_grad = on;
  return *this;
}

template <class T>
Tensor<T>& Tensor<T>::register_hook(std::function<void(const Tensor&)> fn) {
  EMBER_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  meta().hooks.push_back(std::move(fn));
  return *this;
}

template <class T>
struct AutogradMeta {
  bool requires_grad = false;                      ///< Tensor::requires_grad().
  bool retains_grad = false;                       ///< Set by Tensor::retain_grad(): a non-leaf keeps its grad.
  Tensor<T> grad;                                  ///< The accumulated gradient (Tensor::grad()).
  std::shared_ptr<autograd::Node> grad_fn;         ///< The node that produced this tensor (null for leaves).
  std::weak_ptr<autograd::Node> accumulator;       ///< A leaf's gradient sink, made on first use.
  std::vector<std::function<void(const Tensor<T>&)>> hooks;  ///< Tensor::register_hook's callbacks, in order.
};

}  // namespace ember
