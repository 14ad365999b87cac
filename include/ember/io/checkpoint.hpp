// ember — training checkpoints: model and optimizer state (name -> tensor maps, as state_dict() returns them),
// epoch and step, the random generator's state and free-form metadata, in one safetensors file written atomically.
// Resuming from a checkpoint restores every bit of that state, so with deterministic training the run continues
// exactly as if it had not stopped.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::io {

/// Everything a training run needs to resume.
struct Checkpoint {
  TensorMap model;             ///< the model's parameters and buffers (Module::state_dict())
  TensorMap optimizer;         ///< the optimizer's state (momenta, step counts, ...)
  std::int64_t epoch = 0;      ///< epochs completed
  std::int64_t step = 0;       ///< optimizer steps taken
  Generator rng{};             ///< the random generator's state (seed and offset)
  Metadata extra;              ///< anything else (learning-rate scheduler state, configuration, ...)
};

namespace detail {
inline constexpr const char* kCheckpointFormat = "ember-checkpoint-1";

template <class I>
I parse_int(const Metadata& m, const std::string& key, const std::string& file) {
  auto it = m.find(key);
  EMBER_CHECK(it != m.end(), "load_checkpoint: '", file, "' has no '", key, "' entry");
  I v{};
  const char* b = it->second.data();
  const char* e = b + it->second.size();
  const auto r = std::from_chars(b, e, v);
  EMBER_CHECK(r.ec == std::errc() && r.ptr == e, "load_checkpoint: '", file, "': '", key, "' is ",
              quote_untrusted(it->second), ", not an integer");
  return v;
}
}  // namespace detail

/// Writes a checkpoint atomically: until the new file is complete and synced, `path` keeps the previous one.
/// A writer killed mid-save leaves a temporary file `.<name>.tmp-<pid>-<n>` beside `path`; the next save to the same
/// path removes those whose process no longer runs (see ember/core/atomic_file.hpp).
EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c);
#if EMBER_IO_BODIES
EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c) {
  TensorMap all;
  for (auto& [k, t] : c.model) all.emplace("model/" + k, t);
  for (auto& [k, t] : c.optimizer) all.emplace("optimizer/" + k, t);
  Metadata meta;
  for (auto& [k, v] : c.extra) meta.emplace("extra/" + k, v);
  meta["format"] = detail::kCheckpointFormat;
  meta["epoch"] = std::to_string(c.epoch);
  meta["step"] = std::to_string(c.step);
  meta["rng_seed"] = std::to_string(c.rng.seed());
  meta["rng_offset"] = std::to_string(c.rng.offset());
  save_safetensors(path, all, meta);
}
#endif

/// Reads a checkpoint written by save_checkpoint.
EMBER_IO_INLINE Checkpoint load_checkpoint(const std::string& path);
#if EMBER_IO_BODIES
EMBER_IO_INLINE Checkpoint load_checkpoint(const std::string& path) {
  SafeTensors f = load_safetensors(path);
  auto fmt = f.metadata.find("format");
  EMBER_CHECK(fmt != f.metadata.end() && fmt->second == detail::kCheckpointFormat, "load_checkpoint: '", path,
              "' is a safetensors file but not an ember checkpoint (metadata format is ",
              fmt == f.metadata.end() ? std::string("<missing>") : detail::quote_untrusted(fmt->second), ", expected '",
              detail::kCheckpointFormat, "')");
  Checkpoint c;
  for (auto& [k, t] : f.tensors) {
    if (k.rfind("model/", 0) == 0) c.model.emplace(k.substr(6), t);
    else if (k.rfind("optimizer/", 0) == 0) c.optimizer.emplace(k.substr(10), t);
    else EMBER_CHECK(false, "load_checkpoint: '", path, "': tensor ", detail::quote_untrusted(k),
                     " belongs to neither model/ nor optimizer/");
  }
  for (auto& [k, v] : f.metadata)
    if (k.rfind("extra/", 0) == 0) c.extra.emplace(k.substr(6), v);
  c.epoch = detail::parse_int<std::int64_t>(f.metadata, "epoch", path);
  c.step = detail::parse_int<std::int64_t>(f.metadata, "step", path);
  c.rng.manual_seed(detail::parse_int<std::uint64_t>(f.metadata, "rng_seed", path));
  c.rng.set_offset(detail::parse_int<std::uint64_t>(f.metadata, "rng_offset", path));
  return c;
}
#endif

}  // namespace ember::io
