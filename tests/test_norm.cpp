// batch_norm and layer_norm (ops/normalization.hpp, autograd/normalization.hpp, cpu/norm.hpp) and the BatchNorm
// modules (nn/normalization.hpp): values and gradients against PyTorch 1.13 (fixtures written by
// tests/fixtures/gen_norm_loss.py and gen_ops_edges.py), gradcheck in double for every mode (non-contiguous inputs,
// training with and without affine, eval), float vs double, the running statistics (momentum None included), and one
// test per error. (softmax: test_softmax.cpp; folding a BatchNorm into the layer before it: test_fuse.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"
#include "ember/autograd/normalization.hpp"

using namespace ember;

namespace {

using ember_test::TD;
using ember_test::TF;
using ember_test::Inputs;
using Fn = ember_test::GradFn;

using ember_test::Fixtures;

constexpr auto norm_fx = &ember_test::norm_fixtures;

using ember_test::check_close;
using ember_test::check_grad;
using ember_test::normal;

using ember_test::leaf;
using ember_test::to_float;
using ember_test::to_double;

}  // namespace

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

namespace {
template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  const std::vector<T> va = a.contiguous().to_vector(), vb = b.contiguous().to_vector();
  return va.size() == vb.size() && std::memcmp(va.data(), vb.data(), va.size() * sizeof(T)) == 0;
}
}  // namespace

static_assert(ops::BatchNormParam<float, bfloat16> && ops::BatchNormParam<float, half> &&
              ops::BatchNormParam<double, double> && !ops::BatchNormParam<double, bfloat16> &&
              !ops::BatchNormParam<float, double> && !ops::BatchNormParam<half, float>);

TEST_CASE_TEMPLATE("batch_norm on 16-bit data with float statistics and parameters: what widening to float, "
                   "normalising and rounding gives, forward and backward, training and eval", T, bfloat16, half) {
  // The mixed-type kernel reads the 16-bit values and computes in float; going through a float copy of x computes
  // the same float values, so everything must agree bit for bit (y and dx rounded once to T, dbias and the running
  // statistics in float; dweight to its float rounding, see below). A strided (transposed) input and an affine-free
  // call are included.
  const TF x0 = to_float(normal({6, 5, 7, 4}, 71, 1.5, 2)), g0 = to_float(normal({6, 5, 7, 4}, 72));
  const Tensor<T> xs = cast<T>(x0), gs = cast<T>(g0);
  for (bool training : {true, false})
    for (bool affine : {true, false})
      for (bool strided : {false, true}) {
        CAPTURE(training);
        CAPTURE(affine);
        CAPTURE(strided);
        const Tensor<T> xin = strided ? Tensor<T>(xs.transpose(2, 3).contiguous().transpose(2, 3)) : xs;
        auto params = [&] {
          std::vector<TF> p = {to_float(normal({5}, 73, 0.2)), to_float(normal({5}, 74, 0.1, 1)),
                               to_float(normal({5}, 75, 0.3, 1)), to_float(normal({5}, 76))};
          for (std::size_t i = 2; i < 4; ++i) p[i].requires_grad_(true);
          return p;
        };
        std::vector<TF> pm = params(), pr = params();
        const TF wm = affine ? pm[2] : TF(), bm = affine ? pm[3] : TF();
        const TF wr = affine ? pr[2] : TF(), br = affine ? pr[3] : TF();
        Tensor<T> xm = xin.clone(), xr = xin.clone();
        xm.requires_grad_(true);
        xr.requires_grad_(true);
        Tensor<T> ym = batch_norm(xm, pm[0], pm[1], wm, bm, training, 0.1, 1e-5);
        Tensor<T> yr = cast<T>(batch_norm(TF(cast<float>(xr)), pr[0], pr[1], wr, br, training, 0.1, 1e-5));
        CHECK(same_bits(ym, yr));
        CHECK(same_bits(pm[0], pr[0]));
        CHECK(same_bits(pm[1], pr[1]));
        ym.backward(gs);
        yr.backward(gs);
        CHECK(same_bits(xm.grad(), xr.grad()));
        if (affine) {
          // dweight sums g (x - mean) in float lanes, and the compiler may contract that product-and-add into a
          // fused multiply-add in one instantiation of the loop and not the other (seen at -O3): the same float sum
          // up to its rounding, not the same bits.
          check_close(wm.grad(), to_double(wr.grad()), 1e-5, 1e-5);
          CHECK(same_bits(bm.grad(), br.grad()));
        }
      }
  // The module under the mixed policy runs the same kernel: its output equals the functional call's.
  using Policy = std::conditional_t<std::is_same_v<T, bfloat16>, amp::bf16_mixed, amp::fp16_mixed>;
  nn::BatchNormT<2, Policy> bn(5);
  const TF rm = bn.running_mean.clone(), rv = bn.running_var.clone();
  const Tensor<T> y = bn(xs);
  CHECK(same_bits(y, batch_norm(xs, rm, rv, bn.weight.detach(), bn.bias.detach(), true, 0.1, 1e-5)));
  CHECK(same_bits(bn.running_mean, rm));
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
