// ember — what a training checkpoint holds (io::Checkpoint), without the file code: the Trainer's state type, so that
// <ember/train.hpp> names it without compiling the safetensors reader and writer (<ember/io/checkpoint.hpp> reads and
// writes it).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"

namespace ember::io {

/// Everything a training run needs to resume exactly, in one file (io::save_checkpoint, io::load_checkpoint; the
/// Trainer writes the same format, and train::save_run / train::resume_run write and restore it in one call).
/// Fields in declaration order (designated initialisers follow it):
/// ```
/// io::save_checkpoint(path, {.model = m.state_dict(), .optimizer = opt.state_dict(), .scaler = scaler.state_dict(),
///                            .scheduler = sched.state_dict(), .epoch = epoch, .step = step,
///                            .rng = default_generator()});
/// ```
struct Checkpoint {
  StateDict model{};                ///< the model's parameters and buffers (Module::state_dict())
  StateDict optimizer{};            ///< the optimizer's state (momenta, step counts, ...)
  StateDict scaler{};               ///< the loss scaler's state (amp::GradScaler::state_dict(): scale, growth tracker)
  StateDict scheduler{};            ///< the LR scheduler's state (LRScheduler::state_dict())
  std::int64_t epoch = 0;           ///< epochs completed (so: the epoch in progress, counted from 0)
  std::int64_t batch_in_epoch = 0;  ///< batches of the epoch in progress already trained on (0 between epochs)
  std::int64_t step = 0;            ///< optimizer steps taken
  Generator rng{};                  ///< the default generator's state (seed and offset)
  std::map<std::string, Generator> generators{};  ///< other generators, by name (letters, digits, '_', '-', '.')
  std::map<std::string, std::string> extra{};     ///< anything else, as text (callbacks' state, configuration)
};

}  // namespace ember::io
