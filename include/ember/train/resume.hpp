// ember — resuming a train::Trainer run from a checkpoint, all or nothing. Every part of the checkpoint is checked
// before any is loaded: the file itself when it is read (its format, counts and generator state), the Trainer's
// position and the epoch's running totals, each callback's state (Callback::check_state), the optimizer's, the loss
// scaler's and the scheduler's state (their check_state_dict). Then the parts are loaded: the callbacks first (each
// given back the state its save_state gave before, should a later part fail), the model (Module::load_state_dict
// writes nothing unless every entry fits), and the parts already checked. So a refused checkpoint leaves the model,
// the optimizer, the scheduler, the loss scaler, the callbacks and the default generator as they were.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/amp/grad_scaler.hpp"
#include "ember/config.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/train/hooks.hpp"

namespace ember::train::detail {

/// The running totals of the epoch a mid-epoch checkpoint was written in (extra/trainer/...), so that the epoch's
/// logged means continue exactly.
struct EpochTotals {
  double loss_sum = 0;
  std::int64_t loss_n = 0, samples = 0;
};

/// Checks the Trainer's own entries: the position within an epoch of `epoch_batches` batches, and the epoch's running
/// totals (all three entries or none). Returns the totals (zeros without them).
inline EpochTotals check_position(const TrainingState& s, const std::string& path, std::int64_t epoch_batches) {
  EMBER_CHECK(s.batch_in_epoch <= epoch_batches, "train::Trainer::fit: the checkpoint ", path, " resumes at batch ",
              s.batch_in_epoch, " of an epoch of ", epoch_batches,
              " batches (did the data or limit_train_batches change?)");
  const auto a = s.extra.find("trainer/loss_sum"), b = s.extra.find("trainer/loss_n"),
             c = s.extra.find("trainer/samples");
  const int present = int(a != s.extra.end()) + int(b != s.extra.end()) + int(c != s.extra.end());
  if (present == 0) return {};
  EMBER_CHECK(present == 3, "train::Trainer::fit: '", path, "' has ", present, " of the epoch's running totals "
              "(extra/trainer/loss_sum, loss_n and samples), expected all three or none");
  // Each written in full: the loss sum (NaN or inf only if the run trained on with stop_on_nonfinite_loss = false),
  // the loss count (at most one per batch so far) and the sample count.
  auto number = [&](const std::pair<const std::string, std::string>& kv, double max_count) {
    double v = 0;
    const bool count = max_count >= 0;
    EMBER_CHECK(parse_double(kv.second, v) && (!count || (v >= 0 && v <= max_count && v == std::floor(v))),
                "train::Trainer::fit: '", path, "': extra/", kv.first, " is ",
                ember::detail::quote_untrusted(kv.second),
                count ? ", expected a whole number in [0, " + std::to_string(std::int64_t(max_count)) + "]"
                      : std::string(", expected a number"));
    return v;
  };
  EpochTotals t;
  t.loss_sum = number(*a, -1);
  t.loss_n = std::int64_t(number(*b, double(s.batch_in_epoch)));
  t.samples = std::int64_t(number(*c, 9.0e15));
  return t;
}

/// A callback's part of the checkpoint: the extra entries "callback/<key>/<name>", by name.
inline std::map<std::string, std::string> callback_state(const TrainingState& s, const std::string& key) {
  const std::string prefix = "callback/" + key + "/";
  std::map<std::string, std::string> kv;
  for (auto it = s.extra.lower_bound(prefix); it != s.extra.end() && it->first.rfind(prefix, 0) == 0; ++it)
    kv.emplace(it->first.substr(prefix.size()), it->second);
  return kv;
}

/// Checks every stateful callback's part of the checkpoint (Callback::check_state); changes nothing.
inline void check_callback_states(const std::vector<std::shared_ptr<Callback>>& callbacks, const TrainingState& s) {
  for (const auto& c : callbacks) {
    const std::string key = c->state_key();
    if (!key.empty()) c->check_state(callback_state(s, key));
  }
}

/// Loads every stateful callback's state, in order. If one throws, or if this object is destroyed before commit()
/// (a later part of the resume threw), the callbacks loaded so far, and the one that threw, get back the state their
/// save_state gave before.
class CallbackLoad {
 public:
  CallbackLoad(const std::vector<std::shared_ptr<Callback>>& callbacks, const TrainingState& s) {
    try {
      for (const auto& c : callbacks) {
        const std::string key = c->state_key();
        if (key.empty()) continue;
        std::map<std::string, std::string> before;
        c->save_state(before);
        undo_.emplace_back(c.get(), std::move(before));
        c->load_state(callback_state(s, key));
      }
    } catch (...) {
      restore();
      throw;
    }
  }
  CallbackLoad(const CallbackLoad&) = delete;
  CallbackLoad& operator=(const CallbackLoad&) = delete;
  ~CallbackLoad() { restore(); }
  /// The resume succeeded: keep what was loaded.
  void commit() { undo_.clear(); }

 private:
  void restore() noexcept {
    // A state the callback saved itself loads back; should it not, the resume's own error is still the one thrown.
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) try {
        it->first->load_state(it->second);
      } catch (...) {
      }
    undo_.clear();
  }
  std::vector<std::pair<Callback*, std::map<std::string, std::string>>> undo_;
};

/// Whether an optimizer type can check a state without loading it (every optim::Optimizer can).
template <class Opt>
concept ChecksState = requires(const Opt& o, const StateDict& sd) { o.check_state_dict(sd); };

/// Checks the optimizer's, the loss scaler's (when it is enabled) and the scheduler's state; changes nothing.
template <class Opt>
void check_components(const Opt& opt, const amp::GradScaler& scaler, const optim::LRScheduler* sched,
                      const TrainingState& s) {
  if constexpr (ChecksState<Opt>) opt.check_state_dict(s.optimizer);
  if (scaler.is_enabled()) scaler.check_state_dict(s.scaler);
  if (sched) sched->check_state_dict(s.scheduler);
}

/// Loads the model's, the optimizer's, the scaler's and the scheduler's state, all but the model's checked before by
/// check_components. An optimizer without check_state_dict is loaded before the model instead, and given back its
/// state_dict() of before should the model's load be refused.
template <class Model, class Opt>
void load_components(Model& model, Opt& opt, amp::GradScaler& scaler, optim::LRScheduler* sched,
                     const TrainingState& s) {
  if constexpr (ChecksState<Opt>) {
    model.load_state_dict(s.model);
    opt.load_state_dict(s.optimizer);
  } else {
    const StateDict before = opt.state_dict();
    opt.load_state_dict(s.optimizer);
    try {
      model.load_state_dict(s.model);
    } catch (...) {
      opt.load_state_dict(before);
      throw;
    }
  }
  if (scaler.is_enabled()) scaler.load_state_dict(s.scaler);
  if (sched) sched->load_state_dict(s.scheduler);  // after the optimizer's: it writes the rates of its step
}

}  // namespace ember::train::detail
