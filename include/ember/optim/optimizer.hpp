// ember — the optimizer interface: parameter groups with their own options, zero_grad, step, state_dict. Schedulers
// and the training loop talk to this non-template base; SGD and Adam/AdamW implement it.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/nn/module.hpp"
#include "ember/ops/elementwise.hpp"

namespace ember::optim {

/// A set of parameters sharing options (e.g. no weight decay for biases and norms).
template <class T, class Options>
struct ParamGroup {
  std::vector<Tensor<T>> params;
  Options options;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient (parameters without one are skipped, as in PyTorch).
  virtual void step() = 0;
  /// Clears the gradients (set_to_none, the default) or zeroes them in place.
  virtual void zero_grad(bool set_to_none = true) = 0;
  virtual std::size_t num_groups() const = 0;
  /// The learning rate of a group (schedulers write it).
  virtual double& lr(std::size_t group) = 0;
  /// SGD's momentum or Adam's beta1, which one-cycle schedules cycle; nullptr if the optimizer has none.
  virtual double* momentum(std::size_t group) = 0;
  /// Per-parameter state ("state.<i>.<name>", i counting parameters over the groups in order) and the groups'
  /// hyper-parameters ("param_groups.<g>.<name>" as 0-d float64 tensors), as PyTorch's optimizer state_dict.
  virtual nn::StateDict state_dict() const = 0;
  virtual void load_state_dict(const nn::StateDict& sd) = 0;
};

namespace detail {

/// Checks a parameter and its gradient before a fused update; returns the gradient, contiguous.
template <class T>
Tensor<T> checked_grad(const Tensor<T>& p, const char* op) {
  const Tensor<T>& g = p.grad();
  EMBER_CHECK(p.is_contiguous(), op, ": parameters must be contiguous, got one of shape ", p.shape().str(),
              " with strides ", p.strides().str());
  EMBER_CHECK(g.shape() == p.shape(), op, ": the gradient has shape ", g.shape().str(), " but the parameter has ",
              p.shape().str());
  EMBER_CHECK(p.device() == g.device(), op, ": the parameter is on ", p.device().str(), " but its gradient on ",
              g.device().str());
  return g.is_contiguous() ? g : g.contiguous();
}

/// Checks that an optimizer state tensor (when there is one) lives where its parameter does: Module::to moves the
/// parameters but not the optimizer's state, as in PyTorch.
template <class T>
void check_state_device(const Tensor<T>& p, const Tensor<T>& state, const char* op, const char* name) {
  EMBER_CHECK(!state.defined() || state.device() == p.device(), op, ": the parameter of shape ", p.shape().str(),
              " is on ", p.device().str(), " but its state '", name, "' is on ", state.device().str(),
              "; the optimizer's state stays where it was made when the model moves: create the optimizer after "
              "Module::to, or load its state_dict again (state is moved to each parameter's device)");
}

/// The error of an optimizer step on CUDA tensors in a translation unit that nvcc did not compile.
[[noreturn, gnu::cold]] inline void no_cuda_update(const char* op, Device d) {
  throw Error(::ember::detail::concat(op, ": a parameter is on ", d.str(), "; the update of CUDA parameters is "
                                      "compiled into the translation unit that calls step(), so compile it with nvcc "
                                      "(a .cu file) and link ember::cuda"));
}

template <class T>
void zero_grads(const std::vector<Tensor<T>>& params, bool set_to_none) {
  for (const Tensor<T>& p : params) {
    if (!p.has_meta() || !p.grad().defined()) continue;
    if (set_to_none) p.grad() = Tensor<T>();
    else {
      NoGradGuard ng;
      p.grad().zero_();
    }
  }
}

inline Tensor<double> scalar(double v) { return full<double>(Shape{}, v); }
using ::ember::read_scalar;

/// One hyper-parameter of a parameter group, as state_dict saves it: "param_groups.<g>.<name>", 0-d float64.
struct GroupScalar {
  const char* name;
  double value;
};
/// Writes group g's hyper-parameters into sd.
EMBER_HEADER_INLINE void put_group(nn::StateDict& sd, std::size_t g, std::initializer_list<GroupScalar> values);
/// Reads group g's hyper-parameters back, in the order of `names`; a missing key, or one that is not a one-element
/// float64 tensor, is an error naming `op` and the key.
EMBER_HEADER_INLINE std::vector<double> get_group(const nn::StateDict& sd, std::size_t g,
                                                  std::initializer_list<const char*> names, const char* op);
#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE void put_group(nn::StateDict& sd, std::size_t g, std::initializer_list<GroupScalar> values) {
  const std::string pre = "param_groups." + std::to_string(g) + ".";
  for (const GroupScalar& v : values) sd.emplace(pre + v.name, scalar(v.value));
}
EMBER_COLD EMBER_HEADER_INLINE std::vector<double> get_group(const nn::StateDict& sd, std::size_t g,
                                                  std::initializer_list<const char*> names, const char* op) {
  const std::string pre = "param_groups." + std::to_string(g) + ".";
  std::vector<double> out;
  for (const char* n : names) out.push_back(read_scalar(sd, pre + n, op));
  return out;
}
#endif
/// Copies a saved state tensor into (or creates) a buffer of the parameter's shape, on the parameter's device. Its
/// values must be finite (and, with `non_negative`, at least 0, as second moments are): a NaN or an infinity from a
/// file would otherwise reach the parameter at the next step without a word.
template <class T>
EMBER_COLD void load_buffer(const nn::StateDict& sd, const std::string& key, const Tensor<T>& like, Tensor<T>& buf,
                 const char* op, bool non_negative = false) {
  auto it = sd.find(key);
  if (it == sd.end()) {
    buf = Tensor<T>();
    return;
  }
  const auto* t = std::get_if<Tensor<T>>(&it->second);
  EMBER_CHECK(t && t->shape() == like.shape(), op, "::load_state_dict: '", key, "' is ", nn::describe(it->second),
              ", expected ", dtype_name<T>(), " ", like.shape().str());
  const Tensor<T> host = (t->device().is_cpu() ? *t : t->to(Device::cpu())).contiguous();
  const T* v = host.data();
  for (std::int64_t i = 0; i < host.numel(); ++i)
    EMBER_CHECK(std::isfinite(double(v[i])) && (!non_negative || v[i] >= T(0)), op, "::load_state_dict: '", key,
                "' holds ", double(v[i]), " at element ", i, ", expected finite values",
                non_negative ? " >= 0 (a second moment)" : "");
  buf = t->device() == like.device() ? t->clone() : t->to(like.device());  // on the parameter's device, as PyTorch
}

}  // namespace detail
}  // namespace ember::optim
