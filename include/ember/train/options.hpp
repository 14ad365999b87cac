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

/// Lightning's precision flag. The arithmetic is the model's own policy type (Net<amp::bf16_mixed>, ...); this
/// flag decides the loss scaling: fp16_mixed runs an amp::GradScaler (Lightning's "16-mixed"), the others none.
enum class Precision { fp32, bf16_mixed, fp16_mixed };
enum class ClipAlgorithm { norm, value };
enum class Interval { step, epoch };

struct TrainerOptions {
  std::int64_t max_epochs = -1;            ///< -1: 1000 when max_steps is -1 too (Lightning's default), else no limit
  std::int64_t max_steps = -1;             ///< optimizer steps; -1: no limit
  Precision precision = Precision::fp32;
  amp::GradScalerOptions scaler{};         ///< the loss scaler's options when precision is fp16_mixed
  int accumulate_grad_batches = 1;
  double gradient_clip_val = 0;            ///< 0: no clipping
  ClipAlgorithm gradient_clip_algorithm = ClipAlgorithm::norm;
  double val_check_interval = 1.0;         ///< fraction of an epoch between validations (in (0, 1])
  int check_val_every_n_epoch = 1;
  std::int64_t limit_train_batches = -1;   ///< batches per epoch; -1: all
  std::int64_t limit_val_batches = -1;     ///< -1: all
  std::int64_t num_sanity_val_steps = 0;   ///< validation batches run before training to catch errors early
  bool deterministic = false;              ///< seed every generator from `seed` at the start of fit
  std::uint64_t seed = 0;
  int log_every_n_steps = 50;              ///< how often training metrics go to the loggers
  bool enable_progress_bar = true;
  ProgressOptions progress{};              ///< the progress bar's options (output, refresh rates)
  bool stop_on_nonfinite_loss = true;      ///< a NaN or infinite loss is an error (fp16_mixed: the scaler skips)
  bool print_summary = true;               ///< at the end: why it stopped, and whether input- or compute-bound
  /// Records the run with this profiler (started at fit's start unless running, one step per training batch,
  /// stopped at the end; its table printed with the summary). Export the trace from it afterwards.
  profile::Profiler* profiler = nullptr;
};

/// What fit needs besides the model, optimizer, loaders and steps.
struct FitOptions {
  optim::LRScheduler* scheduler = nullptr;  ///< stepped every optimizer step, or every epoch
  Interval scheduler_interval = Interval::step;
  /// Resume from this checkpoint ("last": the newest one a ModelCheckpoint callback wrote); empty: start afresh.
  /// Needs <ember/train/checkpoint.hpp> (ember::io).
  std::string ckpt_path{};
};

/// What a training_step may return instead of the bare loss: the loss and metrics to log beside it.
struct StepOutput {
  Tensor<float> loss;
  Metrics metrics;
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
