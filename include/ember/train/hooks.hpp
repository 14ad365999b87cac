// ember — what train::Trainer calls out to: Callback (hooks into the loop, with state saved in checkpoints), Logger
// (receives metrics), and TrainingState, everything a resumable checkpoint holds; the checkpoint files themselves are
// read and written by <ember/train/checkpoint.hpp>, which installs itself as two optional parts
// (detail::CheckpointSavePart, CheckpointLoadPart).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "ember/core/optional_part.hpp"
#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/io/checkpoint_state.hpp"
#include "ember/train/metrics.hpp"

namespace ember::train {

class Trainer;

/// Everything a resumable checkpoint holds: ember's one checkpoint type (io/checkpoint_state.hpp), whose `extra`
/// carries the callbacks' state ("callback/<key>/<name>") and the Trainer's running totals ("trainer/...").
using TrainingState = io::Checkpoint;

/// A hook into the loop. Every method has an empty default; override what you need.
class Callback {
 public:
  virtual ~Callback() = default;
  /// At the start of Trainer::fit, before the first epoch (after a resume has loaded its checkpoint).
  virtual void on_fit_start(Trainer&) {}
  /// At the start of each training epoch.
  virtual void on_train_epoch_start(Trainer&) {}
  /// After each batch (after the optimizer step when this batch completed one).
  virtual void on_train_batch_end(Trainer&) {}
  /// After each validation pass, when its metrics are available (early stopping and checkpointing decide here).
  virtual void on_validation_end(Trainer&) {}
  /// At the end of each training epoch.
  virtual void on_train_epoch_end(Trainer&) {}
  /// At the end of Trainer::fit, also when a callback stopped it early.
  virtual void on_fit_end(Trainer&) {}
  /// A name unique among the callbacks of a run that keep state (the key of their state in checkpoints).
  virtual std::string state_key() const { return {}; }
  /// Writes the callback's state into `kv` (name -> text) for a checkpoint; only called when state_key() is
  /// not empty.
  virtual void save_state(std::map<std::string, std::string>&) const {}
  /// Loads what save_state wrote (`kv` is empty when the checkpoint holds no state of this callback); it should write
  /// nothing unless all of kv is valid.
  virtual void load_state(const std::map<std::string, std::string>&) {}
  /// Throws what load_state(kv) would throw, and changes nothing: a resume checks every part of the checkpoint before
  /// it loads any (<ember/train/resume.hpp>). A callback that does not override it is checked by its load_state, and
  /// gets back the state its save_state gave before the resume should a later part fail.
  virtual void check_state(const std::map<std::string, std::string>&) const {}
  /// The checkpoint FitOptions{.ckpt_path = "last"} resumes from, when this callback wrote one.
  virtual std::string last_checkpoint() const { return {}; }
};

/// Receives metrics: a CSV file, TensorBoard event files, ...
class Logger {
 public:
  virtual ~Logger() = default;
  /// Records the metrics `m` at global step `step` (the optimizer steps so far).
  virtual void log_metrics(const Metrics& m, std::int64_t step) = 0;
  /// Flushes and closes the output at the end of the run.
  virtual void finalize() {}
};

namespace detail {
/// Writing and reading checkpoints lives in <ember/train/checkpoint.hpp> (it needs ember::io): two optional parts
/// (core/optional_part.hpp) that including that header installs.
struct CheckpointSavePart {
  using Entry = void (*)(const std::string& path, const TrainingState& s);
};
struct CheckpointLoadPart {
  using Entry = TrainingState (*)(const std::string& path);
};

/// Text saved in a checkpoint read back as a double (ember::parse_double, config.hpp).
using ember::detail::parse_double;
}  // namespace detail

}  // namespace ember::train
