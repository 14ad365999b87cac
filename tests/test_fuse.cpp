// Folding for inference (nn/fuse.hpp: nn::fuse_conv_bn, nn::fuse_modules): an evaluation-mode BatchNorm folded into
// the Conv2d or Linear before it, and the ReLU/GELU/SiLU activations and 2x2 max pools that follow moved into the
// layer's epilogue (ops::conv2d and ops::linear with a fused activation or pool, against the unfused ops bit for bit);
// folded models against unfolded ones, their state dicts, training through a fused model, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"

using namespace ember;

namespace {

using ember_test::TD;
using ember_test::TF;

using ember_test::check_close;
using ember_test::normal;

using ember_test::to_float;

}  // namespace

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
