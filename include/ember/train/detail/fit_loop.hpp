// ember — train::Trainer::fit, the training loop: the template that calls the user's model, optimizer, loaders and
// steps (epochs of training steps with gradient accumulation, clipping, loss scaling and scheduler steps, and
// validation); the bookkeeping it calls is the Trainer class's, in <ember/train/trainer.hpp>, which includes this.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "ember/amp/grad_scaler.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/optim/clip_grad.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/profile/profiler.hpp"
#include "ember/train/metrics.hpp"
#include "ember/train/options.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace detail {
/// The number of samples in a batch: b.size(), else b.data.size(0), else 1.
template <class B>
std::int64_t batch_size_of(const B& b) {
  if constexpr (requires { b.size(); }) return std::int64_t(b.size());
  else if constexpr (requires { b.data.size(0); }) return std::int64_t(b.data.size(0));
  else return 1;
}
}  // namespace detail

// ---- the loop ----------------------------------------------------------------------------------------------------

template <class Model, class Opt, class TrainLoader, class ValLoader, class TrainStep, class ValStep>
FitResult Trainer::fit(Model& model, Opt& opt, TrainLoader& train_loader, ValLoader* val_loader,
                       TrainStep&& training_step, ValStep&& validation_step, const FitOptions& fo) {
  amp::GradScalerOptions so = o_.scaler;
  so.enabled = o_.precision == Precision::fp16_mixed;
  amp::GradScaler scaler(so);
  optim::LRScheduler* sched = fo.scheduler;
  if constexpr (std::is_base_of_v<optim::Optimizer, Opt>) optimizer_ = &opt;
  get_state_ = [&] {
    TrainingState s;
    s.model = model.state_dict();
    s.optimizer = opt.state_dict();
    s.scaler = scaler.state_dict();
    if (sched) s.scheduler = sched->state_dict();
    return s;
  };
  check_state_ = [&](const TrainingState& s) { detail::check_components(opt, scaler, sched, s); };
  set_state_ = [&](const TrainingState& s) { detail::load_components(model, opt, scaler, sched, s); };
  struct Reset {  // the hooks capture this frame: clear them whichever way fit leaves
    Trainer* t;
    ~Reset() {
      if (t->running_) t->finish_fit();
    }
  } reset{this};

  auto validate = [&](std::int64_t limit) {
    profile::Range range("validation", "loop");
    Metrics sum;
    double weight = 0;
    const bool was_training = model.is_training();
    model.eval();
    {
      InferenceMode im;
      std::int64_t i = 0;
      if (limit != 0)  // (a limit stops before the next batch is fetched)
        for (auto it = val_loader->begin(); !(it == val_loader->end()); ++it) {
          auto& b = *it;
          const double n = double(detail::batch_size_of(b));
          const Metrics m = validation_step(b);
          for (const auto& [k, v] : m) sum.set(k, sum.get(k).value_or(0.0) + v * n);
          weight += n;
          if (limit >= 0 && ++i >= limit) break;
        }
    }
    model.train(was_training);
    Metrics mean;
    for (const auto& [k, v] : sum) mean.set(k, weight > 0 ? v / weight : 0.0);
    return mean;
  };

  begin_fit(fo, val_loader != nullptr, std::int64_t(train_loader.size()));
  if (val_loader && o_.num_sanity_val_steps > 0 && start_batch_ == 0 && epoch_ == 0) validate(o_.num_sanity_val_steps);
  const int acc = o_.accumulate_grad_batches;
  auto params = model.parameters();
  while (epoch_allowed()) {
    model.train();
    if constexpr (requires { train_loader.set_epoch(std::uint64_t(0)); }) train_loader.set_epoch(std::uint64_t(epoch_));
    const std::int64_t skip = batch_in_epoch_;
    if constexpr (requires { train_loader.skip_batches(std::size_t(0)); })
      if (skip > 0) train_loader.skip_batches(std::size_t(skip));
    begin_epoch(std::int64_t(train_loader.size()));
    std::int64_t pending = 0;  // micro-batches accumulated since the last step
    auto it = train_loader.begin();
    if constexpr (!requires { train_loader.skip_batches(std::size_t(0)); })
      for (std::int64_t i = 0; i < skip && !(it == train_loader.end()); ++i) ++it;
    for (; !(it == train_loader.end()) && batch_in_epoch_ < epoch_batches_; ++it) {  // (ends by the break below)
      auto& batch = *it;
      batch_fetched();
      Metrics step_metrics;
      Tensor<float> loss;
      using R = std::remove_cvref_t<decltype(training_step(batch))>;
      {
        EMBER_PROFILE_RANGE_CAT("training_step", "loop");
        if constexpr (std::is_same_v<R, StepOutput>) {
          StepOutput out = training_step(batch);
          loss = out.loss;
          step_metrics = std::move(out.metrics);
        } else {
          loss = training_step(batch);
        }
      }
      EMBER_CHECK(loss.defined() && loss.numel() == 1, "train::Trainer::fit: training_step must return a loss with "
                  "one element, got ", loss.defined() ? loss.shape().str() : std::string("an undefined tensor"));
      EMBER_CHECK(loss.requires_grad(), "train::Trainer::fit: the loss training_step returned does not require grad "
                  "(computed under NoGradGuard/InferenceMode, or from tensors without requires_grad)");
      const double lv = double(loss.item());
      if (!scaler.is_enabled()) check_loss(lv);  // with loss scaling an overflow skips the step instead
      {
        EMBER_PROFILE_RANGE_CAT("backward", "loop");
        Tensor<float> scaled = acc > 1 ? Tensor<float>(loss * (1.0f / float(acc))) : loss;
        if (scaler.is_enabled()) scaler.scale(scaled).backward();
        else scaled.backward();
      }
      ++pending;
      const bool last = batch_in_epoch_ + 1 >= epoch_batches_;
      bool stepped = false;
      if (pending == acc || last) {
        EMBER_PROFILE_RANGE_CAT("optimizer_step", "loop");
        if (o_.gradient_clip_val > 0) {
          if (scaler.is_enabled()) scaler.unscale_(opt);
          if (o_.gradient_clip_algorithm == ClipAlgorithm::norm) optim::clip_grad_norm_(params, o_.gradient_clip_val);
          else optim::clip_grad_value_(params, o_.gradient_clip_val);
        }
        if (!scaler.step(opt)) ++skipped_steps_;
        scaler.update();
        opt.zero_grad();
        if (sched && fo.scheduler_interval == Interval::step) sched->step();
        ++global_step_;
        pending = 0;
        stepped = true;
      }
      batch_done(lv, detail::batch_size_of(batch), stepped, step_metrics);
      if (mid_epoch_validation_due()) validation_done(validate(o_.limit_val_batches), false);
      if (stepped && o_.max_steps >= 0 && global_step_ >= o_.max_steps)
        request_stop("max_steps=" + std::to_string(o_.max_steps) + " reached");
      if (stop_ || batch_in_epoch_ >= epoch_batches_) break;  // before fetching a batch that will not be used
    }
    const bool finished = batch_in_epoch_ >= epoch_batches_;
    if (finished) {
      if (epoch_end_validation_due()) validation_done(validate(o_.limit_val_batches), true);
      if (sched && fo.scheduler_interval == Interval::epoch) sched->step();
      end_epoch();
    } else {
      fit_wait_ += wait_;
      fit_loop_ += detail::now_seconds() - epoch_t0_;
      bar_.end_epoch(progress(), Metrics{});
    }
  }
  return end_fit();
}

}  // namespace ember::train
