// ember — Module: the base of every layer and model. A module owns named parameters and buffers and named child
// modules; it switches between training and evaluation, moves between devices, and saves/loads its state as a
// name -> tensor map with PyTorch's names ("conv1.weight", "bn1.running_mean", ...).
//
// A module is a cheap handle, as a tensor is: its registry lives in shared state and its parameters are tensor
// handles, so copying a module (into a Sequential, into a lambda) shares the parameters instead of duplicating
// them, and a model can be a plain struct:
//
//   struct Net : nn::Module {
//     nn::Linear fc1{784, 256}, fc2{256, 10};
//     Net() { register_module("fc1", fc1); register_module("fc2", fc2); }
//     Tensor<float> forward(const Tensor<float>& x) { return fc2(relu(fc1(x))); }
//   };
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/nn/detail/module_state.hpp"

namespace ember::nn {

/// A tensor of any dtype (ember::AnyTensor, core/state_dict.hpp). A module's own parameters and buffers are floating
/// or int64 (detail::TensorSlot); a state dict may carry any (load_state_dict names an entry of another dtype).
using AnyTensor = ember::StateTensor;
/// A module's (or optimizer's) state: fully qualified name -> tensor, ordered by name.
using StateDict = ember::StateDict;
using ember::describe;

/// The base of every layer and model (PyTorch's `nn.Module`): named parameters, buffers and child modules, the
/// training/evaluation mode, moving between devices and a state dict with PyTorch's names. A Module is a handle:
/// copies share the same parameters and registry, so a model can be a plain struct deriving from Module that
/// registers its layers in its constructor (register_module, register_parameter, register_buffer).
class Module {
 public:
  /// A module named `type_name` in printing and in named_modules() (PyTorch's class name, e.g. "Linear"), with
  /// no parameters, buffers or children yet, in training mode.
  explicit Module(std::string type_name = "Module") : s_(std::make_shared<detail::ModuleState>()) {
    s_->type_name = std::move(type_name);
  }
  virtual ~Module() = default;
  // Copies share the module (handle semantics, like tensors). Deriving structs get these for free.
  /// A second handle to the same module: parameters, buffers, children and mode are shared, not copied.
  Module(const Module&) = default;
  /// Makes this a handle to `other`'s module (shared, as the copy constructor).
  Module& operator=(const Module&) = default;

  // ---- parameters, buffers, children ---------------------------------------------------------------------
  /// Parameters of dtype T (all of this module's and, when recurse, its descendants'), in registration order; a
  /// parameter shared by two submodules (weight tying) appears once, as in PyTorch (remove_duplicate=True).
  template <class T = float>
  std::vector<Tensor<T>> parameters(bool recurse = true) const;
  /// The parameters of parameters() with their fully qualified names ("fc1.weight"), as PyTorch's
  /// named_parameters().
  template <class T = float>
  std::vector<std::pair<std::string, Tensor<T>>> named_parameters(bool recurse = true) const;
  /// Every parameter whatever its dtype.
  EMBER_HEADER_INLINE std::vector<std::pair<std::string, AnyTensor>> named_parameters_any(bool recurse = true) const;
  /// Every buffer, each distinct tensor once (as parameters()).
  EMBER_HEADER_INLINE std::vector<std::pair<std::string, AnyTensor>> named_buffers(bool recurse = true) const;
  /// Number of parameter elements (all dtypes), as sum(p.numel() for p in model.parameters()).
  EMBER_HEADER_INLINE std::int64_t num_parameters() const;
  /// The name given to the constructor ("Linear", "Conv2d", "Sequential", ...): what printing shows and what
  /// apply() callbacks test to pick layers (PyTorch's `type(m).__name__`).
  const std::string& type_name() const { return s_->type_name; }
  /// This module's extension of kind E (detail::Extension: what nn::fuse_conv_bn or quant:: attached to it, see
  /// nn/detail/fused_act.hpp and nn/detail/quant_hook.hpp), or null. Shared by every handle of the module.
  template <class E>
  E* extension() const {
    return detail::find_extension<E>(*s_);
  }
  /// This module's own parameter `name` of dtype T (undefined when there is none): a layer built without a bias
  /// finds here the one nn::fuse_conv_bn gave it, in every handle of the module.
  template <class T>
  Tensor<T> own_parameter(const std::string& name) const {
    for (const auto& [n, t] : s_->params)
      if (n == name)
        if (auto* p = std::get_if<Tensor<T>>(&t)) return *p;
    return Tensor<T>();
  }

  // ---- the module tree -------------------------------------------------------------------------------------
  /// This module ("") and every descendant under its qualified name ("encoder.0.fc"), depth first in registration
  /// order, each distinct module once (PyTorch's named_modules()). The entries are handles sharing each module's
  /// parameters, buffers and settings: they have its type_name(), not its C++ type.
  EMBER_HEADER_INLINE std::vector<std::pair<std::string, Module>> named_modules() const;
  /// The modules of named_modules().
  EMBER_HEADER_INLINE std::vector<Module> modules() const;
  /// The direct children under their names, in registration order.
  EMBER_HEADER_INLINE std::vector<std::pair<std::string, Module>> named_children() const;
  /// The modules of named_children() (PyTorch's children()).
  EMBER_HEADER_INLINE std::vector<Module> children() const;
  /// Calls fn(Module&) on every descendant, children before parents, then on this module (PyTorch's apply, for
  /// custom initialisation: `if (m.type_name() == "Linear") nn::init::normal_(...m.own_parameter<float>("weight"))`).
  template <class F>
  Module& apply(F&& fn) {
    for (auto& c : children()) c.apply(fn);
    fn(*this);
    return *this;
  }
  /// Sets requires_grad on every floating-point parameter (false freezes the module: autograd then neither
  /// computes nor stores their gradients). Returns this module, as PyTorch's requires_grad_.
  template <class Deferred = void>
  Module& requires_grad_(bool on = true);

  // ---- modes ---------------------------------------------------------------------------------------------
  /// Training mode (dropout active, batch norm uses and updates batch statistics) for this module and its children.
  void train(bool on = true) { set_training(*s_, on); }
  /// Evaluation mode: train(false).
  void eval() { train(false); }
  /// Whether the module is in training mode (PyTorch's `module.training`).
  bool is_training() const { return s_->training; }

  // requires_grad_, zero_grad, to and load_state_dict visit every dtype of the state variant; as member templates
  // (Deferred is unused) they are compiled only in the TUs that call them, not in every TU that includes this
  // header. They are defined below the class, not inline, as parameters and named_parameters are: with
  // ember::precompiled a TU then compiles none of them, not even to inline them.

  /// Clears (set_to_none, the default as in PyTorch 2) or zeroes every parameter's gradient.
  template <class Deferred = void>
  void zero_grad(bool set_to_none = true);

  /// Moves every parameter and buffer to `device`, in place, as PyTorch's module.to(device): each tensor keeps its
  /// identity (every handle to it, the module's members and copies of the module, sees the moved data; a parameter
  /// stays a leaf that requires grad) and a parameter's .grad moves with it. Other views of the old memory (an
  /// optimizer's state) do not move: create optimizers after moving the model, as in PyTorch.
  template <class Deferred = void>
  void to(Device device);

  // ---- state -----------------------------------------------------------------------------------------------
  /// Parameters and buffers by fully qualified name. The tensors are detached handles sharing the module's memory
  /// (as PyTorch's state_dict); clone them to snapshot.
  EMBER_HEADER_INLINE StateDict state_dict() const;

  /// Copies `sd` into the parameters and buffers. strict: every key must match (missing and unexpected keys are
  /// listed in the error). Shapes must match; floating dtypes convert (as PyTorch's copy_ does), other dtype
  /// changes are errors. Nothing is written unless every check passes.
  template <class Deferred = void>
  void load_state_dict(const StateDict& sd, bool strict = true);

  /// Prints the module tree as PyTorch does.
  friend std::ostream& operator<<(std::ostream& os, const Module& m) {
    m.print_tree(os);
    return os;
  }

 protected:
  /// Registers a parameter (a leaf that requires grad) under `name`; returns it.
  template <class T>
  Tensor<T>& register_parameter(const std::string& name, Tensor<T>& t, bool requires_grad = true) {
    static_assert(is_floating_v<T>, "register_parameter: parameters must be floating point");
    check_name(name);
    if (t.defined() && requires_grad && !t.requires_grad()) t.requires_grad_(true);
    s_->params.emplace_back(name, t);
    return t;
  }
  /// Registers a buffer: state that is saved and moved with the module but not trained (running statistics).
  template <class T>
  Tensor<T>& register_buffer(const std::string& name, Tensor<T>& t) {
    check_name(name);
    s_->buffers.emplace_back(name, t);
    return t;
  }
  /// Registers a child module (shares it: the child stays usable through `m`).
  template <class M>
  M& register_module(const std::string& name, M& m) {
    static_assert(std::is_base_of_v<Module, M>, "register_module: the child must derive from nn::Module");
    add_child(name, m);
    return m;
  }
  /// What the module prints inside its parentheses ("784, 256, bias=True").
  void set_extra_repr(std::function<std::string()> f) { s_->extra_repr = std::move(f); }
  /// Records a numeric setting that code walking the module tree can read (nn::fuse_conv_bn reads "eps").
  void set_setting(const std::string& name, double v) { s_->settings.emplace_back(name, v); }

 private:
  struct HandleTag {};
  // A handle to a registered child (named_modules, children): shares its state.
  Module(std::shared_ptr<detail::ModuleState> s, HandleTag) : s_(std::move(s)) {}
  EMBER_HEADER_INLINE void check_name(const std::string& name) const;
  // register_module's work, the same whatever the child's type.
  EMBER_HEADER_INLINE void add_child(const std::string& name, const Module& m);
  // Points t's implementation (shared by every handle) at a contiguous copy of its data on `device`.
  template <class T>
  static void move_in_place(const Tensor<T>& t, Device device) {
    const Tensor<T> moved = ember::detail::copy_to_device(t, device, false);
    TensorImpl<T>& impl = *t.unsafe_impl();
    impl.storage = moved.storage();
    impl.sizes = moved.shape();
    impl.strides = moved.strides();
    impl.offset = moved.storage_offset();
    impl.is_view = false;
  }
  EMBER_HEADER_INLINE static void set_training(detail::ModuleState& s, bool on);
  void print_tree(std::ostream& os) const { print(os, *s_, 0); }
  EMBER_HEADER_INLINE static void print(std::ostream& os, const detail::ModuleState& s, int indent);

  std::shared_ptr<detail::ModuleState> s_;
  friend struct detail::ModuleAccess;
};

namespace detail {
/// The registry behind a module handle, for code that rewrites the module tree (nn/fuse.hpp).
struct ModuleAccess {
  static ModuleState& state(const Module& m) { return *m.s_; }
};
}  // namespace detail

template <class T>
std::vector<Tensor<T>> Module::parameters(bool recurse) const {
  std::vector<Tensor<T>> out;
  for (auto& [n, t] : named_parameters<T>(recurse)) out.push_back(t);
  return out;
}

template <class T>
std::vector<std::pair<std::string, Tensor<T>>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor<T>>> out;
  detail::walk_unique(*s_, true, recurse, [&](const std::string& n, const detail::TensorSlot& t) {
    if (auto* p = std::get_if<Tensor<T>>(&t)) out.emplace_back(n, *p);
  });
  return out;
}

template <class Deferred>
Module& Module::requires_grad_(bool on) {
  detail::walk(*s_, "", true, true, [&](const std::string&, const detail::TensorSlot& slot) {
    std::visit(
        [&](const auto& p) {
          using T = typename std::remove_cvref_t<decltype(p)>::value_type;
          if constexpr (is_floating_v<T>) {
            if (!p.defined()) return;
            Tensor<T> handle = p;  // shares the parameter's autograd state
            handle.requires_grad_(on);
          }
        },
        slot);
  });
  return *this;
}

template <class Deferred>
void Module::zero_grad(bool set_to_none) {
  detail::walk(*s_, "", true, true, [&](const std::string&, const detail::TensorSlot& slot) {
    std::visit(
        [&](const auto& p) {
          using T = typename std::remove_cvref_t<decltype(p)>::value_type;
          if constexpr (is_floating_v<T>) {
            if (!p.has_meta() || !p.grad().defined()) return;
            if (set_to_none) {
              p.grad() = Tensor<T>();
              return;
            }
            Tensor<T> g = p.grad();
            if (!g.device().is_cpu()) {  // device memory: zeros copied from the host
              NoGradGuard ng;
              g.copy_(ember::zeros<T>(g.shape()));
              return;
            }
            for (std::int64_t o : detail::element_offsets(g)) g.data()[o] = T(0);
            g.bump_version();
          }
        },
        slot);
  });
}

template <class Deferred>
void Module::to(Device device) {
  auto move = [&](const std::string& n, const detail::TensorSlot& slot) {
    std::visit(
        [&](const auto& t) {
          using T = typename std::remove_cvref_t<decltype(t)>::value_type;
          if (!t.defined()) return;
          EMBER_CHECK(device.is_cpu() || ember::detail::part<ember::detail::CudaAllocatorPart>() != nullptr,
                      "Module::to: cannot move '", n, "' (", describe(slot), " on ", t.device().str(), ") to ", device.str(), ": ",
                      ember::detail::no_cuda_backend());
          if (t.device() != device) move_in_place(t, device);
          if constexpr (is_floating_v<T>) {
            if (t.has_meta() && t.grad().defined() && t.grad().device() != device) move_in_place(t.grad(), device);
          }
        },
        slot);
  };
  detail::walk(*s_, "", true, true, move);
  detail::walk(*s_, "", false, true, move);
}

template <class Deferred>
EMBER_COLD void Module::load_state_dict(const StateDict& sd, bool strict) {
  std::vector<std::pair<std::string, const detail::TensorSlot*>> mine;
  auto collect = [&](const std::string& n, const detail::TensorSlot& t) { mine.emplace_back(n, &t); };
  detail::walk(*s_, "", true, true, collect);
  detail::walk(*s_, "", false, true, collect);
  std::vector<std::string> missing, unexpected;
  for (auto& [n, t] : mine)
    if (!sd.count(n)) missing.push_back(n);
  for (auto& [n, t] : sd) {
    bool found = false;
    for (auto& [m, s] : mine) found = found || m == n;
    if (!found) unexpected.push_back(n);
  }
  // Every problem is listed in one error, as PyTorch's "Error(s) in loading state_dict"; nothing is written
  // unless there is none. (Each side is visited on its own: 5 + 5 instantiations, not 5 x 5 pairs.)
  std::vector<std::string> problems;
  for (auto& entry : mine) {
    const auto& n = entry.first;
    auto it = sd.find(n);
    if (it == sd.end()) continue;
    const detail::SlotInfo dst = detail::slot_info(*entry.second), src = detail::slot_info(it->second);
    if (!src.defined) {
      problems.push_back("'" + n + "' is an undefined tensor");
      continue;
    }
    if (!(dst.shape == src.shape))
      problems.push_back("size mismatch for '" + n + "': the checkpoint has " + src.shape.str() +
                         ", the module has " + dst.shape.str());
    if (!(std::string_view(dst.dtype) == src.dtype || (dst.floating && src.floating)))
      problems.push_back("dtype mismatch for '" + n + "': the checkpoint has " + src.dtype + ", the module has " +
                         dst.dtype);
  }
  const bool keys_bad = strict && (!missing.empty() || !unexpected.empty());
  if (keys_bad || !problems.empty()) {
    std::ostringstream os;
    os << "load_state_dict: error(s) loading the state of " << type_name() << ":";
    if (strict && !missing.empty()) {
      os << " missing key(s):";
      for (auto& k : missing) os << " '" << k << "'";
      os << ";";
    }
    if (strict && !unexpected.empty()) {
      os << " unexpected key(s):";
      for (auto& k : unexpected) os << " '" << k << "'";
      os << ";";
    }
    for (auto& p : problems) os << " " << p << ";";
    throw Error(os.str());
  }
  for (auto& entry : mine) {
    auto it = sd.find(entry.first);
    if (it == sd.end()) continue;
    std::visit(
        [&](const auto& dst) {
          using D = typename std::remove_cvref_t<decltype(dst)>::value_type;
          // Converted on the host; a tensor on a GPU (either side) goes through a host copy.
          const Tensor<D> hd = detail::host_target(dst);
          const auto od = detail::element_offsets(hd);
          if (const auto* same = std::get_if<Tensor<D>>(&it->second)) {
            const Tensor<D> hs =
                same->device().is_cpu() ? *same : ember::detail::copy_to_device(*same, Device::cpu(), false);
            const auto os = detail::element_offsets(hs);
            for (std::size_t i = 0; i < od.size(); ++i) hd.data()[od[i]] = hs.data()[os[i]];
          } else if constexpr (is_floating_v<D>) {
            // Another floating dtype (the checks above allow nothing else), through double: every floating
            // dtype converts to double exactly, so each element rounds once, to D, as a direct conversion does.
            const std::vector<double> v = detail::values_as_double(it->second);
            for (std::size_t i = 0; i < od.size(); ++i) hd.data()[od[i]] = convert<D>(v[i]);
          }
          detail::commit_host_target(dst, hd);
        },
        *entry.second);
  }
}

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE std::vector<std::pair<std::string, AnyTensor>> Module::named_parameters_any(bool recurse) const {
  std::vector<std::pair<std::string, AnyTensor>> out;
  detail::walk_unique(*s_, true, recurse,
                      [&](const std::string& n, const detail::TensorSlot& t) {
                        std::visit([&](const auto& x) { out.emplace_back(n, x); }, t);
                      });
  return out;
}

EMBER_HEADER_INLINE std::vector<std::pair<std::string, AnyTensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, AnyTensor>> out;
  detail::walk_unique(*s_, false, recurse, [&](const std::string& n, const detail::TensorSlot& t) {
    std::visit([&](const auto& x) { out.emplace_back(n, x); }, t);
  });
  return out;
}

EMBER_HEADER_INLINE std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (auto& [name, t] : named_parameters_any()) std::visit([&](const auto& x) { n += x.numel(); }, t);
  return n;
}

EMBER_COLD EMBER_HEADER_INLINE StateDict Module::state_dict() const {
  StateDict sd;
  auto add = [&](const std::string& n, const detail::TensorSlot& slot) {
    std::visit([&](const auto& t) { sd.emplace(n, AnyTensor(t.defined() ? t.detach() : t)); }, slot);
  };
  detail::walk(*s_, "", true, true, add);
  detail::walk(*s_, "", false, true, add);
  return sd;
}

EMBER_HEADER_INLINE std::vector<std::pair<std::string, Module>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module>> out;
  std::unordered_set<const detail::ModuleState*> seen;
  struct Rec {
    static void run(const std::shared_ptr<detail::ModuleState>& s, const std::string& name,
                    std::vector<std::pair<std::string, Module>>& out,
                    std::unordered_set<const detail::ModuleState*>& seen) {
      if (!seen.insert(s.get()).second) return;
      out.emplace_back(name, Module(s, HandleTag{}));
      for (const auto& [n, c] : s->children) run(c, name.empty() ? n : name + "." + n, out, seen);
    }
  };
  Rec::run(s_, "", out, seen);
  return out;
}

EMBER_HEADER_INLINE std::vector<Module> Module::modules() const {
  std::vector<Module> out;
  for (auto& [n, m] : named_modules()) out.push_back(m);
  return out;
}

EMBER_HEADER_INLINE std::vector<std::pair<std::string, Module>> Module::named_children() const {
  std::vector<std::pair<std::string, Module>> out;
  std::unordered_set<const detail::ModuleState*> seen;
  for (const auto& [n, c] : s_->children)
    if (seen.insert(c.get()).second) out.emplace_back(n, Module(c, HandleTag{}));
  return out;
}

EMBER_HEADER_INLINE std::vector<Module> Module::children() const {
  std::vector<Module> out;
  for (auto& [n, m] : named_children()) out.push_back(m);
  return out;
}

EMBER_HEADER_INLINE void Module::add_child(const std::string& name, const Module& m) {
  check_name(name);
  EMBER_CHECK(m.s_ != s_, "register_module: a module cannot be its own child ('", name, "')");
  s_->children.emplace_back(name, m.s_);
}

EMBER_HEADER_INLINE void Module::check_name(const std::string& name) const {
  EMBER_CHECK(!name.empty() && name.find('.') == std::string::npos, "register: invalid name '", name,
              "' in ", type_name(), " (names are non-empty and contain no '.')");
  auto taken = [&](const auto& v) {
    for (auto& [n, x] : v)
      if (n == name) return true;
    return false;
  };
  EMBER_CHECK(!taken(s_->params) && !taken(s_->buffers) && !taken(s_->children), "register: '", name,
              "' is already registered in ", type_name());
}

EMBER_HEADER_INLINE void Module::set_training(detail::ModuleState& s, bool on) {
  s.training = on;
  for (auto& [n, c] : s.children) set_training(*c, on);
}

EMBER_HEADER_INLINE void Module::print(std::ostream& os, const detail::ModuleState& s, int indent) {
  os << s.type_name << "(";
  if (s.extra_repr) os << s.extra_repr();
  if (!s.children.empty()) {
    os << "\n";
    for (auto& [n, c] : s.children) {
      os << std::string(std::size_t(indent + 2), ' ') << "(" << n << "): ";
      print(os, *c, indent + 2);
      os << "\n";
    }
    os << std::string(std::size_t(indent), ' ');
  }
  os << ")";
}
#endif

}  // namespace ember::nn
