// ember — train::TrainerOptions, FitOptions and FitResult: what a run of train::Trainer is configured with and what
// it returns (Lightning's names where they exist).
#pragma once

#include <cstdint>
#include <string>

#include "ember/amp/grad_scaler.hpp"
#include "ember/core/tensor.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/train/metrics.hpp"
#include "ember/train/progress.hpp"

namespace ember::train {

/// Lightning's precision flag ("32-true", "bf16-mixed", "16-mixed"). The arithmetic is the model's own policy type
/// (Net<amp::bf16_mixed>, ...); this flag decides the loss scaling: fp16_mixed runs an amp::GradScaler (Lightning's
/// "16-mixed"), the others none.
enum class Precision { fp32, bf16_mixed, fp16_mixed };
/// How TrainerOptions::gradient_clip_val clips: by the total norm (clip_grad_norm_) or by value (clip_grad_value_);
/// Lightning's gradient_clip_algorithm "norm" / "value".
enum class ClipAlgorithm { norm, value };
/// When something runs in fit: every optimizer step or every epoch (Lightning's "interval": "step" / "epoch").
enum class Interval { step, epoch };

/// The options of train::Trainer, with the names of Lightning's Trainer(...) arguments where it has them (fields in
/// declaration order: designated initialisers follow it):
/// ```
/// train::Trainer trainer({.max_epochs = 10, .precision = train::Precision::bf16_mixed, .gradient_clip_val = 1.0});
/// ```
struct TrainerOptions {
  std::int64_t max_epochs = -1;            ///< -1: 1000 when max_steps is -1 too (Lightning's default), else no limit
  std::int64_t max_steps = -1;             ///< optimizer steps; -1: no limit
  Precision precision = Precision::fp32;   ///< the loss scaling (fp16_mixed: an amp::GradScaler); see Precision
  amp::GradScalerOptions scaler{};         ///< the loss scaler's options when precision is fp16_mixed
  int accumulate_grad_batches = 1;         ///< an optimizer step every k batches (and at an epoch's end); loss / k
  double gradient_clip_val = 0;            ///< the largest total norm (or value) of the gradients; 0: no clipping
  ClipAlgorithm gradient_clip_algorithm = ClipAlgorithm::norm;  ///< with fp16_mixed the gradients are unscaled first
  /// Fraction of an epoch between validations, in (0, 1] (Lightning also takes a batch count; ember does not).
  double val_check_interval = 1.0;
  int check_val_every_n_epoch = 1;         ///< validate in every n-th epoch only
  std::int64_t limit_train_batches = -1;   ///< batches per epoch; -1: all (Lightning's fractions are not supported)
  std::int64_t limit_val_batches = -1;     ///< batches per validation; -1: all
  /// Validation batches run before training to catch errors early (Lightning's default is 2).
  std::int64_t num_sanity_val_steps = 0;
  bool deterministic = false;              ///< seed the default generator from `seed` at the start of fit
  std::uint64_t seed = 0;                  ///< with deterministic (Lightning: seed_everything(seed))
  int log_every_n_steps = 50;              ///< how often training metrics go to the loggers
  bool enable_progress_bar = true;         ///< false: no progress bar, whatever progress.enabled says
  ProgressOptions progress{};              ///< the progress bar's options (output, refresh rates)
  bool stop_on_nonfinite_loss = true;      ///< a NaN or infinite loss is an error (fp16_mixed: the scaler skips)
  bool print_summary = true;               ///< at the end: why it stopped, and whether input- or compute-bound
  /// Records the run with this profiler (started at fit's start unless running, one step per training batch,
  /// stopped at the end; its table printed with the summary). Export the trace from it afterwards.
  profile::Profiler* profiler = nullptr;
};

/// What fit needs besides the model, optimizer, loaders and steps (Lightning's fit(ckpt_path=...) and the
/// scheduler configuration that configure_optimizers returns there).
struct FitOptions {
  optim::LRScheduler* scheduler = nullptr;  ///< stepped every optimizer step, or every epoch; nullptr: none
  Interval scheduler_interval = Interval::step;  ///< when the scheduler steps (Lightning's "interval")
  /// Resume from this checkpoint ("last": the newest one a ModelCheckpoint callback wrote); empty: start afresh.
  /// Needs <ember/train/checkpoint.hpp> (ember::io).
  std::string ckpt_path{};
};

/// What a training_step may return instead of the bare loss: the loss and metrics to log beside it.
struct StepOutput {
  Tensor<float> loss;  ///< what backward runs on (a scalar)
  Metrics metrics;     ///< logged beside the loss, as Lightning's self.log in training_step
};


/// What fit returns.
struct FitResult {
  std::int64_t epochs = 0;        ///< epochs completed
  std::int64_t global_step = 0;   ///< optimizer steps taken
  std::string stop_reason;        ///< why it stopped ("max_epochs=5 reached", an EarlyStopping message, ...)
  Metrics metrics;                ///< the last value of every metric (Trainer::callback_metrics)
  double seconds = 0;             ///< wall time of fit
  double data_wait_fraction = 0;  ///< share of the training loop's time spent waiting for batches
  std::int64_t skipped_steps = 0; ///< optimizer steps the loss scaler skipped (fp16 overflow)
};

}  // namespace ember::train
