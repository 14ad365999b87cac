// ember — train::Trainer: the training loop as options (PyTorch Lightning's names where they exist), so a model,
// an optimizer, data loaders and a step lambda become a run with validation, gradient accumulation and clipping,
// loss scaling, scheduler stepping, callbacks (early stopping, checkpoints, learning-rate logging), loggers and a
// progress bar:
//
//   train::Trainer trainer({.max_epochs = 5, .gradient_clip_val = 1.0});
//   trainer.add_callback(std::make_shared<train::EarlyStopping>(train::EarlyStoppingOptions{.monitor = "val_loss"}));
//   trainer.fit(model, opt, train_loader, &val_loader,
//               [&](auto& b) { return nn::cross_entropy(model(b.data), b.target); },             // -> the loss
//               [&](auto& b) { return train::Metrics{{"val_loss", ...}, {"val_acc", ...}}; },    // -> metrics
//               {.scheduler = &schedule});
//
// The model may instead have training_step(batch) and validation_step(batch) members: fit(model, opt, train, &val).
// No inheritance anywhere. The loop itself is the template (it calls the user's types; in train/detail/fit_loop.hpp,
// included at the end); the bookkeeping around it — callbacks, metrics, the progress bar, loggers, timing — is
// plain code compiled once, not per model.
//
// Semantics follow Lightning: with accumulate_grad_batches = k the loss is divided by k and the optimizer steps
// every k batches (and at the end of an epoch); global_step counts optimizer steps; validation runs at the end of
// every check_val_every_n_epoch-th epoch, or every val_check_interval of an epoch (after an optimizer step), in
// eval mode under InferenceMode, and its metrics are the batch-size-weighted means of what validation_step returns.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ember/amp/grad_scaler.hpp"
#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/core/tensor.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/train/hooks.hpp"
#include "ember/train/metrics.hpp"
#include "ember/train/options.hpp"
#include "ember/train/progress.hpp"
#include "ember/train/resume.hpp"

namespace ember::train {

namespace detail {
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace detail

/// The training loop, as PyTorch Lightning's Trainer: fit() runs epochs of training steps (with gradient
/// accumulation, clipping, mixed-precision loss scaling and scheduler steps as the options say), validation, the
/// callbacks' hooks, logging and the progress bar, and resumes from checkpoints.
class Trainer {
 public:
  /// A trainer with options `o` (checked); neither max_epochs nor max_steps set means 1000 epochs at most.
  explicit Trainer(TrainerOptions o = {}) : o_(std::move(o)), bar_(o_.progress) {
    EMBER_CHECK(o_.accumulate_grad_batches >= 1, "train::Trainer: accumulate_grad_batches must be at least 1, got ",
                o_.accumulate_grad_batches);
    EMBER_CHECK(o_.val_check_interval > 0 && o_.val_check_interval <= 1, "train::Trainer: val_check_interval must be "
                "a fraction of an epoch in (0, 1], got ", o_.val_check_interval);
    EMBER_CHECK(o_.check_val_every_n_epoch >= 1, "train::Trainer: check_val_every_n_epoch must be at least 1, got ",
                o_.check_val_every_n_epoch);
    EMBER_CHECK(o_.gradient_clip_val >= 0 && std::isfinite(o_.gradient_clip_val), "train::Trainer: gradient_clip_val "
                "must be finite and non-negative, got ", o_.gradient_clip_val);
    EMBER_CHECK(o_.log_every_n_steps >= 1, "train::Trainer: log_every_n_steps must be at least 1, got ",
                o_.log_every_n_steps);
    EMBER_CHECK(o_.max_epochs >= -1 && o_.max_steps >= -1, "train::Trainer: max_epochs and max_steps must be -1 (no "
                "limit) or non-negative, got ", o_.max_epochs, " and ", o_.max_steps);
    if (!o_.enable_progress_bar) {
      ProgressOptions off = o_.progress;
      off.enabled = false;
      bar_ = ProgressBar(off);
    }
    if (o_.max_epochs == -1 && o_.max_steps == -1) o_.max_epochs = 1000;
  }

  /// Adds a callback (EarlyStopping, ModelCheckpoint, ... or your own); its hooks run in the order added.
  Trainer& add_callback(std::shared_ptr<Callback> c) {
    EMBER_CHECK(c != nullptr, "train::Trainer::add_callback: null callback");
    callbacks_.push_back(std::move(c));
    return *this;
  }
  /// Adds a logger (CSVLogger, TensorBoardLogger, ...), which receives every logged metric.
  Trainer& add_logger(std::shared_ptr<Logger> l) {
    EMBER_CHECK(l != nullptr, "train::Trainer::add_logger: null logger");
    loggers_.push_back(std::move(l));
    return *this;
  }

  /// Trains `model` with `opt` on `train_loader`, validating on `*val_loader` (null: no validation).
  /// training_step(batch) returns the loss (Tensor<float>, one element) or a StepOutput; validation_step(batch)
  /// returns Metrics (means over the batch).
  template <class Model, class Opt, class TrainLoader, class ValLoader, class TrainStep, class ValStep>
  FitResult fit(Model& model, Opt& opt, TrainLoader& train_loader, ValLoader* val_loader, TrainStep&& training_step,
                ValStep&& validation_step, const FitOptions& fo = {});

  /// Without validation.
  template <class Model, class Opt, class TrainLoader, class TrainStep>
  FitResult fit(Model& model, Opt& opt, TrainLoader& train_loader, TrainStep&& training_step,
                const FitOptions& fo = {}) {
    return fit(model, opt, train_loader, static_cast<TrainLoader*>(nullptr), std::forward<TrainStep>(training_step),
               [](auto&) { return Metrics{}; }, fo);
  }

  /// A model with training_step(batch) and validation_step(batch) members.
  template <class Model, class Opt, class TrainLoader, class ValLoader>
    requires requires(Model& m, typename TrainLoader::batch_type& b) { m.training_step(b); }
  FitResult fit(Model& model, Opt& opt, TrainLoader& train_loader, ValLoader* val_loader, const FitOptions& fo = {}) {
    return fit(model, opt, train_loader, val_loader, [&](auto& b) { return model.training_step(b); },
               [&](auto& b) { return model.validation_step(b); }, fo);
  }

  // ---- what callbacks see ----------------------------------------------------------------------------------
  /// The options the trainer was made with.
  const TrainerOptions& options() const { return o_; }
  /// The epoch running (from 0), as Lightning's current_epoch.
  std::int64_t current_epoch() const { return epoch_; }
  /// The optimizer steps taken so far, as Lightning's global_step.
  std::int64_t global_step() const { return global_step_; }
  /// Batches of the current epoch done.
  std::int64_t batch_idx() const { return batch_in_epoch_; }
  /// Whether the batch just finished ended with an optimizer step.
  bool stepped() const { return stepped_; }
  /// Whether fit was given a validation loader.
  bool has_validation() const { return has_val_; }
  /// Whether validation ran in the current epoch so far.
  bool validated_this_epoch() const { return validated_this_epoch_; }
  /// Whether the current validation ran at the end of an epoch (not mid-epoch).
  bool at_epoch_end() const { return at_epoch_end_; }
  /// The latest value of every metric: train_loss (per step), train_loss_epoch, validation metrics, lr-... .
  const Metrics& callback_metrics() const { return metrics_; }
  /// The optimizer as the optim::Optimizer interface (null when it is not one).
  optim::Optimizer* optimizer() const { return optimizer_; }
  /// Whether request_stop() was called (Lightning's should_stop).
  bool should_stop() const { return stop_; }
  /// The reason given to request_stop() (empty when none).
  const std::string& stop_reason() const { return stop_reason_; }
  /// Asks the loop to stop after the current batch; `reason` is printed and returned in FitResult.
  void request_stop(std::string reason) {
    if (stop_) return;
    stop_ = true;
    stop_reason_ = std::move(reason);
  }
  /// Sends metrics to every logger at the current global step (and into callback_metrics).
  void log(const Metrics& m) {
    metrics_.merge(m);
    for (auto& l : loggers_) l->log_metrics(m, global_step_);
  }
  /// Prints a line above the progress bar (or plainly when it is off).
  void print(const std::string& text) {
    if (bar_.enabled()) bar_.message(text);
    else std::printf("%s\n", text.c_str());
  }
  /// The callbacks, in the order added.
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  /// The first callback of type C (null when there is none): `t.callback<train::ModelCheckpoint>()`.
  template <class C>
  C* callback() const {
    for (const auto& c : callbacks_)
      if (auto* p = dynamic_cast<C*>(c.get())) return p;
    return nullptr;
  }

  /// The whole state of the run now (only during fit).
  TrainingState state() const {
    EMBER_CHECK(bool(get_state_), "train::Trainer::state: only available while fit runs");
    TrainingState s = get_state_();
    // At the end of an epoch (its validation and scheduler step done) the run continues with the next one.
    s.epoch = epoch_complete_ ? epoch_ + 1 : epoch_;
    s.batch_in_epoch = epoch_complete_ ? 0 : batch_in_epoch_;
    s.step = global_step_;
    s.rng = default_generator();
    if (!epoch_complete_) {  // the epoch's running totals, so its logged means continue exactly
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", loss_sum_);
      s.extra["trainer/loss_sum"] = buf;
      s.extra["trainer/loss_n"] = std::to_string(loss_n_);
      s.extra["trainer/samples"] = std::to_string(samples_);
    }
    for (const auto& c : callbacks_) {
      const std::string key = c->state_key();
      if (key.empty()) continue;
      std::map<std::string, std::string> kv;
      c->save_state(kv);
      for (auto& [k, v] : kv) s.extra["callback/" + key + "/" + k] = v;
    }
    return s;
  }
  /// Writes state() to `path` atomically. Needs <ember/train/checkpoint.hpp>.
  void save_checkpoint(const std::string& path) const {
    EMBER_CHECK(ember::detail::part<detail::CheckpointSavePart>() != nullptr,
                "train::Trainer::save_checkpoint: checkpoints need #include <ember/train/checkpoint.hpp> (and the CMake "
                "target ember::io)");
    ember::detail::part<detail::CheckpointSavePart>()(path, state());
  }

 private:
  // ---- the non-template parts of the loop ------------------------------------------------------------------
  void begin_fit(const FitOptions& fo, bool has_val, std::int64_t loader_batches) {
    EMBER_CHECK(!running_, "train::Trainer::fit: already running (fit is not reentrant)");
    running_ = true;
    has_val_ = has_val;
    stop_ = false;
    stop_reason_.clear();
    metrics_.clear();
    epoch_ = global_step_ = batch_in_epoch_ = start_batch_ = 0;
    skipped_steps_ = 0;
    fit_t0_ = detail::now_seconds();
    fit_wait_ = fit_loop_ = 0;
    // A resume restores the default generator (and changes nothing if the checkpoint is refused).
    if (!fo.ckpt_path.empty()) resume(fo.ckpt_path, epoch_length(loader_batches));
    else if (o_.deterministic) manual_seed(o_.seed);
    for (auto& c : callbacks_) c->on_fit_start(*this);
    if (o_.profiler && !o_.profiler->started()) {
      o_.profiler->start();
      started_profiler_ = true;
    }
  }

  void resume(const std::string& which, std::int64_t epoch_batches) {
    EMBER_CHECK(ember::detail::part<detail::CheckpointLoadPart>() != nullptr,
                "train::Trainer::fit: resuming (ckpt_path = '", which,
                "') needs #include <ember/train/checkpoint.hpp> (and the CMake target ember::io)");
    std::string path = which;
    if (which == "last") {
      path.clear();
      for (const auto& c : callbacks_)
        if (path.empty()) path = c->last_checkpoint();
      EMBER_CHECK(!path.empty(), "train::Trainer::fit: ckpt_path = \"last\" but no callback has written a checkpoint "
                  "(add a ModelCheckpoint with save_last = true, or pass a path)");
    }
    // The file: its format, counts, generator state.
    const TrainingState s = ember::detail::part<detail::CheckpointLoadPart>()(path);
    // All or nothing (<ember/train/resume.hpp>): every part is checked before any is loaded.
    const detail::EpochTotals totals = detail::check_position(s, path, epoch_batches);
    detail::check_callback_states(callbacks_, s);
    check_state_(s);
    detail::CallbackLoad loaded(callbacks_, s);  // (undone if the model's load below is refused)
    set_state_(s);
    loaded.commit();
    default_generator() = s.rng;
    epoch_ = s.epoch;
    start_batch_ = batch_in_epoch_ = s.batch_in_epoch;
    global_step_ = s.step;
    resumed_totals_ = totals;
    resumed_from_ = path;
  }

  /// The batches an epoch trains on, of a loader with `loader_batches`.
  std::int64_t epoch_length(std::int64_t loader_batches) const {
    return o_.limit_train_batches >= 0 ? std::min(loader_batches, o_.limit_train_batches) : loader_batches;
  }

  /// Whether another epoch may start.
  bool epoch_allowed() {
    if (stop_) return false;
    if (o_.max_epochs >= 0 && epoch_ >= o_.max_epochs) {
      request_stop("max_epochs=" + std::to_string(o_.max_epochs) + " reached");
      return false;
    }
    if (o_.max_steps >= 0 && global_step_ >= o_.max_steps) {
      request_stop("max_steps=" + std::to_string(o_.max_steps) + " reached");
      return false;
    }
    return true;
  }

  void begin_epoch(std::int64_t loader_batches) {
    epoch_batches_ = epoch_length(loader_batches);
    val_every_ = o_.val_check_interval >= 1.0
                     ? 0
                     : std::max<std::int64_t>(1, std::int64_t(double(epoch_batches_) * o_.val_check_interval));
    loss_sum_ = 0;
    loss_n_ = 0;
    samples_ = 0;
    if (batch_in_epoch_ > 0) {  // resumed mid-epoch (the position was checked against the epoch's length then)
      loss_sum_ = resumed_totals_.loss_sum;
      loss_n_ = resumed_totals_.loss_n;
      samples_ = resumed_totals_.samples;
    }
    wait_ = 0;
    step_loss_ = 0;
    step_loss_n_ = 0;
    validated_this_epoch_ = false;
    at_epoch_end_ = false;
    bar_.start_epoch(epoch_, o_.max_epochs, epoch_batches_);
    for (auto& c : callbacks_) c->on_train_epoch_start(*this);
    epoch_t0_ = last_t_ = detail::now_seconds();
    if (batch_in_epoch_ > 0) bar_.message("resumed from " + resumed_from_ + " at epoch " + std::to_string(epoch_ + 1) +
                                          ", batch " + std::to_string(batch_in_epoch_));
  }

  /// Time since the previous batch ended is time spent waiting for this one.
  void batch_fetched() {
    const double t = detail::now_seconds();
    wait_ += t - last_t_;
  }

  void check_loss(double loss) {
    if (o_.stop_on_nonfinite_loss && !std::isfinite(loss))
      EMBER_CHECK(false, "train::Trainer::fit: the training loss is ", loss, " at epoch ", epoch_, ", batch ",
                  batch_in_epoch_, " (global step ", global_step_, "); set stop_on_nonfinite_loss = false to train on");
  }

  /// After a batch: its (unscaled, undivided) loss and size; `stepped` when the optimizer stepped.
  void batch_done(double loss, std::int64_t n, bool stepped, const Metrics& step_metrics) {
    ++batch_in_epoch_;
    loss_sum_ += loss;
    ++loss_n_;
    samples_ += n;
    step_loss_ += loss;
    ++step_loss_n_;
    stepped_ = stepped;
    if (stepped) {
      const double sl = step_loss_ / double(step_loss_n_);
      step_loss_ = 0;
      step_loss_n_ = 0;
      metrics_.set("train_loss", sl);
      metrics_.merge(step_metrics);
      if (global_step_ % o_.log_every_n_steps == 0 && !loggers_.empty()) {
        Metrics m{{"train_loss", sl}, {"epoch", double(epoch_)}};
        m.merge(step_metrics);
        for (auto& l : loggers_) l->log_metrics(m, global_step_);
      }
    }
    for (auto& c : callbacks_) c->on_train_batch_end(*this);
    bar_.update(progress());
    if (o_.profiler && o_.profiler->started()) o_.profiler->step();
    last_t_ = detail::now_seconds();
  }

  ProgressStats progress() const {
    return {.batches = batch_in_epoch_ - start_batch_, .samples = samples_,
            .loss = loss_n_ ? loss_sum_ / double(loss_n_) : 0.0, .data_wait_seconds = wait_};
  }

  bool mid_epoch_validation_due() const {
    return has_val_ && val_every_ > 0 && stepped_ && batch_in_epoch_ % val_every_ == 0 &&
           batch_in_epoch_ < epoch_batches_ && (epoch_ + 1) % o_.check_val_every_n_epoch == 0;
  }
  bool epoch_end_validation_due() const {
    return has_val_ && (epoch_ + 1) % o_.check_val_every_n_epoch == 0;
  }

  void validation_done(const Metrics& m, bool epoch_end) {
    validated_this_epoch_ = true;
    at_epoch_end_ = epoch_end;
    val_metrics_ = m;
    log(m);
    for (auto& c : callbacks_) c->on_validation_end(*this);
    last_t_ = detail::now_seconds();  // validation time is not data waiting
  }

  void end_epoch() {
    const double secs = detail::now_seconds() - epoch_t0_;
    fit_wait_ += wait_;
    fit_loop_ += secs;
    if (loss_n_) {
      const Metrics m{{"train_loss_epoch", loss_sum_ / double(loss_n_)}, {"epoch", double(epoch_)},
                      {"samples_per_second", double(samples_) / std::max(secs, 1e-9)},
                      {"data_wait", std::clamp(wait_ / std::max(secs, 1e-9), 0.0, 1.0)}};
      log(m);
    }
    at_epoch_end_ = true;
    epoch_complete_ = true;
    for (auto& c : callbacks_) c->on_train_epoch_end(*this);
    Metrics shown = validated_this_epoch_ ? val_metrics_ : Metrics{};
    bar_.end_epoch(progress(), shown);
    epoch_complete_ = false;
    ++epoch_;
    batch_in_epoch_ = start_batch_ = 0;
  }

  FitResult end_fit() {
    for (auto& c : callbacks_) c->on_fit_end(*this);
    for (auto& l : loggers_) l->finalize();
    FitResult r;
    r.epochs = epoch_;
    r.global_step = global_step_;
    r.stop_reason = stop_reason_;
    r.metrics = metrics_;
    r.seconds = detail::now_seconds() - fit_t0_;
    r.data_wait_fraction = fit_loop_ > 0 ? std::clamp(fit_wait_ / fit_loop_, 0.0, 1.0) : 0.0;
    r.skipped_steps = skipped_steps_;
    if (started_profiler_) {
      o_.profiler->stop();
      started_profiler_ = false;
      if (o_.print_summary) print(o_.profiler->table(15));
    }
    if (o_.print_summary && !stop_reason_.empty()) print("stopped: " + stop_reason_);
    if (o_.print_summary && fit_loop_ > 0) {
      char buf[160];
      if (r.data_wait_fraction > 0.10)
        std::snprintf(buf, sizeof buf, "input-bound: waiting for data %.0f%% of step time - raise num_workers or pack "
                      "records", 100 * r.data_wait_fraction);
      else std::snprintf(buf, sizeof buf, "compute-bound: waiting for data %.1f%% of step time",
                         100 * r.data_wait_fraction);
      print(buf);
    }
    finish_fit();
    return r;
  }
  void finish_fit() {
    if (started_profiler_) o_.profiler->stop();
    started_profiler_ = false;
    running_ = false;
    get_state_ = nullptr;
    check_state_ = set_state_ = nullptr;
    optimizer_ = nullptr;
  }

  TrainerOptions o_;
  ProgressBar bar_;
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<Logger>> loggers_;
  std::function<TrainingState()> get_state_;
  std::function<void(const TrainingState&)> check_state_, set_state_;  // (resume.hpp's check_ and load_components)
  optim::Optimizer* optimizer_ = nullptr;
  Metrics metrics_, val_metrics_;
  std::string stop_reason_, resumed_from_;
  bool running_ = false, has_val_ = false, stop_ = false, stepped_ = false, validated_this_epoch_ = false,
       at_epoch_end_ = false, epoch_complete_ = false, started_profiler_ = false;
  detail::EpochTotals resumed_totals_{};
  std::int64_t epoch_ = 0, global_step_ = 0, batch_in_epoch_ = 0, start_batch_ = 0, epoch_batches_ = 0,
               val_every_ = 0, loss_n_ = 0, samples_ = 0, step_loss_n_ = 0, skipped_steps_ = 0;
  double loss_sum_ = 0, step_loss_ = 0, wait_ = 0, fit_t0_ = 0, epoch_t0_ = 0, last_t_ = 0, fit_wait_ = 0,
         fit_loop_ = 0;
};

}  // namespace ember::train

// The loop, Trainer::fit (a template: it calls the user's types), after the class it belongs to.
#include "ember/train/detail/fit_loop.hpp"
