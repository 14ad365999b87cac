// ember — folding for inference: nn::fuse_conv_bn folds an evaluation-mode BatchNorm into the layer before it, and
// moves an activation that follows into that layer's epilogue (PyTorch's fuse_modules, done by ember's layers).
//
// For each output channel c, with s_c = gamma_c / sqrt(var_c + eps) (gamma = 1 and beta = 0 without affine):
//   W'[c, ...] = W[c, ...] * s_c        b'_c = (b_c - mean_c) * s_c + beta_c     (b_c = 0 for a layer without bias)
// so conv(x, W', b') equals bn(conv(x, W, b)) with the running statistics, and the BatchNorm pass disappears.
// Conv2d -> BatchNorm2d and Linear -> BatchNorm1d are folded (the Linear's input is (N, features), so its output
// channels are BatchNorm1d's). A ReLU, GELU or SiLU module right after the layer (or after its BatchNorm) moves into
// the layer: when nothing needs a gradient it is applied in the GEMM's epilogue (each image's or row block's output
// while it is in cache), otherwise as a separate fused op, so training through a fused model stays exact. A 2x2
// max pool (MaxPool2d(2)) right after a Conv2d's last folded module moves into the convolution the same way: each
// image's output is pooled while it is in cache instead of in a pass over the whole batch's output (ember's own
// fusion; PyTorch's fuse_modules stops at the activation).
// The model is changed in place:
//   - the layer's weight is rewritten in its own memory (every handle of the module sees it); a layer built without
//     bias gains a registered parameter "bias" (its forward uses it, and state_dict() lists it);
//   - the BatchNorm, the activation and the pool become identities (they print as Identity() and hold no state), as after
//     PyTorch's torch.ao.quantization.fuse_modules.
// So the folded model's state_dict() loads back into a model that was folded the same way. To keep the unfolded
// model, build a second instance, load_state_dict(model.state_dict()) into it and fold that one.
//
//   model.eval();
//   nn::fuse_conv_bn(model);                                          // every group inside an nn::Sequential
//   nn::fuse_modules(net, {{"conv1", "bn1", "relu1", "pool1"}, {"fc", "act"}}); // named groups in any module
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/core/dtype.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

/// What nn::fuse_conv_bn folds besides each BatchNorm into the layer before it. PyTorch has no such switches:
/// torch.ao.quantization.fuse_modules (ember's nn::fuse_modules) fuses the groups it is given by name.
struct FuseOptions {
  /// Also move a ReLU / GELU / SiLU module that follows a layer (or its BatchNorm) into the layer.
  bool activations = true;
  /// Also move a 2x2 max pool (MaxPool2d(2): stride 2, no padding, floor) that follows a Conv2d into the
  /// convolution's epilogue (after its BatchNorm and activation, when those fold).
  bool pools = true;
};

/// Folds every Conv2d -> BatchNorm2d and Linear -> BatchNorm1d pair that follow each other in an nn::Sequential
/// anywhere in `model` (nested Sequentials included), and moves a ReLU / GELU / SiLU module that follows such a
/// layer (with or without a BatchNorm between) into it, and a 2x2 max pool after a Conv2d's last folded module.
/// Returns the number of layers changed. Folding a BatchNorm needs evaluation mode.
EMBER_DEFERRED EMBER_HEADER_INLINE int fuse_conv_bn(Module& model, const FuseOptions& o = {});

/// Fuses named groups, each by dotted paths in `model` as in its state_dict, as PyTorch's fuse_modules:
/// {layer, [batchnorm], [activation], [max pool]} with at least one of the optional modules, in that order, where
/// the layer is a Conv2d (with a BatchNorm2d) or a Linear (with a BatchNorm1d), the activation a ReLU, GELU or SiLU
/// module and the pool a MaxPool2d(2) (Conv2d only; kernel 2, stride 2, no padding, floor). Every group is
/// checked before anything changes: the kinds, evaluation mode, running statistics, channel counts, and, inside an
/// nn::Sequential, that the group's modules follow each other. In other modules the forward decides the order,
/// which ember cannot see: as with PyTorch, naming a group asserts each module is applied directly to the output
/// of the one before it. An activation module used after several layers (one shared ReLU) must be named in the group
/// of each of them (a shared MaxPool2d likewise): once fused it passes through whatever it is given outside autograd.
EMBER_DEFERRED
EMBER_HEADER_INLINE void fuse_modules(Module& model, const std::vector<std::vector<std::string>>& groups);

namespace detail {

struct FoldSite {
  ModuleState* layer = nullptr;
  ModuleState* bn = nullptr;   // null: no BatchNorm to fold
  ModuleState* act = nullptr;  // null: no activation to move
  std::string layer_name, bn_name, act_name;
  Activation act_kind = Activation::none;  // what act is, read before any group is folded (it may be shared)
  ModuleState* pool = nullptr;  // null: no max pool to move
  std::string pool_name;
};

/// The Activation of an activation module's state, or none when it is not one ember can fuse.
inline Activation act_of(const ModuleState& s) {
  if (fused_of(s).folded) return Activation::none;
  if (s.type_name == "ReLU") return Activation::relu;
  if (s.type_name == "SiLU") return Activation::silu;
  if (s.type_name == "GELU") {
    for (const auto& [n, v] : s.settings)
      if (n == "approximate") return v != 0 ? Activation::gelu_tanh : Activation::gelu;
  }
  return Activation::none;
}
/// A MaxPool2d that a Conv2d's epilogue can take: 2x2, stride 2, no padding or dilation, floor.
inline bool is_pool2x2(const ModuleState& s) {
  if (fused_of(s).folded || s.type_name != "MaxPool2d") return false;
  for (const auto& [n, v] : s.settings)
    if (n == "pool2x2") return v != 0;
  return false;
}
inline bool is_fusable_layer(const ModuleState& s) { return s.type_name == "Conv2d" || s.type_name == "Linear"; }
inline bool is_bn_for(const ModuleState& layer, const ModuleState& bn) {
  return (layer.type_name == "Conv2d" && bn.type_name == "BatchNorm2d") ||
         (layer.type_name == "Linear" && bn.type_name == "BatchNorm1d");
}

EMBER_HEADER_INLINE const TensorSlot* find_slot(const std::vector<std::pair<std::string, TensorSlot>>& v,
                                                const std::string& name);
EMBER_DEFERRED EMBER_HEADER_INLINE Shape slot_shape(const TensorSlot& slot);
EMBER_DEFERRED EMBER_HEADER_INLINE std::vector<double> slot_values(const TensorSlot& slot);
EMBER_DEFERRED EMBER_HEADER_INLINE void set_slot_values(const TensorSlot& slot, const std::vector<double>& v);
EMBER_DEFERRED EMBER_HEADER_INLINE void check_fold(const FoldSite& f, const char* op);
EMBER_DEFERRED EMBER_HEADER_INLINE void fold(const FoldSite& f);

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE const TensorSlot* find_slot(const std::vector<std::pair<std::string, TensorSlot>>& v,
                                                const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return &t;
  return nullptr;
}

EMBER_DEFERRED_DEF EMBER_HEADER_INLINE Shape slot_shape(const TensorSlot& slot) {
  return std::visit([](const auto& t) { return t.defined() ? t.shape() : Shape{}; }, slot);
}

/// The elements of a floating tensor (on any device) in row-major order, as doubles.
EMBER_DEFERRED_DEF EMBER_HEADER_INLINE std::vector<double> slot_values(const TensorSlot& slot) {
  return values_as_double(slot);
}

/// Writes v (row-major) into a floating tensor's memory in place, rounding to its dtype.
EMBER_DEFERRED_DEF EMBER_HEADER_INLINE void set_slot_values(const TensorSlot& slot, const std::vector<double>& v) {
  std::visit(
      [&](const auto& t) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        const Tensor<T> h = host_target(t);
        const auto offs = element_offsets(h);
        for (std::size_t i = 0; i < offs.size(); ++i) h.data()[offs[i]] = convert<T>(v[i]);
        commit_host_target(t, h);
      },
      slot);
}

EMBER_DEFERRED_DEF EMBER_HEADER_INLINE void check_fold(const FoldSite& f, const char* op) {
  const ModuleState& l = *f.layer;
  if (f.pool) {
    const std::string what = std::string(op) + ": cannot move '" + f.pool_name + "' (" + f.pool->type_name +
                             ") into '" + f.layer_name + "' (" + l.type_name + ")";
    EMBER_CHECK(l.type_name == "Conv2d", what, ": only a Conv2d takes a max pool in its epilogue");
    EMBER_CHECK(is_pool2x2(*f.pool), what, ": expected a MaxPool2d with kernel 2, stride 2, no padding or dilation "
                "and floor mode", fused_of(*f.pool).folded ? " (this one was already fused)" : "");
    EMBER_CHECK(!fused_of(l).pool, what, ": the layer already takes a max pool");
  }
  if (f.act) {
    const std::string what = std::string(op) + ": cannot move '" + f.act_name + "' (" + f.act->type_name + ") into '" +
                             f.layer_name + "' (" + l.type_name + ")";
    EMBER_CHECK(is_fusable_layer(l), what, ": expected a Conv2d or a Linear");
    EMBER_CHECK(act_of(*f.act) != Activation::none, what, ": expected a ReLU, GELU or SiLU module",
                fused_of(*f.act).folded ? " (this one was already fused)" : "");
    EMBER_CHECK(fused_of(l).activation == Activation::none, what, ": the layer already applies ",
                activation_name(fused_of(l).activation));
  }
  if (!f.bn) return;
  const ModuleState& b = *f.bn;
  const std::string what = std::string(op) + ": cannot fold '" + f.bn_name + "' (" + b.type_name + ") into '" +
                           f.layer_name + "' (" + l.type_name + ")";
  EMBER_CHECK(!fused_of(b).folded, what, ": the BatchNorm was already folded");
  EMBER_CHECK(is_bn_for(l, b), what, ": expected a Conv2d followed by a BatchNorm2d, or a Linear followed by a "
              "BatchNorm1d");
  EMBER_CHECK(fused_of(l).activation == Activation::none, what,
              ": the layer already applies an activation, which the BatchNorm follows");
  const bool conv = l.type_name == "Conv2d";
  EMBER_CHECK(!l.training && !b.training, what, ": the model is in training mode; call eval() first (folding uses "
              "the running statistics, which only evaluation mode uses)");
  const TensorSlot* w = find_slot(l.params, "weight");
  const TensorSlot* mean = find_slot(b.buffers, "running_mean");
  const TensorSlot* var = find_slot(b.buffers, "running_var");
  EMBER_CHECK(w != nullptr, what, ": the layer has no parameter 'weight'");
  EMBER_CHECK(mean && var, what, ": the BatchNorm has no running statistics (track_running_stats=false), so it "
              "normalises with batch statistics in evaluation too and cannot be folded");
  bool has_eps = false;
  for (const auto& [n, v] : b.settings) has_eps = has_eps || n == "eps";
  EMBER_CHECK(has_eps, what, ": the BatchNorm does not record its eps");
  const Shape ws = slot_shape(*w);
  const std::int64_t channels = slot_shape(*mean).numel();
  EMBER_CHECK(ws.n == (conv ? 4 : 2) && ws[0] == channels, what, ": the layer's weight ", ws.str(), " has ",
              ws.n > 0 ? ws[0] : 0, " output channels, the BatchNorm normalises ", channels);
  if (const TensorSlot* bias = find_slot(l.params, "bias")) {
    EMBER_CHECK(slot_shape(*bias).numel() == channels, what, ": the layer's bias has shape ",
                slot_shape(*bias).str(), ", expected [", channels, "]");
  }
}

/// Turns a fused module into a stateless identity.
inline void make_identity(ModuleState& s) {
  extension<Fused>(s).folded = true;
  s.type_name = "Identity";
  s.extra_repr = nullptr;
  s.params.clear();
  s.buffers.clear();
}

EMBER_DEFERRED_DEF EMBER_HEADER_INLINE void fold(const FoldSite& f) {
  ModuleState& l = *f.layer;
  if (f.pool) {
    extension<Fused>(l).pool = true;
    make_identity(*f.pool);
  }
  if (f.act) {
    extension<Fused>(l).activation = f.act_kind;
    if (cpu::is_heavy_act(f.act_kind)) {  // the layer's forward reads GELU's or SiLU's loops from a table
      cpu::enable_act_epilogues<float>();
      cpu::enable_act_epilogues<double>();
      cpu::enable_act_epilogues<half>();
      cpu::enable_act_epilogues<bfloat16>();
    }
    make_identity(*f.act);
  }
  if (!f.bn) return;
  ModuleState& b = *f.bn;
  const TensorSlot& w = *find_slot(l.params, "weight");
  const std::vector<double> mean = slot_values(*find_slot(b.buffers, "running_mean"));
  const std::vector<double> var = slot_values(*find_slot(b.buffers, "running_var"));
  const std::size_t C = mean.size();
  std::vector<double> gamma(C, 1.0), beta(C, 0.0);
  if (const TensorSlot* g = find_slot(b.params, "weight")) gamma = slot_values(*g);
  if (const TensorSlot* bt = find_slot(b.params, "bias")) beta = slot_values(*bt);
  double eps = 0;
  for (const auto& [n, v] : b.settings)
    if (n == "eps") eps = v;

  std::vector<double> scale(C);
  for (std::size_t c = 0; c < C; ++c) {
    EMBER_CHECK(var[c] + eps > 0, "nn::fuse_conv_bn: running_var[", c, "] is ", var[c], " (eps ", eps,
                "); the running variance plus eps must be positive (a corrupt state dict?)");
    scale[c] = gamma[c] / std::sqrt(var[c] + eps);
  }
  std::vector<double> wv = slot_values(w);
  const std::size_t per = wv.size() / C;
  for (std::size_t c = 0; c < C; ++c)
    for (std::size_t k = 0; k < per; ++k) wv[c * per + k] *= scale[c];

  const TensorSlot* bias = find_slot(l.params, "bias");
  std::vector<double> bv = bias ? slot_values(*bias) : std::vector<double>(C, 0.0);
  for (std::size_t c = 0; c < C; ++c) bv[c] = (bv[c] - mean[c]) * scale[c] + beta[c];

  set_slot_values(w, wv);
  if (bias) {
    set_slot_values(*bias, bv);
  } else {
    // A parameter like the weight: its dtype and device, a leaf that requires grad when the weight does.
    TensorSlot gained = std::visit(
        [&](const auto& wt) -> TensorSlot {
          using T = typename std::remove_cvref_t<decltype(wt)>::value_type;
          if constexpr (is_floating_v<T>) {
            Tensor<T> t = ember::empty<T>(Shape{std::int64_t(C)}, wt.device());
            if (wt.requires_grad()) t.requires_grad_(true);
            return t;
          } else {
            return wt;  // (never: check_fold found a floating weight of the layer's kind)
          }
        },
        w);
    set_slot_values(gained, bv);
    l.params.emplace_back("bias", std::move(gained));
  }
  make_identity(b);
}
#endif

}  // namespace detail

#if EMBER_HEADER_BODIES
EMBER_DEFERRED_DEF EMBER_HEADER_INLINE int fuse_conv_bn(Module& model, const FuseOptions& o) {
  std::vector<detail::FoldSite> sites;
  auto collect = [&](auto& self, detail::ModuleState& s, const std::string& prefix) -> void {
    if (s.type_name == "Sequential") {
      const auto& ch = s.children;
      for (std::size_t i = 0; i < ch.size(); ++i) {
        detail::ModuleState& l = *ch[i].second;
        if (!detail::is_fusable_layer(l)) continue;
        detail::FoldSite f{&l, nullptr, nullptr, prefix + ch[i].first, "", "", Activation::none, nullptr, ""};
        std::size_t j = i + 1;
        if (j < ch.size() && detail::is_bn_for(l, *ch[j].second) && !detail::fused_of(*ch[j].second).folded) {
          f.bn = ch[j].second.get();
          f.bn_name = prefix + ch[j].first;
          ++j;
        }
        if (o.activations && detail::fused_of(l).activation == Activation::none && j < ch.size() &&
            detail::act_of(*ch[j].second) != Activation::none) {
          f.act = ch[j].second.get();
          f.act_name = prefix + ch[j].first;
          f.act_kind = detail::act_of(*f.act);
          ++j;
        }
        // A pool right after the layer's last folded module (an activation left in place stays between them).
        if (o.pools && l.type_name == "Conv2d" && !detail::fused_of(l).pool && j < ch.size() &&
            detail::is_pool2x2(*ch[j].second)) {
          f.pool = ch[j].second.get();
          f.pool_name = prefix + ch[j].first;
        }
        if (f.bn || f.act || f.pool) sites.push_back(f);
      }
    }
    for (auto& [n, c] : s.children) self(self, *c, prefix + n + ".");
  };
  collect(collect, detail::ModuleAccess::state(model), "");
  for (const auto& f : sites) detail::check_fold(f, "fuse_conv_bn");
  for (const auto& f : sites) detail::fold(f);
  return int(sites.size());
}

EMBER_DEFERRED_DEF
EMBER_HEADER_INLINE void fuse_modules(Module& model, const std::vector<std::vector<std::string>>& groups) {
  struct Found {
    detail::ModuleState* s = nullptr;
    detail::ModuleState* parent = nullptr;
    std::size_t index = 0;
  };
  auto find = [&](const std::string& path) {
    Found f{&detail::ModuleAccess::state(model), nullptr, 0};
    std::size_t start = 0;
    while (start <= path.size()) {
      const std::size_t dot = std::min(path.find('.', start), path.size());
      const std::string part = path.substr(start, dot - start);
      bool found = false;
      for (std::size_t i = 0; i < f.s->children.size() && !found; ++i) {
        if (f.s->children[i].first != part) continue;
        f = {f.s->children[i].second.get(), f.s, i};
        found = true;
      }
      EMBER_CHECK(found, "fuse_modules: ", detail::ModuleAccess::state(model).type_name, " has no submodule '", path,
                  "'");
      start = dot + 1;
    }
    return f;
  };
  std::vector<detail::FoldSite> sites;
  std::vector<const detail::ModuleState*> used;
  for (const auto& g : groups) {
    std::string listed;
    for (const auto& n : g) listed += (listed.empty() ? "'" : ", '") + n + "'";
    EMBER_CHECK(g.size() >= 2 && g.size() <= 4, "fuse_modules: a group names 2 to 4 modules (layer, batchnorm, "
                "activation, max pool), got ", g.size(), " (", listed, ")");
    std::vector<Found> m;
    for (const auto& n : g) m.push_back(find(n));
    for (std::size_t i = 1; i < m.size(); ++i)
      EMBER_CHECK(!detail::fused_of(*m[i].s).folded, "fuse_modules: cannot fuse ", listed, ": '", g[i],
                  "' was already fused into the layer before it");
    for (std::size_t i = 1; i < m.size(); ++i) {
      const bool in_seq = (m[i - 1].parent && m[i - 1].parent->type_name == "Sequential") ||
                          (m[i].parent && m[i].parent->type_name == "Sequential");
      EMBER_CHECK(!in_seq || (m[i - 1].parent == m[i].parent && m[i].index == m[i - 1].index + 1),
                  "fuse_modules: cannot fuse ", listed, ": in an nn::Sequential '", g[i],
                  "' must come directly after '", g[i - 1], "'");
    }
    // {layer, [bn], [act], [pool]}: a trailing MaxPool2d is the pool; of the rest after the layer, two are the
    // BatchNorm and the activation, one is the activation when it is an activation module, else the BatchNorm.
    const bool has_pool = m.back().s->type_name == "MaxPool2d";
    const std::size_t end = m.size() - (has_pool ? 1 : 0), rest = end - 1;
    EMBER_CHECK(rest <= 2, "fuse_modules: cannot fuse ", listed, ": a group is a layer followed by a BatchNorm, an "
                "activation and a MaxPool2d, in that order, each optional");
    const bool has_act = rest == 2 || (rest == 1 && detail::act_of(*m[1].s) != Activation::none);
    const bool has_bn = rest == 2 || (rest == 1 && !has_act);
    // A layer or a BatchNorm belongs to one group; an activation or pool module may follow several layers (one ReLU
    // module used after each of them), and then every one of those layers must name it.
    const std::size_t owned = has_bn ? 2 : 1;
    for (std::size_t i = 0; i < owned; ++i)
      for (const auto* u : used)
        EMBER_CHECK(u != m[i].s, "fuse_modules: '", g[i], "' of (", listed, ") appears in two groups");
    for (std::size_t i = 0; i < owned; ++i) used.push_back(m[i].s);
    detail::FoldSite f{m[0].s, nullptr, nullptr, g[0], "", "", Activation::none, nullptr, ""};
    if (has_bn) {
      f.bn = m[1].s;
      f.bn_name = g[1];
    }
    if (has_act) {
      f.act = m[end - 1].s;
      f.act_name = g[end - 1];
      f.act_kind = detail::act_of(*f.act);
    }
    if (has_pool) {
      f.pool = m.back().s;
      f.pool_name = g.back();
    }
    sites.push_back(f);
  }
  for (const auto& f : sites) detail::check_fold(f, "fuse_modules");
  for (const auto& f : sites) detail::fold(f);
}
#endif

}  // namespace ember::nn
