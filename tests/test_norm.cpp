// softmax / log_softmax, batch_norm and layer_norm: values and gradients against PyTorch 1.13 (fixtures written by
// tests/fixtures/gen_norm_loss.py), gradcheck in double for every mode (dims other than the last, non-contiguous
// inputs, training with and without affine, eval), stability for large logits, float vs double, the running
// statistics, and one test per error.
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
#include "ember/autograd/normalization.hpp"
#include "ember/autograd/softmax.hpp"

using namespace ember;

namespace {

using TD = Tensor<double>;
using TF = Tensor<float>;
using Inputs = std::vector<TD>;
using Fn = std::function<TD(const Inputs&)>;

using ember_test::Fixtures;

const Fixtures& norm_fx() {
  static const Fixtures f("norm.txt");
  return f;
}

using ember_test::check_close;
using ember_test::check_grad;
using ember_test::normal;

TD leaf(TD t) {
  t.requires_grad_(true);
  return t;
}
TF to_float(const TD& t) {
  TF r = empty<float>(t.shape());
  const TD c = t.contiguous();
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data()[i] = float(c.data()[i]);
  return r;
}
TD to_double(const TF& t) {
  TD r = empty<double>(t.shape());
  const TF c = t.contiguous();
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data()[i] = double(c.data()[i]);
  return r;
}

}  // namespace

// ============================================================================================== softmax

TEST_CASE("softmax / log_softmax: values and gradients match PyTorch along every dim") {
  const auto& fx = norm_fx();
  const TD x = fx["sm.x"], g = fx["sm.g"];
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    TD a = leaf(x.clone());
    TD y = softmax(a, d);
    check_close(y, fx["softmax." + std::to_string(d) + ".y"]);
    y.backward(g);
    check_close(a.grad(), fx["softmax." + std::to_string(d) + ".dx"]);
    TD b = leaf(x.clone());
    TD z = log_softmax(b, d - 3);  // negative dims count from the end
    check_close(z, fx["log_softmax." + std::to_string(d) + ".y"]);
    z.backward(g);
    check_close(b.grad(), fx["log_softmax." + std::to_string(d) + ".dx"]);
  }
}

TEST_CASE("gradcheck: softmax and log_softmax along every dim, contiguous and strided") {
  const TD x = normal({3, 4, 5}, 11, 2);
  for (int d = 0; d < 3; ++d) {
    check_grad("softmax dim " + std::to_string(d), [d](const Inputs& v) { return softmax(v[0], d); }, {x});
    check_grad("log_softmax dim " + std::to_string(d), [d](const Inputs& v) { return log_softmax(v[0], d); }, {x});
    // Non-contiguous inputs: a transposed view and a strided slice.
    check_grad("softmax of a transpose, dim " + std::to_string(d),
               [d](const Inputs& v) { return softmax(v[0].transpose(0, 2), d); }, {x});
    check_grad("log_softmax of a strided slice, dim " + std::to_string(d),
               [d](const Inputs& v) { return log_softmax(v[0].slice(2, 0, 5, 2), d); }, {x});
  }
  // More inner positions than one block of columns (64), and a 1-d input.
  check_grad("softmax dim 0 with 70 inner positions", [](const Inputs& v) { return softmax(v[0], 0); },
             {normal({3, 70}, 12)});
  check_grad("log_softmax of a vector", [](const Inputs& v) { return log_softmax(v[0], 0); }, {normal({7}, 13)});
}

TEST_CASE("softmax is stable for logits of 1e4 and beyond") {
  TF x = tensor<float>({{1e4f, 0.f, -1e4f}, {3e38f, 3e38f, -3e38f}, {-1e4f, -1e4f + 1, -1e4f + 2}});
  TF y = softmax(x, 1);
  TF z = log_softmax(x, 1);
  const auto yv = y.to_vector(), zv = z.to_vector();
  for (float v : yv) CHECK(std::isfinite(v));
  for (float v : zv) CHECK(!std::isnan(v));
  CHECK(yv[0] == 1.f);
  CHECK(yv[1] == 0.f);
  CHECK(zv[0] == 0.f);
  CHECK(zv[1] == -1e4f);
  CHECK(zv[2] == -2e4f);
  CHECK(yv[3] == doctest::Approx(0.5));
  CHECK(yv[4] == doctest::Approx(0.5));
  // Shifted logits give the same probabilities as unshifted ones.
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), s = 1 + e1 + e2;
  CHECK(yv[6] == doctest::Approx(1 / s).epsilon(1e-6));
  CHECK(yv[8] == doctest::Approx(e2 / s).epsilon(1e-6));
  CHECK(zv[8] == doctest::Approx(2 - std::log(s)).epsilon(1e-6));
}

TEST_CASE("softmax in float agrees with double, forward and backward, on larger shapes") {
  struct Case {
    Shape s;
    int dim;
  };
  for (const Case& c : {Case{{7, 300}, 1}, Case{{5, 37, 70}, 1}, Case{{4, 3, 129}, 0}, Case{{2, 9, 5}, 2}}) {
    INFO("shape " << c.s.str() << " dim " << c.dim);
    const TD xd = normal(c.s, 21, 4), gd = normal(c.s, 22);
    for (bool log : {false, true}) {
      TD a = leaf(xd.clone());
      TF af = to_float(xd);
      af.requires_grad_(true);
      TD y = log ? log_softmax(a, c.dim) : softmax(a, c.dim);
      TF yf = log ? log_softmax(af, c.dim) : softmax(af, c.dim);
      check_close(yf, y, 1e-5, 1e-6);
      y.backward(gd);
      yf.backward(to_float(gd));
      check_close(af.grad(), a.grad(), 1e-4, 1e-5);
    }
  }
}

TEST_CASE("softmax in half and bfloat16 computes in float") {
  const TD xd = normal({6, 33}, 23, 3);
  TF xf = to_float(xd);
  Tensor<half> xh = cast<half>(xf);
  Tensor<bfloat16> xb = cast<bfloat16>(xf);
  TF yh = cast<float>(softmax(xh, 1)), yb = cast<float>(log_softmax(xb, 1));
  TF rh = softmax(TF(cast<float>(xh)), 1), rb = log_softmax(TF(cast<float>(xb)), 1);
  check_close(yh, to_double(rh), 2e-3, 1e-4);
  check_close(yb, to_double(rb), 1e-2, 2e-2);
}

TEST_CASE("softmax of a 0-d tensor and of an empty tensor") {
  TD s = full<double>(Shape{}, 3.0);
  CHECK(softmax(s, 0).item() == 1.0);
  CHECK(log_softmax(s, -1).item() == 0.0);
  TD e = empty<double>(Shape{0, 4});
  CHECK(softmax(e, 1).shape() == Shape{0, 4});
  CHECK(log_softmax(e, 0).numel() == 0);
}

TEST_CASE("softmax / log_softmax: a dim out of range is an error naming the op and the shape") {
  TD x = normal({2, 3}, 1);
  CHECK_THROWS_WITH_AS(softmax(x, 2), doctest::Contains("softmax: dim 2 is out of range for a tensor of shape [2, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(log_softmax(x, -3), doctest::Contains("log_softmax: dim -3 is out of range"), Error);
}

// ============================================================================================ batch_norm

TEST_CASE("batch_norm matches PyTorch: training with and without affine, eval, 4-d and 2-d inputs") {
  const auto& fx = norm_fx();
  for (const std::string tag : {"bn4", "bn2"}) {
    for (const std::string mode : {"train", "train_noaffine", "eval"}) {
      INFO(tag << " " << mode);
      const bool training = mode != "eval", affine = mode != "train_noaffine";
      TD x = leaf(fx[tag + ".x"]);
      TD w = affine ? leaf(fx[tag + ".w"]) : TD(), b = affine ? leaf(fx[tag + ".b"]) : TD();
      TD rm = fx[tag + ".rm"], rv = fx[tag + ".rv"];
      TD y = batch_norm(x, rm, rv, w, b, training, 0.3, 1e-4);
      const std::string k = tag + "." + mode;
      check_close(y, fx[k + ".y"]);
      check_close(rm, fx[k + ".rm"]);
      check_close(rv, fx[k + ".rv"]);
      y.backward(fx[tag + ".g"]);
      check_close(x.grad(), fx[k + ".dx"], 1e-8, 1e-10);
      if (affine) {
        check_close(w.grad(), fx[k + ".dw"], 1e-8, 1e-10);
        check_close(b.grad(), fx[k + ".db"], 1e-8, 1e-10);
      }
    }
  }
}

TEST_CASE("batch_norm updates the running statistics with the unbiased batch variance") {
  // One channel of 4 values: mean 2.5, biased variance 1.25, unbiased 5/3.
  TD x = from_vector<double>({1, 2, 3, 4}, Shape{2, 1, 2});
  TD rm = from_vector<double>({10}, Shape{1}), rv = from_vector<double>({20}, Shape{1});
  const auto v0 = rm.version();
  TD y = batch_norm(x, rm, rv, TD(), TD(), true, 0.25, 0.0);
  CHECK(rm.item() == doctest::Approx(0.75 * 10 + 0.25 * 2.5));
  CHECK(rv.item() == doctest::Approx(0.75 * 20 + 0.25 * (5.0 / 3.0)));
  CHECK(rm.version() > v0);
  // The output uses the biased variance.
  CHECK(y.to_vector()[0] == doctest::Approx((1 - 2.5) / std::sqrt(1.25)));
  // Eval mode reads them and leaves them alone.
  const double m = rm.item(), v = rv.item();
  TD z = batch_norm(x, rm, rv, TD(), TD(), false, 0.25, 0.0);
  CHECK(rm.item() == m);
  CHECK(rv.item() == v);
  CHECK(z.to_vector()[3] == doctest::Approx((4 - m) / std::sqrt(v)));
  // Training without running statistics only normalises.
  TD u = batch_norm(x, TD(), TD(), TD(), TD(), true);
  CHECK(u.to_vector()[3] == doctest::Approx(1.5 / std::sqrt(1.25 + 1e-5)));
}

TEST_CASE("gradcheck: batch_norm in training with and without affine, eval, strided inputs, (N, C)") {
  const TD x = normal({3, 2, 2, 3}, 31, 2, 1), w = normal({2}, 32, 0.5, 1), b = normal({2}, 33);
  const TD rm = normal({2}, 34), rv = normal({2}, 35, 0.1, 1);
  check_grad("train affine", [](const Inputs& v) { return batch_norm(v[0], TD(), TD(), v[1], v[2], true); },
             {x, w, b});
  check_grad("train without affine", [](const Inputs& v) { return batch_norm(v[0], TD(), TD(), TD(), TD(), true); },
             {x});
  check_grad("train, weight only", [](const Inputs& v) { return batch_norm(v[0], TD(), TD(), v[1], TD(), true); },
             {x, w});
  check_grad("eval", [rm, rv](const Inputs& v) { return batch_norm(v[0], rm, rv, v[1], v[2], false); }, {x, w, b});
  check_grad("train, input a permuted view",
             [](const Inputs& v) { return batch_norm(v[0].permute({2, 1, 0, 3}), TD(), TD(), v[1], v[2], true); },
             {x, w, b});
  check_grad("train, (N, C) input", [](const Inputs& v) { return batch_norm(v[0], TD(), TD(), v[1], v[2], true); },
             {normal({5, 3}, 36), normal({3}, 37), normal({3}, 38)});
  check_grad("train, (N, C, L) input with running stats",
             [](const Inputs& v) {
               TD m = zeros<double>(Shape{3}), s = ones<double>(Shape{3});
               return batch_norm(v[0], m, s, v[1], v[2], true);
             },
             {normal({2, 3, 4}, 39), normal({3}, 40), normal({3}, 41)});
}

TEST_CASE("batch_norm in float: statistics stay accurate for a large mean, forward and backward") {
  // Channel values around 1000 with unit spread: a one-pass float E[x²] - E[x]² would lose most digits. The double
  // reference runs on the same float-rounded inputs, so the comparison sees only the float computation's error.
  const TD xd = to_double(to_float(normal({16, 4, 9, 9}, 51, 1, 1000))), gd = to_double(to_float(normal({16, 4, 9, 9}, 52)));
  const TD wd = to_double(to_float(normal({4}, 53, 0.3, 1))), bd = to_double(to_float(normal({4}, 54)));
  TD xl = leaf(xd.clone()), wl = leaf(wd.clone()), bl = leaf(bd.clone());
  TD y = batch_norm(xl, TD(), TD(), wl, bl, true);
  y.backward(gd);
  TF xf = to_float(xd), wf = to_float(wd), bf = to_float(bd);
  xf.requires_grad_(true);
  wf.requires_grad_(true);
  bf.requires_grad_(true);
  TF rmf = zeros<float>(Shape{4}), rvf = ones<float>(Shape{4});
  TF yf = batch_norm(xf, rmf, rvf, wf, bf, true);
  yf.backward(to_float(gd));
  // The mean is carried as hi + lo floats, so x - mean keeps its digits; a plain float mean would leave
  // |x| * 2^-24 = 6e-5 absolute error in every output.
  check_close(yf, y, 1e-5, 1e-5);
  check_close(xf.grad(), xl.grad(), 1e-5, 1e-5);
  check_close(wf.grad(), wl.grad(), 1e-5, 1e-4);
  check_close(bf.grad(), bl.grad(), 1e-5, 1e-4);
  TD rm = zeros<double>(Shape{4}), rv = ones<double>(Shape{4});
  batch_norm(xd, rm, rv, TD(), TD(), true);
  check_close(rmf, rm, 1e-6, 0);
  check_close(rvf, rv, 1e-3, 0);
}

TEST_CASE("batch_norm does not depend on the thread count") {
  struct Guard {
    int saved = cpu::get_num_threads();
    ~Guard() { cpu::set_num_threads(saved); }
  } guard;
  const TF x = to_float(normal({8, 6, 10, 10}, 61, 2, 3)), g = to_float(normal({8, 6, 10, 10}, 62));
  std::vector<std::vector<float>> outs;
  for (int n : {1, 2, 3}) {
    cpu::set_num_threads(n);
    TF xl = x.clone();
    xl.requires_grad_(true);
    TF y = batch_norm(xl, TF(), TF(), TF(), TF(), true);
    y.backward(g);
    auto v = y.to_vector();
    const auto gv = xl.grad().to_vector();
    v.insert(v.end(), gv.begin(), gv.end());
    outs.push_back(v);
  }
  CHECK(outs[0] == outs[1]);
  CHECK(outs[0] == outs[2]);
}

TEST_CASE("batch_norm errors: rank, channel mismatches, missing running stats, one value per channel") {
  const TD x = normal({4, 3, 2}, 71);
  const TD c3 = ones<double>(Shape{3}), c2 = ones<double>(Shape{2});
  CHECK_THROWS_WITH_AS(batch_norm(normal({5}, 1), TD(), TD(), TD(), TD(), true),
                       doctest::Contains("batch_norm: expected an input of shape (N, C) or (N, C, *), got shape [5]"),
                       Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, c2, c3, TD(), TD(), true),
                       doctest::Contains("batch_norm: running_mean has shape [2] but the input of shape [4, 3, 2] has "
                                         "3 channels"),
                       Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, c3, c2, TD(), TD(), false), doctest::Contains("running_var has shape [2]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, TD(), TD(), c2, TD(), true), doctest::Contains("weight has shape [2]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, TD(), TD(), c3, ones<double>(Shape{3, 1}), true),
                       doctest::Contains("bias has shape [3, 1]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, TD(), TD(), TD(), TD(), false),
                       doctest::Contains("must be defined in evaluation mode"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, c3, TD(), TD(), TD(), true),
                       doctest::Contains("running_mean and running_var must be both defined"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(normal({1, 3}, 2), TD(), TD(), TD(), TD(), true),
                       doctest::Contains("expected more than 1 value per channel when training"), Error);
}

// ============================================================================================ layer_norm

TEST_CASE("layer_norm matches PyTorch over 1 and 2 trailing dims, with and without affine") {
  const auto& fx = norm_fx();
  const TD g = fx["ln.g"];
  for (const std::string tag : {"ln1", "ln2"}) {
    INFO(tag);
    const Shape ns = tag == "ln1" ? Shape{4} : Shape{3, 4};
    TD x = leaf(fx["ln.x"]), w = leaf(fx[tag + ".w"]), b = leaf(fx[tag + ".b"]);
    TD y = layer_norm(x, ns, w, b);
    check_close(y, fx[tag + ".y"]);
    y.backward(g);
    check_close(x.grad(), fx[tag + ".dx"], 1e-8, 1e-10);
    check_close(w.grad(), fx[tag + ".dw"], 1e-8, 1e-10);
    check_close(b.grad(), fx[tag + ".db"], 1e-8, 1e-10);
    TD x2 = leaf(fx["ln.x"]);
    TD y2 = layer_norm(x2, ns);
    check_close(y2, fx[tag + ".noaffine.y"]);
    y2.backward(g);
    check_close(x2.grad(), fx[tag + ".noaffine.dx"], 1e-8, 1e-10);
  }
}

TEST_CASE("gradcheck: layer_norm over 1 and 2 trailing dims, affine or not, strided inputs") {
  const TD x = normal({3, 4, 5}, 81, 2, 0.5);
  check_grad("last dim", [](const Inputs& v) { return layer_norm(v[0], Shape{5}, v[1], v[2]); },
             {x, normal({5}, 82, 0.5, 1), normal({5}, 83)});
  check_grad("last two dims", [](const Inputs& v) { return layer_norm(v[0], Shape{4, 5}, v[1], v[2]); },
             {x, normal({4, 5}, 84, 0.5, 1), normal({4, 5}, 85)});
  check_grad("no affine", [](const Inputs& v) { return layer_norm(v[0], Shape{5}); }, {x});
  check_grad("transposed input", [](const Inputs& v) { return layer_norm(v[0].transpose(0, 2), Shape{3}, v[1], v[2]); },
             {x, normal({3}, 86), normal({3}, 87)});
  check_grad("strided weight", [](const Inputs& v) { return layer_norm(v[0], Shape{5}, v[1].slice(0, 0, 10, 2)); },
             {x, normal({10}, 88)});
}

TEST_CASE("layer_norm in float agrees with double for rows with a large mean") {
  const TD xd = to_double(to_float(normal({37, 300}, 91, 1, 500))), gd = to_double(to_float(normal({37, 300}, 92)));
  const TD wd = to_double(to_float(normal({300}, 93, 0.2, 1)));
  TD xl = leaf(xd.clone()), wl = leaf(wd.clone());
  TD y = layer_norm(xl, Shape{300}, wl);
  y.backward(gd);
  TF xf = to_float(xd), wf = to_float(wd);
  xf.requires_grad_(true);
  wf.requires_grad_(true);
  TF yf = layer_norm(xf, Shape{300}, wf);
  yf.backward(to_float(gd));
  // With the mean as hi + lo floats, x - mean is nearly exact even at |x| = 500.
  check_close(yf, y, 1e-5, 1e-5);
  check_close(xf.grad(), xl.grad(), 1e-5, 1e-5);
  check_close(wf.grad(), wl.grad(), 1e-5, 1e-4);
}

TEST_CASE("layer_norm errors: normalized_shape, weight and bias shapes") {
  const TD x = normal({2, 3, 4}, 95);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{3}),
                       doctest::Contains("layer_norm: normalized_shape [3] does not match the trailing dims of the "
                                         "input of shape [2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{1, 2, 3, 4}), doctest::Contains("normalized_shape [1, 2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{}), doctest::Contains("at least one dim"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{4}, ones<double>(Shape{3})),
                       doctest::Contains("layer_norm: weight has shape [3] but normalized_shape is [4]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, Shape{3, 4}, TD(), ones<double>(Shape{4})),
                       doctest::Contains("layer_norm: bias has shape [4] but normalized_shape is [3, 4]"), Error);
}

// ---- issue 10 item 20: BatchNorm with momentum = None (cumulative moving average) ------------------------------

TEST_CASE("BatchNorm1d / BatchNorm2d with momentum None keep the cumulative average of the batch statistics") {
  // PyTorch: momentum=None updates the running statistics with factor 1 / num_batches_tracked, so after k
  // batches they are the plain average of the k batch means and unbiased variances.
  static const Fixtures fx("ops_edges.txt");
  auto run = [&](auto& bn, const std::string& tag) {
    for (int step = 0; step < 3; ++step) {
      const std::string pre = tag + "." + std::to_string(step);
      INFO(pre);
      TD y = bn(fx[pre + ".x"]);
      check_close(y, fx[pre + ".y"], 1e-9, 1e-11);
      check_close(bn.running_mean, fx[pre + ".rm"], 1e-12, 1e-14);
      check_close(bn.running_var, fx[pre + ".rv"], 1e-12, 1e-14);
      CHECK(bn.num_batches_tracked.item() == step + 1);
    }
    bn.eval();
    check_close(bn(fx[tag + ".eval.x"]), fx[tag + ".eval.y"], 1e-9, 1e-11);
  };
  nn::BatchNormT<1, amp::fp64> b1(3, {.momentum = std::nullopt});
  run(b1, "bn1");
  nn::BatchNormT<2, amp::fp64> b2(3, {.momentum = std::nullopt});
  run(b2, "bn2");
  std::ostringstream repr;
  repr << b2;
  CHECK(repr.str().find("momentum=None") != std::string::npos);
  // gradcheck through the layer in training (the running statistics change on every call but do not enter the
  // training output).
  nn::BatchNormT<2, amp::fp64> b3(2, {.momentum = std::nullopt});
  check_grad("BatchNorm2d momentum None",
             [&](const Inputs& v) {
               b3.weight = v[1];
               b3.bias = v[2];
               return b3(v[0]);
             },
             {normal({3, 2, 2, 2}, 31), normal({2}, 32), normal({2}, 33)});
}

// ================================================================================ folding (nn::fuse_conv_bn)

namespace {

/// Running statistics and affine parameters far from their defaults, so a fold that ignored any of them fails.
template <class BN>
void randomise_bn(BN& bn, std::uint64_t seed) {
  using P = typename BN::param_t;
  const std::int64_t C = bn.num_features;
  const TD m = normal({C}, seed), v = normal({C}, seed + 1), g = normal({C}, seed + 2), b = normal({C}, seed + 3);
  for (std::int64_t c = 0; c < C; ++c) {
    bn.running_mean.data()[c] = P(m.data()[c]);
    bn.running_var.data()[c] = P(0.2 + v.data()[c] * v.data()[c]);
    if (bn.options.affine) {
      bn.weight.data()[c] = P(1.0 + 0.5 * g.data()[c]);
      bn.bias.data()[c] = P(b.data()[c]);
    }
  }
}

/// max |a - b| / max |b|
double rel_diff(const TF& a, const TF& b) {
  double d = 0, m = 0;
  const TF ac = a.contiguous(), bc = b.contiguous();
  REQUIRE(a.shape() == b.shape());
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    d = std::max(d, std::abs(double(ac.data()[i]) - double(bc.data()[i])));
    m = std::max(m, std::abs(double(bc.data()[i])));
  }
  return d / m;
}

struct ConvNet : nn::Module {
  nn::Conv2d conv1{3, 8, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn1{8, {.eps = 1e-3}};
  nn::Conv2d conv2{8, 6, 3, {.stride = 2, .groups = 2}};
  nn::BatchNorm2d bn2{6, {.affine = false}};
  nn::Linear fc{6 * 3 * 3, 5, false};
  nn::BatchNorm1d bn3{5, {.eps = 0.1}};
  ConvNet() : nn::Module("ConvNet") {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc", fc);
    register_module("bn3", bn3);
  }
  TF forward(const TF& x) const {
    TF h = relu(bn1(conv1(x)));
    h = bn2(conv2(h));
    return bn3(fc(h.reshape({h.size(0), -1})));
  }
  TF operator()(const TF& x) const { return forward(x); }
};

}  // namespace

TEST_CASE("fuse_conv_bn on a Sequential: folded eval equals unfolded eval, groups, bias or not, eps, affine") {
  nn::Sequential model(nn::Conv2d(3, 8, 3, {.padding = 1}), nn::BatchNorm2d(8, {.eps = 1e-2}), nn::ReLU(),
                       nn::Conv2d(8, 6, 3, {.groups = 2, .bias = false}), nn::BatchNorm2d(6, {.affine = false}),
                       nn::ReLU(), nn::Conv2d(6, 4, 1), nn::Conv2d(4, 4, 1),  // a conv without a BN after it stays
                       nn::BatchNorm2d(4));
  auto& s = model;
  const auto params = s.named_parameters();
  // Set the statistics through the state_dict (the Sequential holds its own handles of the layers).
  auto sd = s.state_dict();
  for (auto& [name, t] : sd) {
    if (name.find("running_mean") != std::string::npos || name.find(".weight") != std::string::npos ||
        name.find(".bias") != std::string::npos || name.find("running_var") != std::string::npos) {
      auto f = std::get<TF>(t);
      const TD r = normal({f.numel()}, std::uint64_t(name.size()) * 7 + 1);
      for (std::int64_t i = 0; i < f.numel(); ++i)
        f.data()[i] = float(name.find("running_var") != std::string::npos ? 0.3 + r.data()[i] * r.data()[i]
                                                                         : r.data()[i] * 0.5);
    }
  }
  const TF x = to_float(normal({2, 3, 9, 7}, 5));
  model.train();
  CHECK_THROWS_WITH_AS(nn::fuse_conv_bn(model), doctest::Contains("the model is in training mode; call eval()"),
                       Error);
  model.eval();
  const TF ref = model(x);
  CHECK(nn::fuse_conv_bn(model) == 3);
  const TF got = model(x);
  CHECK(rel_diff(got, ref) < 1e-5);
  // The folded BatchNorms are identities without state; the bias-free conv gained a bias.
  const auto after = model.state_dict();
  CHECK(after.count("1.running_mean") == 0);
  CHECK(after.count("1.weight") == 0);
  CHECK(after.count("3.bias") == 1);
  CHECK(after.count("6.bias") == 1);
  CHECK(after.count("7.bias") == 1);
  CHECK(after.count("8.num_batches_tracked") == 0);
  std::ostringstream os;
  os << model;
  CHECK(os.str().find("(1): Identity()") != std::string::npos);
  CHECK(os.str().find("BatchNorm") == std::string::npos);
  CHECK(nn::fuse_conv_bn(model) == 0);  // nothing left to fold
  (void)params;

  // The folded state loads back into a model folded the same way (with other statistics before folding).
  nn::Sequential other(nn::Conv2d(3, 8, 3, {.padding = 1}), nn::BatchNorm2d(8, {.eps = 1e-2}), nn::ReLU(),
                       nn::Conv2d(8, 6, 3, {.groups = 2, .bias = false}), nn::BatchNorm2d(6, {.affine = false}),
                       nn::ReLU(), nn::Conv2d(6, 4, 1), nn::Conv2d(4, 4, 1), nn::BatchNorm2d(4));
  other.eval();
  nn::fuse_conv_bn(other);
  other.load_state_dict(after);
  CHECK(rel_diff(other(x), got) == 0);
}

TEST_CASE("fuse_modules with named pairs: Conv2d + BatchNorm2d and Linear + BatchNorm1d in a plain module") {
  ConvNet net;
  randomise_bn(net.bn1, 11);
  randomise_bn(net.bn2, 21);
  randomise_bn(net.bn3, 31);
  net.eval();
  const TF x = to_float(normal({4, 3, 8, 8}, 6));
  const TF ref = net(x);
  const TF w1 = net.conv1.weight.clone();
  // Errors leave the model as it was: every pair is checked before anything is written.
  const TF wfc = net.fc.weight.clone();
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"fc", "bn3"}, {"conv1", "bn2"}}),
                       doctest::Contains("cannot fold 'bn2' (BatchNorm2d) into 'conv1' (Conv2d): the layer's weight "
                                         "[8, 3, 3, 3] has 8 output channels, the BatchNorm normalises 6"),
                       Error);
  CHECK(rel_diff(net.conv1.weight, w1) == 0);
  CHECK(rel_diff(net.fc.weight, wfc) == 0);
  CHECK(!nn::folded(net.bn3));
  CHECK(rel_diff(net(x), ref) == 0);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"fc", "bn1"}}),
                       doctest::Contains("expected a Conv2d followed by a BatchNorm2d, or a Linear followed by a "
                                         "BatchNorm1d"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv1", "bn9"}}),
                       doctest::Contains("fuse_modules: ConvNet has no submodule 'bn9'"), Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv1", "bn1"}, {"conv1", "bn1"}}),
                       doctest::Contains("'conv1' of ('conv1', 'bn1') appears in two groups"), Error);
  CHECK(rel_diff(net(x), ref) == 0);

  nn::fuse_modules(net, {{"conv1", "bn1"}, {"conv2", "bn2"}, {"fc", "bn3"}});
  CHECK(nn::folded(net.bn1));
  CHECK(rel_diff(net(x), ref) < 1e-5);
  // Every handle of the conv sees the folded weight and the gained bias.
  nn::Conv2d handle = net.conv1;
  CHECK(rel_diff(handle(x), net.conv1(x)) == 0);
  CHECK(net.conv1.own_parameter<float>("bias").requires_grad());
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv1", "bn1"}}), doctest::Contains("'bn1' was already fused"), Error);
}

TEST_CASE("fuse_conv_bn in double matches to rounding; errors for statistics, order and channel mismatches") {
  nn::Conv2dT<amp::fp64> conv(2, 4, 3, {.padding = 1});
  nn::BatchNormT<2, amp::fp64> bn(4, {.eps = 1e-4});
  randomise_bn(bn, 41);
  nn::Sequential seq(conv, bn);
  seq.eval();
  const TD x = normal({3, 2, 5, 5}, 7);
  const TD ref = seq(x);
  nn::fuse_conv_bn(seq);
  check_close(seq(x), ref, 1e-12, 1e-12);

  nn::Sequential no_stats(nn::Conv2d(2, 4, 3), nn::BatchNorm2d(4, {.track_running_stats = false}));
  no_stats.eval();
  CHECK_THROWS_WITH_AS(nn::fuse_conv_bn(no_stats), doctest::Contains("has no running statistics"), Error);
  nn::Sequential gap(nn::Conv2d(2, 4, 3), nn::ReLU(), nn::BatchNorm2d(4));
  gap.eval();
  CHECK(nn::fuse_conv_bn(gap, {.activations = false}) == 0);  // not adjacent: not a pair
  CHECK_THROWS_WITH_AS(nn::fuse_modules(gap, {{"0", "2"}}),
                       doctest::Contains("fuse_modules: cannot fuse '0', '2': in an nn::Sequential '2' must come directly after '0'"),
                       Error);
  nn::Sequential mismatch(nn::Linear(3, 5), nn::BatchNorm1d(4));
  mismatch.eval();
  CHECK_THROWS_WITH_AS(nn::fuse_conv_bn(mismatch),
                       doctest::Contains("cannot fold '1' (BatchNorm1d) into '0' (Linear): the layer's weight [5, 3] "
                                         "has 5 output channels, the BatchNorm normalises 4"),
                       Error);
}

TEST_CASE("fused activations: Conv2d/Linear epilogues equal the unfused ops bit for bit, and training stays exact") {
  // ops level: every activation, float and bfloat16, conv (bias or not) and linear (bias or not, 3-D input).
  const TF x = to_float(normal({3, 4, 7, 6}, 81)), w = to_float(normal({6, 4, 3, 3}, 82)), b = to_float(normal({6}, 83));
  const TF xl = to_float(normal({2, 37, 19}, 84)), wl = to_float(normal({23, 19}, 85)), bl = to_float(normal({23}, 86));
  const Conv2dOptions co{.padding = 1};
  for (auto act : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    INFO("act " << std::string(activation_name(act)));
    NoGradGuard ng;
    auto unfused = [&](const auto& y) {
      using T = typename std::remove_cvref_t<decltype(y)>::value_type;
      switch (act) {
        case Activation::relu: return Tensor<T>(relu(y));
        case Activation::gelu: return Tensor<T>(gelu(y));
        case Activation::gelu_tanh: return Tensor<T>(gelu_tanh(y));
        default: return Tensor<T>(silu(y));
      }
    };
    CHECK(rel_diff(ops::conv2d(x, w, b, co, act), unfused(ops::conv2d(x, w, b, co))) == 0);
    CHECK(rel_diff(ops::conv2d(x, w, TF(), co, act), unfused(ops::conv2d(x, w, TF(), co))) == 0);
    // The unfused reference of act(y + b): one element-wise pass after the GEMM (one rounding for 16-bit types).
    auto bias_act = [&](auto y, const auto& bias) {
      ops::detail::bias_act_(y, bias, act, [&](const auto& e) { cpu::assign(y, e, "reference"); });
      return y;
    };
    CHECK(rel_diff(ops::linear(xl, wl, bl, act), bias_act(Tensor<float>(matmul(xl, wl.t())), bl)) == 0);
    CHECK(rel_diff(ops::linear(xl, wl, TF(), act), unfused(matmul(xl, wl.t()))) == 0);
    // Several blocks of rows (a wide layer: 256-row blocks) and a strided input.
    const TF xw = to_float(normal({600, 14}, 89)).slice(1, 0, 14, 2), ww = to_float(normal({1100, 7}, 90));
    const TF bw = to_float(normal({1100}, 91));
    CHECK(rel_diff(ops::linear(xw, ww, bw, act), bias_act(Tensor<float>(matmul(xw, ww.t())), bw)) == 0);
    using B = bfloat16;
    const Tensor<B> xb = cast<B>(x), wb = cast<B>(w), bb = cast<B>(b);
    const Tensor<B> fused = ops::conv2d(xb, wb, bb, co, act), ref = unfused(ops::conv2d(xb, wb, bb, co));
    CHECK(rel_diff(cast<float>(fused), cast<float>(ref)) == 0);
    const Tensor<B> xlb = cast<B>(xl), wlb = cast<B>(wl), blb = cast<B>(bl);
    CHECK(rel_diff(cast<float>(ops::linear(xlb, wlb, blb, act)),
                   cast<float>(bias_act(Tensor<B>(matmul(xlb, wlb.t())), blb))) == 0);
  }
  // Without an activation, linear's bias in the epilogue equals the GEMM followed by the bias add.
  {
    NoGradGuard ng;
    CHECK(rel_diff(linear(xl, wl, bl), Tensor<float>(matmul(xl, wl.t()) + bl)) == 0);
  }

  // Module level: the activation modules of a Sequential move into the layers before them.
  auto make = [] {
    manual_seed(9);
    return nn::Sequential(nn::Conv2d(2, 5, 3, {.padding = 1}), nn::ReLU(), nn::Conv2d(5, 4, 3, {.bias = false}),
                          nn::GELU(true), nn::Flatten(), nn::Linear(4 * 4 * 4, 12), nn::SiLU(), nn::Linear(12, 3),
                          nn::GELU());
  };
  nn::Sequential plain = make(), fused = make();
  CHECK(nn::fuse_conv_bn(fused) == 4);  // activations need no eval mode
  std::ostringstream os;
  os << fused;
  CHECK(os.str().find("ReLU") == std::string::npos);
  CHECK(os.str().find("GELU") == std::string::npos);
  CHECK(os.str().find("(8): Identity()") != std::string::npos);
  const TF xin = to_float(normal({3, 2, 6, 6}, 87));
  {
    InferenceMode im;
    CHECK(rel_diff(fused(xin), plain(xin)) == 0);
  }
  {
    // An unbatched input (C, H, W) through a conv with a fused activation.
    manual_seed(10);
    nn::Sequential one(nn::Conv2d(2, 3, 3), nn::SiLU());
    nn::Sequential two(nn::Conv2d(2, 3, 3), nn::SiLU());
    two.load_state_dict(one.state_dict());
    nn::fuse_conv_bn(two);
    InferenceMode im;
    const TF x3 = to_float(normal({2, 5, 5}, 88));
    CHECK(rel_diff(two(x3), one(x3)) == 0);
  }
  // With gradients the activation is a separate differentiable op: the same loss and gradients as unfused.
  const TF lp = sum(square(plain(xin))), lf = sum(square(fused(xin)));
  lp.backward();
  lf.backward();
  CHECK(rel_diff(lf, lp) == 0);
  const auto pp = plain.named_parameters(), pf = fused.named_parameters();
  REQUIRE(pp.size() == pf.size());
  for (std::size_t i = 0; i < pp.size(); ++i) {
    INFO(pp[i].first);
    CHECK(rel_diff(pf[i].second.grad(), pp[i].second.grad()) == 0);
  }

  // Named groups: {conv, bn, act} and {linear, act}; errors name the modules.
  struct Net : nn::Module {
    nn::Conv2d conv{2, 3, 3};
    nn::BatchNorm2d bn{3};
    nn::ReLU relu;
    nn::Tanh tanh;
    nn::Linear fc{3, 2};
    nn::SiLU silu;
    Net() : nn::Module("Net") {
      register_module("conv", conv);
      register_module("bn", bn);
      register_module("relu", relu);
      register_module("tanh", tanh);
      register_module("fc", fc);
      register_module("silu", silu);
    }
  } net;
  net.eval();
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"fc", "tanh"}}),
                       doctest::Contains("fuse_modules: cannot fold 'tanh' (Tanh) into 'fc' (Linear): expected a Conv2d "
                                         "followed by a BatchNorm2d"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv", "bn", "tanh"}}),
                       doctest::Contains("fuse_modules: cannot move 'tanh' (Tanh) into 'conv' (Conv2d): expected a "
                                         "ReLU, GELU or SiLU module"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv", "bn", "relu", "fc"}}),
                       doctest::Contains("fuse_modules: cannot fuse 'conv', 'bn', 'relu', 'fc': a group is a layer "
                                         "followed by a BatchNorm, an activation and a MaxPool2d"),
                       Error);
  {
    // One ReLU module after two convolutions, named in both groups: both convolutions apply it.
    struct Shared : nn::Module {
      nn::Conv2d c1{2, 3, 3, {.padding = 1}}, c2{3, 3, 3, {.padding = 1}};
      nn::ReLU relu;
      Shared() : nn::Module("Shared") {
        register_module("c1", c1);
        register_module("c2", c2);
        register_module("relu", relu);
      }
      TF operator()(const TF& x) const { return relu(c2(relu(c1(x)))); }
    };
    Shared a, b;
    b.load_state_dict(a.state_dict());
    nn::fuse_modules(b, {{"c1", "relu"}, {"c2", "relu"}});
    InferenceMode im;
    const TF xs = to_float(normal({2, 2, 5, 5}, 92));
    CHECK(rel_diff(b(xs), a(xs)) == 0);
  }
  nn::fuse_modules(net, {{"conv", "bn", "relu"}, {"fc", "silu"}});
  CHECK(nn::folded(net.relu));
  CHECK(nn::folded(net.silu));
  CHECK(nn::fused_activation(net.conv) == Activation::relu);
  CHECK(nn::fused_activation(net.fc) == Activation::silu);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"fc", "silu"}}),
                       doctest::Contains("cannot fuse 'fc', 'silu': 'silu' was already fused into the layer before it"), Error);
}

TEST_CASE("fused 2x2 max pools: the conv epilogue pools bit for bit, training through the model stays exact") {
  // ops level: odd and even output sizes, every activation, float and bfloat16.
  for (const Shape& xs : {Shape{3, 4, 9, 7}, Shape{2, 4, 8, 8}}) {
    const TF x = to_float(normal(xs, 101)), w = to_float(normal({6, 4, 3, 3}, 102)), b = to_float(normal({6}, 103));
    const Conv2dOptions co{.padding = 1};
    NoGradGuard ng;
    for (auto act : {Activation::none, Activation::relu, Activation::gelu, Activation::silu}) {
      INFO("act " << std::string(activation_name(act)) << " input " << xs.str());
      CHECK(rel_diff(ops::conv2d(x, w, b, co, act, true), max_pool2d(ops::conv2d(x, w, b, co, act), 2)) == 0);
      using B = bfloat16;
      const Tensor<B> xb = cast<B>(x), wb = cast<B>(w), bb = cast<B>(b);
      CHECK(rel_diff(cast<float>(ops::conv2d(xb, wb, bb, co, act, true)),
                     cast<float>(max_pool2d(ops::conv2d(xb, wb, bb, co, act), 2))) == 0);
    }
  }
  // Module level: conv-BN-ReLU-pool twice; fuse_conv_bn moves both pools, the MaxPool2d(3) stays.
  auto make = [] {
    manual_seed(11);
    return nn::Sequential(nn::Conv2d(2, 6, 3, {.padding = 1}), nn::BatchNorm2d(6), nn::ReLU(), nn::MaxPool2d(2),
                          nn::Conv2d(6, 4, 3, {.padding = 1, .bias = false}), nn::MaxPool2d(2), nn::MaxPool2d(3),
                          nn::Flatten(), nn::Linear(4, 3));
  };
  nn::Sequential ref = make(), fused = make(), unpooled = make();
  for (auto* m : {&ref, &fused, &unpooled}) m->eval();
  const TF x = to_float(normal({5, 2, 13, 12}, 104));
  const TF want = ref(x);
  CHECK(nn::fuse_conv_bn(fused) == 2);
  CHECK(nn::fuse_conv_bn(unpooled, {.pools = false}) == 1);
  std::ostringstream os;
  os << fused;
  CHECK(os.str().find("(3): Identity()") != std::string::npos);
  CHECK(os.str().find("(5): Identity()") != std::string::npos);
  CHECK(os.str().find("(6): MaxPool2d") != std::string::npos);
  {
    InferenceMode g;
    CHECK(rel_diff(fused(x), want) < 1e-5);
    CHECK(rel_diff(fused(x), unpooled(x)) == 0);  // the pool in the epilogue changes no bit
  }
  // With autograd the layers run unfused and the folded modules apply their ops: same loss, same gradients.
  const TF lf = sum(fused(x) * fused(x)), lu = sum(unpooled(x) * unpooled(x));
  CHECK(rel_diff(lf, lu) == 0);
  lf.backward();
  lu.backward();
  const auto gf = fused.named_parameters(), gu = unpooled.named_parameters();
  REQUIRE(gf.size() == gu.size());
  for (std::size_t i = 0; i < gf.size(); ++i) CHECK(rel_diff(gf[i].second.grad(), gu[i].second.grad()) == 0);

  // Named groups of four; a pool that is not 2x2, or after a Linear, is refused.
  struct Net : nn::Module {
    nn::Conv2d conv{2, 3, 3};
    nn::BatchNorm2d bn{3};
    nn::ReLU relu;
    nn::MaxPool2d pool{2}, pool3{3};
    nn::Linear fc{4, 4};
    Net() : nn::Module("Net") {
      register_module("conv", conv);
      register_module("bn", bn);
      register_module("relu", relu);
      register_module("pool", pool);
      register_module("pool3", pool3);
      register_module("fc", fc);
    }
  };
  Net net;
  net.eval();
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv", "bn", "relu", "pool3"}}),
                       doctest::Contains("expected a MaxPool2d with kernel 2, stride 2"), Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"fc", "pool"}}),
                       doctest::Contains("only a Conv2d takes a max pool in its epilogue"), Error);
  CHECK_THROWS_WITH_AS(nn::fuse_modules(net, {{"conv", "pool", "relu"}}), doctest::Contains("cannot fold 'pool'"),
                       Error);
  CHECK(!nn::fused_pool(net.conv));
  nn::fuse_modules(net, {{"conv", "bn", "relu", "pool"}});
  CHECK(nn::fused_pool(net.conv));
  CHECK(nn::fused_activation(net.conv) == Activation::relu);
  CHECK(nn::folded(net.pool));
}
