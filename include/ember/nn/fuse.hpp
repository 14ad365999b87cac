// ember — nn::fuse_conv_bn: folds an evaluation-mode BatchNorm into the layer before it, for inference.
//
// For each output channel c, with s_c = gamma_c / sqrt(var_c + eps) (gamma = 1 and beta = 0 without affine):
//   W'[c, ...] = W[c, ...] * s_c        b'_c = (b_c - mean_c) * s_c + beta_c     (b_c = 0 for a layer without bias)
// so conv(x, W', b') equals bn(conv(x, W, b)) with the running statistics, and the BatchNorm pass disappears.
// Conv2d -> BatchNorm2d and Linear -> BatchNorm1d are folded (the Linear's input is (N, features), so its output
// channels are BatchNorm1d's). The model is changed in place:
//   - the layer's weight is rewritten in its own memory (every handle of the module sees it); a layer built without
//     bias gains a registered parameter "bias" (its forward uses it, and state_dict() lists it);
//   - the BatchNorm becomes an identity (it prints as Identity() and has no parameters or buffers left), as after
//     PyTorch's torch.ao.quantization.fuse_modules.
// So the folded model's state_dict() loads back into a model that was folded the same way. To keep the unfolded
// model, build a second instance, load_state_dict(model.state_dict()) into it and fold that one.
//
//   model.eval();
//   nn::fuse_conv_bn(model);                                   // every pair adjacent in an nn::Sequential
//   nn::fuse_conv_bn(net, {{"conv1", "bn1"}, {"conv2", "bn2"}}); // named pairs in any module ("a.b.conv", ...)
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
#include "ember/autograd/grad_mode.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {

/// Folds every Conv2d -> BatchNorm2d and Linear -> BatchNorm1d pair that follow each other in an nn::Sequential
/// anywhere in `model` (nested Sequentials included). Returns the number of pairs folded. The model must be in
/// evaluation mode.
EMBER_HEADER_INLINE int fuse_conv_bn(Module& model);

/// Folds the named (layer, BatchNorm) pairs, named by their dotted paths in `model` as in its state_dict
/// ({"conv1", "bn1"}, {"layer1.0.conv", "layer1.0.bn"}). Every pair is checked before anything changes: the
/// kinds (Conv2d with BatchNorm2d, Linear with BatchNorm1d), evaluation mode, running statistics, channel counts,
/// and, inside an nn::Sequential, that the BatchNorm comes directly after the layer. In other modules the forward
/// decides the order, which ember cannot see: as with PyTorch's fuse_modules, naming a pair asserts the BatchNorm
/// is applied directly to the layer's output.
EMBER_HEADER_INLINE void fuse_conv_bn(Module& model, const std::vector<std::pair<std::string, std::string>>& pairs);

namespace detail {

struct FoldSite {
  ModuleState* layer = nullptr;
  ModuleState* bn = nullptr;
  std::string layer_name, bn_name;
};

EMBER_HEADER_INLINE const TensorSlot* find_slot(const std::vector<std::pair<std::string, TensorSlot>>& v,
                                                const std::string& name);
EMBER_HEADER_INLINE Shape slot_shape(const TensorSlot& slot);
EMBER_HEADER_INLINE std::vector<double> slot_values(const TensorSlot& slot);
EMBER_HEADER_INLINE void set_slot_values(const TensorSlot& slot, const std::vector<double>& v);
EMBER_HEADER_INLINE void check_fold(const FoldSite& f);
EMBER_HEADER_INLINE void fold(const FoldSite& f);

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE const TensorSlot* find_slot(const std::vector<std::pair<std::string, TensorSlot>>& v,
                                                const std::string& name) {
  for (const auto& [n, t] : v)
    if (n == name) return &t;
  return nullptr;
}

EMBER_HEADER_INLINE Shape slot_shape(const TensorSlot& slot) {
  return std::visit([](const auto& t) { return t.defined() ? t.shape() : Shape{}; }, slot);
}

/// The elements of a floating tensor (on any device) in row-major order, as doubles.
EMBER_HEADER_INLINE std::vector<double> slot_values(const TensorSlot& slot) {
  return std::visit(
      [](const auto& t) {
        const auto h = t.device().is_cpu() ? t : ember::detail::copy_to_device(t, Device::cpu(), false);
        std::vector<double> out;
        out.reserve(std::size_t(h.numel()));
        for (std::int64_t o : element_offsets(h)) out.push_back(convert<double>(h.data()[o]));
        return out;
      },
      slot);
}

/// Writes v (row-major) into a floating tensor's memory in place, rounding to its dtype.
EMBER_HEADER_INLINE void set_slot_values(const TensorSlot& slot, const std::vector<double>& v) {
  std::visit(
      [&](const auto& t) {
        using T = typename std::remove_cvref_t<decltype(t)>::value_type;
        const Tensor<T> h = t.device().is_cpu() ? t : ember::empty<T>(t.shape());
        const auto offs = element_offsets(h);
        for (std::size_t i = 0; i < offs.size(); ++i) h.data()[offs[i]] = convert<T>(v[i]);
        if (t.device().is_cpu()) {
          h.bump_version();
        } else {
          NoGradGuard ng;
          Tensor<T> d = t;
          d.copy_(h);
        }
      },
      slot);
}

EMBER_HEADER_INLINE void check_fold(const FoldSite& f) {
  const ModuleState &l = *f.layer, &b = *f.bn;
  const std::string what = "fuse_conv_bn: cannot fold '" + f.bn_name + "' (" + b.type_name + ") into '" +
                           f.layer_name + "' (" + l.type_name + ")";
  const bool conv = l.type_name == "Conv2d" && b.type_name == "BatchNorm2d";
  const bool linear = l.type_name == "Linear" && b.type_name == "BatchNorm1d";
  EMBER_CHECK(!b.folded, what, ": the BatchNorm was already folded");
  EMBER_CHECK(conv || linear, what, ": expected a Conv2d followed by a BatchNorm2d, or a Linear followed by a "
              "BatchNorm1d");
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

EMBER_HEADER_INLINE void fold(const FoldSite& f) {
  ModuleState &l = *f.layer, &b = *f.bn;
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
  for (std::size_t c = 0; c < C; ++c) scale[c] = gamma[c] / std::sqrt(var[c] + eps);
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
  b.folded = true;
  b.type_name = "Identity";
  b.extra_repr = nullptr;
  b.params.clear();
  b.buffers.clear();
}
#endif

}  // namespace detail

#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE int fuse_conv_bn(Module& model) {
  std::vector<detail::FoldSite> sites;
  auto collect = [&](auto& self, detail::ModuleState& s, const std::string& prefix) -> void {
    if (s.type_name == "Sequential") {
      for (std::size_t i = 0; i + 1 < s.children.size(); ++i) {
        detail::ModuleState &a = *s.children[i].second, &b = *s.children[i + 1].second;
        if ((a.type_name == "Conv2d" && b.type_name == "BatchNorm2d") ||
            (a.type_name == "Linear" && b.type_name == "BatchNorm1d"))
          sites.push_back({&a, &b, prefix + s.children[i].first, prefix + s.children[i + 1].first});
      }
    }
    for (auto& [n, c] : s.children) self(self, *c, prefix + n + ".");
  };
  collect(collect, detail::ModuleAccess::state(model), "");
  for (const auto& f : sites) detail::check_fold(f);
  for (const auto& f : sites) detail::fold(f);
  return int(sites.size());
}

EMBER_HEADER_INLINE void fuse_conv_bn(Module& model, const std::vector<std::pair<std::string, std::string>>& pairs) {
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
      EMBER_CHECK(found, "fuse_conv_bn: ", detail::ModuleAccess::state(model).type_name, " has no submodule '", path,
                  "'");
      start = dot + 1;
    }
    return f;
  };
  std::vector<detail::FoldSite> sites;
  for (const auto& [ln, bn] : pairs) {
    const Found l = find(ln), b = find(bn);
    const bool in_seq = (l.parent && l.parent->type_name == "Sequential") ||
                        (b.parent && b.parent->type_name == "Sequential");
    EMBER_CHECK(!in_seq || (l.parent == b.parent && b.index == l.index + 1), "fuse_conv_bn: cannot fold '", bn,
                "' into '", ln, "': in an nn::Sequential the BatchNorm must come directly after the layer");
    for (const auto& s : sites)
      EMBER_CHECK(s.layer != l.s && s.bn != b.s && s.bn != l.s && s.layer != b.s, "fuse_conv_bn: '", ln, "' or '",
                  bn, "' appears in two pairs");
    sites.push_back({l.s, b.s, ln, bn});
  }
  for (const auto& f : sites) detail::check_fold(f);
  for (const auto& f : sites) detail::fold(f);
}
#endif

}  // namespace ember::nn
