// amp::GradScaler (amp/grad_scaler.hpp): an inf or NaN gradient skips the step and keeps the parameters and the
// optimizer's state, the scale's growth and backoff, unscaled gradients equal to the unscaled run's (accumulation and
// clipping after unscale_), state_dict round trips, misuse errors, small fp16 gradients kept by the scaling, and an
// inf anywhere in a large or strided gradient found by the unscaling pass. CUDA twin: the GradScaler case of
// test_nn_cuda.cu.
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

// ---- amp::GradScaler ------------------------------------------------------------------------------------------

namespace {
using TD = Tensor<double>;
using TF = Tensor<float>;

// A small fp32 model and a fixed batch: the loss of a Linear(4, 3) on 8 samples.
struct ScalerProblem {
  nn::Linear lin;
  TF x, y;
  explicit ScalerProblem(std::uint64_t seed)
      : lin((manual_seed(seed), std::int64_t(4)), 3), x(randn<float>({8, 4})), y(randn<float>({8, 3})) {}
  TF loss() const { return TF(sum(square(lin(x) - y)) / 8.0f); }
  std::vector<float> values() const {
    auto v = lin.weight.to_vector();
    for (float b : lin.bias.to_vector()) v.push_back(b);
    return v;
  }
};

std::vector<std::vector<float>> dict_values(const StateDict& sd) {
  std::vector<std::vector<float>> r;
  for (const auto& [k, v] : sd)
    if (const auto* t = std::get_if<TF>(&v)) r.push_back(t->to_vector());
  return r;
}
}  // namespace

TEST_CASE("GradScaler: an inf or NaN gradient skips the step, keeps parameters and optimizer state, halves the scale") {
  for (float poison : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(poison);
    ScalerProblem pr(3);
    optim::Adam<float> opt(pr.lin.parameters<float>(), {.lr = 1e-2});
    amp::GradScaler scaler;
    CHECK(scaler.get_scale() == 65536.0);
    // One clean step so that Adam has state to protect.
    opt.zero_grad();
    scaler.scale(pr.loss()).backward();
    CHECK(scaler.step(opt));
    scaler.update();
    CHECK(scaler.get_scale() == 65536.0);
    CHECK(scaler.get_growth_tracker() == 1);
    const auto params = pr.values();
    const auto state = dict_values(opt.state_dict());

    opt.zero_grad();
    scaler.scale(pr.loss()).backward();
    pr.lin.bias.grad().data()[1] = poison;  // one element of one gradient
    CHECK_FALSE(scaler.step(opt));
    CHECK(scaler.found_inf(opt));
    scaler.update();
    CHECK(scaler.get_scale() == 32768.0);
    CHECK(scaler.get_growth_tracker() == 0);
    CHECK(pr.values() == params);
    CHECK(dict_values(opt.state_dict()) == state);

    // The next clean step goes through at the new scale.
    opt.zero_grad();
    scaler.scale(pr.loss()).backward();
    CHECK(scaler.step(opt));
    scaler.update();
    CHECK(pr.values() != params);
  }
}

TEST_CASE("GradScaler: growth_interval clean steps double the scale; backoff never reaches 0") {
  ScalerProblem pr(4);
  optim::SGD<float> opt(pr.lin.parameters<float>(), {.lr = 1e-4});
  amp::GradScaler scaler;  // the defaults: 2^16, x2 every 2000 clean steps
  for (int i = 1; i <= 2000; ++i) {
    opt.zero_grad();
    scaler.scale(pr.loss()).backward();
    scaler.step(opt);
    scaler.update();
    if (i == 1999) CHECK(scaler.get_scale() == 65536.0);
  }
  CHECK(scaler.get_scale() == 131072.0);
  CHECK(scaler.get_growth_tracker() == 0);

  // 300 overflows in a row: PyTorch's scale would reach 0 and never recover; ember's stops at FLT_MIN, whose
  // inverse is finite, and grows back.
  amp::GradScaler s2({.init_scale = 1.0, .growth_interval = 1});
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    s2.scale(pr.loss()).backward();
    pr.lin.weight.grad().data()[0] = std::numeric_limits<float>::infinity();
    CHECK_FALSE(s2.step(opt));
    s2.update();
  }
  CHECK(s2.get_scale() == double(std::numeric_limits<float>::min()));
  CHECK(std::isfinite(float(1.0 / s2.get_scale())));
  opt.zero_grad();
  s2.scale(pr.loss()).backward();
  CHECK(s2.step(opt));
  s2.update();
  CHECK(s2.get_scale() == 2.0 * double(std::numeric_limits<float>::min()));
}

TEST_CASE("GradScaler: unscaled gradients equal the unscaled run's, with accumulation and clipping after unscale_") {
  // Scaling by a power of two is exact, so two micro-batches scaled, accumulated and unscaled once give the fp32
  // gradients bit for bit; clip_grad_norm_ after unscale_ sees the true norm.
  auto grads = [](bool scaled) {
    ScalerProblem pr(5);
    optim::SGD<float> opt(pr.lin.parameters<float>(), {.lr = 0.1});
    amp::GradScaler scaler({.enabled = scaled});
    opt.zero_grad();
    for (int mb = 0; mb < 2; ++mb) {
      TF xi = pr.x.narrow(0, mb * 4, 4), yi = pr.y.narrow(0, mb * 4, 4);
      scaler.scale(TF(sum(square(pr.lin(xi) - yi)) / 8.0f)).backward();
    }
    scaler.unscale_(opt);
    std::vector<float> g = pr.lin.weight.grad().to_vector();
    const double norm = optim::clip_grad_norm_(pr.lin.parameters<float>(), 0.5);
    g.push_back(float(norm));
    scaler.step(opt);
    scaler.update();
    for (float v : pr.values()) g.push_back(v);
    return g;
  };
  CHECK(grads(true) == grads(false));
}

TEST_CASE("GradScaler: state_dict round-trips mid-run and the resumed run matches") {
  auto run = [](int steps, const StateDict* resume_scaler, const StateDict* resume_opt, ScalerProblem* pr,
                optim::Adam<float>* opt, amp::GradScaler* scaler, int first) {
    if (resume_scaler) scaler->load_state_dict(*resume_scaler);
    if (resume_opt) opt->load_state_dict(*resume_opt);
    for (int i = first; i < first + steps; ++i) {
      opt->zero_grad();
      scaler->scale(pr->loss()).backward();
      if (i % 4 == 2) pr->lin.bias.grad().data()[0] = std::numeric_limits<float>::quiet_NaN();
      scaler->step(*opt);
      scaler->update();
    }
  };
  const amp::GradScalerOptions so{.init_scale = 1024.0, .growth_interval = 3};
  ScalerProblem a(6);
  optim::Adam<float> oa(a.lin.parameters<float>(), {.lr = 1e-2});
  amp::GradScaler sa(so);
  run(5, nullptr, nullptr, &a, &oa, &sa, 0);
  // Copies, as a checkpoint file would hold (state dicts share the live tensors, as PyTorch's do).
  auto copy = [](const StateDict& sd) {
    StateDict c;
    for (const auto& [k, v] : sd) c[k] = std::visit([](const auto& t) { return AnyTensor(t.clone()); }, v);
    return c;
  };
  const StateDict ssd = copy(sa.state_dict()), osd = copy(oa.state_dict()), msd = copy(a.lin.state_dict());
  CHECK(std::get<TD>(ssd.at("scale")).item() == sa.get_scale());
  CHECK(std::get<TD>(ssd.at("_growth_tracker")).item() == double(sa.get_growth_tracker()));
  run(7, nullptr, nullptr, &a, &oa, &sa, 5);

  ScalerProblem b(6);  // the same data; parameters, optimizer and scaler state from the checkpoint
  {
    NoGradGuard ng;
    b.lin.weight.zero_();
  }
  b.lin.load_state_dict(msd);
  optim::Adam<float> ob(b.lin.parameters<float>(), {.lr = 1e-2});
  amp::GradScaler sb;  // default options: all of them come from the state
  run(7, &ssd, &osd, &b, &ob, &sb, 5);
  CHECK(b.values() == a.values());
  CHECK(sb.get_scale() == sa.get_scale());
  CHECK(sb.get_growth_tracker() == sa.get_growth_tracker());

  StateDict bad = ssd;
  bad["_growth_tracker"] = full<double>(Shape{}, 5.0);  // not below growth_interval 3
  CHECK_THROWS_WITH_AS(sb.load_state_dict(bad), doctest::Contains("inconsistent state"), Error);
  bad.erase("scale");
  CHECK_THROWS_WITH_AS(sb.load_state_dict(bad), doctest::Contains("missing key 'scale'"), Error);
}

TEST_CASE("GradScaler: misuse is an error naming the call; disabled is a pass-through") {
  ScalerProblem pr(8);
  optim::SGD<float> opt(pr.lin.parameters<float>(), {.lr = 0.1});
  amp::GradScaler scaler;
  CHECK_THROWS_WITH_AS(scaler.update(), doctest::Contains("no inf checks were recorded"), Error);
  scaler.scale(pr.loss()).backward();
  scaler.unscale_(opt);
  CHECK_THROWS_WITH_AS(scaler.unscale_(opt), doctest::Contains("already called on this optimizer"), Error);
  scaler.step(opt);
  CHECK_THROWS_WITH_AS(scaler.step(opt), doctest::Contains("step: already called"), Error);
  CHECK_THROWS_WITH_AS(scaler.unscale_(opt), doctest::Contains("called after step()"), Error);
  scaler.update();
  CHECK_THROWS_WITH_AS(amp::GradScaler({.growth_factor = 0.5}), doctest::Contains("growth_factor"), Error);
  CHECK_THROWS_WITH_AS(amp::GradScaler({.init_scale = 0.0}), doctest::Contains("init_scale"), Error);

  amp::GradScaler off({.enabled = false});
  CHECK(off.get_scale() == 1.0);
  const TF l = pr.loss();
  CHECK(off.scale(l).item() == l.item());
  CHECK(off.state_dict().empty());
}

TEST_CASE("fp16 without loss scaling flushes small gradients to zero; the scaler keeps them") {
  // A loss scaled down to 1e-8 per element: its gradient, 1e-8, is below half's smallest subnormal (6e-8) and
  // rounds to zero in the fp16 activations; multiplied by 2^16 it survives, and unscaling lands it on the fp32
  // masters within fp16's precision of the fp32 model's gradient.
  manual_seed(11);
  nn::LinearT<amp::fp16_mixed> h(4, 3);
  nn::Linear f(4, 3);
  f.load_state_dict(h.state_dict());
  const TF x = randn<float>({8, 4});
  const Tensor<half> xh = cast<half>(x);
  auto loss16 = [&] { return TF(sum(cast<float>(h(xh))) * 1e-8f); };

  optim::SGD<float> oh(h.parameters<float>(), {.lr = 0.1});
  oh.zero_grad();
  loss16().backward();
  for (float g : h.weight.grad().to_vector()) CHECK(g == 0.0f);  // flushed

  oh.zero_grad();
  amp::GradScaler scaler;
  scaler.scale(loss16()).backward();
  scaler.unscale_(oh);
  CHECK_FALSE(scaler.found_inf(oh));
  TF(sum(f(TF(cast<float>(xh)))) * 1e-8f).backward();
  const auto gh = h.weight.grad().to_vector(), gf = f.weight.grad().to_vector();
  for (std::size_t i = 0; i < gh.size(); ++i) {
    CHECK(gh[i] != 0.0f);
    // The fp16 output gradient and the fp16 weight gradient are each rounded once (unit roundoff 2^-11).
    CHECK(std::fabs(gh[i] - gf[i]) <= 1.1e-3 * std::fabs(gf[i]));
  }
}

TEST_CASE("GradScaler: an inf anywhere in a large or strided gradient is found in the unscaling pass") {
  for (std::int64_t at : {std::int64_t(0), std::int64_t(123457), std::int64_t(299999)}) {
    CAPTURE(at);
    TF w = zeros<float>({300000});
    w.requires_grad_();
    TF gw = full<float>({300000}, 65536.f);
    gw.data()[at] = std::numeric_limits<float>::infinity();
    w.grad() = gw;
    // A second parameter whose gradient is a strided view (every other element of a buffer).
    TF u = zeros<float>({1000});
    u.requires_grad_();
    TF buf = full<float>({2000}, 131072.f);
    u.grad() = buf.slice(0, 0, 2000, 2);
    optim::SGD<float> opt({w, u}, {.lr = 1.0});
    amp::GradScaler scaler;
    scaler.unscale_(opt);
    CHECK(scaler.found_inf(opt));
    CHECK_FALSE(scaler.step(opt));
    CHECK(scaler.found_inf(opt));
    CHECK(w.grad().data()[at == 0 ? 1 : 0] == 1.f);
    CHECK(buf.data()[0] == 2.f);  // unscaled in place, through the view
    CHECK(buf.data()[1] == 131072.f);
    CHECK(w.data()[5] == 0.f);  // skipped
  }
}
