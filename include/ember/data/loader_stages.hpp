// ember — the stages of loading a batch (read, decode, augment, collate) and the time each took, so a DataLoader's
// statistics say which stage to make cheaper when a run waits for data. The loader times a dataset's get() as
// "read", the transform as "augment" and collate() as "collate"; code inside them moves its own share to another
// stage with a StageTimer (an image decoder marks "decode"), and that share is taken out of the enclosing stage.
#pragma once

#include <chrono>

namespace ember::data {

enum class Stage : int { read = 0, decode = 1, augment = 2, collate = 3 };
inline constexpr int kNumStages = 4;

inline const char* stage_name(Stage s) {
  switch (s) {
    case Stage::read: return "read";
    case Stage::decode: return "decode";
    case Stage::augment: return "augment";
    default: return "collate";
  }
}

/// Seconds spent in each stage, summed over the threads that ran it (so with workers, CPU time, not wall time).
struct StageTimes {
  double seconds[kNumStages] = {};  ///< By stage: read, decode, augment, collate.
  /// Stage s's seconds.
  double& operator[](Stage s) { return seconds[int(s)]; }
  /// Stage s's seconds.
  double operator[](Stage s) const { return seconds[int(s)]; }
  /// The seconds of all stages.
  double total() const { return seconds[0] + seconds[1] + seconds[2] + seconds[3]; }
  /// Adds o's seconds stage by stage.
  StageTimes& operator+=(const StageTimes& o) {
    for (int i = 0; i < kNumStages; ++i) seconds[i] += o.seconds[i];
    return *this;
  }
  /// The stage that took longest.
  Stage largest() const {
    int k = 0;
    for (int i = 1; i < kNumStages; ++i)
      if (seconds[i] > seconds[k]) k = i;
    return Stage(k);
  }
};

namespace detail {
using StageClock = std::chrono::steady_clock;
/// This thread's stage times, and the seconds StageTimers claimed (which the enclosing phase does not count).
struct StageAccount {
  StageTimes times;
  double claimed = 0;
};
inline StageAccount& stage_account() {
  thread_local StageAccount a;
  return a;
}
inline double stage_seconds(StageClock::time_point t0) {
  return std::chrono::duration<double>(StageClock::now() - t0).count();
}
}  // namespace detail

/// Counts the time of its scope as `stage` on this thread (not nested in another StageTimer).
class StageTimer {
 public:
  /// Starts timing stage s; the destructor adds the time to this thread's account.
  explicit StageTimer(Stage s) : stage_(s), t0_(detail::StageClock::now()) {}
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;
  ~StageTimer() {
    const double dt = detail::stage_seconds(t0_);
    detail::StageAccount& a = detail::stage_account();
    a.times[stage_] += dt;
    a.claimed += dt;
  }

 private:
  Stage stage_;
  detail::StageClock::time_point t0_;
};

namespace detail {
/// Runs f as a phase of the loader counted as `stage`, less what StageTimers inside it claimed.
template <class F>
decltype(auto) timed_phase(Stage stage, F&& f) {
  StageAccount& a = stage_account();
  const double claimed0 = a.claimed;
  const StageClock::time_point t0 = StageClock::now();
  struct Done {
    StageAccount& a;
    Stage stage;
    double claimed0;
    StageClock::time_point t0;
    ~Done() {
      const double own = stage_seconds(t0) - (a.claimed - claimed0);
      a.times[stage] += own > 0 ? own : 0;
      a.claimed = claimed0;
    }
  } done{a, stage, claimed0, t0};
  return f();
}
}  // namespace detail

}  // namespace ember::data
