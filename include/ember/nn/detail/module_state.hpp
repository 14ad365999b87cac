// ember — the state behind an nn::Module handle: its registry of named tensors (of several dtypes) and children,
// the extensions that code rewriting the module tree attaches to it, and the type-erased walks over the tree that
// parameters(), state_dict(), to() and load_state_dict() are built on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/device.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"

namespace ember::nn {

class Module;

namespace detail {
struct ModuleAccess;

/// Something that code transforming a module tree attaches to a module's state: nn::fuse_conv_bn's record of
/// what it moved into a layer (nn/detail/fused_act.hpp), quant's observer or int8 layer (nn/detail/quant_hook.hpp).
/// A module holds at most one extension of each kind, found by its type (find_extension); nn::Module itself knows
/// none of them.
struct Extension {
  virtual ~Extension() = default;
};
/// The key of extension kind E: the address of this variable, one per type in the program.
template <class E>
inline constexpr char extension_key = 0;

using TensorSlot = std::variant<Tensor<float>, Tensor<double>, Tensor<half>, Tensor<bfloat16>, Tensor<std::int64_t>>;

struct ModuleState {
  std::string type_name;
  std::vector<std::pair<std::string, TensorSlot>> params, buffers;
  std::vector<std::pair<std::string, std::shared_ptr<ModuleState>>> children;
  std::function<std::string()> extra_repr;  // "784, 256, bias=True" for printing
  bool training = true;
  /// Numeric settings that code working on the module tree reads by name (BatchNorm's "eps", for folding).
  std::vector<std::pair<std::string, double>> settings;
  /// What code that rewrites the module tree attached to this module, one of each kind (find_extension).
  std::vector<std::pair<const void*, std::shared_ptr<Extension>>> extensions;

  ModuleState() = default;
  ModuleState(const ModuleState&) = delete;  // shared through shared_ptr, never copied
  ModuleState& operator=(const ModuleState&) = delete;
  EMBER_HEADER_INLINE ~ModuleState();  // (not inline: compiled once with ember::precompiled)
};
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE ModuleState::~ModuleState() = default;
#endif

/// s's extension of kind E (or of a type derived from it, attached as E), or null.
template <class E>
E* find_extension(const ModuleState& s) {
  for (const auto& [key, e] : s.extensions)
    if (key == &extension_key<E>) return static_cast<E*>(e.get());
  return nullptr;
}
/// Attaches e as s's extension of kind E, replacing the one it had; a null e removes it.
template <class E, class D>
void set_extension(ModuleState& s, std::shared_ptr<D> e) {
  static_assert(std::is_base_of_v<E, D> && std::is_base_of_v<Extension, E>, "set_extension: D must derive from E");
  std::erase_if(s.extensions, [](const auto& x) { return x.first == &extension_key<E>; });
  if (e) s.extensions.emplace_back(&extension_key<E>, std::shared_ptr<Extension>(std::move(e)));
}
/// s's extension of kind E, attached (default-constructed) if it had none.
template <class E>
E& extension(ModuleState& s) {
  if (E* e = find_extension<E>(s)) return *e;
  auto e = std::make_shared<E>();
  E& r = *e;
  set_extension<E>(s, std::move(e));
  return r;
}

/// What load_state_dict checks of one state tensor: whether it is defined, its shape and its dtype.
struct SlotInfo {
  bool defined = false;
  Shape shape;
  const char* dtype = "";
  bool floating = false;
};
template <class V>  // a TensorSlot, or a state dict's AnyTensor
SlotInfo slot_info(const V& t) {
  return std::visit(
      [](const auto& x) {
        using T = typename std::remove_cvref_t<decltype(x)>::value_type;
        return SlotInfo{x.defined(), x.defined() ? x.shape() : Shape{}, dtype_name<T>(), is_floating_v<T>};
      },
      t);
}

/// Storage offsets of t's elements in row-major order. Module state is copied element by element through these
/// (plain loops, not the fused executor), so including this header instantiates no kernels per dtype.
template <class T>
std::vector<std::int64_t> element_offsets(const Tensor<T>& t) {
  std::vector<std::int64_t> offs(static_cast<std::size_t>(t.numel()));
  std::int64_t idx[kMaxDims] = {};
  std::int64_t off = 0;
  for (auto& o : offs) {
    o = off;
    for (int d = t.dim() - 1; d >= 0; --d) {
      off += t.strides()[d];
      if (++idx[d] < t.shape()[d]) break;
      off -= t.strides()[d] * t.shape()[d];
      idx[d] = 0;
    }
  }
  return offs;
}

/// The elements of a state tensor (on any device) in row-major order, as doubles (exact for every floating dtype).
/// A template (over a TensorSlot or an AnyTensor) so that it is compiled where it is called (load_state_dict,
/// nn::fuse_conv_bn, quant).
template <class V>
EMBER_COLD std::vector<double> values_as_double(const V& t) {
  return std::visit(
      [](const auto& x) {
        const auto h = x.device().is_cpu() ? x : ember::detail::copy_to_device(x, Device::cpu(), false);
        std::vector<double> out;
        out.reserve(std::size_t(h.numel()));
        for (std::int64_t o : element_offsets(h)) out.push_back(convert<double>(h.data()[o]));
        return out;
      },
      t);
}

/// Where to write dst's new elements on the host: dst itself on the CPU, else a host tensor of its shape.
template <class T>
Tensor<T> host_target(const Tensor<T>& dst) {
  return dst.device().is_cpu() ? dst : ember::empty<T>(dst.shape());
}
/// After writing h (host_target(dst)): dst's version moves on (on the CPU h is dst), or h is copied to dst's device.
template <class T>
void commit_host_target(const Tensor<T>& dst, const Tensor<T>& h) {
  if (dst.device().is_cpu()) {
    dst.bump_version();
  } else {
    NoGradGuard ng;
    Tensor<T> d = dst;
    d.copy_(h);
  }
}

/// The walks below are one non-template function each; a caller's lambda adds only a trampoline.
using SlotFn = void (*)(void* ctx, const std::string& name, const TensorSlot& t);
template <class F>
void call_slot_fn(void* ctx, const std::string& name, const TensorSlot& t) {
  (*static_cast<F*>(ctx))(name, t);
}

EMBER_HEADER_INLINE void walk_erased(const ModuleState& s, const std::string& prefix, bool params, bool recurse,
                                     SlotFn fn, void* ctx);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void walk_erased(const ModuleState& s, const std::string& prefix, bool params, bool recurse,
                                     SlotFn fn, void* ctx) {
  for (const auto& [n, t] : params ? s.params : s.buffers) fn(ctx, prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, c] : s.children) walk_erased(*c, prefix + n + ".", params, true, fn, ctx);
}
#endif

EMBER_HEADER_INLINE void walk_unique_erased(const ModuleState& s, bool params, bool recurse, SlotFn fn, void* ctx);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE void walk_unique_erased(const ModuleState& s, bool params, bool recurse, SlotFn fn, void* ctx) {
  std::unordered_set<const void*> seen;
  auto once = [&](const std::string& n, const TensorSlot& t) {
    const void* id = std::visit([](const auto& x) -> const void* { return x.impl_ptr().get(); }, t);
    if (id && !seen.insert(id).second) return;
    fn(ctx, n, t);
  };
  walk_erased(s, "", params, recurse, call_slot_fn<decltype(once)>, &once);
}
#endif

/// Calls f(name, tensor) for every registered tensor of `which` (params or buffers) in s and its descendants.
template <class F>
void walk(const ModuleState& s, const std::string& prefix, bool params, bool recurse, F&& f) {
  using Fn = std::remove_reference_t<F>;
  walk_erased(s, prefix, params, recurse, call_slot_fn<Fn>, const_cast<void*>(static_cast<const void*>(&f)));
}

/// walk, calling f once per distinct tensor (under the first name it has), as PyTorch's named_parameters /
/// named_buffers with their default remove_duplicate=True: a tensor or submodule registered under two names
/// (weight tying) is listed once, so an optimizer updates it once per step. Undefined tensors are all kept.
template <class F>
void walk_unique(const ModuleState& s, bool params, bool recurse, F&& f) {
  using Fn = std::remove_reference_t<F>;
  walk_unique_erased(s, params, recurse, call_slot_fn<Fn>, const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace detail

}  // namespace ember::nn
