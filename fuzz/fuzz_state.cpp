// libFuzzer target: training state loaded from a file, past the bytes. A model, an optimizer (SGD with and without
// Nesterov momentum, Adam with amsgrad, AdamW), a learning-rate schedule (StepLR, CosineWarmupLR, OneCycleLR,
// ReduceLROnPlateau) and a GradScaler train two steps; the input then edits their state dicts (drops, renames or
// adds entries, changes a tensor's dtype, shape or values to NaN, infinities, negatives, zero, ones, huge values),
// and fresh objects load the result. A load must either throw ember::Error or give a state that the objects' own
// constructors would accept, with finite optimizer buffers, non-negative second moments, whole step counts and
// finite, non-negative learning rates; when the loaded values are moderate, three more training steps must keep
// every parameter finite. A crash, a sanitizer report, another exception type or a silent NaN is a bug.
// Seeds: fuzz/corpus/state, one input per (optimizer, schedule) pair.
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ember/ember.hpp"

namespace {

using namespace ember;

// The edits of the current input, for a finding's report.
std::string g_edits;

// A finding: says which property failed (the crash report shows it above the stack), then stops like a crash.
[[noreturn]] void bug(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_state: %s %s\nafter the edits:%s\n", what, detail.c_str(), g_edits.c_str());
  __builtin_trap();
}

struct Net : nn::Module {
  nn::Linear fc1{4, 3}, fc2{3, 2};
  Net() : nn::Module("Net") {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor<float> forward(const Tensor<float>& x) const { return fc2(Tensor<float>(relu(fc1(x)))); }
};

// One training run's objects: optimizer and schedule chosen by the input, the rest fixed.
struct Run {
  int opt_kind, sched_kind;
  Net net;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::LRScheduler> sched;
  std::unique_ptr<optim::ReduceLROnPlateau> plateau;
  amp::GradScaler scaler;

  Run(int o, int s) : opt_kind(o), sched_kind(s) {
    switch (opt_kind) {
      case 0: opt = std::make_unique<optim::SGD<float>>(net.parameters(), optim::SGDOptions{.lr = 0.05}); break;
      case 1:
        opt = std::make_unique<optim::SGD<float>>(
            net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
        break;
      case 2:
        opt = std::make_unique<optim::Adam<float>>(net.parameters(), optim::AdamOptions{.lr = 0.01, .amsgrad = true});
        break;
      default: opt = std::make_unique<optim::AdamW<float>>(net.parameters(), optim::AdamOptions{.lr = 0.01}); break;
    }
    switch (sched_kind) {
      case 0: sched = std::make_unique<optim::StepLR>(*opt, 2, 0.5); break;
      case 1: sched = std::make_unique<optim::CosineWarmupLR>(*opt, 1, 8); break;
      case 2: sched = std::make_unique<optim::OneCycleLR>(*opt, 0.05, optim::OneCycleOptions{.total_steps = 8}); break;
      default: plateau = std::make_unique<optim::ReduceLROnPlateau>(*opt); break;
    }
  }

  // f(the optimizer as its own type): GradScaler::step needs it.
  template <class F>
  void with_opt(F&& f) {
    switch (opt_kind) {
      case 0:
      case 1: f(static_cast<optim::SGD<float>&>(*opt)); break;
      case 2: f(static_cast<optim::Adam<float>&>(*opt)); break;
      default: f(static_cast<optim::AdamW<float>&>(*opt)); break;
    }
  }

  // One step on a fixed batch; returns the loss.
  double step() {
    manual_seed(7);
    const Tensor<float> x = randn<float>(Shape{5, 4});
    opt->zero_grad();
    const Tensor<float> y = net.forward(x);
    Tensor<float> loss = sum(y * y);
    scaler.scale(loss).backward();
    with_opt([&](auto& o) { scaler.step(o); });
    scaler.update();
    const double l = double(loss.item());
    if (sched) sched->step();
    if (plateau) plateau->step(l);
    return l;
  }

  std::vector<nn::StateDict> state() const {
    return {net.state_dict(), opt->state_dict(), sched ? sched->state_dict() : plateau->state_dict(),
            scaler.state_dict()};
  }
  void load(const std::vector<nn::StateDict>& sd) {
    net.load_state_dict(sd[0]);
    opt->load_state_dict(sd[1]);
    if (sched) sched->load_state_dict(sd[2]);
    else plateau->load_state_dict(sd[2]);
    scaler.load_state_dict(sd[3]);
  }
};

// Values a file can hold that a run never writes, and a few it does.
double pick_value(FuzzedDataProvider& in) {
  static constexpr double kValues[] = {std::numeric_limits<double>::quiet_NaN(),
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(),
                                       -1.0, -0.5, 0.0, 0.5, 0.999, 1.0, 2.0, 3.0, 1e6, 1e300, -1e300};
  return in.PickValueInArray(kValues);
}

// v as a T: an integer type gets v's integer part clamped to its range (0 for NaN), a floating type v itself.
template <class T>
T element(double v) {
  if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v)) return T(0);
    const double lo = std::fmax(-1e15, double(std::numeric_limits<T>::lowest()));
    const double hi = std::fmin(1e15, double(std::numeric_limits<T>::max()));
    return T(std::fmax(lo, std::fmin(hi, v)));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
Tensor<T> filled(const Shape& s, double v) {
  return full<T>(s, element<T>(v));
}

// A tensor of the given dtype code and shape, every element v (element<T>). Codes 0-2 are the dtypes training state
// holds (float32, float64, int64); 3-6 (int32, uint8, int8, bool) are ones a state dict may carry but no optimizer,
// schedule or scaler expects.
constexpr int kDtypes = 7;
AnyTensor make_tensor(int dtype, const Shape& s, double v) {
  switch (dtype) {
    case 0: return filled<float>(s, v);
    case 1: return filled<double>(s, v);
    case 3: return filled<std::int32_t>(s, v);
    case 4: return filled<std::uint8_t>(s, v);
    case 5: return filled<std::int8_t>(s, v);
    case 6: return filled<bool>(s, v);
    default: return filled<std::int64_t>(s, v);
  }
}

void edit(nn::StateDict& sd, FuzzedDataProvider& in) {
  const int action = in.ConsumeIntegralInRange<int>(0, 6);
  g_edits += " [" + std::to_string(action);
  if (action == 6 || sd.empty()) {  // a new entry
    const std::string key = in.ConsumeRandomLengthString(24);
    g_edits += " new key]";
    sd[key] = make_tensor(in.ConsumeIntegralInRange<int>(0, kDtypes - 1), Shape{}, pick_value(in));
    return;
  }
  auto it = sd.begin();
  std::advance(it, in.ConsumeIntegralInRange<std::size_t>(0, sd.size() - 1));
  const Shape shape = std::visit([](const auto& t) { return t.shape(); }, it->second);
  g_edits += " " + it->first + "]";
  switch (action) {
    case 0: sd.erase(it); break;
    case 1: it->second = make_tensor(1, Shape{}, pick_value(in)); break;  // a 0-d float64 (a hyper-parameter)
    case 2: it->second = make_tensor(in.ConsumeIntegralInRange<int>(0, kDtypes - 1), shape, pick_value(in)); break;
    case 3: {  // another shape
      std::vector<std::int64_t> dims(in.ConsumeIntegralInRange<std::size_t>(0, 3));
      for (auto& d : dims) d = in.ConsumeIntegralInRange<std::int64_t>(0, 5);
      it->second = make_tensor(in.ConsumeIntegralInRange<int>(0, 1), Shape(dims), pick_value(in));
      break;
    }
    case 4: {  // renamed
      AnyTensor t = it->second;
      std::string key = it->first;
      sd.erase(it);
      key += in.ConsumeRandomLengthString(4);
      sd[key] = t;
      break;
    }
    default: {  // one element changed in place
      const double v = pick_value(in);
      std::visit(
          [&](auto& t) {
            using T = typename std::remove_cvref_t<decltype(t)>::value_type;
            if (t.numel() == 0) return;
            Tensor<T> c = t.clone();
            c.data()[in.ConsumeIntegralInRange<std::int64_t>(0, c.numel() - 1)] =
                element<T>(std::is_integral_v<T> && !std::isfinite(v) ? 0.0 : v);
            t = c;
          },
          it->second);
    }
  }
}

// Every parameter finite, and none larger than `bound` in magnitude.
bool all_within(const std::vector<Tensor<float>>& ps, double bound) {
  for (const auto& p : ps) {
    const Tensor<float> c = p.contiguous();
    for (std::int64_t i = 0; i < c.numel(); ++i)
      if (!(std::fabs(c.data()[i]) <= bound)) return false;
  }
  return true;
}

// What a loaded state must satisfy, checked through what the objects report after the load:
// - the optimizer's hyper-parameters are ones its constructor accepts;
// - its buffers are finite, second moments are not negative, step counts are non-negative integers;
// - every group's learning rate (after the schedule wrote it) is finite and not negative;
// - the loss scale is finite and positive.
// Returns whether the state is also moderate (learning rates and the schedule's base rates, weight decays, SGD
// momentum and dampening within 1, Adam eps in [1e-12, 1], buffers within 1e6), so that three steps from weights
// within 100 cannot overflow.
bool check_loaded(Run& r) {
  bool moderate = true;
  r.with_opt([&](auto& o) {
    using Opt = std::remove_cvref_t<decltype(o)>;
    for (const auto& g : o.param_groups()) {
      try {
        Opt again(g.params, g.options);
      } catch (const Error& e) {
        bug("the load accepted hyper-parameters the constructor refuses:", e.what());
      }
      if constexpr (std::is_same_v<Opt, optim::SGD<float>>)
        moderate = moderate && g.options.momentum <= 1 && std::fabs(g.options.dampening) <= 1 &&
                   g.options.weight_decay <= 1;
      else
        moderate = moderate && g.options.eps >= 1e-12 && g.options.eps <= 1 && *g.options.weight_decay <= 1;
    }
  });
  for (const auto& entry : r.opt->state_dict()) {  // (clang before 16 cannot capture structured bindings)
    const std::string& key = entry.first;
    if (key.rfind("state.", 0) != 0) continue;
    const bool second_moment = key.find("exp_avg_sq") != std::string::npos, is_step = key.ends_with(".step");
    std::visit(
        [&](const auto& x) {
          const auto c = x.contiguous();
          for (std::int64_t i = 0; i < c.numel(); ++i) {
            const double v = double(c.data()[i]);
            if (!std::isfinite(v)) bug("a non-finite optimizer buffer loaded:", key);
            if (second_moment && v < 0) bug("a negative second moment loaded:", key);
            if (is_step && (v < 0 || v != std::floor(v))) bug("a step count that is no count loaded:", key);
            if (!is_step && std::fabs(v) > 1e6) moderate = false;
          }
        },
        entry.second);
  }
  for (std::size_t g = 0; g < r.opt->num_groups(); ++g) {
    const double lr = r.opt->lr(g);
    if (!std::isfinite(lr) || lr < 0) bug("a loaded state gave a learning rate", std::to_string(lr));
    moderate = moderate && lr <= 1;
  }
  // The schedule's base rates are the rates of later steps (the current one may be a warmup's 0).
  if (r.sched)
    for (const auto& entry : r.sched->state_dict())
      if (entry.first.rfind("base_lrs.", 0) == 0)
        moderate = moderate && std::get<Tensor<double>>(entry.second).item() <= 1;
  const double scale = r.scaler.get_scale();
  if (!std::isfinite(scale) || scale <= 0) bug("a loaded loss scale", std::to_string(scale));
  return moderate;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const int opt_kind = in.ConsumeIntegralInRange<int>(0, 3), sched_kind = in.ConsumeIntegralInRange<int>(0, 3);
  std::vector<nn::StateDict> sd;
  {
    Run first(opt_kind, sched_kind);
    first.step();
    first.step();
    sd = first.state();
  }
  const int edits = in.ConsumeIntegralInRange<int>(0, 6);
  g_edits = " opt " + std::to_string(opt_kind) + ", schedule " + std::to_string(sched_kind) + ";";
  for (int e = 0; e < edits; ++e) edit(sd[in.ConsumeIntegralInRange<std::size_t>(0, sd.size() - 1)], in);

  Run second(opt_kind, sched_kind);
  try {
    second.load(sd);
  } catch (const Error&) {
    return 0;
  }
  const std::vector<Tensor<float>> ps = second.net.parameters();
  // Weights are data (a file may hold any floats, and training from huge or NaN weights is the user's affair); the
  // optimizer, schedule and scaler state is checked, and with moderate values three steps must stay finite.
  const bool watch = check_loaded(second) && all_within(ps, 100);
  for (int s = 0; s < 3; ++s) {
    try {
      second.step();
    } catch (const Error&) {
      return 0;  // a clear error later (a schedule stepped past its end, say) is allowed
    }
    if (watch && !all_within(ps, std::numeric_limits<float>::max()))
      bug("moderate state and weights loaded, yet a step made a weight NaN or infinite");
  }
  return 0;
}
