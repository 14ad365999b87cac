// ember — training checkpoints: model, optimizer and LR scheduler state (StateDicts, the type every state_dict()
// returns), epoch and step, the random generator's state and free-form metadata, in one safetensors file written
// atomically.
// Resuming from a checkpoint restores every bit of that state, so with deterministic training the run continues
// exactly as if it had not stopped.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>
#include <type_traits>
#include <variant>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::io {

/// Everything a training run needs to resume:
///   io::save_checkpoint(path, {.model = m.state_dict(), .optimizer = opt.state_dict(),
///                              .scheduler = sched.state_dict(), .step = step, .rng = default_generator()});
///   const io::Checkpoint c = io::load_checkpoint(path);
///   m.load_state_dict(c.model); opt.load_state_dict(c.optimizer); sched.load_state_dict(c.scheduler); ...
struct Checkpoint {
  StateDict model{};           ///< the model's parameters and buffers (Module::state_dict())
  StateDict optimizer{};       ///< the optimizer's state (momenta, step counts, ...)
  StateDict scheduler{};       ///< the LR scheduler's state (LRScheduler::state_dict())
  std::int64_t epoch = 0;      ///< epochs completed
  std::int64_t step = 0;       ///< optimizer steps taken
  Generator rng{};             ///< the random generator's state (seed and offset)
  Metadata extra{};            ///< anything else (configuration, ...)
};

namespace detail {
inline constexpr const char* kCheckpointFormat = "ember-checkpoint-1";

template <class I>
EMBER_COLD I parse_int(const Metadata& m, const std::string& key, const std::string& file) {
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

/// A file's tensor as a state tensor (the dtypes state dicts hold); another dtype is an error naming it.
EMBER_COLD inline StateTensor to_state_tensor(const AnyTensor& t, const std::string& key, const std::string& file) {
  return std::visit(
      [&](const auto& x) -> StateTensor {
        if constexpr (std::is_constructible_v<StateTensor, decltype(x)>) {
          return x;
        } else {
          using T = typename std::remove_cvref_t<decltype(x)>::value_type;
          throw Error("load_checkpoint: '" + file + "': tensor " + quote_untrusted(key) + " is " + dtype_name<T>() +
                      ", a dtype no state dict holds (float32, float64, float16, bfloat16, int64)");
        }
      },
      t);
}
}  // namespace detail

/// Writes a checkpoint atomically: until the new file is complete and synced, `path` keeps the previous one.
/// A writer killed mid-save leaves a temporary file `.<name>.tmp-<pid>-<n>` beside `path`; the next save to the same
/// path removes those whose process no longer runs (see ember/core/atomic_file.hpp).
EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c);
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c) {
  EMBER_CHECK(c.epoch >= 0 && c.step >= 0, "save_checkpoint: '", path, "': epoch ", c.epoch, " and step ", c.step,
              " count what is done and cannot be negative");
  TensorMap all;
  auto put = [&](const char* prefix, const StateDict& sd) {
    for (const auto& entry : sd)  // (clang before 16 cannot capture structured bindings)
      std::visit([&](const auto& t) { all.emplace(prefix + entry.first, t); }, entry.second);
  };
  put("model/", c.model);
  put("optimizer/", c.optimizer);
  put("scheduler/", c.scheduler);
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
EMBER_COLD EMBER_IO_INLINE Checkpoint load_checkpoint(const std::string& path) {
  SafeTensors f = load_safetensors(path);
  auto fmt = f.metadata.find("format");
  EMBER_CHECK(fmt != f.metadata.end() && fmt->second == detail::kCheckpointFormat, "load_checkpoint: '", path,
              "' is a safetensors file but not an ember checkpoint (metadata format is ",
              fmt == f.metadata.end() ? std::string("<missing>") : detail::quote_untrusted(fmt->second), ", expected '",
              detail::kCheckpointFormat, "')");
  Checkpoint c;
  for (auto& [k, t] : f.tensors) {
    if (k.rfind("model/", 0) == 0) c.model.emplace(k.substr(6), detail::to_state_tensor(t, k, path));
    else if (k.rfind("optimizer/", 0) == 0) c.optimizer.emplace(k.substr(10), detail::to_state_tensor(t, k, path));
    else if (k.rfind("scheduler/", 0) == 0) c.scheduler.emplace(k.substr(10), detail::to_state_tensor(t, k, path));
    else EMBER_CHECK(false, "load_checkpoint: '", path, "': tensor ", detail::quote_untrusted(k),
                     " belongs to none of model/, optimizer/, scheduler/");
  }
  for (auto& [k, v] : f.metadata)
    if (k.rfind("extra/", 0) == 0) c.extra.emplace(k.substr(6), v);
  c.epoch = detail::parse_int<std::int64_t>(f.metadata, "epoch", path);
  c.step = detail::parse_int<std::int64_t>(f.metadata, "step", path);
  EMBER_CHECK(c.epoch >= 0 && c.step >= 0, "load_checkpoint: '", path, "': epoch ", c.epoch, " and step ", c.step,
              " count what is done and cannot be negative");
  c.rng.manual_seed(detail::parse_int<std::uint64_t>(f.metadata, "rng_seed", path));
  c.rng.set_offset(detail::parse_int<std::uint64_t>(f.metadata, "rng_offset", path));
  return c;
}
#endif

}  // namespace ember::io
