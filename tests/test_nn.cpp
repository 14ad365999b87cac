// nn: the Module registry (names, state_dict round trips and its errors, modes, printing), the layers without
// convolution/normalisation (Linear, Embedding, Dropout, activations, Flatten, Sequential), initialisation, and
// the precision-policy parameter of layers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using ember_test::rd;

namespace {

using TD = Tensor<double>;

struct Mlp : nn::Module {
  nn::Linear fc1{4, 8}, fc2{8, 3};
  nn::Dropout drop{0.5};
  Mlp() : nn::Module("Mlp") {
    register_module("fc1", fc1);
    register_module("drop", drop);
    register_module("fc2", fc2);
  }
  Tensor<float> forward(const Tensor<float>& x) const { return fc2(drop(Tensor<float>(relu(fc1(x))))); }
};

template <class V>
std::vector<std::string> names(const std::vector<std::pair<std::string, V>>& v) {
  std::vector<std::string> r;
  for (auto& [n, t] : v) r.push_back(n);
  return r;
}

template <class T>
double max_abs_diff(const Tensor<T>& a, const Tensor<T>& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(rd(a, i)) - double(rd(b, i))));
  return m;
}

}  // namespace

TEST_CASE("Module: parameter names, counts, modes and printing follow PyTorch") {
  Mlp m;
  CHECK(names(m.named_parameters()) == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(m.num_parameters() == 4 * 8 + 8 + 8 * 3 + 3);
  for (auto& p : m.parameters()) CHECK(p.requires_grad());
  CHECK(m.parameters<double>().empty());
  CHECK(m.is_training());
  m.eval();
  CHECK(!m.is_training());
  CHECK(!m.drop.is_training());  // children follow
  m.train();
  CHECK(m.fc1.is_training());
  std::ostringstream os;
  os << m;
  CHECK(os.str() ==
        "Mlp(\n  (fc1): Linear(in_features=4, out_features=8, bias=True)\n  (drop): Dropout(p=0.500000)\n"
        "  (fc2): Linear(in_features=8, out_features=3, bias=True)\n)");
  // A copy is a handle: it shares the parameters.
  Mlp c = m;
  CHECK(c.fc1.weight.same_impl(m.fc1.weight));
}

TEST_CASE("Module: state_dict round trip, strictness and shape/dtype errors") {
  Mlp a, b;
  Tensor<float> x = randn<float>({5, 4});
  a.eval();
  b.eval();
  Tensor<float> ya = a.forward(x), yb = b.forward(x);
  CHECK(max_abs_diff(ya, yb) > 1e-3);  // different random initialisations
  nn::StateDict sd = a.state_dict();
  CHECK(sd.size() == 4);
  b.load_state_dict(sd);
  CHECK(max_abs_diff(a.forward(x), b.forward(x)) == 0);
  // state_dict shares memory, as PyTorch's does.
  CHECK(std::get<Tensor<float>>(sd.at("fc1.weight")).storage() == a.fc1.weight.storage());

  nn::StateDict missing = sd;
  missing.erase("fc2.bias");
  CHECK_THROWS_WITH_AS(b.load_state_dict(missing), doctest::Contains("missing key(s): 'fc2.bias'"), Error);
  b.load_state_dict(missing, /*strict=*/false);  // allowed when not strict
  nn::StateDict extra = sd;
  extra.emplace("fc3.weight", zeros<float>({2}));
  CHECK_THROWS_WITH_AS(b.load_state_dict(extra), doctest::Contains("unexpected key(s): 'fc3.weight'"), Error);
  nn::StateDict bad = sd;
  bad["fc1.weight"] = zeros<float>({8, 5});
  CHECK_THROWS_WITH_AS(b.load_state_dict(bad),
                       doctest::Contains("size mismatch for 'fc1.weight': the checkpoint has [8, 5], the module has "
                                         "[8, 4]"),
                       Error);
  nn::StateDict ints = sd;
  ints["fc1.bias"] = zeros<std::int64_t>({8});
  CHECK_THROWS_WITH_AS(b.load_state_dict(ints), doctest::Contains("dtype mismatch for 'fc1.bias'"), Error);
  // Every problem in one error, and nothing written: a missing key, an unexpected one, a size and a dtype mismatch.
  nn::StateDict many = sd;
  many.erase("fc2.bias");
  many.emplace("fc3.weight", zeros<float>({2}));
  many["fc1.weight"] = zeros<float>({8, 5});
  many["fc1.bias"] = zeros<std::int64_t>({8});
  many["fc2.weight"] = zeros<float>({3, 8});
  const std::vector<float> before = b.fc2.weight.to_vector();
  const std::string msg = ember_test::error_of([&] { b.load_state_dict(many); });
  for (const char* part : {"missing key(s): 'fc2.bias'", "unexpected key(s): 'fc3.weight'",
                           "size mismatch for 'fc1.weight'", "dtype mismatch for 'fc1.bias'"}) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  }
  CHECK(b.fc2.weight.to_vector() == before);
  // A state dict carries every dtype; one the module does not hold is a dtype mismatch naming the key and both
  // dtypes, and nothing is written.
  const std::vector<float> bias_before = b.fc1.bias.to_vector();
  const std::vector<std::pair<AnyTensor, const char*>> others = {
      {zeros<std::int32_t>({8}), "int32"}, {zeros<std::uint8_t>({8}), "uint8"},
      {zeros<std::int8_t>({8}), "int8"},   {zeros<bool>({8}), "bool"}};
  for (const auto& [t, name] : others) {
    nn::StateDict odd = sd;
    odd["fc1.bias"] = t;
    CHECK(scalar_type(odd.at("fc1.bias")) != ScalarType::Float);
    const std::string want = std::string("dtype mismatch for 'fc1.bias': the checkpoint has ") + name +
                             ", the module has float32";
    CHECK_THROWS_WITH_AS(b.load_state_dict(odd), doctest::Contains(want.c_str()), Error);
    CHECK(b.fc1.bias.to_vector() == bias_before);
  }
  // Floating dtypes convert, as copy_ does in PyTorch.
  nn::StateDict dbl = sd;
  dbl["fc1.bias"] = full<double>({8}, 0.25);
  b.load_state_dict(dbl);
  CHECK(rd(b.fc1.bias, 7) == 0.25f);
}

TEST_CASE("Module: load_state_dict converts floating dtypes element by element, rounding each once") {
  struct M : nn::Module {
    Tensor<float> f = zeros<float>({3, 4});
    Tensor<half> h = zeros<half>({3, 4});
    Tensor<bfloat16> b = zeros<bfloat16>({3, 4});
    Tensor<double> d = zeros<double>({3, 4});
    M() : nn::Module("M") {
      register_parameter("f", f);
      register_parameter("h", h);
      register_parameter("b", b);
      register_parameter("d", d);
    }
  } m;
  Generator g(3);
  const Tensor<double> src = randn<double>(Shape{4, 3}, g).t();  // strided: read through its strides
  const Tensor<float> srcf = randn<float>(Shape{3, 4}, g);
  const Tensor<half> srch = randn<half>(Shape{3, 4}, g);
  m.load_state_dict({{"f", src}, {"h", src}, {"b", srcf}, {"d", srch}});
  const std::vector<double> s = src.contiguous().to_vector();
  const std::vector<float> sf = srcf.to_vector();
  const std::vector<half> sh = srch.to_vector();
  const std::vector<float> f = m.f.to_vector();
  const std::vector<half> h = m.h.to_vector();
  const std::vector<bfloat16> b = m.b.to_vector();
  const std::vector<double> d = m.d.to_vector();
  for (std::size_t i = 0; i < 12; ++i) {
    INFO(i);
    CHECK(f[i] == convert<float>(s[i]));
    CHECK(float(h[i]) == float(convert<half>(s[i])));  // what converting the double itself gives
    CHECK(float(b[i]) == float(convert<bfloat16>(sf[i])));
    CHECK(d[i] == double(float(sh[i])));
  }
}

TEST_CASE("Module: register errors and zero_grad") {
  struct Bad : nn::Module {
    Tensor<float> w = zeros<float>({2});
    nn::Linear l{1, 1};
    void dup() { register_parameter("w", w), register_parameter("w", w); }
    void dotted() { register_module("a.b", l); }
  } bad;
  CHECK_THROWS_WITH_AS(bad.dup(), doctest::Contains("'w' is already registered"), Error);
  CHECK_THROWS_WITH_AS(bad.dotted(), doctest::Contains("invalid name 'a.b'"), Error);

  nn::Linear l(3, 2);
  sum(l(ones<float>({4, 3}))).backward();
  REQUIRE(l.weight.grad().defined());
  l.zero_grad(/*set_to_none=*/false);
  CHECK(l.weight.grad().defined());
  CHECK(rd(l.weight.grad(), 0) == 0.f);
  l.zero_grad();
  CHECK(!l.weight.grad().defined());
}

TEST_CASE("Linear: PyTorch's initialisation bounds, forward by hand, gradcheck in double") {
  manual_seed(7);
  nn::Linear l(100, 30);
  const double bound = 1.0 / std::sqrt(100.0);
  double lo = 1, hi = -1;
  for (auto v : l.weight.to_vector()) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
  CHECK(lo >= -bound);
  CHECK(hi <= bound);
  CHECK(lo < -0.9 * bound);  // fills the whole range
  CHECK(hi > 0.9 * bound);

  nn::LinearT<amp::fp64> d(3, 2);
  TD x = randn<double>({4, 3});
  TD y = d(x);
  for (int i = 0; i < 4; ++i)
    for (int o = 0; o < 2; ++o) {
      double ref = d.bias.at(o);
      for (int k = 0; k < 3; ++k) ref += x.at(i, k) * d.weight.at(o, k);
      CHECK(y.at(i, o) == doctest::Approx(ref).epsilon(1e-12));
    }
  // Gradients reach x, weight and bias (the layer's members are rebound to the checked leaves).
  auto r = gradcheck(
      [&](const std::vector<TD>& v) {
        d.weight = v[1];
        d.bias = v[2];
        return d(v[0]);
      },
      {randn<double>({4, 3}), randn<double>({2, 3}), randn<double>({2})});
  CHECK_MESSAGE(r.ok, r.message);
  // Batched input (..., in) and no bias.
  nn::LinearT<amp::fp64> nb(3, 5, /*bias=*/false);
  CHECK(nb.named_parameters<double>().size() == 1);
  CHECK(nb(randn<double>({2, 7, 3})).shape() == Shape{2, 7, 5});
  CHECK_THROWS_WITH_AS(nb(randn<double>({2, 4})), doctest::Contains("does not match weight of shape [5, 3]"), Error);
  CHECK_THROWS_AS(nn::Linear(0, 3), Error);
}

TEST_CASE("linear with ReLU in training: one node, the same values and gradients as matmul, add and relu") {
  using ember_test::bitwise_equal;
  using ember_test::ThreadsGuard;
  ThreadsGuard tg;
  manual_seed(11);
  // 70 x 37 -> 45: no dimension a whole number of micro-tiles; a 3-D input; negative pre-activations.
  const Tensor<float> x0 = randn<float>({2, 35, 37}), w0 = randn<float>({45, 37}), b0 = randn<float>({45});
  const Tensor<float> g = randn<float>({2, 35, 45});
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    cpu::set_num_threads(threads);
    auto leaves = [&] {
      return std::vector<Tensor<float>>{x0.clone().requires_grad_(true), w0.clone().requires_grad_(true),
                                        b0.clone().requires_grad_(true)};
    };
    std::vector<Tensor<float>> f = leaves(), u = leaves();
    Tensor<float> yf = linear(f[0], f[1], f[2], Activation::relu);
    REQUIRE(yf.grad_fn() != nullptr);
    CHECK(std::string(yf.grad_fn()->name()) == "LinearReluBackward");
    Tensor<float> yu = relu(matmul(u[0], u[1].t()) + u[2]);
    CHECK(bitwise_equal(yf, yu));
    yf.backward(g);
    yu.backward(g);
    CHECK(bitwise_equal(f[0].grad(), u[0].grad()));
    CHECK(bitwise_equal(f[1].grad(), u[1].grad()));
    CHECK(f[1].grad().is_contiguous());
    // The bias gradient is a column sum: accumulated in double here, so within float rounding of the other's.
    for (std::int64_t j = 0; j < 45; ++j) CHECK(f[2].grad().at(j) == doctest::Approx(u[2].grad().at(j)).epsilon(1e-5));
    // Without the activation: LinearBackward, the bias in the GEMM's write-back.
    Tensor<float> xn = x0.clone().requires_grad_(true), wn = w0.clone().requires_grad_(true);
    Tensor<float> yn = linear(xn, wn, b0);
    CHECK(std::string(yn.grad_fn()->name()) == "LinearBackward");
    CHECK(bitwise_equal(yn, Tensor<float>(matmul(x0, w0.t()) + b0)));
  }
  // A saved operand modified in place is reported; one that backward does not read may change (x needs no
  // gradient here, so the weight is not saved).
  Tensor<float> w = w0.clone().requires_grad_(true), xr = x0.clone().requires_grad_(true);
  Tensor<float> y = linear(xr, w, b0, Activation::relu);
  {
    NoGradGuard ng;
    w.fill_(0.f);
  }
  CHECK_THROWS_WITH_AS(y.backward(g), doctest::Contains("LinearReluBackward"), Error);
  Tensor<float> w2 = w0.clone().requires_grad_(true);
  Tensor<float> y2 = linear(x0, w2, b0, Activation::relu);
  {
    NoGradGuard ng;
    w2.fill_(0.f);
  }
  y2.backward(g);
  CHECK(w2.grad().defined());
  // The output modified in place before backward: ReLU's derivative reads it.
  Tensor<float> w3 = w0.clone().requires_grad_(true);
  Tensor<float> y3 = linear(x0, w3, b0, Activation::relu);
  {
    NoGradGuard ng;
    y3.fill_(1.f);
  }
  CHECK_THROWS_WITH_AS(y3.backward(g), doctest::Contains("modified by an in-place operation"), Error);
}

TEST_CASE("Sequential: Linear -> ReLU pairs run as one op, with the modules' values and gradients") {
  using ember_test::bitwise_equal;
  manual_seed(5);
  nn::Linear a(9, 20), b(20, 7);
  nn::Sequential seq(a, nn::ReLU(), b, nn::ReLU());
  seq.train();
  const Tensor<float> x = randn<float>({13, 9});
  Tensor<float> ys = seq(x);
  CHECK(std::string(ys.grad_fn()->name()) == "LinearReluBackward");
  sum(ys).backward();
  const Tensor<float> gw = a.weight.grad().clone(), gb = b.weight.grad().clone();
  seq.zero_grad();
  Tensor<float> yu = relu(b(Tensor<float>(relu(a(x)))));  // the modules one by one
  CHECK(bitwise_equal(ys, yu));
  sum(yu).backward();
  CHECK(bitwise_equal(gw, a.weight.grad()));
  CHECK(bitwise_equal(gb, b.weight.grad()));
  // In eval mode, without autograd, the same values.
  seq.eval();
  InferenceMode im;
  CHECK(bitwise_equal(seq(x), yu.detach()));
}

TEST_CASE("Sequential: runs its modules in order and names them by position") {
  manual_seed(3);
  nn::Linear a(4, 6), b(6, 2);
  nn::Sequential seq(a, nn::ReLU(), b, nn::Tanh());
  CHECK(seq.size() == 4);
  CHECK(names(seq.named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  Tensor<float> x = randn<float>({3, 4});
  Tensor<float> ref = tanh(b(Tensor<float>(relu(a(x)))));
  CHECK(max_abs_diff(seq(x), ref) == 0);
  CHECK_THROWS_WITH_AS(seq(randn<double>({3, 4})), doctest::Contains("module 0 has no forward for a float64"), Error);
  // Activations and Flatten accept any floating dtype.
  nn::Sequential any(nn::Flatten(), nn::GELU(), nn::SiLU(), nn::Sigmoid(), nn::LeakyReLU(0.2), nn::GELU(true));
  TD xd = randn<double>({2, 3, 4});
  TD yd = any(xd);
  CHECK(yd.shape() == Shape{2, 12});
  auto r = gradcheck([&](const std::vector<TD>& v) { return any(v[0]); }, {xd});
  CHECK_MESSAGE(r.ok, r.message);
}

namespace {
struct Block : nn::Module {
  nn::LayerNorm norm;
  nn::Linear fc;
  explicit Block(std::int64_t d) : nn::Module("Block"), norm(d), fc(d, d) {
    register_module("norm", norm);
    register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const { return Tensor<float>(x + fc(norm(x))); }
};
}  // namespace

TEST_CASE("ModuleList, ModuleDict, named_modules, apply, requires_grad_: the module tree as PyTorch's") {
  manual_seed(5);
  struct Net : nn::Module {
    nn::ModuleList blocks;
    nn::ModuleDict heads;
    Net() : nn::Module("Net") {
      for (int i = 0; i < 3; ++i) blocks.push_back(Block(4));
      heads.insert("cls", nn::Linear(4, 2));
      heads.insert("reg", nn::Linear(4, 1, false));
      register_module("blocks", blocks);
      register_module("heads", heads);
    }
  } net;
  CHECK(net.blocks.size() == 3);
  const auto np = names(net.named_parameters());
  REQUIRE(np.size() == 3 * 4 + 3);
  CHECK(np[0] == "blocks.0.norm.weight");
  CHECK(np[7] == "blocks.1.fc.bias");
  CHECK(np[12] == "heads.cls.weight");
  CHECK(np[14] == "heads.reg.weight");
  CHECK(net.num_parameters() == 3 * (4 + 4 + 16 + 4) + 10 + 4);
  CHECK(net.parameters(false).empty());  // Net registers no tensors of its own
  CHECK(net.blocks.parameters(false).empty());
  CHECK(net.blocks.at<Block>(-1).fc.parameters(false).size() == 2);

  // named_modules: this module first, then depth first in registration order; names and types as PyTorch's.
  std::vector<std::string> mods;
  for (auto& [n, m] : net.named_modules()) mods.push_back(n + ":" + m.type_name());
  CHECK(mods == std::vector<std::string>{":Net", "blocks:ModuleList", "blocks.0:Block", "blocks.0.norm:LayerNorm",
                                         "blocks.0.fc:Linear", "blocks.1:Block", "blocks.1.norm:LayerNorm",
                                         "blocks.1.fc:Linear", "blocks.2:Block", "blocks.2.norm:LayerNorm",
                                         "blocks.2.fc:Linear", "heads:ModuleDict", "heads.cls:Linear",
                                         "heads.reg:Linear"});
  CHECK(net.modules().size() == 14);
  CHECK(names(net.named_children()) == std::vector<std::string>{"blocks", "heads"});

  // apply: children before parents; a custom init through the handles writes the real parameters.
  std::vector<std::string> order;
  net.apply([&](nn::Module& m) {
    order.push_back(m.type_name());
    if (m.type_name() == "Linear") {
      Tensor<float> w = m.own_parameter<float>("weight");
      nn::init::constant_(w, 0.5);
    }
  });
  CHECK(order.front() == "LayerNorm");
  CHECK(order.back() == "Net");
  CHECK(order.size() == 14);
  CHECK(net.blocks.at<Block>(1).fc.weight.to_vector() == std::vector<float>(16, 0.5f));
  CHECK(net.heads.at<nn::Linear>("reg").weight.to_vector() == std::vector<float>(4, 0.5f));

  // Iterating the list runs the blocks; freezing the first block leaves its gradients empty.
  net.blocks.at<Block>(0).requires_grad_(false);
  Tensor<float> x = randn<float>({2, 4});
  Tensor<float> h = x;
  for (auto& b : net.blocks) h = static_cast<Block&>(b).forward(h);
  sum(net.heads.at<nn::Linear>("cls")(h)).backward();
  CHECK(!net.blocks.at<Block>(0).fc.weight.grad().defined());
  CHECK(!net.blocks.at<Block>(0).norm.weight.requires_grad());
  CHECK(net.blocks.at<Block>(1).fc.weight.grad().defined());
  net.requires_grad_(true);
  CHECK(net.blocks.at<Block>(0).fc.weight.requires_grad());

  CHECK(net.heads.contains("cls"));
  CHECK(net.heads.keys() == std::vector<std::string>{"cls", "reg"});
  CHECK_THROWS_WITH_AS(net.heads.at<Block>("cls"), doctest::Contains("key 'cls' holds a Linear"), Error);
  CHECK_THROWS_WITH_AS(net.heads["box"], doctest::Contains("no module under key 'box' (keys: 'cls', 'reg')"), Error);
  CHECK_THROWS_WITH_AS(net.blocks[3], doctest::Contains("index 3 is out of range for a list of 3"), Error);
  CHECK_THROWS_WITH_AS(net.heads.insert("cls", nn::ReLU()), doctest::Contains("'cls' is already registered"), Error);
  // The state dict round-trips through the containers' names.
  Net other;
  other.load_state_dict(net.state_dict());
  CHECK(other.heads.at<nn::Linear>("cls").weight.to_vector() == net.heads.at<nn::Linear>("cls").weight.to_vector());
}

TEST_CASE("Dropout: identity in eval, Bernoulli mask scaled by 1/(1-p) in training, reproducible by seed") {
  nn::Dropout d(0.3, 42);
  Tensor<float> x = ones<float>({100000});
  x.requires_grad_();
  Tensor<float> y = d(x);
  std::int64_t zeros_n = 0;
  bool scaled = true;
  for (std::int64_t i = 0; i < y.numel(); ++i) {
    const float v = rd(y, i);
    if (v == 0.f) ++zeros_n;
    else scaled = scaled && std::fabs(v - 1.f / 0.7f) < 1e-6f;
  }
  CHECK(scaled);
  CHECK(double(zeros_n) / 1e5 == doctest::Approx(0.3).epsilon(0.03));
  sum(y).backward();
  CHECK(max_abs_diff(x.grad(), y.detach()) == 0);  // the gradient is the same mask times the same scale
  nn::Dropout d2(0.3, 42);
  CHECK(max_abs_diff(d2(x.detach()), y.detach()) == 0);
  d.eval();
  CHECK(d(x).same_impl(x));
  CHECK_THROWS_AS(nn::Dropout(1.5), Error);
}

TEST_CASE("Dropout: masks from the default generator, fresh per layer and per call, replayed by manual_seed") {
  nn::Dropout a(0.5), b(0.5);
  const Tensor<float> x = ones<float>({4096});
  manual_seed(3);
  const Tensor<float> ya = a(x), yb = b(x), ya2 = a(x);
  CHECK(max_abs_diff(ya, yb) > 0);   // two layers of one model: different masks
  CHECK(max_abs_diff(ya, ya2) > 0);  // two calls of one layer: different masks
  manual_seed(3);
  CHECK(max_abs_diff(a(x), ya) == 0);
  CHECK(max_abs_diff(b(x), yb) == 0);
  // The generator is the whole state: restoring it (as checkpoints do) replays the masks.
  const Generator saved = default_generator();
  const Tensor<float> next = a(x);
  default_generator() = saved;
  CHECK(max_abs_diff(a(x), next) == 0);
  manual_seed(3);
  CHECK(max_abs_diff(nn::functional::dropout(x, 0.5), ya) == 0);
  CHECK(nn::functional::dropout(x, 0.5, false).same_impl(x));
  CHECK_THROWS_AS(nn::functional::dropout(x, -0.1), Error);
}

TEST_CASE("Embedding: rows of the table, accumulated gradients for repeated indices, padding_idx") {
  nn::EmbeddingT<amp::fp64> e(5, 3, /*padding_idx=*/1);
  for (int j = 0; j < 3; ++j) CHECK(e.weight.at(1, j) == 0.0);
  Tensor<std::int64_t> idx = tensor<std::int64_t>({{0, 2, 0}, {1, 4, 0}});
  TD y = e(idx);
  CHECK(y.shape() == Shape{2, 3, 3});
  for (int j = 0; j < 3; ++j) {
    CHECK(y.at(0, 1, j) == e.weight.at(2, j));
    CHECK(y.at(1, 1, j) == e.weight.at(4, j));
    CHECK(y.at(1, 0, j) == 0.0);
  }
  sum(y).backward();
  for (int j = 0; j < 3; ++j) {
    CHECK(e.weight.grad().at(0, j) == 3.0);  // index 0 appears three times
    CHECK(e.weight.grad().at(1, j) == 0.0);  // padding
    CHECK(e.weight.grad().at(3, j) == 0.0);  // unused
  }
  CHECK_THROWS_WITH_AS(e(tensor<std::int64_t>({7})), doctest::Contains("out of range"), Error);
  auto r = gradcheck(
      [&](const std::vector<TD>& v) {
        e.weight = v[0];
        return e(idx);
      },
      {randn<double>({5, 3})});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("init: gains, bounds and moments as torch.nn.init") {
  CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::ReLU) == doctest::Approx(std::sqrt(2.0)));
  CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::Tanh) == doctest::Approx(5.0 / 3.0));
  CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::LeakyReLU, std::sqrt(5.0)) ==
        doctest::Approx(std::sqrt(2.0 / 6.0)));
  Generator g(1);
  Tensor<double> w = empty<double>({256, 64, 3, 3});
  auto moments = [&] {
    double s = 0, s2 = 0;
    for (auto v : w.to_vector()) s += v, s2 += v * v;
    const double n = double(w.numel());
    return std::pair{s / n, std::sqrt(s2 / n - (s / n) * (s / n))};
  };
  nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::FanIn, nn::init::Nonlinearity::ReLU, g);
  CHECK(moments().second == doctest::Approx(std::sqrt(2.0 / (64 * 9))).epsilon(0.02));
  nn::init::xavier_uniform_(w, 1.0, g);
  CHECK(moments().second == doctest::Approx(std::sqrt(2.0 / (64 * 9 + 256 * 9))).epsilon(0.02));
  nn::init::normal_(w, 2.0, 0.5, g);
  CHECK(moments().first == doctest::Approx(2.0).epsilon(0.01));
  nn::init::zeros_(w);
  CHECK(moments().first == 0.0);
  Tensor<double> v = empty<double>({3});
  CHECK_THROWS_WITH_AS(nn::init::kaiming_uniform_(v), doctest::Contains("fewer than 2 dims"), Error);
}

TEST_CASE("Precision policy: a bf16-compute Linear keeps fp32 master weights and gradients") {
  manual_seed(11);
  nn::LinearT<amp::bf16_mixed> lb(16, 4);
  nn::Linear lf(16, 4);
  lf.load_state_dict(lb.state_dict());
  Tensor<float> x = randn<float>({8, 16});
  Tensor<bfloat16> xb = cast<bfloat16>(x);
  Tensor<bfloat16> yb = lb(xb);
  Tensor<float> yf = lf(x);
  CHECK(max_abs_diff(Tensor<float>(cast<float>(yb)), yf) < 0.05);
  Tensor<float> lossb = sum(cast<float>(yb));
  lossb.backward();
  sum(yf).backward();
  static_assert(std::is_same_v<decltype(lb.weight), Tensor<float>>);
  REQUIRE(lb.weight.grad().defined());
  CHECK(max_abs_diff(lb.weight.grad(), lf.weight.grad()) < 0.1);
  CHECK(max_abs_diff(lb.bias.grad(), lf.bias.grad()) == 0);
}

TEST_CASE("Conv2d and pooling layers: PyTorch's layout, names and printing; gradcheck through the layer") {
  manual_seed(2);
  nn::Conv2d c(4, 6, 3, {.padding = 1, .groups = 2, .bias = false});
  CHECK(c.weight.shape() == Shape{6, 2, 3, 3});
  CHECK(!c.bias.defined());
  CHECK(names(c.named_parameters()) == std::vector<std::string>{"weight"});
  const double bound = 1.0 / std::sqrt(2.0 * 9.0);
  for (float v : c.weight.to_vector()) CHECK(std::fabs(v) <= bound);
  std::ostringstream os;
  os << c;
  CHECK(os.str() == "Conv2d(4, 6, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), groups=2, bias=False)");
  CHECK(c(randn<float>({2, 4, 5, 5})).shape() == Shape{2, 6, 5, 5});
  CHECK_THROWS_AS(nn::Conv2d(3, 4, 3, {.groups = 2}), Error);

  nn::Conv2dT<amp::fp64> cd(2, 3, {2, 3}, {.stride = {2, 1}});
  nn::MaxPool2d mp(2);
  nn::AvgPool2d ap(2, {.stride = 1});
  nn::AdaptiveAvgPool2d aap({2, 1});
  auto r = gradcheck(
      [&](const std::vector<TD>& v) {
        cd.weight = v[1];
        cd.bias = v[2];
        const TD y = cd(v[0]);  // (1, 3, 3, 4)
        const TD s = sum(aap(ap(y)));
        return TD(mp(y) + s);
      },
      {randn<double>({1, 2, 6, 6}), randn<double>({3, 2, 2, 3}), randn<double>({3})});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("BatchNorm2d: batch statistics and running-stat updates in training, running statistics in eval") {
  nn::BatchNormT<2, amp::fp64> bn(3, {.momentum = 0.2});
  CHECK(bn.state_dict().size() == 5);  // weight, bias, running_mean, running_var, num_batches_tracked
  CHECK(bn.named_buffers().size() == 3);
  Generator g(4);
  TD x = randn<double>({4, 3, 2, 5}, g) * 2.0 + 1.0;
  TD y = bn(x);
  CHECK(bn.num_batches_tracked.item() == 1);
  for (int c = 0; c < 3; ++c) {
    double s = 0, s2 = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 10; ++i) {
        const double v = x.at(n, c, i / 5, i % 5);
        s += v, s2 += v * v;
      }
    const double mean = s / 40, var = s2 / 40 - mean * mean;
    CHECK(bn.running_mean.at(c) == doctest::Approx(0.2 * mean).epsilon(1e-12));
    CHECK(bn.running_var.at(c) == doctest::Approx(0.8 + 0.2 * var * 40 / 39).epsilon(1e-12));  // unbiased
    CHECK(y.at(1, c, 1, 2) == doctest::Approx((x.at(1, c, 1, 2) - mean) / std::sqrt(var + 1e-5)).epsilon(1e-9));
  }
  bn.eval();
  TD ye = bn(x);
  CHECK(bn.num_batches_tracked.item() == 1);  // eval does not count
  CHECK(ye.at(0, 2, 0, 0) ==
        doctest::Approx((x.at(0, 2, 0, 0) - bn.running_mean.at(2)) / std::sqrt(bn.running_var.at(2) + 1e-5)));
  CHECK_THROWS_WITH_AS(bn(randn<double>({4, 2, 2, 2})), doctest::Contains("expected 3 channels"), Error);
  CHECK_THROWS_WITH_AS(bn(randn<double>({4, 3})), doctest::Contains("expected a 4-D input"), Error);
  bn.train();
  auto r = gradcheck(
      [&](const std::vector<TD>& v) {
        bn.weight = v[1];
        bn.bias = v[2];
        return bn(v[0]);
      },
      {randn<double>({3, 3, 2, 2}), randn<double>({3}), randn<double>({3})});
  CHECK_MESSAGE(r.ok, r.message);
  nn::BatchNorm1d b1(5, {.affine = false, .track_running_stats = false});
  CHECK(b1.state_dict().empty());
  Tensor<float> z = b1(randn<float>({8, 5, 3}));
  CHECK(std::fabs(mean(z).item()) < 1e-5);
}

TEST_CASE("BatchNorm2d with corrupt running statistics from a state dict: an error naming them, not NaN or overflow") {
  nn::Sequential model(nn::Conv2d(2, 3, 1), nn::BatchNorm2d(3));
  const nn::StateDict good = model.state_dict();
  const Tensor<float> x = randn<float>({2, 2, 3, 3});
  auto loaded = [&](const std::string& key, const AnyTensor& t) {
    nn::StateDict sd = good;
    sd[key] = t;
    model.load_state_dict(sd);
  };
  Tensor<float> var = ones<float>({3});
  var.data()[1] = -2.f;
  loaded("1.running_var", var);
  model.eval();
  CHECK_THROWS_WITH_AS(model(x), doctest::Contains("batch_norm: running_var[1] is -2 (eps 1e-05); in eval the "
                                                   "running variance plus eps must be positive"),
                       Error);
  CHECK_THROWS_WITH_AS(nn::fuse_conv_bn(model), doctest::Contains("nn::fuse_conv_bn: running_var[1] is -2"), Error);
  var.data()[1] = std::numeric_limits<float>::quiet_NaN();
  loaded("1.running_var", var);
  CHECK_THROWS_WITH_AS(model(x), doctest::Contains("running_var[1] is nan"), Error);
  loaded("1.running_var", ones<float>({3}));
  CHECK(std::isfinite(double(sum(model(x)).item())));

  model.train();
  for (const std::int64_t n : {std::int64_t(-1), std::numeric_limits<std::int64_t>::max()}) {
    CAPTURE(n);
    loaded("1.num_batches_tracked", full<std::int64_t>(Shape{}, n));
    const std::string want = "BatchNorm2d: num_batches_tracked is " + std::to_string(n) +
                             ", expected a count in [0, 2^62)";
    CHECK_THROWS_WITH_AS(model(x), doctest::Contains(want.c_str()), Error);
  }
  loaded("1.num_batches_tracked", full<std::int64_t>(Shape{}, 41));
  model(x);
  CHECK(std::get<Tensor<std::int64_t>>(model.state_dict().at("1.num_batches_tracked")).item() == 42);
}

TEST_CASE("LayerNorm: normalises the trailing dims; gradcheck through the layer") {
  nn::LayerNormT<amp::fp64> ln(Shape{2, 3});
  TD x = randn<double>({4, 2, 3});
  TD y = ln(x);
  double s = 0, s2 = 0;
  for (int i = 0; i < 6; ++i) s += y.at(1, i / 3, i % 3), s2 += y.at(1, i / 3, i % 3) * y.at(1, i / 3, i % 3);
  CHECK(s / 6 == doctest::Approx(0).epsilon(1e-9));
  CHECK(s2 / 6 == doctest::Approx(1).epsilon(1e-4));
  auto r = gradcheck(
      [&](const std::vector<TD>& v) {
        ln.weight = v[1];
        ln.bias = v[2];
        return ln(v[0]);
      },
      {randn<double>({3, 2, 3}), randn<double>({2, 3}), randn<double>({2, 3})});
  CHECK_MESSAGE(r.ok, r.message);
}

TEST_CASE("Embedding: an index outside [0, num_embeddings) is an error naming the op, the index and the range") {
  // PyTorch's Embedding raises on -1 (a corrupt token id) instead of wrapping to the last row.
  nn::EmbeddingT<amp::fp64> e(5, 3);
  EXPECT_ERROR([&] { (void)e(tensor<std::int64_t>({{0, 2}, {-1, 4}})); },
               {"Embedding", "index -1", "position 2", "[0, 5)"});
  EXPECT_ERROR([&] { (void)e(tensor<std::int64_t>({5})); }, {"Embedding", "index 5", "[0, 5)"});
  EXPECT_ERROR([&] { (void)e(tensor<std::int64_t>({-5})); }, {"Embedding", "index -5", "[0, 5)"});
  // With a padding_idx given as a negative number (PyTorch wraps padding_idx itself), lookups still must be >= 0.
  nn::EmbeddingT<amp::fp64> p(5, 3, /*padding_idx=*/-1);
  CHECK(p.padding_idx == 4);
  EXPECT_ERROR([&] { (void)p(tensor<std::int64_t>({-1})); }, {"Embedding", "index -1", "[0, 5)"});
  CHECK(p(tensor<std::int64_t>({4})).to_vector() == std::vector<double>{0, 0, 0});
  // A strided (non-contiguous) index tensor is checked element by element too.
  const Tensor<std::int64_t> strided = tensor<std::int64_t>({{0, 1}, {-2, 3}}).t();
  EXPECT_ERROR([&] { (void)e(strided); }, {"Embedding", "index -2"});
}

namespace {
// max |got - ref| / max |ref| over all elements (a norm-wise relative error).
double rel_err(const Tensor<float>& got, const Tensor<float>& ref) {
  const Tensor<float> g = got.contiguous(), r = ref.contiguous();
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    num = std::max(num, std::fabs(double(g.data()[i]) - double(r.data()[i])));
    den = std::max(den, std::fabs(double(r.data()[i])));
  }
  return den > 0 ? num / den : num;
}

// Runs a policy layer and its fp32 twin (same parameters) on the same inputs (rounded to the compute type once),
// forward and backward against the same output gradient, and checks that the output, the input gradient and every
// parameter gradient (on the fp32 masters) agree norm-wise within 16 units of the compute type's epsilon: the
// inputs and outputs are rounded once each and everything inside accumulates in fp32.
template <class C, class LayerC, class LayerF, class In>
void check_policy_layer(const char* what, LayerC& lc, LayerF& lf, const In& input) {
  CAPTURE(what);
  lf.load_state_dict(lc.state_dict());
  const double tol = 16 * double(std::numeric_limits<C>::epsilon());
  Tensor<C> yc;
  Tensor<float> yf, xc_grad, xf_grad;
  if constexpr (std::is_same_v<In, Tensor<float>>) {
    Tensor<C> xc = cast<C>(input);
    Tensor<float> xf = cast<float>(xc);
    xc.requires_grad_(true);
    xf.requires_grad_(true);
    yc = lc(xc);
    yf = lf(xf);
    const Tensor<float> g = cast<float>(Tensor<C>(cast<C>(randn<float>(yf.shape()))));
    sum(cast<float>(yc) * g).backward();
    sum(yf * g).backward();
    CHECK(rel_err(Tensor<float>(cast<float>(xc.grad())), xf.grad()) <= tol);
  } else {  // indices
    yc = lc(input);
    yf = lf(input);
    const Tensor<float> g = cast<float>(Tensor<C>(cast<C>(randn<float>(yf.shape()))));
    sum(cast<float>(yc) * g).backward();
    sum(yf * g).backward();
  }
  CHECK(rel_err(Tensor<float>(cast<float>(yc)), yf) <= tol);
  const auto pc = lc.template named_parameters<float>(), pf = lf.template named_parameters<float>();
  REQUIRE(pc.size() == pf.size());
  for (std::size_t i = 0; i < pc.size(); ++i) {
    CAPTURE(pc[i].first);
    REQUIRE(pc[i].second.grad().defined());  // the gradient lands on the fp32 master
    CHECK(rel_err(pc[i].second.grad(), pf[i].second.grad()) <= tol);
  }
}
}  // namespace

TEST_CASE_TEMPLATE("Precision policies: Linear, Conv2d, BatchNorm2d, LayerNorm, Embedding in bf16/fp16 match fp32", P,
                   amp::bf16_mixed, amp::fp16_mixed) {
  using C = typename P::compute_t;
  manual_seed(21);
  {
    nn::LinearT<P> lc(40, 24);
    nn::Linear lf(40, 24);
    check_policy_layer<C>("Linear", lc, lf, randn<float>({16, 40}));
  }
  {
    nn::Conv2dT<P> lc(6, 8, 3, {.padding = 1});
    nn::Conv2d lf(6, 8, 3, {.padding = 1});
    check_policy_layer<C>("Conv2d", lc, lf, randn<float>({4, 6, 9, 9}));
  }
  {
    nn::BatchNormT<2, P> lc(6);
    nn::BatchNorm2d lf(6);
    {
      NoGradGuard ng;
      lc.weight.copy_(Tensor<float>(rand<float>({6}) + 0.5f));
      lc.bias.copy_(randn<float>({6}));
    }
    check_policy_layer<C>("BatchNorm2d", lc, lf, Tensor<float>(randn<float>({8, 6, 5, 5}) * 3.0f + 1.0f));
  }
  {
    nn::LayerNormT<P> lc(32);
    nn::LayerNorm lf(32);
    {
      NoGradGuard ng;
      lc.weight.copy_(Tensor<float>(rand<float>({32}) + 0.5f));
      lc.bias.copy_(randn<float>({32}));
    }
    check_policy_layer<C>("LayerNorm", lc, lf, Tensor<float>(randn<float>({10, 32}) * 2.0f - 1.0f));
  }
  {
    nn::EmbeddingT<P> lc(50, 12);
    nn::Embedding lf(50, 12);
    check_policy_layer<C>("Embedding", lc, lf, randint<std::int64_t>(0, 50, {7, 5}));
  }
}
