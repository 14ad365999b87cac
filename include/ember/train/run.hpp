// ember — a hand-written training loop checkpointed in one call and resumed exactly in one call: the model, the
// optimizer, the LR scheduler, the loss scaler, the counters, the default generator and any named ones, and text of
// the user's, in ember's one checkpoint format (io/checkpoint.hpp, which the Trainer writes too).
//
//   std::int64_t epoch = 0, step = 0;
//   train::Run run{.model = &model, .optimizer = opt, .scheduler = sched, .scaler = scaler, .epoch = &epoch,
//                  .step = &step};
//   if (std::filesystem::exists(path)) train::resume_run(path, run);   // all or nothing
//   for (; epoch < epochs; ++epoch) { ... ++step; ... train::save_run(path, run); }
//
// resume_run checks every part of the file before it changes any: the file itself (format, counts, generators), then
// each part's state against its object (check_state_dict), then that the file has exactly the parts `run` names.
// Only then are they loaded, the model first (Module::load_state_dict writes nothing unless every entry fits). A
// refused checkpoint leaves every object of `run` as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/core/state_dict.hpp"
#include "ember/io/checkpoint.hpp"
#include "ember/nn/module.hpp"

namespace ember::train {

/// A reference to an object with state_dict(), load_state_dict(sd) and check_state_dict(sd) (an optimizer, an LR
/// scheduler, ReduceLROnPlateau, amp::GradScaler); empty: none.
class StateRef {
 public:
  StateRef() = default;
  /// A reference to obj's state_dict, load_state_dict and check_state_dict (obj must outlive it).
  template <class T>
    requires(!std::is_same_v<std::remove_cv_t<T>, StateRef>) && requires(T& t, const StateDict& sd) {
      { t.state_dict() } -> std::convertible_to<StateDict>;
      t.load_state_dict(sd);
      t.check_state_dict(sd);
    }
  StateRef(T& obj)  // NOLINT: implicit, so that `.optimizer = opt` reads as it should
      : save_([&obj] { return StateDict(obj.state_dict()); }),
        load_([&obj](const StateDict& sd) { obj.load_state_dict(sd); }),
        check_([&obj](const StateDict& sd) { obj.check_state_dict(sd); }) {}
  /// Whether it refers to an object (false when default-constructed: "none").
  explicit operator bool() const { return bool(save_); }
  /// The object's state_dict().
  StateDict state_dict() const { return save_(); }
  /// The object's load_state_dict(sd).
  void load_state_dict(const StateDict& sd) const { load_(sd); }
  /// The object's check_state_dict(sd).
  void check_state_dict(const StateDict& sd) const { check_(sd); }

 private:
  std::function<StateDict()> save_;
  std::function<void(const StateDict&)> load_, check_;
};

/// The parts of a run that save_run writes and resume_run restores. A part left empty (null) is neither written nor
/// read; a checkpoint that holds a part `run` leaves empty, or lacks one it names, is refused. Fields in declaration
/// order (designated initialisers follow it).
struct Run {
  nn::Module* model = nullptr;         ///< the model: its parameters and buffers (Module::state_dict())
  StateRef optimizer{};                ///< optim::SGD, Adam, AdamW, ZeroRedundancyOptimizer, ...
  StateRef scheduler{};                ///< any LRScheduler, or ReduceLROnPlateau
  StateRef scaler{};                   ///< amp::GradScaler (fp16 loss scaling: its scale and growth tracker)
  std::int64_t* epoch = nullptr;       ///< epochs completed
  std::int64_t* batch_in_epoch = nullptr;  ///< batches of the epoch in progress already done (mid-epoch saves)
  std::int64_t* step = nullptr;        ///< optimizer steps taken
  Generator* rng = &default_generator();   ///< the default generator (dropout, initialisation, rand)
  std::map<std::string, Generator*> generators{};  ///< more generators, by name
  std::map<std::string, std::string>* extra = nullptr;  ///< the user's own text (configuration, notes)
};

namespace detail {
inline const char* part_name(int i) {
  static constexpr const char* names[] = {"model", "optimizer", "scheduler", "scaler"};
  return names[i];
}
}  // namespace detail

/// Writes the run's state to `path` atomically (until the new file is complete, `path` keeps the previous one).
inline void save_run(const std::string& path, const Run& r) {
  io::Checkpoint c;
  if (r.model) c.model = r.model->state_dict();
  if (r.optimizer) c.optimizer = r.optimizer.state_dict();
  if (r.scheduler) c.scheduler = r.scheduler.state_dict();
  if (r.scaler) c.scaler = r.scaler.state_dict();
  if (r.epoch) c.epoch = *r.epoch;
  if (r.batch_in_epoch) c.batch_in_epoch = *r.batch_in_epoch;
  if (r.step) c.step = *r.step;
  if (r.rng) c.rng = *r.rng;
  for (const auto& [name, g] : r.generators) {
    EMBER_CHECK(g != nullptr, "train::save_run: generator '", name, "' is null");
    c.generators.emplace(name, *g);
  }
  if (r.extra) c.extra = *r.extra;
  io::save_checkpoint(path, c);
}

/// Restores the run's state from a checkpoint save_run (or the Trainer, or io::save_checkpoint) wrote: all of it, or
/// nothing (an ember::Error says what was refused).
inline void resume_run(const std::string& path, const Run& r) {
  const io::Checkpoint c = io::load_checkpoint(path);
  const std::string where = "train::resume_run: '" + path + "'";
  // The parts: each named in `run` has state in the file, and each with state in the file is named in `run` (a
  // disabled scaler's state is empty, so the two agree there).
  const StateDict* states[] = {&c.model, &c.optimizer, &c.scheduler, &c.scaler};
  const bool named[] = {r.model != nullptr, bool(r.optimizer), bool(r.scheduler), bool(r.scaler)};
  for (int i = 0; i < 4; ++i) {
    EMBER_CHECK(named[i] || states[i]->empty(), where, " holds ", detail::part_name(i), " state, which the run "
                "does not name (give it Run::", detail::part_name(i), ")");
    EMBER_CHECK(!named[i] || !states[i]->empty() || i == 3, where, " holds no ", detail::part_name(i), " state");
  }
  for (const auto& [name, g] : c.generators)
    EMBER_CHECK(r.generators.count(name), where, " holds generator '", name, "', which the run does not name");
  for (const auto& [name, g] : r.generators) {
    EMBER_CHECK(g != nullptr, "train::resume_run: generator '", name, "' is null");
    EMBER_CHECK(c.generators.count(name), where, " holds no generator '", name, "'");
  }
  // Every part's state, checked against its object; nothing changes yet.
  if (r.optimizer) r.optimizer.check_state_dict(c.optimizer);
  if (r.scheduler) r.scheduler.check_state_dict(c.scheduler);
  if (r.scaler) r.scaler.check_state_dict(c.scaler);
  // Loading: the model first (it writes nothing unless every entry fits), then the parts already checked.
  if (r.model) r.model->load_state_dict(c.model);
  if (r.optimizer) r.optimizer.load_state_dict(c.optimizer);
  if (r.scaler) r.scaler.load_state_dict(c.scaler);
  if (r.scheduler) r.scheduler.load_state_dict(c.scheduler);  // after the optimizer's: it writes the step's rates
  if (r.epoch) *r.epoch = c.epoch;
  if (r.batch_in_epoch) *r.batch_in_epoch = c.batch_in_epoch;
  if (r.step) *r.step = c.step;
  if (r.rng) *r.rng = c.rng;
  for (const auto& [name, g] : r.generators) *g = c.generators.at(name);
  if (r.extra) *r.extra = c.extra;
}

}  // namespace ember::train
