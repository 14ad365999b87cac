// ember — int8 models in safetensors files: quant::save writes quant::state_dict(model) with metadata naming the
// scheme, quant::load converts a float model of the same architecture from such a file. Includes <ember/io.hpp>
// (CMake target ember::io).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "ember/config.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/nn/module.hpp"
#include "ember/quant/layers.hpp"
#include "ember/quant/quantize.hpp"

namespace ember::quant {

inline constexpr const char* kFormat = "ember-int8-1";

/// Writes quant::state_dict(model) to a safetensors file (atomically), with metadata naming the scheme and each
/// int8 layer's input type.
inline void save(nn::Module& model, const std::string& path) {
  io::Metadata meta;
  meta["format"] = kFormat;
  meta["scheme"] = "weights int8 symmetric per output channel in [-127, 127]; inputs affine per tensor";
  for (const auto& s : detail::layers(model))
    if (const auto* l = detail::int8_of(*s.s)) meta["input_dtype/" + detail::label(s)] = detail::qdtype_name(l->layer().input_dtype);
  io::save_safetensors(path, state_dict(model), meta);
}

/// Loads a file written by save() into `model`: a float model of the same architecture (folded the same way
/// by nn::fuse_conv_bn when the saved one was), in evaluation mode. The layers the file holds in int8 are converted;
/// everything else loads as load_state_dict(strict). Every check passes before anything changes.
inline void load(nn::Module& model, const std::string& path) {
  const char* op = "quant::load";
  io::SafeTensors f = io::load_safetensors(path);
  const auto fmt = f.metadata.find("format");
  EMBER_CHECK(fmt != f.metadata.end() && fmt->second == kFormat, op, ": '", path,
              "' is not an ember int8 model (metadata format is ",
              fmt == f.metadata.end() ? std::string("<missing>") : io::detail::quote_untrusted(fmt->second),
              ", expected '", kFormat, "')");
  auto need = [&](const std::string& k) -> const io::AnyTensor& {
    auto it = f.tensors.find(k);
    EMBER_CHECK(it != f.tensors.end(), op, ": '", path, "' has no tensor '", k, "'");
    return it->second;
  };
  struct Job {
    detail::Site site;
    QuantizedLayer q;
  };
  std::vector<Job> jobs;
  std::set<std::string> used;
  for (const auto& s : detail::layers(model)) {
    const std::string wk = detail::key(s, "weight");
    auto it = f.tensors.find(wk);
    if (it == f.tensors.end() || io::scalar_type(it->second) != ScalarType::Int8) continue;
    EMBER_CHECK(!detail::int8_of(*s.s), op, ": layer '", detail::label(s), "' is already int8; load into a float model");
    const auto* w = nn::detail::find_slot(s.s->params, "weight");
    EMBER_CHECK(w != nullptr, op, ": layer '", detail::label(s), "' has no float weight to replace");
    QuantizedLayer q;
    q.conv = s.s->type_name == "Conv2d";
    q.name = detail::label(s);
    q.weight = io::get_as<std::int8_t>(it->second, "'" + wk + "'");
    EMBER_CHECK(q.weight.shape() == nn::detail::slot_shape(*w), op, ": '", wk, "' has shape ", q.weight.shape().str(),
                ", the model's layer ", nn::detail::slot_shape(*w).str());
    q.weight_scale = io::get_as<float>(need(detail::key(s, "weight_scale")), "'" + detail::key(s, "weight_scale") + "'");
    q.bias = io::get_as<float>(need(detail::key(s, "bias")), "'" + detail::key(s, "bias") + "'");
    const auto is = io::get_as<float>(need(detail::key(s, "input_scale")), "'" + detail::key(s, "input_scale") + "'");
    const auto iz =
        io::get_as<std::int64_t>(need(detail::key(s, "input_zero_point")), "'" + detail::key(s, "input_zero_point") + "'");
    EMBER_CHECK(is.shape() == Shape{1} && iz.shape() == Shape{1}, op, ": '", path,
                "': the input scale and zero point of '", detail::label(s), "' must have shape [1], got ",
                is.shape().str(), " and ", iz.shape().str());
    const auto dt = f.metadata.find("input_dtype/" + detail::label(s));
    EMBER_CHECK(dt != f.metadata.end() && (dt->second == "quint8" || dt->second == "qint8"), op, ": '", path,
                "': metadata input_dtype/", detail::label(s), " must be quint8 or qint8");
    q.input_dtype = dt->second == "quint8" ? QDtype::quint8 : QDtype::qint8;
    q.input.scale = is.data()[0];
    EMBER_CHECK(iz.data()[0] >= qmin(q.input_dtype) && iz.data()[0] <= qmax(q.input_dtype), op, ": '", path,
                "': input zero point ", iz.data()[0], " of '", detail::label(s), "' is outside ",
                detail::qdtype_name(q.input_dtype));
    q.input.zero_point = std::int32_t(iz.data()[0]);
    q.act = nn::detail::fused_of(*s.s).activation;
    q.pool = nn::detail::fused_of(*s.s).pool;
    if (q.conv) q.conv_options = detail::conv_options(*s.s);
    q.prepare();  // validates the sizes and values
    for (const char* field : {"weight", "weight_scale", "bias", "input_scale", "input_zero_point"})
      used.insert(detail::key(s, field));
    jobs.push_back({s, std::move(q)});
  }
  // The rest is the float state of the model without the layers above.
  StateDict rest;
  for (const auto& entry : f.tensors) {  // (no structured binding: lambdas capture them only from clang 16 on)
    const std::string& k = entry.first;
    if (used.count(k)) continue;
    rest.emplace(k, entry.second);  // any dtype: checked against the model's below
  }
  std::set<std::string> expected;
  for (auto& [k, t] : model.state_dict()) expected.insert(k);
  for (const auto& j : jobs) {
    expected.erase(detail::key(j.site, "weight"));
    expected.erase(detail::key(j.site, "bias"));
  }
  std::string missing, unexpected;
  for (const auto& k : expected)
    if (!rest.count(k)) missing += " '" + k + "'";
  for (const auto& [k, t] : rest)
    if (!expected.count(k)) unexpected += " '" + io::detail::quote_untrusted(k) + "'";
  EMBER_CHECK(missing.empty() && unexpected.empty(), op, ": '", path, "' does not match ", model.type_name(),
              missing.empty() ? "" : "; missing:", missing, unexpected.empty() ? "" : "; unexpected:", unexpected);
  const StateDict mine = model.state_dict();
  for (const auto& [k, t] : rest) {
    const auto& m = mine.at(k);
    const bool ok = std::visit(
        [](const auto& a, const auto& b) {
          using A = typename std::remove_cvref_t<decltype(a)>::value_type;
          using B = typename std::remove_cvref_t<decltype(b)>::value_type;
          return a.shape() == b.shape() && (std::is_same_v<A, B> || (is_floating_v<A> && is_floating_v<B>));
        },
        t, m);
    EMBER_CHECK(ok, op, ": '", path, "': '", k, "' is ", describe(t), ", the model has ", describe(m));
  }
  for (auto& j : jobs) detail::install(*j.site.s, std::move(j.q));
  model.load_state_dict(rest, true);
}

}  // namespace ember::quant
