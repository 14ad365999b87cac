// ember — the optimizer interface: parameter groups with their own options, zero_grad, step, state_dict. Schedulers
// and the training loop talk to this non-template base; SGD and Adam/AdamW implement it.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
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
  std::vector<Tensor<T>> params;  ///< The group's parameters (leaf tensors).
  Options options;                ///< Their hyper-parameters (SGDOptions, AdamOptions).
};

/// The interface of every optimizer (PyTorch's `torch.optim.Optimizer`), what schedulers, the Trainer and
/// checkpoints work through.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// Updates every parameter that has a gradient (parameters without one are skipped, as in PyTorch).
  virtual void step() = 0;
  /// Clears the gradients (set_to_none, the default) or zeroes them in place.
  virtual void zero_grad(bool set_to_none = true) = 0;
  /// The number of param groups.
  virtual std::size_t num_groups() const = 0;
  /// The learning rate of a group (schedulers write it).
  virtual double& lr(std::size_t group) = 0;
  /// SGD's momentum or Adam's beta1, which one-cycle schedules cycle; nullptr if the optimizer has none.
  virtual double* momentum(std::size_t group) = 0;
  /// Per-parameter state ("state.<i>.<name>", i counting parameters over the groups in order) and the groups'
  /// hyper-parameters ("param_groups.<g>.<name>" as 0-d float64 tensors), as PyTorch's optimizer state_dict.
  virtual nn::StateDict state_dict() const = 0;
  /// Loads a state (from state_dict(), or PyTorch's names): every entry is checked before anything is written, so a
  /// refused state leaves the optimizer as it was.
  virtual void load_state_dict(const nn::StateDict& sd) = 0;
  /// Throws what load_state_dict(sd) would throw, and changes nothing (the Trainer checks every part of a checkpoint
  /// before it loads any).
  virtual void check_state_dict(const nn::StateDict& sd) const = 0;
};

/// The ranges of the optimizers' hyper-parameters, held by their constructors and by load_state_dict (one check,
/// detail::check_hyper). PyTorch's own checks are the floor (lr, weight_decay >= 0, momentum and dampening in
/// [0, 1], betas in [0, 1)); the upper bounds, and eps's lower one, keep one fp32 update finite: with every
/// hyper-parameter in range and parameters, gradients and optimizer state of magnitude at most kFiniteStepMagnitude,
/// a step of SGD, Adam or AdamW gives finite parameters and state. (The largest term is Adam's step when the second
/// moment is 0: lr / (1 - beta1) * |exp_avg| / eps <= 1e4 * 2^24 * 1e6 / 1e-20 ~ 1.7e37, below float's 3.4e38.)
/// Several steps can still diverge, as any too-large learning rate makes training diverge.
inline constexpr double kMaxLr = 1e4;
inline constexpr double kMaxWeightDecay = 1e4;
inline constexpr double kMinEps = 1e-20;
inline constexpr double kMaxEps = 1e4;
/// Betas are used in float, where a value above 1 - 2^-24 rounds to 1 (and Adam's bias correction 1 - beta1^t
/// could amplify a loaded moment 2^53-fold).
inline constexpr double kMaxBeta = 1.0 - 0x1p-24;
inline constexpr double kFiniteStepMagnitude = 1e6;

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

/// The one check of a hyper-parameter's range: `value` in [lo, hi] (NaN never is); `range` shows the bounds in the
/// message ("<where>: invalid <name> <value>, expected a value in <range>").
EMBER_COLD inline void check_hyper(const char* where, const char* name, double value, double lo, double hi,
                                   const char* range) {
  EMBER_CHECK(value >= lo && value <= hi, where, ": invalid ", name, " ", value, ", expected a value in ", range);
}
/// The learning rate's range, shared by the optimizers and by the schedules that write rates into them.
inline void check_lr(const char* where, double lr) { check_hyper(where, "learning rate", lr, 0, kMaxLr, "[0, 1e4]"); }

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
/// Checks a saved state tensor and, when `buf` is not null, copies it into (or creates) a buffer of the parameter's
/// shape, on the parameter's device; returns whether `sd` has the key. Its values must be finite (and, with
/// `non_negative`, at least 0, as second moments are): a NaN or an infinity from a file would otherwise reach the
/// parameter at the next step without a word. With `buf` null (check_state_dict) nothing is copied.
template <class T>
EMBER_COLD bool load_buffer(const nn::StateDict& sd, const std::string& key, const Tensor<T>& like, Tensor<T>* buf,
                            const char* op, bool non_negative = false) {
  auto it = sd.find(key);
  if (it == sd.end()) {
    if (buf) *buf = Tensor<T>();
    return false;
  }
  const auto* t = std::get_if<Tensor<T>>(&it->second);
  EMBER_CHECK(t && t->shape() == like.shape(), op, "::load_state_dict: '", key, "' is ", nn::describe(it->second),
              ", expected ", dtype_name<T>(), " ", like.shape().str());
  if (t->numel() > 0) {
    // The first element out of range, by one reduction on the host (arg-max of the mask of bad values).
    const Tensor<T> host = (t->device().is_cpu() ? *t : t->to(Device::cpu())).contiguous();
    const Tensor<T>& h = host;
    constexpr compute_t<T> big = std::numeric_limits<compute_t<T>>::max();
    Shape ones;
    for (int d = 0; d < host.dim(); ++d) ones.push_back(1);
    Tensor<std::int64_t> at = empty<std::int64_t>(ones);
    using First = expr::ArgR<bool, false>;
    if (non_negative) ops::reduce<First>(at, !((h >= compute_t<T>(0)) & (h <= big)), op);
    else ops::reduce<First>(at, !(abs(h) <= big), op);
    const std::int64_t i = *at.data();
    const T v = host.data()[i];
    EMBER_CHECK(std::isfinite(double(v)) && (!non_negative || v >= T(0)), op, "::load_state_dict: '", key, "' holds ",
                double(v), " at element ", i, ", expected finite values",
                non_negative ? " >= 0 (a second moment)" : "");
  }
  if (buf) *buf = t->device() == like.device() ? t->clone() : t->to(like.device());  // on the parameter's device
  return true;
}

}  // namespace detail
}  // namespace ember::optim
