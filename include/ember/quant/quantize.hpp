// ember — INT8 post-training quantization of a trained model's Linear and Conv2d layers, as PyTorch's eager-mode
// static quantization (prepare, calibrate, convert):
//
//   model.eval();
//   nn::fuse_conv_bn(model);                     // optional: fold BatchNorm, move ReLU/GELU/SiLU into the layers
//   quant::prepare(model, {.activation = {.kind = quant::ObserverKind::histogram}});
//   { InferenceMode g; for (auto& b : calibration) model.forward(b.data); }   // observers record input ranges
//   quant::convert(model);                       // every prepared Linear/Conv2d now runs in int8 (quant/layers.hpp)
//   quant::save(model, "model_int8.safetensors");  // quant/serialize.hpp
//
// Weights are quantized per output channel, symmetric, to [-127, 127]; each layer's input per tensor, affine, with
// the range its observer recorded. Converting removes the layer's float weight and bias from its registry (they are
// not what runs any more): model.state_dict() then lists the float state of the other modules, and
// quant::state_dict(model) everything, the int8 layers' tensors included. The converted model is for inference:
// its int8 layers compute no gradients. Conversion is in place; the layer objects keep their (unused) float weight
// tensors alive.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/cpu/epilogue.hpp"
#include "ember/cpu/qlinear.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/nn/fuse.hpp"
#include "ember/nn/detail/fused_act.hpp"
#include "ember/nn/detail/quant_hook.hpp"
#include "ember/nn/module.hpp"
#include "ember/quant/layers.hpp"
#include "ember/quant/observer.hpp"

namespace ember::quant {

/// What quant::prepare quantizes and how: torch.ao.quantization.QConfig's activation observer, plus which layers stay
/// in float (PyTorch sets module.qconfig = None for those). Weights are always per output channel, symmetric int8
/// in [-127, 127] (PyTorch's PerChannelMinMaxObserver with qscheme=torch.per_channel_symmetric):
/// ```
/// quant::prepare(model, {.activation = {.kind = quant::ObserverKind::histogram}, .keep_float = {"head"}});
/// ```
struct QConfig {
  /// How each layer's input range is recorded, and its integer type. PyTorch: QConfig(activation=...).
  ObserverOptions activation{};
  /// Dotted names (as in state_dict) of layers to leave in float.
  std::vector<std::string> keep_float{};
  /// Leave the first Linear or Conv2d (in registration order) in float: with the last, the layers whose error costs
  /// the most accuracy for the least time.
  bool keep_first = false;
  bool keep_last = false;  ///< leave the last Linear or Conv2d (in registration order) in float
};

namespace detail {

using nn::detail::ModuleState;

struct Site {
  std::string name;
  ModuleState* s;
};

inline void collect(ModuleState& s, const std::string& prefix, std::vector<Site>& out, std::set<ModuleState*>& seen) {
  for (auto& [n, c] : s.children) {
    if (!seen.insert(c.get()).second) continue;
    const std::string name = prefix + n;
    if (c->type_name == "Conv2d" || c->type_name == "Linear" || c->type_name == "QuantizedConv2d" ||
        c->type_name == "QuantizedLinear")
      out.push_back({name, c.get()});
    collect(*c, name + ".", out, seen);
  }
}

/// Every Linear and Conv2d of m (converted ones too), depth first in registration order, each module once.
inline std::vector<Site> layers(nn::Module& m) {
  std::vector<Site> out;
  std::set<ModuleState*> seen;
  ModuleState& root = nn::detail::ModuleAccess::state(m);
  if (root.type_name == "Conv2d" || root.type_name == "Linear") out.push_back({"", &root});
  collect(root, "", out, seen);
  return out;
}

inline std::string label(const Site& s) { return s.name.empty() ? std::string("<root>") : s.name; }
inline std::string key(const Site& s, const char* field) { return s.name.empty() ? field : s.name + "." + field; }

class Calibrator final : public nn::detail::QuantHook {
 public:
  Calibrator(std::string name, const ObserverOptions& o) : name_(std::move(name)), obs_(o) {}
  bool converted() const override { return false; }
  void observe(const Tensor<float>& x) override {
    EMBER_CHECK(x.device().is_cpu(), "quant: calibrating layer '", name_, "': int8 layers run on the CPU; the input ",
                x.shape().str(), " is on ", x.device().str());
    const Tensor<float> c = x.contiguous();
    std::lock_guard<std::mutex> lock(mu_);  // a model may be run from several threads
    obs_.observe(c.data(), c.numel());
  }
  Tensor<float> forward(const Tensor<float>&) const override {
    throw Error("quant: layer '" + name_ + "' is being calibrated, not converted");
  }
  const Observer& observer() const { return obs_; }

 private:
  std::string name_;
  Observer obs_;
  std::mutex mu_;
};

class Int8Layer final : public nn::detail::QuantHook {
 public:
  explicit Int8Layer(QuantizedLayer q) : q_(std::move(q)) {}
  bool converted() const override { return true; }
  void observe(const Tensor<float>&) override {}
  Tensor<float> forward(const Tensor<float>& x) const override {
    return q_.conv ? quantized_conv2d(q_, x) : quantized_linear(q_, x);
  }
  const QuantizedLayer& layer() const { return q_; }

 private:
  QuantizedLayer q_;
};

inline const Int8Layer* int8_of(const ModuleState& s) {
  return dynamic_cast<const Int8Layer*>(nn::detail::find_extension<nn::detail::QuantHook>(s));
}

inline double setting(const ModuleState& s, const char* name, double fallback) {
  for (const auto& [n, v] : s.settings)
    if (n == name) return v;
  return fallback;
}

inline Conv2dOptions conv_options(const ModuleState& s) {
  Conv2dOptions o;
  o.stride = Size2(std::int64_t(setting(s, "stride_h", 1)), std::int64_t(setting(s, "stride_w", 1)));
  o.padding = Size2(std::int64_t(setting(s, "padding_h", 0)), std::int64_t(setting(s, "padding_w", 0)));
  o.dilation = Size2(std::int64_t(setting(s, "dilation_h", 1)), std::int64_t(setting(s, "dilation_w", 1)));
  o.groups = std::int64_t(setting(s, "groups", 1));
  return o;
}

inline void erase_param(ModuleState& s, const std::string& name) {
  std::erase_if(s.params, [&](const auto& p) { return p.first == name; });
}

/// Installs q in the layer: the int8 forward runs from now on and the float weight and bias leave the registry.
inline void install(ModuleState& s, QuantizedLayer q) {
  const bool conv = q.conv;
  nn::detail::set_extension<nn::detail::QuantHook>(s, std::make_shared<Int8Layer>(std::move(q)));
  erase_param(s, "weight");
  erase_param(s, "bias");
  s.type_name = conv ? "QuantizedConv2d" : "QuantizedLinear";
}

inline void check_cpu_float(const Site& site, const nn::detail::TensorSlot& slot, const char* what) {
  std::visit(
      [&](const auto& t) {
        EMBER_CHECK(t.defined() && t.device().is_cpu(), "quant: layer '", label(site), "': its ", what,
                    " must be a defined tensor on the CPU (int8 layers run on the CPU), got ",
                    t.defined() ? t.device().str() : std::string("undefined"));
      },
      slot);
}

inline const char* qdtype_name(QDtype d) { return d == QDtype::quint8 ? "quint8" : "qint8"; }

}  // namespace detail

/// Attaches an observer of the input to every Linear and Conv2d of `model` (except those QConfig keeps in float).
/// The model must be in evaluation mode. Run calibration batches through it next, then convert(). Returns the
/// number of layers prepared.
inline int prepare(nn::Module& model, const QConfig& c = {}) {
  Observer check(c.activation);  // rejects bad options before anything changes
  (void)check;
  EMBER_CHECK(!model.is_training(), "quant::prepare: ", model.type_name(),
              " is in training mode; call eval() first (calibration observes the evaluation-mode forward)");
  auto sites = detail::layers(model);
  for (const auto& name : c.keep_float) {
    bool found = false;
    for (const auto& s : sites) found = found || s.name == name;
    EMBER_CHECK(found, "quant::prepare: keep_float names '", name, "', which is not a Linear or Conv2d of ",
                model.type_name());
  }
  for (const auto& s : sites) {
    EMBER_CHECK(!detail::int8_of(*s.s), "quant::prepare: layer '", detail::label(s), "' is already converted to int8");
    for (const auto& [n, t] : s.s->params)
      if (n == "weight" || n == "bias") detail::check_cpu_float(s, t, n.c_str());
  }
  int n = 0;
  for (std::size_t i = 0; i < sites.size(); ++i) {
    const auto& s = sites[i];
    bool keep = (c.keep_first && i == 0) || (c.keep_last && i + 1 == sites.size());
    for (const auto& name : c.keep_float) keep = keep || name == s.name;
    if (keep) {
      nn::detail::set_extension<nn::detail::QuantHook>(*s.s, std::shared_ptr<nn::detail::QuantHook>());
      continue;
    }
    nn::detail::set_extension<nn::detail::QuantHook>(*s.s,
                                                     std::make_shared<detail::Calibrator>(detail::label(s), c.activation));
    ++n;
  }
  return n;
}

/// Quantizes every prepared layer of `model` with the range its observer recorded and switches it to int8. Every
/// prepared layer must have seen calibration data; nothing changes unless all have. Returns the number converted.
inline int convert(nn::Module& model) {
  struct Job {
    detail::Site site;
    QuantizedLayer q;
  };
  std::vector<Job> jobs;
  for (const auto& s : detail::layers(model)) {
    const auto* cal = dynamic_cast<const detail::Calibrator*>(nn::detail::find_extension<nn::detail::QuantHook>(*s.s));
    if (!cal) continue;
    const Observer& obs = cal->observer();
    EMBER_CHECK(obs.has_data(), "quant::convert: layer '", detail::label(s),
                "' observed no calibration data; run batches through the model after quant::prepare");
    const auto* w = nn::detail::find_slot(s.s->params, "weight");
    EMBER_CHECK(w != nullptr, "quant::convert: layer '", detail::label(s), "' has no weight");
    const Shape ws = nn::detail::slot_shape(*w);
    const std::vector<double> wv = nn::detail::slot_values(*w);
    const std::int64_t O = ws[0], per = ws.numel() / std::max<std::int64_t>(O, 1);
    std::vector<float> wf(wv.begin(), wv.end());
    for (std::size_t i = 0; i < wf.size(); ++i)
      EMBER_CHECK(std::isfinite(wf[i]), "quant::convert: layer '", detail::label(s), "': weight element ", i, " is ",
                  wf[i]);
    const std::vector<float> scales = symmetric_scales(wf.data(), O, per);
    QuantizedLayer q;
    q.conv = s.s->type_name == "Conv2d";
    q.name = detail::label(s);
    q.weight = empty<std::int8_t>(ws);
    cpu::q::quantize_weights(wf.data(), scales.data(), O, per, q.weight.data());
    q.weight_scale = empty<float>(Shape{O});
    std::copy(scales.begin(), scales.end(), q.weight_scale.data());
    q.bias = zeros<float>(Shape{O});
    if (const auto* b = nn::detail::find_slot(s.s->params, "bias")) {
      const std::vector<double> bv = nn::detail::slot_values(*b);
      for (std::int64_t o = 0; o < O && o < std::int64_t(bv.size()); ++o) q.bias.data()[o] = float(bv[std::size_t(o)]);
    }
    q.input_dtype = obs.options().dtype;
    q.input = obs.qparams();
    q.act = nn::detail::fused_of(*s.s).activation;
    q.pool = nn::detail::fused_of(*s.s).pool;
    if (q.conv) q.conv_options = detail::conv_options(*s.s);
    q.prepare();
    jobs.push_back({s, std::move(q)});
  }
  for (auto& j : jobs) detail::install(*j.site.s, std::move(j.q));
  return int(jobs.size());
}

/// The int8 layer `name` of a converted model (nullptr when that layer is not int8).
inline const QuantizedLayer* quantized_layer(nn::Module& model, const std::string& name) {
  for (const auto& s : detail::layers(model))
    if (s.name == name)
      if (const auto* l = detail::int8_of(*s.s)) return &l->layer();
  return nullptr;
}

/// Every tensor of a (partly) converted model: its state_dict() (the float modules) and, for each int8 layer
/// "<name>", <name>.weight (int8), <name>.weight_scale, <name>.bias, <name>.input_scale (float32 [1]) and
/// <name>.input_zero_point (int64 [1]).
inline io::TensorMap state_dict(nn::Module& model) {
  io::TensorMap out = model.state_dict();
  for (const auto& s : detail::layers(model)) {
    const auto* l = detail::int8_of(*s.s);
    if (!l) continue;
    const QuantizedLayer& q = l->layer();
    Tensor<float> is = empty<float>(Shape{1});
    is.data()[0] = q.input.scale;
    Tensor<std::int64_t> iz = empty<std::int64_t>(Shape{1});
    iz.data()[0] = q.input.zero_point;
    out[detail::key(s, "weight")] = q.weight;
    out[detail::key(s, "weight_scale")] = q.weight_scale;
    out[detail::key(s, "bias")] = q.bias;
    out[detail::key(s, "input_scale")] = is;
    out[detail::key(s, "input_zero_point")] = iz;
  }
  return out;
}

}  // namespace ember::quant
