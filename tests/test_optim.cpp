// optim: SGD / Adam / AdamW trajectories and lr/momentum schedules against PyTorch (fixtures written by
// tests/fixtures/gen_optim.py with torch), state_dict resume, parameter groups, gradient clipping, gradient
// accumulation equal to one big batch, and a training step that allocates nothing from the system in steady state.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using ember_test::rd;

namespace {

using TD = Tensor<double>;

const std::map<std::string, std::vector<double>>& fixtures() {
  static const auto m = [] {
    std::map<std::string, std::vector<double>> r;
    const auto path = std::filesystem::path(__FILE__).parent_path() / "fixtures" / "optim_ref.txt";
    std::ifstream f(path);
    REQUIRE_MESSAGE(f.good(), "cannot open ", path.string());
    std::string line;
    while (std::getline(f, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream is(line);
      std::string name;
      std::size_t n = 0;
      is >> name >> n;
      std::vector<double> v(n);
      for (auto& x : v) is >> x;
      r[name] = v;
    }
    return r;
  }();
  return m;
}
const std::vector<double>& fixture(const std::string& name) {
  auto it = fixtures().find(name);
  REQUIRE_MESSAGE(it != fixtures().end(), "fixture ", name, " missing");
  return it->second;
}

TD arr(std::int64_t n, double a, double b) {
  TD t = empty<double>({n});
  for (std::int64_t i = 0; i < n; ++i) t.data()[i] = std::sin(a * double(i) + b);
  return t;
}

// The problem of gen_optim.py: loss = sum(c0*a + 0.5*d0*a*a*|a|) + sum(c1*b + 0.5*d1*b*b).
struct Problem {
  TD a = arr(12, 0.7, 0.1).reshape({3, 4}).clone(), b = arr(5, 1.3, 0.4);
  TD c0 = arr(12, 0.9, 1.0).reshape({3, 4}).clone(), c1 = arr(5, 0.5, 2.0);
  TD d0 = TD(abs(arr(12, 0.3, 0.2)) + 0.5).reshape({3, 4}), d1 = abs(arr(5, 0.2, 0.6)) + 0.5;
  Problem() {
    a.requires_grad_();
    b.requires_grad_();
  }
  std::vector<TD> params() const { return {a, b}; }
  void grads() const {
    TD loss = sum(c0 * a + 0.5 * d0 * a * a * abs(a)) + sum(c1 * b + 0.5 * d1 * b * b);
    loss.backward();
  }
  std::vector<double> values() const {
    auto v = a.to_vector();
    for (double x : b.to_vector()) v.push_back(x);
    return v;
  }
};

void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK_MESSAGE(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])), what, " [", i, "]: ", got[i],
                  " vs torch ", want[i]);
}

template <class Opt>
std::vector<double> run(Problem& pr, Opt& opt, int steps = 6) {
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    pr.grads();
    opt.step();
  }
  return pr.values();
}

}  // namespace

TEST_CASE("SGD, Adam and AdamW follow torch.optim's trajectories") {
  check_close(Problem().values(), fixture("init"), 1e-15, "init");
  using optim::AdamOptions;
  using optim::SGDOptions;
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<optim::Optimizer>(std::vector<TD>)>>> cases = {
      {"sgd_plain", [](auto p) { return std::make_unique<optim::SGD<double>>(p, SGDOptions{.lr = 0.1}); }},
      {"sgd_momentum",
       [](auto p) {
         return std::make_unique<optim::SGD<double>>(
             p, SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
       }},
      {"sgd_nesterov",
       [](auto p) {
         return std::make_unique<optim::SGD<double>>(
             p, SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.02, .nesterov = true});
       }},
      {"sgd_maximize",
       [](auto p) {
         return std::make_unique<optim::SGD<double>>(p, SGDOptions{.lr = 0.05, .momentum = 0.5, .maximize = true});
       }},
      {"adam", [](auto p) { return std::make_unique<optim::Adam<double>>(p, AdamOptions{.lr = 0.05}); }},
      {"adam_wd_amsgrad",
       [](auto p) {
         return std::make_unique<optim::Adam<double>>(
             p, AdamOptions{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true});
       }},
      {"adamw",
       [](auto p) { return std::make_unique<optim::AdamW<double>>(p, AdamOptions{.lr = 0.05, .weight_decay = 0.1}); }},
      {"adamw_amsgrad",
       [](auto p) {
         return std::make_unique<optim::AdamW<double>>(
             p, AdamOptions{.lr = 0.02, .beta1 = 0.85, .beta2 = 0.95, .weight_decay = 0.3, .amsgrad = true});
       }},
  };
  for (auto& [name, make] : cases) {
    Problem pr;
    auto opt = make(pr.params());
    check_close(run(pr, *opt), fixture(name), 1e-12, name);
  }
}

TEST_CASE("Optimizer state_dict: 3 steps, save, load into a fresh optimizer, 3 more steps = 6 steps") {
  optim::AdamOptions o{.lr = 0.02, .beta1 = 0.85, .beta2 = 0.95, .weight_decay = 0.3, .amsgrad = true};
  Problem straight;
  optim::AdamW<double> a(straight.params(), o);
  const auto want = run(straight, a, 6);

  Problem resumed;
  nn::StateDict sd;
  std::vector<double> mid;
  {
    optim::AdamW<double> first(resumed.params(), o);
    run(resumed, first, 3);
    sd = first.state_dict();
  }
  CHECK(sd.count("state.0.exp_avg") == 1);
  CHECK(sd.count("state.1.max_exp_avg_sq") == 1);
  optim::AdamW<double> second(resumed.params(), optim::AdamOptions{.amsgrad = true});
  second.load_state_dict(sd);
  CHECK(second.lr(0) == 0.02);
  check_close(run(resumed, second, 3), want, 0, "resumed AdamW");

  Problem sg1, sg2;
  optim::SGD<double> s1(sg1.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  const auto sw = run(sg1, s1, 4);
  optim::SGD<double> s2a(sg2.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  run(sg2, s2a, 2);
  optim::SGD<double> s2b(sg2.params(), {.lr = 1, .momentum = 0.9, .nesterov = true});
  s2b.load_state_dict(s2a.state_dict());
  check_close(run(sg2, s2b, 2), sw, 0, "resumed SGD");

  nn::StateDict bad = sd;
  bad["state.0.exp_avg"] = zeros<double>({2});
  CHECK_THROWS_WITH_AS(second.load_state_dict(bad), doctest::Contains("'state.0.exp_avg' is float64 [2], expected "
                                                                      "float64 [3, 4]"),
                       Error);
  bad = sd;
  bad.erase("param_groups.0.lr");
  CHECK_THROWS_WITH_AS(second.load_state_dict(bad), doctest::Contains("missing key 'param_groups.0.lr'"), Error);
  // A state dict may carry any dtype; one the optimizer does not keep is an error naming the key and the dtype.
  bad = sd;
  bad["state.0.exp_avg"] = zeros<std::uint8_t>({3, 4});
  CHECK_THROWS_WITH_AS(second.load_state_dict(bad), doctest::Contains("'state.0.exp_avg' is uint8 [3, 4], expected "
                                                                      "float64 [3, 4]"),
                       Error);
  bad = sd;
  bad["param_groups.0.lr"] = full<bool>(Shape{}, true);
  CHECK_THROWS_WITH_AS(second.load_state_dict(bad), doctest::Contains("'param_groups.0.lr' must be a one-element "
                                                                      "float64 tensor, got bool []"),
                       Error);
}

// A state dict comes from a file: what its constructor refuses, a load refuses too, and so are NaN or infinite
// buffers, negative second moments and step counts that are not counts (each of which reached the parameters, or
// a float-to-integer conversion, before). A refused load leaves the optimizer as it was. fuzz/fuzz_state.cpp
// searches for more.
TEST_CASE("Optimizer and schedule state from a file: hostile values are errors, and a refused load changes nothing") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  auto scalar = [](double v) { return full<double>(Shape{}, v); };
  struct Case {
    const char* key;
    TD value;
    const char* message;
  };
  // Each case loaded into `opt` is refused with its message, and leaves the state as it was.
  auto refused = [](optim::Optimizer& opt, const nn::StateDict& good, std::initializer_list<Case> cases) {
    for (const Case& c : cases) {
      CAPTURE(c.key);
      nn::StateDict bad = good;
      bad[c.key] = c.value;
      CHECK_THROWS_WITH_AS(opt.check_state_dict(bad), doctest::Contains(c.message), Error);
      CHECK_THROWS_WITH_AS(opt.load_state_dict(bad), doctest::Contains(c.message), Error);
      const nn::StateDict now = opt.state_dict();
      REQUIRE(now.size() == good.size());
      for (const auto& [k, t] : now) {
        const TD x = std::get<TD>(t).contiguous(), y = std::get<TD>(good.at(k)).contiguous();
        REQUIRE(x.shape() == y.shape());
        for (std::int64_t i = 0; i < x.numel(); ++i) CHECK(x.data()[i] == y.data()[i]);
      }
    }
  };

  Problem pa;
  optim::Adam<double> adam(pa.params(), {.lr = 0.01, .amsgrad = true});
  run(pa, adam, 2);
  const nn::StateDict good = adam.state_dict();
  TD neg_sq = std::get<TD>(good.at("state.0.exp_avg_sq")).clone();
  neg_sq.data()[5] = -1e-3;
  TD inf_m = std::get<TD>(good.at("state.1.exp_avg")).clone();
  inf_m.data()[0] = inf;
  TD nan_vmax = std::get<TD>(good.at("state.0.max_exp_avg_sq")).clone();
  nan_vmax.data()[2] = nan;
  refused(adam, good, {
      {"param_groups.0.lr", scalar(nan), "optim::Adam::load_state_dict: param_groups.0: invalid learning rate nan"},
      {"param_groups.0.lr", scalar(-0.5), "param_groups.0: invalid learning rate -0.5"},
      {"param_groups.0.beta1", scalar(1.0),
       "param_groups.0: invalid betas (1, 0.999), expected each in [0, 1 - 2^-24]"},
      {"param_groups.0.beta2", scalar(nan), "invalid betas (0.9, nan)"},
      {"param_groups.0.eps", scalar(inf), "param_groups.0: invalid epsilon inf"},
      {"param_groups.0.weight_decay", scalar(-1.0), "param_groups.0: invalid weight_decay -1"},
      {"state.0.step", scalar(nan), "state.0.step must be a non-negative integer, got nan"},
      {"state.1.step", scalar(-1.0), "state.1.step must be a non-negative integer, got -1"},
      {"state.1.step", scalar(2.5), "state.1.step must be a non-negative integer, got 2.5"},
      {"state.1.step", scalar(1e300), "state.1.step must be a non-negative integer"},
      {"state.0.exp_avg_sq", neg_sq, "'state.0.exp_avg_sq' holds -0.001 at element 5, expected finite values >= 0"},
      {"state.1.exp_avg", inf_m, "'state.1.exp_avg' holds inf at element 0, expected finite values"},
      {"state.0.max_exp_avg_sq", nan_vmax, "'state.0.max_exp_avg_sq' holds nan at element 2"},
  });

  Problem ps;
  optim::SGD<double> sgd(ps.params(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  run(ps, sgd, 2);
  const nn::StateDict sgood = sgd.state_dict();
  TD nan_buf = std::get<TD>(sgood.at("state.0.momentum_buffer")).clone();
  nan_buf.data()[1] = nan;
  refused(sgd, sgood, {
      {"param_groups.0.lr", scalar(inf), "optim::SGD::load_state_dict: param_groups.0: invalid learning rate inf"},
      {"param_groups.0.momentum", scalar(-0.9), "param_groups.0: invalid momentum -0.9"},
      {"param_groups.0.momentum", scalar(0.0), "Nesterov momentum requires a momentum and zero dampening"},
      {"param_groups.0.dampening", scalar(nan), "param_groups.0: invalid dampening nan"},
      {"param_groups.0.weight_decay", scalar(nan), "param_groups.0: invalid weight_decay nan"},
      {"state.0.momentum_buffer", nan_buf, "'state.0.momentum_buffer' holds nan at element 1, expected finite values"},
  });
  // The constructors refuse the same values.
  CHECK_THROWS_WITH_AS(optim::SGD<double>(ps.params(), {.lr = inf}), doctest::Contains("optim::SGD: invalid learning "
                                                                                      "rate inf"),
                       Error);
  CHECK_THROWS_WITH_AS(optim::Adam<double>(pa.params(), {.eps = nan}), doctest::Contains("optim::Adam: invalid "
                                                                                        "epsilon nan"),
                       Error);

  // A schedule's base rates become the optimizer's rates: NaN, infinite or negative ones are refused.
  optim::StepLR sched(sgd, 2, 0.5);
  sched.step();
  const nn::StateDict lgood = sched.state_dict();
  for (const double v : {nan, inf, -0.1}) {
    CAPTURE(v);
    nn::StateDict bad = lgood;
    bad["base_lrs.0"] = scalar(v);
    CHECK_THROWS_WITH_AS(sched.load_state_dict(bad), doctest::Contains("optim::LRScheduler::load_state_dict: "
                                                                       "base_lrs.0 is "),
                         Error);
    CHECK(sgd.lr(0) == 0.05);
    CHECK(sched.last_step() == 1);
  }
  nn::StateDict bad = lgood;
  bad["last_epoch"] = scalar(nan);
  CHECK_THROWS_WITH_AS(sched.load_state_dict(bad), doctest::Contains("last_epoch must be a non-negative integer, got "
                                                                     "nan"),
                       Error);

  // A loss scale the float loss cannot hold (it was infinite, and every step was skipped until backoff caught up).
  CHECK_THROWS_WITH_AS(amp::GradScaler({.init_scale = 1e300}), doctest::Contains("init_scale must be positive and at "
                                                                                "most the largest float, got 1e+300"),
                       Error);
  amp::GradScaler scaler;
  nn::StateDict ssd = scaler.state_dict();
  ssd["scale"] = scalar(1e39);
  CHECK_THROWS_WITH_AS(scaler.load_state_dict(ssd), doctest::Contains("inconsistent state (scale 1e+39"), Error);
  CHECK(scaler.get_scale() == 65536.0);
}

namespace {
using TF = Tensor<float>;
bool all_finite(const TF& t) {
  const TF c = t.contiguous();
  for (std::int64_t i = 0; i < c.numel(); ++i)
    if (!std::isfinite(c.data()[i])) return false;
  return true;
}
// Every float tensor of a state dict finite (its float64 entries are the hyper-parameters and step counts).
bool state_finite(const nn::StateDict& sd) {
  for (const auto& [k, t] : sd)
    if (const auto* f = std::get_if<TF>(&t); f && !all_finite(*f)) return false;
  return true;
}
}  // namespace

// Values a file held that loaded and made the parameters inf or NaN within three steps are refused now: the ranges of
// optimizer.hpp, checked in the constructors and in load_state_dict by the same code, and a schedule's base rates
// and the rates it would set held to the optimizers' range.
TEST_CASE("Optimizer hyper-parameters are bounded: lr, weight_decay, momentum, dampening of 1e308, 2^62, 9e15 fail") {
  auto scalar = [](double v) { return full<double>(Shape{}, v); };
  const double huge[] = {1e308, 0x1p62, 9e15};
  TF w = full<float>(Shape{4}, 0.5f);
  w.requires_grad_();

  optim::SGD<float> sgd({w}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  const nn::StateDict sgood = sgd.state_dict();
  for (const char* key : {"lr", "weight_decay", "momentum", "dampening"})
    for (const double v : huge) {
      CAPTURE(key);
      CAPTURE(v);
      nn::StateDict bad = sgood;
      bad[std::string("param_groups.0.") + key] = scalar(v);
      CHECK_THROWS_WITH_AS(sgd.load_state_dict(bad), doctest::Contains("optim::SGD::load_state_dict: param_groups.0: "
                                                                       "invalid "),
                           Error);
      CHECK(sgd.lr(0) == 0.1);
      CHECK(*sgd.momentum(0) == 0.9);
    }
  // The constructor holds the same ranges (PyTorch's own checks are the floor: momentum and dampening in [0, 1]).
  EXPECT_ERROR([&] { optim::SGD<float>({w}, {.lr = 1e308}); },
               {"optim::SGD: invalid learning rate 1e+308, expected a value in [0, 1e4]"});
  EXPECT_ERROR([&] { optim::SGD<float>({w}, {.momentum = 1.5}); }, {"optim::SGD: invalid momentum 1.5", "[0, 1]"});
  EXPECT_ERROR([&] { optim::SGD<float>({w}, {.dampening = -0.1}); }, {"optim::SGD: invalid dampening -0.1"});
  EXPECT_ERROR([&] { optim::SGD<float>({w}, {.dampening = 2}); }, {"optim::SGD: invalid dampening 2"});
  EXPECT_ERROR([&] { optim::SGD<float>({w}, {.weight_decay = 0x1p62}); }, {"optim::SGD: invalid weight_decay"});
  optim::SGD<float>({w}, {.lr = optim::kMaxLr, .momentum = 1, .dampening = 1, .weight_decay = optim::kMaxWeightDecay});

  optim::AdamW<float> adam({w}, {.lr = 0.01});
  const nn::StateDict agood = adam.state_dict();
  for (const char* key : {"lr", "weight_decay", "eps", "beta1", "beta2"})
    for (const double v : huge) {
      CAPTURE(key);
      CAPTURE(v);
      nn::StateDict bad = agood;
      bad[std::string("param_groups.0.") + key] = scalar(v);
      CHECK_THROWS_WITH_AS(adam.load_state_dict(bad), doctest::Contains("optim::AdamW::load_state_dict: "
                                                                        "param_groups.0: invalid "),
                           Error);
      CHECK(adam.lr(0) == 0.01);
    }
  // eps must be positive (PyTorch takes 0, which makes 0 / 0 of a parameter whose gradients are all 0) and at least
  // 1e-20; a beta that rounds to 1 in float is refused.
  EXPECT_ERROR([&] { optim::Adam<float>({w}, {.eps = 0}); }, {"optim::Adam: invalid epsilon 0", "[1e-20, 1e4]"});
  EXPECT_ERROR([&] { optim::Adam<float>({w}, {.eps = 1e-30}); }, {"optim::Adam: invalid epsilon 1e-30"});
  EXPECT_ERROR([&] { optim::Adam<float>({w}, {.beta1 = 1 - 1e-9}); }, {"optim::Adam: invalid betas", "1 - 2^-24"});
  EXPECT_ERROR([&] { optim::AdamW<float>({w}, {.lr = 9e15}); }, {"optim::AdamW: invalid learning rate 9e+15"});
  optim::Adam<float>({w}, {.lr = optim::kMaxLr, .beta1 = optim::kMaxBeta, .beta2 = optim::kMaxBeta,
                           .eps = optim::kMinEps, .weight_decay = optim::kMaxWeightDecay});

  // A schedule's base rates of 1e308 are refused, and so is a step whose rate would leave the optimizers' range (a
  // StepLR with gamma 2 at step 2000: 0.1 * 2^2000 is infinite) or that the schedule cannot reach (OneCycleLR's
  // total_steps). A refused state changes neither the schedule nor the optimizer's rate and momentum.
  optim::StepLR grow(sgd, 1, 2.0);
  const nn::StateDict lgood = grow.state_dict();
  for (const double v : huge) {
    CAPTURE(v);
    nn::StateDict bad = lgood;
    bad["base_lrs.0"] = scalar(v);
    CHECK_THROWS_WITH_AS(grow.load_state_dict(bad), doctest::Contains("base_lrs.0 is "), Error);
  }
  nn::StateDict far = lgood;
  far["last_epoch"] = scalar(2000);
  CHECK_THROWS_WITH_AS(grow.check_state_dict(far), doctest::Contains("at last_epoch 2000 the schedule gives parameter "
                                                                     "group 0 the learning rate inf"),
                       Error);
  CHECK_THROWS_AS(grow.load_state_dict(far), Error);
  CHECK(grow.last_step() == 0);
  CHECK(sgd.lr(0) == 0.1);
  // A schedule's own options keep the rates and momenta it sets in range (so that its checkpoints load back).
  EXPECT_ERROR([&] { optim::OneCycleLR(sgd, 2e4, {.total_steps = 10}); }, {"optim::OneCycleLR: max_lr: invalid "
                                                                          "learning rate 20000"});
  EXPECT_ERROR([&] { optim::OneCycleLR(sgd, 0.5, {.total_steps = 10, .div_factor = -1}); },
               {"max_lr / div_factor: invalid learning rate -0.5"});
  EXPECT_ERROR([&] { optim::OneCycleLR(sgd, 0.5, {.total_steps = 10, .max_momentum = 1.5}); },
               {"base_momentum and max_momentum must be in [0, 1 - 2^-24]"});
  EXPECT_ERROR([&] { optim::CosineWarmupLR(sgd, 1, 10, -1); },
               {"optim::CosineWarmupLR: min_lr: invalid learning rate"});
  optim::OneCycleLR cycle(sgd, 0.5, {.total_steps = 10, .cos_anneal = false});
  const double lr0 = sgd.lr(0), mom0 = *sgd.momentum(0);
  nn::StateDict past = cycle.state_dict();
  past["last_epoch"] = scalar(1e6);
  CHECK_THROWS_WITH_AS(cycle.check_state_dict(past), doctest::Contains("last_epoch is 1000000, beyond the schedule's "
                                                                       "10 steps"),
                       Error);
  past["last_epoch"] = scalar(7);
  cycle.check_state_dict(past);  // a check writes no rate or momentum
  CHECK(sgd.lr(0) == lr0);
  CHECK(*sgd.momentum(0) == mom0);
  cycle.load_state_dict(past);
  CHECK(cycle.last_step() == 7);
  CHECK(sgd.lr(0) != lr0);
  CHECK(*sgd.momentum(0) != mom0);
}

// The claim the ranges make (optimizer.hpp): at any hyper-parameters within them, one fp32 step from parameters,
// gradients and optimizer state of magnitude at most kFiniteStepMagnitude (1e6) is finite. Checked at the ends of
// every range, on elements that take every sign combination of parameter, gradient and first moment (or momentum
// buffer), with second moments of 0 and 1e6, fresh and loaded state, Adam's loaded step count 0 (its bias correction
// at its largest) and more.
TEST_CASE("At the ends of every hyper-parameter range, one fp32 step from values of magnitude 1e6 stays finite") {
  const double M = optim::kFiniteStepMagnitude;
  std::vector<double> pv, gv, mv, vv;
  for (double p : {-M, M})
    for (double g : {-M, 0.0, M})
      for (double m : {-M, M})
        for (double v : {0.0, M}) {
          pv.push_back(p);
          gv.push_back(g);
          mv.push_back(m);
          vv.push_back(v);
        }
  auto tensor = [](const std::vector<double>& v) {
    TF t = empty<float>({std::int64_t(v.size())});
    for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = float(v[i]);
    return t;
  };
  auto step_is_finite = [&](auto& opt, TF& p, const std::string& what) {
    p.grad() = tensor(gv);
    opt.step();
    CHECK_MESSAGE(all_finite(p), what);
    CHECK_MESSAGE(state_finite(opt.state_dict()), what);
  };
  int steps = 0;
  for (const double wd : {0.0, optim::kMaxWeightDecay})
    for (const double mom : {0.0, 0.5, 1.0})
      for (const double damp : {0.0, 1.0})
        for (const bool nesterov : {false, true})
          for (const bool maximize : {false, true})
            for (const bool loaded : {false, true}) {
              if (nesterov && (mom == 0 || damp != 0)) continue;
              TF p = tensor(pv);
              p.requires_grad_();
              optim::SGD<float> sgd({p}, {.lr = optim::kMaxLr, .momentum = mom, .dampening = damp,
                                          .weight_decay = wd, .nesterov = nesterov, .maximize = maximize});
              if (loaded && mom != 0) {
                nn::StateDict sd = sgd.state_dict();
                sd["state.0.momentum_buffer"] = tensor(mv);
                sgd.load_state_dict(sd);
              }
              step_is_finite(sgd, p, "SGD wd " + std::to_string(wd) + " momentum " + std::to_string(mom));
              ++steps;
            }
  auto adam_corners = [&](auto tag) {
    using Opt = typename decltype(tag)::type;
    for (const double wd : {0.0, optim::kMaxWeightDecay})
      for (const double b1 : {0.0, optim::kMaxBeta})
        for (const double b2 : {0.0, optim::kMaxBeta})
          for (const double eps : {optim::kMinEps, optim::kMaxEps})
            for (const bool amsgrad : {false, true})
              for (const double loaded_step : {-1.0, 0.0, 1.0, 1000.0}) {  // -1: fresh state
                TF p = tensor(pv);
                p.requires_grad_();
                Opt adam({p}, {.lr = optim::kMaxLr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd,
                               .amsgrad = amsgrad});
                if (loaded_step >= 0) {
                  nn::StateDict sd = adam.state_dict();
                  sd["state.0.step"] = full<double>(Shape{}, loaded_step);
                  sd["state.0.exp_avg"] = tensor(mv);
                  sd["state.0.exp_avg_sq"] = tensor(vv);
                  if (amsgrad) sd["state.0.max_exp_avg_sq"] = tensor(vv);
                  adam.load_state_dict(sd);
                }
                step_is_finite(adam, p, "Adam wd " + std::to_string(wd) + " beta1 " + std::to_string(b1) + " eps " +
                                            std::to_string(eps) + " step " + std::to_string(loaded_step));
                ++steps;
              }
  };
  adam_corners(std::type_identity<optim::Adam<float>>{});
  adam_corners(std::type_identity<optim::AdamW<float>>{});
  CHECK(steps == 64 + 2 * 128);
}

TEST_CASE("Parameter groups: no weight decay on biases; parameters without gradients are skipped") {
  nn::LinearT<amp::fp64> l(3, 2);
  const TD w0 = l.weight.detach().clone(), b0 = l.bias.detach().clone();
  optim::SGD<double> opt(std::vector<optim::SGD<double>::Group>{{{l.weight}, {.lr = 0.1, .weight_decay = 0.5}},
                                                                {{l.bias}, {.lr = 0.1}}});
  // Gradients of zero: only decay moves anything.
  l.weight.grad() = zeros<double>({2, 3});
  l.bias.grad() = zeros<double>({2});
  opt.step();
  CHECK(rd(l.weight, 0) == doctest::Approx(rd(w0, 0) * (1 - 0.1 * 0.5)));
  CHECK(rd(l.bias, 1) == rd(b0, 1));
  opt.zero_grad();
  CHECK(!l.weight.grad().defined());
  const TD w1 = l.weight.detach().clone();
  opt.step();  // no gradients: nothing changes
  CHECK(rd(l.weight, 3) == rd(w1, 3));
  CHECK_THROWS_WITH_AS(optim::SGD<double>(l.parameters<double>(), {.lr = -1}), doctest::Contains("invalid learning rate"),
                       Error);
  CHECK_THROWS_WITH_AS(optim::SGD<double>(l.parameters<double>(), {.lr = 0.1, .nesterov = true}),
                       doctest::Contains("Nesterov momentum requires a momentum"), Error);
  CHECK_THROWS_WITH_AS(optim::Adam<double>(l.parameters<double>(), {.beta2 = 1.0}), doctest::Contains("invalid betas"),
                       Error);
  l.weight.grad() = zeros<double>({3, 2});
  CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains("the gradient has shape [3, 2] but the parameter has [2, 3]"),
                       Error);
}

TEST_CASE("A layer shared by two submodules (weight tying) is listed once by parameters() and stepped once") {
  // PyTorch's parameters() / named_parameters() default to remove_duplicate=True; listing the tied layer's
  // parameters twice would make the optimizer apply every update twice.
  struct Tied : nn::Module {
    nn::LinearT<amp::fp64> enc{3, 3};
    nn::LinearT<amp::fp64> dec = enc;  // the same layer: a module copy shares its parameters
    Tied() : nn::Module("Tied") {
      register_module("enc", enc);
      register_module("dec", dec);
    }
  };
  Tied m;
  std::vector<std::string> names;
  for (const auto& [n, t] : m.named_parameters<double>()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"enc.weight", "enc.bias"});
  const std::vector<TD> params = m.parameters<double>();
  CHECK(params.size() == 2);
  CHECK(m.num_parameters() == 12);
  CHECK(m.state_dict().size() == 4);  // state_dict keeps every name, as PyTorch's

  const TD w0 = m.enc.weight.detach().clone(), b0 = m.enc.bias.detach().clone();
  optim::SGD<double> opt(params, {.lr = 0.1});
  m.enc.weight.grad() = ones<double>({3, 3});
  m.enc.bias.grad() = ones<double>({3});
  opt.step();
  CHECK(rd(m.enc.weight, 4) == doctest::Approx(rd(w0, 4) - 0.1));
  CHECK(rd(m.dec.bias, 2) == doctest::Approx(rd(b0, 2) - 0.1));
}

TEST_CASE("Schedules follow torch.optim.lr_scheduler (OneCycleLR, StepLR, ReduceLROnPlateau)") {
  auto one_cycle = [](const std::string& name, double max_lr, optim::OneCycleOptions o, bool adam) {
    TD w = zeros<double>({1});
    w.requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (adam) opt = std::make_unique<optim::Adam<double>>(std::vector<TD>{w}, optim::AdamOptions{.lr = 0.1});
    else opt = std::make_unique<optim::SGD<double>>(std::vector<TD>{w}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    optim::OneCycleLR s(*opt, max_lr, o);
    std::vector<double> lrs, moms;
    for (std::int64_t i = 0; i < o.total_steps; ++i) {
      lrs.push_back(opt->lr(0));
      moms.push_back(*opt->momentum(0));
      opt->step();
      s.step();
    }
    check_close(lrs, fixture(name + "_lr"), 1e-12, name + " lr");
    check_close(moms, fixture(name + "_mom"), 1e-12, name + " momentum");
    CHECK_THROWS_WITH_AS(s.step(), doctest::Contains("tried to step"), Error);
  };
  one_cycle("onecycle_cos", 0.4, {.total_steps = 20}, false);
  one_cycle("onecycle_linear", 0.4,
            {.total_steps = 23, .pct_start = 0.25, .cos_anneal = false, .div_factor = 10, .final_div_factor = 100},
            false);
  one_cycle("onecycle_three", 1.0, {.total_steps = 30, .three_phase = true}, false);
  one_cycle("onecycle_adam", 0.01, {.total_steps = 15, .base_momentum = 0.8, .max_momentum = 0.9}, true);

  TD w = zeros<double>({1});
  w.requires_grad_();
  optim::SGD<double> sgd({w}, {.lr = 0.1, .momentum = 0.9});
  optim::StepLR step(sgd, 3, 0.5);
  std::vector<double> lrs;
  for (int i = 0; i < 10; ++i) {
    lrs.push_back(sgd.lr(0));
    step.step();
  }
  check_close(lrs, fixture("steplr_lr"), 1e-15, "StepLR");

  optim::SGD<double> plain({w}, {.lr = 1.0});
  optim::ReduceLROnPlateau plateau(plain, {.factor = 0.5, .patience = 2, .threshold = 0.01, .cooldown = 1, .min_lr = 0.1});
  lrs.clear();
  for (double m : fixture("plateau_metrics")) {
    plateau.step(m);
    lrs.push_back(plain.lr(0));
  }
  check_close(lrs, fixture("plateau_lr"), 1e-15, "ReduceLROnPlateau");
  {
    // A NaN metric is never an improvement (it compares false), so it counts as a bad epoch, as in PyTorch
    // (tests/fixtures/gen_parity.py).
    const ember_test::Fixtures pf("parity.txt");
    optim::SGD<double> sgd({w}, {.lr = 1.0});
    optim::ReduceLROnPlateau nan_plateau(sgd, {.factor = 0.5, .patience = 1});
    const std::vector<double> m = pf["plateau.metrics"].to_vector(), want_lr = pf["plateau.lr"].to_vector(),
                              want_bad = pf["plateau.bad"].to_vector();
    for (std::size_t i = 0; i < m.size(); ++i) {
      INFO("step " << i << ", metric " << m[i]);
      nan_plateau.step(m[i]);
      CHECK(sgd.lr(0) == want_lr[i]);
      CHECK(double(nan_plateau.num_bad_epochs()) == want_bad[i]);
    }
    CHECK(nan_plateau.best() == pf["plateau.best"].item());
  }
  // Stopped halfway and resumed from the state dicts, it continues on the same rates.
  const std::vector<double> metrics = fixture("plateau_metrics");
  const std::size_t half = metrics.size() / 2;
  optim::SGD<double> a({w}, {.lr = 1.0});
  optim::ReduceLROnPlateau pa(a, {.factor = 0.5, .patience = 2, .threshold = 0.01, .cooldown = 1, .min_lr = 0.1});
  for (std::size_t i = 0; i < half; ++i) pa.step(metrics[i]);
  optim::SGD<double> b({w}, {.lr = 1.0});
  optim::ReduceLROnPlateau pb(b, {.factor = 0.5, .patience = 2, .threshold = 0.01, .cooldown = 1, .min_lr = 0.1});
  b.load_state_dict(a.state_dict());
  pb.load_state_dict(pa.state_dict());
  std::vector<double> resumed(lrs.begin(), lrs.begin() + std::ptrdiff_t(half));
  for (std::size_t i = half; i < metrics.size(); ++i) {
    pb.step(metrics[i]);
    resumed.push_back(b.lr(0));
  }
  check_close(resumed, fixture("plateau_lr"), 1e-15, "ReduceLROnPlateau resumed");
  nn::StateDict bad = pa.state_dict();
  bad["num_bad_epochs"] = full<double>(Shape{}, -1.0);
  CHECK_THROWS_WITH_AS(pb.load_state_dict(bad), doctest::Contains("num_bad_epochs must be a non-negative integer"),
                       Error);
}

TEST_CASE("CosineWarmupLR: linear warmup, then cosine to min_lr") {
  TD w = zeros<double>({1});
  w.requires_grad_();
  optim::SGD<double> sgd({w}, {.lr = 0.8});
  optim::CosineWarmupLR s(sgd, 4, 14, 0.1);
  std::vector<double> got;
  for (int i = 0; i < 16; ++i) {
    got.push_back(sgd.lr(0));
    s.step();
  }
  for (int i = 0; i < 16; ++i) {
    const double want = i < 4 ? 0.8 * i / 4.0
                              : 0.1 + 0.7 * 0.5 * (1 + std::cos(3.14159265358979323846 * std::min(1.0, (i - 4) / 10.0)));
    CHECK(got[std::size_t(i)] == doctest::Approx(want).epsilon(1e-12));
  }
  CHECK_THROWS_AS(optim::CosineWarmupLR(sgd, 5, 5), Error);
}

TEST_CASE("clip_grad_norm_ and clip_grad_value_") {
  TD a = zeros<double>({2}), b = zeros<double>({1});
  a.requires_grad_();
  b.requires_grad_();
  auto set = [&](double x, double y, double z) {
    a.grad() = from_vector<double>({x, y});
    b.grad() = from_vector<double>({z});
  };
  set(3, 0, 4);
  CHECK(optim::clip_grad_norm_<double>({a, b}, 10.0) == doctest::Approx(5.0));
  CHECK(rd(a.grad(), 0) == 3.0);  // below the limit: untouched
  CHECK(optim::clip_grad_norm_<double>({a, b}, 1.0) == doctest::Approx(5.0));
  CHECK(rd(a.grad(), 0) == doctest::Approx(0.6).epsilon(1e-6));
  CHECK(rd(b.grad(), 0) == doctest::Approx(0.8).epsilon(1e-6));
  set(3, -7, 4);
  CHECK(optim::clip_grad_norm_<double>({a, b}, 1.0, INFINITY) == 7.0);
  CHECK(rd(a.grad(), 1) == doctest::Approx(-1.0).epsilon(1e-6));
  set(1, 1, 1);
  CHECK(optim::clip_grad_norm_<double>({a, b}, 10.0, 1.0) == doctest::Approx(3.0));
  set(1, INFINITY, 1);
  CHECK_THROWS_WITH_AS(optim::clip_grad_norm_<double>({a, b}, 1.0, 2.0, true), doctest::Contains("non-finite (inf)"),
                       Error);
  set(1, NAN, 1);
  CHECK(std::isnan(optim::clip_grad_norm_<double>({a, b}, 1.0)));
  CHECK(std::isnan(rd(b.grad(), 0)));  // scaled by NaN, as PyTorch does without error_if_nonfinite
  set(3, -7, 0.5);
  optim::clip_grad_value_<double>({a, b}, 2.0);
  CHECK(a.grad().to_vector() == std::vector<double>{2, -2});
  CHECK(rd(b.grad(), 0) == 0.5);
}

TEST_CASE("Gradient accumulation: k micro-batches with the loss over the total sample count = one big batch") {
  manual_seed(5);
  TD x = randn<double>({12, 6}), y = randn<double>({12, 2});
  auto train = [&](int k) {
    manual_seed(9);
    nn::LinearT<amp::fp64> l(6, 2);
    optim::SGD<double> opt(l.parameters<double>(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      const std::int64_t mb = 12 / k;
      for (int i = 0; i < k; ++i) {
        TD xi = x.narrow(0, i * mb, mb), yi = y.narrow(0, i * mb, mb);
        TD loss = sum(square(l(xi) - yi)) / 12.0;  // sum over the micro-batch / total count
        loss.backward();
      }
      opt.step();
    }
    auto v = l.weight.to_vector();
    for (double b : l.bias.to_vector()) v.push_back(b);
    return v;
  };
  const auto one = train(1);
  check_close(train(3), one, 1e-13, "k=3");
  check_close(train(4), one, 1e-13, "k=4");
}

TEST_CASE("A training step allocates nothing from the system in the steady state") {
  manual_seed(1);
  nn::Sequential model(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 10));
  optim::SGD opt(model.parameters(), {.lr = 0.01, .momentum = 0.9, .nesterov = true});
  Tensor<float> x = randn<float>({32, 64}), y = randn<float>({32, 10});
  auto step = [&] {
    opt.zero_grad();
    Tensor<float> loss = mean(square(model(x) - y));
    loss.backward();
    optim::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
  };
  for (int i = 0; i < 3; ++i) step();
  const auto before = CpuCachingAllocator::instance().stats();
  for (int i = 0; i < 10; ++i) step();
  const auto after = CpuCachingAllocator::instance().stats();
  CHECK(after.system_allocs == before.system_allocs);
  CHECK(after.cache_hits > before.cache_hits);
}
