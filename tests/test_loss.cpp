// Losses: values and gradients against PyTorch 1.13 (fixtures written by tests/fixtures/gen_norm_loss.py) for every
// reduction, class weights, ignore_index and label smoothing; gradcheck in double for every loss and option;
// stability for large logits; fully-ignored batches; the loss modules; the misuse checks and one test per error.
//
// The debug check of nll_loss is compiled in here whatever the build type (the macro is read by the header).
#define EMBER_DEBUG_CHECKS 1
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"
#include "ember/autograd/softmax.hpp"
#include "ember/nn/loss.hpp"

using namespace ember;
using nn::Reduction;

namespace {

using ember_test::TD;
using ember_test::TF;
using TI = Tensor<std::int64_t>;
using ember_test::Inputs;
using Fn = ember_test::GradFn;

using ember_test::Fixtures;

const Fixtures& loss_fx() {
  static const Fixtures f("loss.txt");
  return f;
}

using ember_test::check_close;
using ember_test::check_grad;
using ember_test::normal;

TD uniform(const Shape& s, double lo, double hi, std::uint64_t seed) {
  Generator g(seed);
  TD t = rand<double>(s, g);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = lo + (hi - lo) * t.data()[i];
  return t;
}
using ember_test::leaf;
using ember_test::to_float;
TI idx(const std::vector<std::int64_t>& v, const Shape& s) { return from_vector<std::int64_t>(v, s); }

const char* red_name(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }
constexpr Reduction kReds[] = {Reduction::None, Reduction::Mean, Reduction::Sum};

}  // namespace

// ======================================================================================== class-indexed losses

TEST_CASE("cross_entropy matches PyTorch: (N, C), (N, C, d), (C); reductions, weights, ignore_index, smoothing") {
  const auto& fx = loss_fx();
  for (const std::string tag : {"c2", "c3", "c1"}) {
    const TD x = fx[tag + ".x"], w = fx[tag + ".w"], gnone = fx[tag + ".gnone"];
    const TI t = fx.index(tag + ".t");
    for (Reduction red : kReds) {
      for (const std::string ls : {"0.0", "0.25"}) {
        for (int weighted = 0; weighted < 2; ++weighted) {
          const std::string key = tag + ".ce." + red_name(red) + "." + ls + "." + std::to_string(weighted);
          INFO(key);
          nn::CrossEntropyOptions<double> o;
          o.reduction = red;
          o.label_smoothing = std::stod(ls);
          if (weighted) o.weight = w;
          TD a = leaf(x.clone());
          TD y = nn::cross_entropy(a, t, o);
          check_close(y, fx[key + ".y"]);
          if (red == Reduction::None) y.backward(gnone);
          else y.backward();
          check_close(a.grad(), fx[key + ".dx"]);
        }
      }
    }
  }
}

TEST_CASE("nll_loss matches PyTorch on log_softmax outputs: reductions, weights, ignore_index") {
  const auto& fx = loss_fx();
  for (const std::string tag : {"c2", "c3", "c1"}) {
    const TD w = fx[tag + ".w"], gnone = fx[tag + ".gnone"];
    const TI t = fx.index(tag + ".t");
    for (Reduction red : kReds) {
      for (int weighted = 0; weighted < 2; ++weighted) {
        const std::string key = tag + ".nll." + red_name(red) + "." + std::to_string(weighted);
        INFO(key);
        nn::NllLossOptions<double> o;
        o.reduction = red;
        if (weighted) o.weight = w;
        TD lp = leaf(fx[key + ".lp"]);
        TD y = nn::nll_loss(lp, t, o);
        check_close(y, fx[key + ".y"]);
        if (red == Reduction::None) y.backward(gnone);
        else y.backward();
        check_close(lp.grad(), fx[key + ".dx"]);
      }
    }
  }
}

TEST_CASE("gradcheck: cross_entropy for every reduction, weights, ignore_index, smoothing, layout") {
  const TD x2 = normal({5, 4}, 101, 2), x3 = normal({3, 4, 2}, 102, 2), x1 = normal({4}, 103);
  const TI t2 = idx({1, -100, 3, 0, 3}, {5}), t3 = idx({0, 3, -100, 2, 1, 1}, {3, 2}), t1 = idx({2}, {});
  const TD w = uniform({4}, 0.2, 1.5, 104);
  for (Reduction red : kReds)
    for (double ls : {0.0, 0.3})
      for (bool weighted : {false, true}) {
        nn::CrossEntropyOptions<double> o;
        o.reduction = red;
        o.label_smoothing = ls;
        if (weighted) o.weight = w;
        const std::string what = std::string(red_name(red)) + " ls " + std::to_string(ls) + " weighted " +
                                 std::to_string(weighted);
        check_grad("(N, C) " + what, [&](const Inputs& v) { return nn::cross_entropy(v[0], t2, o); }, {x2});
        check_grad("(N, C, d) " + what, [&](const Inputs& v) { return nn::cross_entropy(v[0], t3, o); }, {x3});
        check_grad("(C) " + what, [&](const Inputs& v) { return nn::cross_entropy(v[0], t1, o); }, {x1});
      }
  // A strided (transposed) logits view, and another ignore_index.
  nn::CrossEntropyOptions<double> o;
  o.ignore_index = 2;
  check_grad("transposed logits, ignore_index 2",
             [&](const Inputs& v) { return nn::cross_entropy(v[0].t(), idx({0, 2, 1, 3}, {4}), o); },
             {normal({4, 4}, 105)});
}

TEST_CASE("gradcheck: nll_loss for every reduction, weights, ignore_index, layout") {
  const TD x2 = normal({5, 4}, 111, 2), x3 = normal({3, 4, 2}, 112, 2);
  const TI t2 = idx({1, -100, 3, 0, 3}, {5}), t3 = idx({0, 3, -100, 2, 1, 1}, {3, 2});
  const TD w = uniform({4}, 0.2, 1.5, 114);
  for (Reduction red : kReds)
    for (bool weighted : {false, true}) {
      nn::NllLossOptions<double> o;
      o.reduction = red;
      if (weighted) o.weight = w;
      const std::string what = std::string(red_name(red)) + " weighted " + std::to_string(weighted);
      check_grad("(N, C) " + what, [&](const Inputs& v) { return nn::nll_loss(log_softmax(v[0], 1), t2, o); }, {x2});
      check_grad("(N, C, d) " + what, [&](const Inputs& v) { return nn::nll_loss(log_softmax(v[0], 1), t3, o); },
                 {x3});
    }
}

TEST_CASE("cross_entropy is stable and exact for logits of 1e4 in float, and agrees with double") {
  TF x = tensor<float>({{1e4f, 0.f, -1e4f}, {0.f, 1e4f, 2e4f}, {-1e4f, -1e4f + 1, -1e4f + 2}});
  x.requires_grad_(true);
  const TI t = idx({0, 1, 2}, {3});
  nn::CrossEntropyOptions<float> o;
  o.reduction = Reduction::None;
  TF l = nn::cross_entropy(x, t, o);
  const auto lv = l.to_vector();
  CHECK(lv[0] == 0.f);
  CHECK(lv[1] == 1e4f);
  const double s = 1 + std::exp(-1.0) + std::exp(-2.0);
  CHECK(lv[2] == doctest::Approx(std::log(s)).epsilon(1e-6));
  l.backward(ones<float>(Shape{3}));
  const auto g = x.grad().to_vector();
  for (float v : g) CHECK(std::isfinite(v));
  CHECK(g[4] == -1.f);
  CHECK(g[5] == 1.f);
  CHECK(g[8] == doctest::Approx(1 / s - 1).epsilon(1e-6));
  // Random logits of scale 1e3 over 1000 classes: float against double.
  const TD xd = normal({32, 1000}, 121, 1e3);
  Generator gen(122);
  TI tt = empty<std::int64_t>(Shape{32});
  for (std::int64_t i = 0; i < 32; ++i) tt.data()[i] = (i * 37) % 1000;
  for (double ls : {0.0, 0.1}) {
    nn::CrossEntropyOptions<double> od;
    od.label_smoothing = ls;
    nn::CrossEntropyOptions<float> of;
    of.label_smoothing = ls;
    TD a = leaf(xd.clone());
    TF af = to_float(xd);
    af.requires_grad_(true);
    TD ld = nn::cross_entropy(a, tt, od);
    TF lf = nn::cross_entropy(af, tt, of);
    ld.backward();
    lf.backward();
    CHECK(double(lf.item()) == doctest::Approx(ld.item()).epsilon(1e-5));
    check_close(af.grad(), a.grad(), 1e-4, 1e-7);
  }
}

TEST_CASE("a batch whose targets are all ignore_index: Mean is NaN with zero gradients (as PyTorch), Sum 0, None 0") {
  const TI t = idx({-100, -100}, {2});
  for (double ls : {0.0, 0.2}) {
    for (Reduction red : kReds) {
      INFO(red_name(red) << " ls " << ls);
      TD x = leaf(normal({2, 3}, 131));
      nn::CrossEntropyOptions<double> o;
      o.reduction = red;
      o.label_smoothing = ls;
      TD l = nn::cross_entropy(x, t, o);
      if (red == Reduction::Mean) CHECK(std::isnan(l.item()));
      if (red == Reduction::Sum) CHECK(l.item() == 0.0);
      if (red == Reduction::None) {
        CHECK(l.to_vector() == std::vector<double>{0, 0});
        l.backward(ones<double>(Shape{2}));
      } else {
        l.backward();
      }
      for (double v : x.grad().to_vector()) CHECK(v == 0.0);
    }
  }
  TD lp = leaf(log_softmax(normal({2, 3}, 132), 1).detach());
  TD l = nn::nll_loss(lp, t);
  CHECK(std::isnan(l.item()));
  l.backward();
  for (double v : lp.grad().to_vector()) CHECK(v == 0.0);
}

TEST_CASE("cross_entropy equals nll_loss of log_softmax, in float") {
  const TF x = to_float(normal({16, 10}, 141, 3));
  TI t = empty<std::int64_t>(Shape{16});
  for (std::int64_t i = 0; i < 16; ++i) t.data()[i] = (i * 7) % 10;
  TF a = x.clone(), b = x.clone();
  a.requires_grad_(true);
  b.requires_grad_(true);
  TF l1 = nn::cross_entropy(a, t);
  TF l2 = nn::nll_loss(log_softmax(b, 1), t);
  CHECK(l1.item() == doctest::Approx(l2.item()).epsilon(1e-6));
  l1.backward();
  l2.backward();
  const auto ga = a.grad().to_vector(), gb = b.grad().to_vector();
  for (std::size_t i = 0; i < ga.size(); ++i) CHECK(ga[i] == doctest::Approx(gb[i]).epsilon(1e-5));
}

TEST_CASE("class losses: writing into the target or the weights after the forward does not change the backward") {
  const TD x = normal({6, 5}, 151, 2);
  TI t = empty<std::int64_t>(Shape{6});
  for (std::int64_t i = 0; i < 6; ++i) t.data()[i] = (i * 3) % 5;
  TD w = full<double>({5}, 1.0);
  w.data()[2] = 3.0;
  for (const bool ce : {true, false}) {
    CAPTURE(ce);
    auto loss = [&](const TD& v, const TI& tt, const TD& ww) {
      if (ce) return nn::cross_entropy(v, tt, {.weight = ww, .label_smoothing = 0.1});
      return nn::nll_loss<double, false>(log_softmax(v, 1), tt, {.weight = ww});
    };
    TD a = x.clone(), b = x.clone();
    a.requires_grad_(true);
    b.requires_grad_(true);
    TI t2 = t.clone();
    TD w2 = w.clone();
    TD la = loss(a, t2, w2), lb = loss(b, t, w);
    t2.data()[1] = 4;  // after the forward, before the backward
    w2.data()[2] = 0.5;
    la.backward();
    lb.backward();
    CHECK(a.grad().to_vector() == b.grad().to_vector());
  }
}

// ========================================================================================= element-wise losses

TEST_CASE("mse, l1, smooth_l1 and huber match PyTorch for every reduction, values and both gradients") {
  const auto& fx = loss_fx();
  const TD a0 = fx["ew.a"], b0 = fx["ew.b"], g = fx["ew.g"];
  using F = std::function<TD(const TD&, const TD&, Reduction)>;
  const std::vector<std::pair<std::string, F>> fns = {
      {"mse", [](const TD& p, const TD& q, Reduction r) { return nn::mse_loss(p, q, r); }},
      {"l1", [](const TD& p, const TD& q, Reduction r) { return nn::l1_loss(p, q, r); }},
      {"smooth_l1.1", [](const TD& p, const TD& q, Reduction r) { return nn::smooth_l1_loss(p, q, r, 1.0); }},
      {"smooth_l1.0.5", [](const TD& p, const TD& q, Reduction r) { return nn::smooth_l1_loss(p, q, r, 0.5); }},
      {"smooth_l1.0", [](const TD& p, const TD& q, Reduction r) { return nn::smooth_l1_loss(p, q, r, 0.0); }},
      {"huber.1", [](const TD& p, const TD& q, Reduction r) { return nn::huber_loss(p, q, r, 1.0); }},
      {"huber.2.5", [](const TD& p, const TD& q, Reduction r) { return nn::huber_loss(p, q, r, 2.5); }},
  };
  for (const auto& [name, fn] : fns)
    for (Reduction red : kReds) {
      const std::string key = "ew." + name + "." + red_name(red);
      INFO(key);
      TD a = leaf(a0.clone()), b = leaf(b0.clone());
      TD y = fn(a, b, red);
      check_close(y, fx[key + ".y"]);
      if (red == Reduction::None) y.backward(g);
      else y.backward();
      check_close(a.grad(), fx[key + ".da"]);
      check_close(b.grad(), fx[key + ".db"]);
    }
}

TEST_CASE("binary_cross_entropy_with_logits matches PyTorch: weight, pos_weight, reductions, zero logits") {
  const auto& fx = loss_fx();
  const TD z0 = fx["bce.z"], y0 = fx["bce.y"], w = fx["bce.w"], pw = fx["bce.pw"], g = fx["ew.g"];
  for (const std::string variant : {"plain", "w", "pw", "wpw"})
    for (Reduction red : kReds) {
      const std::string key = "bce." + variant + "." + red_name(red);
      INFO(key);
      nn::BceWithLogitsOptions<double> o;
      o.reduction = red;
      if (variant == "w" || variant == "wpw") o.weight = w;
      if (variant == "pw" || variant == "wpw") o.pos_weight = pw;
      TD z = leaf(z0.clone()), y = leaf(y0.clone());
      TD l = nn::binary_cross_entropy_with_logits(z, y, o);
      check_close(l, fx[key + ".y"]);
      if (red == Reduction::None) l.backward(g);
      else l.backward();
      check_close(z.grad(), fx[key + ".dz"]);
      check_close(y.grad(), fx[key + ".dy"]);
    }
}

TEST_CASE("gradcheck: element-wise losses for every reduction, and bce options") {
  // Differences kept away from the kinks (0 and ±beta / ±delta), where finite differences are meaningless.
  TD a = normal({3, 5}, 151, 2), b = normal({3, 5}, 152, 2);
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    double& d = a.data()[i];
    const double diff = d - b.data()[i], ad = std::fabs(diff);
    for (double k : {0.0, 0.5, 1.0, 2.5})
      if (std::fabs(ad - k) < 0.05) d += diff >= 0 ? 0.1 : -0.1;
  }
  for (Reduction red : kReds) {
    const std::string r = red_name(red);
    check_grad("mse " + r, [red](const Inputs& v) { return nn::mse_loss(v[0], v[1], red); }, {a, b});
    check_grad("l1 " + r, [red](const Inputs& v) { return nn::l1_loss(v[0], v[1], red); }, {a, b});
    check_grad("smooth_l1 " + r, [red](const Inputs& v) { return nn::smooth_l1_loss(v[0], v[1], red, 0.5); }, {a, b});
    check_grad("huber " + r, [red](const Inputs& v) { return nn::huber_loss(v[0], v[1], red, 2.5); }, {a, b});
    check_grad("mse of a transpose " + r, [red](const Inputs& v) { return nn::mse_loss(v[0].t(), v[1].t(), red); },
               {a, b});
    const TD z = normal({3, 5}, 153, 4), y = uniform({3, 5}, 0, 1, 154), w = uniform({3, 1}, 0.5, 2, 155),
             pw = uniform({5}, 0.2, 3, 156);
    for (int variant = 0; variant < 4; ++variant) {
      nn::BceWithLogitsOptions<double> o;
      o.reduction = red;
      if (variant & 1) o.weight = w;
      if (variant & 2) o.pos_weight = pw;
      check_grad("bce " + r + " variant " + std::to_string(variant),
                 [o](const Inputs& v) { return nn::binary_cross_entropy_with_logits(v[0], v[1], o); }, {z, y});
    }
  }
}

TEST_CASE("binary_cross_entropy_with_logits is stable for huge logits and has gradient sigmoid - y at 0") {
  TF z = tensor<float>({1e4f, -1e4f, 0.f, 88.f, -88.f});
  z.requires_grad_(true);
  const TF y = tensor<float>({0.f, 1.f, 1.f, 1.f, 0.f});
  nn::BceWithLogitsOptions<float> o;
  o.reduction = Reduction::None;
  TF l = nn::binary_cross_entropy_with_logits(z, y, o);
  const auto lv = l.to_vector();
  CHECK(lv[0] == 1e4f);
  CHECK(lv[1] == 1e4f);
  CHECK(lv[2] == doctest::Approx(std::log(2.0)));
  CHECK(lv[3] == doctest::Approx(0.0).epsilon(1e-30));
  l.backward(ones<float>(Shape{5}));
  const auto g = z.grad().to_vector();
  CHECK(g[0] == 1.f);
  CHECK(g[1] == -1.f);
  CHECK(g[2] == doctest::Approx(-0.5));
}

// ================================================================================================ modules

TEST_CASE("loss modules call the functions with their options") {
  const TD x = normal({4, 3}, 161), y = normal({4, 3}, 162);
  const TI t = idx({0, 2, 1, 2}, {4});
  nn::CrossEntropyLoss ce;  // T defaults to float
  static_assert(std::is_same_v<decltype(ce), nn::CrossEntropyLoss<float>>);
  CHECK(ce(to_float(x), t).item() == doctest::Approx(nn::cross_entropy(x, t).item()).epsilon(1e-6));
  nn::CrossEntropyLoss<double> ce2({.weight = {}, .ignore_index = 2, .label_smoothing = 0.1, .reduction = Reduction::Sum});
  nn::CrossEntropyOptions<double> o;
  o.ignore_index = 2;
  o.label_smoothing = 0.1;
  o.reduction = Reduction::Sum;
  CHECK(ce2(x, t).item() == nn::cross_entropy(x, t, o).item());
  nn::NLLLoss<double> nll;
  const TD lp = log_softmax(x, 1);
  CHECK(nll(lp, t).item() == nn::nll_loss(lp, t).item());
  CHECK(nn::MSELoss(Reduction::Sum)(x, y).item() == nn::mse_loss(x, y, Reduction::Sum).item());
  CHECK(nn::L1Loss()(x, y).item() == nn::l1_loss(x, y).item());
  CHECK(nn::SmoothL1Loss(Reduction::Mean, 0.3)(x, y).item() == nn::smooth_l1_loss(x, y, Reduction::Mean, 0.3).item());
  CHECK(nn::HuberLoss(Reduction::Sum, 0.7)(x, y).item() == nn::huber_loss(x, y, Reduction::Sum, 0.7).item());
  nn::BCEWithLogitsLoss<double> bce;
  CHECK(bce(x, uniform({4, 3}, 0, 1, 163)).item() ==
        nn::binary_cross_entropy_with_logits(x, uniform({4, 3}, 0, 1, 163)).item());
}

// ============================================================================================ misuse and errors

TEST_CASE("nll_loss rejects inputs that are not log-probabilities (debug check)") {
  const TD x = normal({3, 4}, 171, 2);
  const TI t = idx({0, 1, 2}, {3});
  // One positive entry (what raw logits have).
  TD logits = log_softmax(x, 1).detach().clone();
  logits.data()[5] = 1.5;
  CHECK_THROWS_WITH_AS(nn::nll_loss(logits, t),
                       doctest::Contains("nll_loss: the input (shape [3, 4]) has a positive entry 1.5 at position 1, "
                                         "class 1"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::nll_loss(logits, t), doctest::Contains("pass raw logits to cross_entropy"), Error);
  // All-negative values that are not normalised.
  TD neg = log_softmax(x, 1).detach();
  neg.data()[0] -= 0.5;
  CHECK_THROWS_WITH_AS(nn::nll_loss(neg, t), doctest::Contains("at position 0 sum to"), Error);
  // Rows whose target is ignored are not checked; real log_softmax outputs pass, in float too.
  CHECK_NOTHROW(nn::nll_loss(neg, idx({-100, 1, 2}, {3})));
  CHECK_NOTHROW(nn::nll_loss(TF(log_softmax(to_float(normal({64, 1000}, 172, 5)), 1)), TI(zeros<std::int64_t>(Shape{64}))));
  // Without the compiled-in check nothing is verified, unless it is switched on at run time.
  CHECK_NOTHROW((nn::nll_loss<double, false>(logits, t)));
  nn::set_debug_checks(true);
  CHECK_THROWS_AS((nn::nll_loss<double, false>(logits, t)), Error);
  nn::set_debug_checks(false);
}

TEST_CASE("class losses: targets out of range are always an error") {
  const TD x = normal({3, 4}, 181);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, idx({0, 4, 1}, {3})),
                       doctest::Contains("cross_entropy: target 4 at position 1 is out of range for 4 classes "
                                         "(expected a class index in [0, 4) or ignore_index -100"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, idx({0, -1, 1}, {3})), doctest::Contains("target -1 at position 1"), Error);
  CHECK_THROWS_WITH_AS((nn::nll_loss<double, false>(log_softmax(x, 1), idx({7, 0, 1}, {3}))),
                       doctest::Contains("nll_loss: target 7 at position 0 is out of range for 4 classes"), Error);
}

TEST_CASE("class losses: shape mismatches of target and weight, bad input rank, bad smoothing") {
  const TD x = normal({3, 4}, 191), x3 = normal({3, 4, 2}, 192);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, idx({0, 1}, {2})),
                       doctest::Contains("cross_entropy: target of shape [2] does not match the input of shape [3, 4] "
                                         "(expected a target of shape [3]"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x3, idx({0, 1, 2}, {3})), doctest::Contains("expected a target of shape [3, 2]"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(normal({4}, 193), idx({1}, {1})),
                       doctest::Contains("a 0-d class index for a (C) input"), Error);
  CHECK_THROWS_WITH_AS(nn::cross_entropy(full<double>(Shape{}, 1.0), idx({0}, {})),
                       doctest::Contains("cross_entropy: expected an input of shape (N, C), (N, C, d1, ...) or (C)"),
                       Error);
  nn::CrossEntropyOptions<double> o;
  o.weight = ones<double>(Shape{3});
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, idx({0, 1, 2}, {3}), o),
                       doctest::Contains("cross_entropy: weight of shape [3] does not match 4 classes"), Error);
  nn::NllLossOptions<double> on;
  on.weight = ones<double>(Shape{4, 1});
  CHECK_THROWS_WITH_AS(nn::nll_loss(log_softmax(x, 1), idx({0, 1, 2}, {3}), on),
                       doctest::Contains("nll_loss: weight of shape [4, 1] does not match 4 classes"), Error);
  nn::CrossEntropyOptions<double> ol;
  ol.label_smoothing = 1.5;
  CHECK_THROWS_WITH_AS(nn::cross_entropy(x, idx({0, 1, 2}, {3}), ol),
                       doctest::Contains("label_smoothing must be in [0, 1], got 1.5"), Error);
}

TEST_CASE("element-wise losses: shape mismatches and bad parameters") {
  const TD a = normal({4, 1}, 201), b = normal({4}, 202), c = normal({4, 1}, 203);
  CHECK_THROWS_WITH_AS(nn::mse_loss(a, b),
                       doctest::Contains("mse_loss: target of shape [4] does not match the input of shape [4, 1]"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::l1_loss(b, a), doctest::Contains("l1_loss: target of shape [4, 1]"), Error);
  CHECK_THROWS_WITH_AS(nn::smooth_l1_loss(a, c, Reduction::Mean, -1.0),
                       doctest::Contains("smooth_l1_loss: beta must be non-negative, got -1"), Error);
  CHECK_THROWS_WITH_AS(nn::huber_loss(a, c, Reduction::Mean, 0.0),
                       doctest::Contains("huber_loss: delta must be positive, got 0"), Error);
  CHECK_THROWS_WITH_AS(nn::binary_cross_entropy_with_logits(a, b),
                       doctest::Contains("binary_cross_entropy_with_logits: target of shape [4]"), Error);
  nn::BceWithLogitsOptions<double> o;
  o.pos_weight = ones<double>(Shape{3});
  CHECK_THROWS_WITH_AS(nn::binary_cross_entropy_with_logits(a, c, o),
                       doctest::Contains("pos_weight of shape [3] does not broadcast to the input of shape [4, 1]"),
                       Error);
  o.pos_weight = TD();
  o.weight = ones<double>(Shape{2, 4, 1});
  CHECK_THROWS_WITH_AS(nn::binary_cross_entropy_with_logits(a, c, o), doctest::Contains("weight of shape [2, 4, 1]"),
                       Error);
}

// ---- issue 10 item 20: cross_entropy with class-probability targets ------------------------------------------------

namespace {
const Fixtures& edges_fx() {
  static const Fixtures f("ops_edges.txt");
  return f;
}
}  // namespace

TEST_CASE("cross_entropy with class-probability targets matches PyTorch: layouts, reductions, weights, smoothing") {
  const auto& fx = edges_fx();
  const TD w = fx["sce.w"];
  for (const char* tag : {"s2", "s4", "s1"}) {
    const std::string pre = std::string("sce.") + tag;
    const TD x = fx[pre + ".x"], t = fx[pre + ".t"], gnone = fx[pre + ".gnone"];
    for (Reduction red : kReds)
      for (const char* ls : {"0.0", "0.3"})
        for (int weighted : {0, 1}) {
          const std::string key = pre + "." + red_name(red) + "." + ls + "." + std::to_string(weighted);
          INFO(key);
          nn::CrossEntropyOptions<double> o;
          o.reduction = red;
          o.label_smoothing = std::stod(ls);
          if (weighted) o.weight = w;
          TD xl = leaf(x.detach().clone()), tl = leaf(t.detach().clone());  // fresh leaves: no accumulated grad
          TD y = nn::cross_entropy(xl, tl, o);
          check_close(y, fx[key + ".y"]);
          y.backward(red == Reduction::None ? gnone : TD(ones<double>({})));
          check_close(xl.grad(), fx[key + ".dx"]);
          check_close(tl.grad(), fx[key + ".dt"]);
          // float agrees with the double reference
          nn::CrossEntropyOptions<float> of;
          of.reduction = red;
          of.label_smoothing = o.label_smoothing;
          if (weighted) of.weight = to_float(w);
          check_close(nn::cross_entropy(to_float(x), to_float(t), of), fx[key + ".y"], 1e-5, 1e-5);
        }
  }
  // The module takes both kinds of target.
  nn::CrossEntropyLoss<double> loss;
  check_close(loss(fx["sce.s2.x"], fx["sce.s2.t"]), fx["sce.s2.mean.0.0.0.y"]);
  // One-hot probabilities give the class-index loss.
  const TD x = normal({3, 4}, 7);
  const TI ti = idx({2, 0, 3}, {3});
  TD onehot = zeros<double>({3, 4});
  for (int i = 0; i < 3; ++i) onehot.data()[i * 4 + ti.data()[i]] = 1;
  nn::CrossEntropyOptions<double> o;
  o.label_smoothing = 0.2;
  CHECK(nn::cross_entropy(x, onehot, o).item() == doctest::Approx(nn::cross_entropy(x, ti, o).item()).epsilon(1e-12));
  // An empty batch: Mean is NaN (as PyTorch), Sum 0.
  CHECK(std::isnan(nn::cross_entropy(zeros<double>({0, 4}), zeros<double>({0, 4})).item()));
  o.reduction = Reduction::Sum;
  CHECK(nn::cross_entropy(zeros<double>({0, 4}), zeros<double>({0, 4}), o).item() == 0.0);
}

TEST_CASE("gradcheck: cross_entropy with class-probability targets, w.r.t. logits and targets") {
  const TD w = uniform({4}, 0.2, 1.5, 204);
  const TD x2 = normal({3, 4}, 201, 2), x4 = normal({2, 4, 2, 3}, 202, 2), x1 = normal({4}, 203);
  const TD t2 = uniform({3, 4}, 0, 1, 205), t4 = uniform({2, 4, 2, 3}, 0, 1, 206), t1 = uniform({4}, 0, 1, 207);
  for (Reduction red : kReds)
    for (double ls : {0.0, 0.3})
      for (bool weighted : {false, true}) {
        nn::CrossEntropyOptions<double> o;
        o.reduction = red;
        o.label_smoothing = ls;
        if (weighted) o.weight = w;
        const std::string what = std::string(red_name(red)) + " ls " + std::to_string(ls) + " weighted " +
                                 std::to_string(weighted);
        auto f = [&](const Inputs& v) { return nn::cross_entropy(v[0], v[1], o); };
        check_grad("(N, C) " + what, f, {x2, t2});
        check_grad("(N, C, d1, d2) " + what, f, {x4, t4});
        check_grad("(C) " + what, f, {x1, t1});
      }
  check_grad("transposed logits and targets",
             [](const Inputs& v) { return nn::cross_entropy(v[0].t(), v[1].t()); },
             {normal({4, 3}, 208), uniform({4, 3}, 0, 1, 209)});
}

TEST_CASE("cross_entropy with class-probability targets: errors name the op, the shapes and what was expected") {
  const TD x = normal({3, 4}, 1);
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, normal({3, 5}, 2)); },
               {"cross_entropy", "class-probability target of shape [3, 5]", "[3, 4]"});
  nn::CrossEntropyOptions<double> o;
  o.ignore_index = 1;
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, normal({3, 4}, 2), o); },
               {"cross_entropy", "ignore_index 1", "not supported", "class-probability"});
  nn::CrossEntropyOptions<double> ow;
  ow.weight = ones<double>({3});
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, normal({3, 4}, 2), ow); },
               {"cross_entropy", "weight of shape [3]", "4 classes"});
  nn::CrossEntropyOptions<double> ol;
  ol.label_smoothing = 1.5;
  EXPECT_ERROR([&] { (void)nn::cross_entropy(x, normal({3, 4}, 2), ol); }, {"cross_entropy", "label_smoothing", "1.5"});
  EXPECT_ERROR([&] { (void)nn::cross_entropy(zeros<double>({}), zeros<double>({})); }, {"cross_entropy", "0-d"});
}
