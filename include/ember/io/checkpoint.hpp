// ember — training checkpoints: the one file format for the state of a run (io::Checkpoint, io/checkpoint_state.hpp:
// model, optimizer, loss scaler and LR scheduler state, epoch, position in the epoch and step, the random generators
// and free-form text), in one safetensors file written atomically. io::save_checkpoint and the Trainer write it;
// io::load_checkpoint reads it and the two formats it replaced (ember-checkpoint-1 from io::save_checkpoint,
// ember-train-checkpoint-1 from the Trainer).
// Resuming from a checkpoint restores every bit of that state, so with deterministic training the run continues
// exactly as if it had not stopped.
//
// File layout: tensors model/<name>, optimizer/<name>, scaler/<name>, scheduler/<name>; metadata format
// (ember-checkpoint-2), epoch, batch_in_epoch, step, rng_seed, rng_offset, generator/<name>/seed and /offset, and
// extra/<key>.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <variant>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/checkpoint_state.hpp"
#include "ember/io/safetensors.hpp"

namespace ember::io {

namespace detail {
inline constexpr const char* kCheckpointFormat = "ember-checkpoint-2";
inline constexpr const char* kCheckpointFormatV1 = "ember-checkpoint-1";         // io::save_checkpoint, before
inline constexpr const char* kTrainCheckpointFormatV1 = "ember-train-checkpoint-1";  // the Trainer's, before
/// The counters a run advances (epoch, batch, step) stop at 9e15, so a resumed run can never overflow them.
inline constexpr std::int64_t kMaxCount = 9'000'000'000'000'000;

/// Metadata entry `key` as a whole number in [0, max], written in full (digits only); an error naming the file.
EMBER_COLD inline std::uint64_t parse_count(const Metadata& m, const std::string& key, const std::string& file,
                                            std::uint64_t max) {
  auto it = m.find(key);
  EMBER_CHECK(it != m.end(), "load_checkpoint: '", file, "' has no '", key, "' entry");
  unsigned long long v = 0;
  EMBER_CHECK(ember::detail::parse_uint(it->second, v, max), "load_checkpoint: '", file, "': '", key, "' is ",
              quote_untrusted(it->second), ", not an integer in [0, ", max, "]");
  return v;
}

/// Whether `name` may name a generator in a checkpoint: 1 to 64 of letters, digits, '_', '-' and '.'.
inline bool valid_generator_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  return true;
}
}  // namespace detail

/// Writes a checkpoint atomically: until the new file is complete and synced, `path` keeps the previous one.
/// A writer killed mid-save leaves a temporary file `.<name>.tmp-<pid>-<n>` beside `path`; the next save to the same
/// path removes those whose process no longer runs (see ember/core/atomic_file.hpp).
EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c);
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE void save_checkpoint(const std::string& path, const Checkpoint& c) {
  EMBER_CHECK(c.epoch >= 0 && c.step >= 0 && c.batch_in_epoch >= 0 && c.epoch <= detail::kMaxCount &&
                  c.step <= detail::kMaxCount && c.batch_in_epoch <= detail::kMaxCount,
              "save_checkpoint: '", path, "': epoch ", c.epoch, ", batch_in_epoch ", c.batch_in_epoch, " and step ",
              c.step, " count what is done: each in [0, ", detail::kMaxCount, "]");
  TensorMap all;
  auto put = [&](const char* prefix, const StateDict& sd) {
    for (const auto& entry : sd)  // (clang before 16 cannot capture structured bindings)
      std::visit([&](const auto& t) { all.emplace(prefix + entry.first, t); }, entry.second);
  };
  put("model/", c.model);
  put("optimizer/", c.optimizer);
  put("scaler/", c.scaler);
  put("scheduler/", c.scheduler);
  Metadata meta;
  for (auto& [k, v] : c.extra) meta.emplace("extra/" + k, v);
  meta["format"] = detail::kCheckpointFormat;
  meta["epoch"] = std::to_string(c.epoch);
  meta["batch_in_epoch"] = std::to_string(c.batch_in_epoch);
  meta["step"] = std::to_string(c.step);
  meta["rng_seed"] = std::to_string(c.rng.seed());
  meta["rng_offset"] = std::to_string(c.rng.offset());
  for (const auto& [name, g] : c.generators) {
    EMBER_CHECK(detail::valid_generator_name(name), "save_checkpoint: '", path, "': generator name ",
                detail::quote_untrusted(name), " (expected 1 to 64 of letters, digits, '_', '-' and '.')");
    meta["generator/" + name + "/seed"] = std::to_string(g.seed());
    meta["generator/" + name + "/offset"] = std::to_string(g.offset());
  }
  save_safetensors(path, all, meta);
}
#endif

/// Reads a checkpoint written by save_checkpoint.
EMBER_IO_INLINE Checkpoint load_checkpoint(const std::string& path);
#if EMBER_IO_BODIES
EMBER_COLD EMBER_IO_INLINE Checkpoint load_checkpoint(const std::string& path) {
  SafeTensors f = load_safetensors(path);
  auto fmt = f.metadata.find("format");
  const std::string format = fmt == f.metadata.end() ? std::string() : fmt->second;
  const bool v2 = format == detail::kCheckpointFormat, io_v1 = format == detail::kCheckpointFormatV1,
             train_v1 = format == detail::kTrainCheckpointFormatV1;
  EMBER_CHECK(v2 || io_v1 || train_v1, "load_checkpoint: '", path,
              "' is a safetensors file but not an ember checkpoint (metadata format is ",
              fmt == f.metadata.end() ? std::string("<missing>") : detail::quote_untrusted(format), ", expected '",
              detail::kCheckpointFormat, "', or '", detail::kCheckpointFormatV1, "' or '",
              detail::kTrainCheckpointFormatV1, "' from earlier versions)");
  Checkpoint c;
  for (auto& [k, t] : f.tensors) {
    const auto slash = k.find('/');
    const std::string section = slash == std::string::npos ? std::string() : k.substr(0, slash);
    StateDict* sd = section == "model"                 ? &c.model
                    : section == "optimizer"           ? &c.optimizer
                    : section == "scaler" && !io_v1    ? &c.scaler
                    : section == "scheduler"           ? &c.scheduler
                                                       : nullptr;
    EMBER_CHECK(sd != nullptr, "load_checkpoint: '", path, "': tensor ", detail::quote_untrusted(k),
                " belongs to none of model/, optimizer/, ", io_v1 ? "" : "scaler/, ", "scheduler/");
    sd->emplace(k.substr(slash + 1), t);  // any dtype: load_state_dict checks what each part expects
  }
  const std::uint64_t any = std::numeric_limits<std::uint64_t>::max();
  for (auto& [k, v] : f.metadata) {
    if (k.rfind("extra/", 0) == 0) {
      c.extra.emplace(k.substr(6), v);
    } else if (v2 && k.rfind("generator/", 0) == 0) {  // generator/<name>/seed and generator/<name>/offset
      const auto slash = k.rfind('/');
      const std::string name = slash > 10 ? k.substr(10, slash - 10) : std::string(), field = k.substr(slash + 1);
      EMBER_CHECK(detail::valid_generator_name(name) && (field == "seed" || field == "offset"), "load_checkpoint: '",
                  path, "': metadata ", detail::quote_untrusted(k), " is not generator/<name>/seed or /offset");
      Generator g(detail::parse_count(f.metadata, "generator/" + name + "/seed", path, any));
      g.set_offset(detail::parse_count(f.metadata, "generator/" + name + "/offset", path, any));
      c.generators[name] = g;
    }
  }
  c.epoch = std::int64_t(detail::parse_count(f.metadata, "epoch", path, detail::kMaxCount));
  c.batch_in_epoch = io_v1 ? 0 : std::int64_t(detail::parse_count(f.metadata, "batch_in_epoch", path,
                                                                   detail::kMaxCount));
  c.step = std::int64_t(detail::parse_count(f.metadata, train_v1 ? "global_step" : "step", path, detail::kMaxCount));
  c.rng.manual_seed(detail::parse_count(f.metadata, "rng_seed", path, any));
  c.rng.set_offset(detail::parse_count(f.metadata, "rng_offset", path, any));
  return c;
}
#endif

}  // namespace ember::io
