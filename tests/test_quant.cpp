// INT8 post-training quantization (quant/): the int8 GEMM on every kernel path the build compiled, exact against an
// integer reference (values that saturate a plain vpmaddubsw included); quantized Linear and Conv2d equal to the
// float computation on the dequantized operands and within the quantization error of the float layer; prepare,
// calibrate, convert on a folded model; save and load; errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "helpers.hpp"
#include "reference_checks.hpp"
#include "ember/io.hpp"
#include "ember/nn/fuse.hpp"
#include "ember/quant.hpp"

namespace {

using namespace ember_test;
using TF = Tensor<float>;
namespace q = ember::cpu::q;

std::vector<q::Path> compiled_paths() {
  std::vector<q::Path> out;
  for (q::Path p : {q::Path::scalar, q::Path::avx2, q::Path::vnni256, q::Path::vnni512})
    if (q::path_compiled(p)) out.push_back(p);
  return out;
}

template <class TA, class TB>
void check_gemm(q::Path path, i64 m, i64 n, i64 k, bool extremes, std::uint32_t seed) {
  std::mt19937 g(seed);
  const i64 lda = q::round_up(k, 4) + 4;
  auto draw = [&](auto t) {
    using T = decltype(t);
    const int lo = std::is_signed_v<T> ? -128 : 0, hi = std::is_signed_v<T> ? 127 : 255;
    if (extremes) return T(g() % 2 ? hi : lo);
    return T(lo + int(g() % std::uint32_t(hi - lo + 1)));
  };
  std::vector<TA> a(std::size_t(m * lda), TA(0));
  std::vector<TB> b(std::size_t(n * k));
  for (i64 i = 0; i < m; ++i)
    for (i64 c = 0; c < k; ++c) a[std::size_t(i * lda + c)] = draw(TA());
  for (auto& v : b) v = draw(TB());
  q::PackedB<TB> pb;
  q::pack_b(b.data(), k, n, k, pb);
  const i64 ldc = n + 3;
  std::vector<std::int32_t> c(std::size_t(m * ldc), -7);
  q::gemm(a.data(), lda, m, pb, c.data(), ldc, path);
  i64 bad = 0;
  for (i64 i = 0; i < m; ++i)
    for (i64 j = 0; j < ldc; ++j) {
      std::int64_t s = -7;  // the columns past n are not written
      if (j < n) {
        s = 0;
        for (i64 t = 0; t < k; ++t) s += std::int64_t(a[std::size_t(i * lda + t)]) * b[std::size_t(j * k + t)];
      }
      bad += s != c[std::size_t(i * ldc + j)];
    }
  INFO("path ", std::string(q::path_name(path)), " m=", m, " n=", n, " k=", k, " extremes=", extremes);
  CHECK(bad == 0);
}

/// The float computation the int8 layer stands for: its dequantized weight, in double.
std::vector<double> dequantized_weight(const quant::QuantizedLayer& l) {
  std::vector<double> w(std::size_t(l.weight.numel()));
  const i64 per = l.weight.numel() / l.out;
  for (i64 o = 0; o < l.out; ++o)
    for (i64 k = 0; k < per; ++k)
      w[std::size_t(o * per + k)] = double(l.weight.data()[o * per + k]) * double(l.weight_scale.data()[o]);
  return w;
}

/// x quantized with the layer's input parameters and dequantized (float32 math as the kernel: x · (1/s)).
std::vector<double> fake_quant_input(const quant::QuantizedLayer& l, const TF& x) {
  const TF xc = x.contiguous();
  const float inv = 1.0f / l.input.scale;
  std::vector<double> out(std::size_t(xc.numel()));
  for (i64 i = 0; i < xc.numel(); ++i) {
    const float r = std::nearbyint(xc.data()[i] * inv) + float(l.zp_u8);
    const int qv = int(std::min(255.0f, std::max(0.0f, r)));
    out[std::size_t(i)] = double(qv - l.zp_u8) * double(l.input.scale);
  }
  return out;
}

double act_ref(Activation a, double v) {
  switch (a) {
    case Activation::relu: return v > 0 ? v : 0;
    case Activation::silu: return v / (1 + std::exp(-v));
    case Activation::gelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    default: return v;
  }
}

/// Naive conv2d in double on flat NCHW buffers.
std::vector<double> conv_ref(const std::vector<double>& x, Shape xs, const std::vector<double>& w, Shape wsh,
                             const float* bias, const Conv2dOptions& o, i64 oh, i64 ow) {
  const i64 N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = wsh[0], cg = wsh[1], KH = wsh[2], KW = wsh[3];
  const i64 og = O / o.groups;
  std::vector<double> y(std::size_t(N * O * oh * ow));
  for (i64 n = 0; n < N; ++n)
    for (i64 oc = 0; oc < O; ++oc)
      for (i64 yy = 0; yy < oh; ++yy)
        for (i64 xx = 0; xx < ow; ++xx) {
          double s = bias[oc];
          const i64 grp = oc / og;
          for (i64 c = 0; c < cg; ++c)
            for (i64 i = 0; i < KH; ++i)
              for (i64 j = 0; j < KW; ++j) {
                const i64 iy = yy * o.stride.h - o.padding.h + i * o.dilation.h;
                const i64 ix = xx * o.stride.w - o.padding.w + j * o.dilation.w;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                s += x[std::size_t(((n * C + grp * cg + c) * H + iy) * W + ix)] *
                     w[std::size_t(((oc * cg + c) * KH + i) * KW + j)];
              }
          y[std::size_t(((n * O + oc) * oh + yy) * ow + xx)] = s;
        }
  (void)C;
  return y;
}

double max_abs(const TF& t) {
  double m = 0;
  const TF c = t.contiguous();
  for (i64 i = 0; i < c.numel(); ++i) m = std::max(m, std::abs(double(c.data()[i])));
  return m;
}

double max_diff(const TF& a, const TF& b) {
  REQUIRE(a.shape() == b.shape());
  const TF ac = a.contiguous(), bc = b.contiguous();
  double d = 0;
  for (i64 i = 0; i < ac.numel(); ++i) d = std::max(d, std::abs(double(ac.data()[i]) - double(bc.data()[i])));
  return d;
}

TF randn_f(Shape s, std::uint64_t seed, double scale = 1, double shift = 0) {
  const auto d = normal(s, seed, scale, shift);
  TF out = empty<float>(s);
  for (i64 i = 0; i < d.numel(); ++i) out.data()[i] = float(d.data()[i]);
  return out;
}

struct Net : nn::Module {
  nn::Conv2d conv1{3, 8, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn1{8};
  nn::ReLU relu1;
  nn::Conv2d conv2{8, 12, 3, {.stride = 2, .groups = 2}};
  nn::Linear fc{12 * 3 * 3, 5};
  Net() : nn::Module("Net") {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("relu1", relu1);
    register_module("conv2", conv2);
    register_module("fc", fc);
  }
  TF forward(const TF& x) const {
    const TF h1 = relu1(bn1(conv1(x)));
    const TF h2 = relu(conv2(h1));
    return fc(h2.reshape({h2.size(0), -1}));
  }
};

void randomise(Net& m, std::uint64_t seed) {
  const auto mean = normal({8}, seed, 0.3), var = normal({8}, seed + 1), g = normal({8}, seed + 2);
  for (i64 c = 0; c < 8; ++c) {
    m.bn1.running_mean.data()[c] = float(mean.data()[c]);
    m.bn1.running_var.data()[c] = float(0.5 + var.data()[c] * var.data()[c]);
    m.bn1.weight.data()[c] = float(1 + 0.3 * g.data()[c]);
  }
}

}  // namespace

TEST_CASE("int8 GEMM: every compiled path exact against an integer reference, saturating values included") {
  const auto paths = compiled_paths();
  MESSAGE("int8 GEMM paths in this build: ", paths.size(), " (best: ", std::string(q::path_name(q::best_path())), ")");
  std::uint32_t seed = 1;
  for (q::Path p : paths)
    for (i64 m : {1, 4, 6, 7, 13})
      for (i64 n : {1, 15, 16, 17, 33, 50})
        for (i64 k : {1, 3, 4, 9, 130})
          for (bool ext : {false, true}) {
            check_gemm<std::uint8_t, std::int8_t>(p, m, n, k, ext, seed++);
            check_gemm<std::int8_t, std::uint8_t>(p, m, n, k, ext, seed++);
          }
}

TEST_CASE("quantized Linear equals the float math on dequantized operands and is within the quantization error") {
  for (auto act : {Activation::none, Activation::relu, Activation::gelu}) {
    for (auto dt : {quant::QDtype::quint8, quant::QDtype::qint8}) {
      const i64 M = 70, K = 37, O = 19;  // rows past one thread block; K not a multiple of 4
      const TF w = randn_f({O, K}, 11, 0.3), bias = randn_f({O}, 12), x = randn_f({M, K}, 13, 1.0, 0.4);
      quant::Observer obs({.dtype = dt});
      obs.observe(x.data(), x.numel());
      quant::QuantizedLayer l;
      l.name = "fc";
      const auto scales = quant::symmetric_scales(w.data(), O, K);
      l.weight = empty<std::int8_t>(Shape{O, K});
      for (i64 o = 0; o < O; ++o)
        for (i64 k = 0; k < K; ++k)
          l.weight.data()[o * K + k] = std::int8_t(std::nearbyint(w.data()[o * K + k] / scales[std::size_t(o)]));
      l.weight_scale = empty<float>(Shape{O});
      std::copy(scales.begin(), scales.end(), l.weight_scale.data());
      l.bias = bias;
      l.input = obs.qparams();
      l.input_dtype = dt;
      l.act = act;
      l.prepare();
      const auto wd = dequantized_weight(l), xd = fake_quant_input(l, x);
      for (q::Path p : compiled_paths()) {
        const TF y = quant::quantized_linear(l, x, p);
        REQUIRE(y.shape() == Shape{M, O});
        double worst = 0, worst_float = 0, bound_excess = 0;
        for (i64 m = 0; m < M; ++m)
          for (i64 o = 0; o < O; ++o) {
            double s = bias.data()[o], f = bias.data()[o], bound = 0;
            for (i64 k = 0; k < K; ++k) {
              s += xd[std::size_t(m * K + k)] * wd[std::size_t(o * K + k)];
              const double xv = x.data()[m * K + k], wv = w.data()[o * K + k];
              f += xv * wv;
              // |x̂ŵ - xw| <= |w|·dx + |x|·dw + dx·dw with dx <= s_x/2, dw <= s_w/2
              bound += std::abs(wv) * l.input.scale / 2 + std::abs(xv) * scales[std::size_t(o)] / 2 +
                       l.input.scale * scales[std::size_t(o)] / 4;
            }
            const double got = y.data()[m * O + o];
            worst = std::max(worst, std::abs(got - act_ref(act, s)) / (1 + std::abs(s)));
            const double err = std::abs(got - act_ref(act, f));
            worst_float = std::max(worst_float, err);
            bound_excess = std::max(bound_excess, err - (bound * 1.001 + 1e-5));
          }
        INFO("path ", std::string(q::path_name(p)), " act ", std::string(activation_name(act)));
        CHECK(worst < 2e-6);         // float rounding of the epilogue only
        CHECK(bound_excess <= 0);    // within the quantization error of the float layer
        CHECK(worst_float > 1e-4);   // and the int8 layer really is quantized
      }
    }
  }
}

TEST_CASE("quantized Conv2d: stride, padding, dilation, groups, zero point padding, every path bit for bit") {
  // Stride 1 reads the padded planes directly; other strides copy the taps. With 4 or more input channels per group
  // the AVX512-VNNI path is the direct kernel (channel quads, blocks of 16 outputs): C and O cover a partial quad
  // and 1 to 5 blocks of outputs (each register tile shape).
  struct Sizes {
    i64 c, o;
  };
  for (const Sizes sz : {Sizes{4, 6}, Sizes{10, 6}, Sizes{16, 34}, Sizes{18, 80}, Sizes{8, 140}})
  for (const Conv2dOptions o : {Conv2dOptions{.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2},
                                Conv2dOptions{.stride = 1, .padding = {2, 1}, .dilation = {2, 1}, .groups = 2},
                                Conv2dOptions{.stride = 1, .padding = 0, .dilation = 1, .groups = 2}}) {
    INFO("stride ", o.stride.str(), " padding ", o.padding.str(), " dilation ", o.dilation.str(), " C ", sz.c, " O ",
         sz.o);
    const i64 N = 3, C = sz.c, H = 9, W = 8, O = sz.o, KH = 3, KW = 2;
    const TF x = randn_f({N, C, H, W}, 21, 1.0, 0.7), w = randn_f({O, C / 2, KH, KW}, 22, 0.5),
             bias = randn_f({O}, 23);
    quant::Observer obs;
    obs.observe(x.data(), x.numel());
    quant::QuantizedLayer l;
    l.conv = true;
    l.name = "conv";
    const i64 per = C / 2 * KH * KW;
    const auto scales = quant::symmetric_scales(w.data(), O, per);
    l.weight = empty<std::int8_t>(w.shape());
    for (i64 i = 0; i < w.numel(); ++i)
      l.weight.data()[i] = std::int8_t(std::nearbyint(w.data()[i] / scales[std::size_t(i / per)]));
    l.weight_scale = empty<float>(Shape{O});
    std::copy(scales.begin(), scales.end(), l.weight_scale.data());
    l.bias = bias;
    l.input = obs.qparams();
    CHECK(l.input.zero_point > 0);  // the padding must read the zero point, not 0
    l.act = Activation::relu;
    l.conv_options = o;
    l.prepare();
    const TF ref_float = ember::conv2d(x, w, bias, o);
    const i64 oh = ref_float.size(2), ow = ref_float.size(3);
    const auto y_ref = conv_ref(fake_quant_input(l, x), x.shape(), dequantized_weight(l), w.shape(), bias.data(), o, oh,
                                ow);
    TF first;
    for (q::Path p : compiled_paths()) {
      for (int threads : {1, 2}) {
        cpu::set_num_threads(threads);
        const TF y = quant::quantized_conv2d(l, x, p);
        cpu::set_num_threads(2);
        REQUIRE(y.shape() == ref_float.shape());
        double worst = 0;
        for (i64 i = 0; i < y.numel(); ++i)
          worst = std::max(worst, std::abs(double(y.data()[i]) - act_ref(l.act, y_ref[std::size_t(i)])) /
                                      (1 + std::abs(y_ref[std::size_t(i)])));
        INFO("path ", std::string(q::path_name(p)), " threads ", threads);
        CHECK(worst < 2e-6);
        if (!first.defined()) first = y;
        CHECK(max_diff(y, first) == 0);
      }
    }
    // Against the float convolution: close, as quantized (a few % of the output range).
    const TF yq = quant::quantized_conv2d(l, x), yf = relu(ref_float);
    CHECK(max_diff(yq, yf) < 0.05 * max_abs(yf));
    CHECK(max_diff(yq, yf) > 0);
    // Unbatched input.
    CHECK(max_diff(quant::quantized_conv2d(l, x.select(0, 1)), quant::quantized_conv2d(l, x).select(0, 1)) == 0);
    // A fused 2x2 max pool equals pooling the output: int32 sums pooled first (none, relu) or after (gelu), odd
    // output sizes included.
    for (auto act : {Activation::none, Activation::relu, Activation::gelu}) {
      quant::QuantizedLayer plain = l, pooled = l;
      plain.act = pooled.act = act;
      pooled.pool = true;
      plain.prepare();
      pooled.prepare();
      const TF want = max_pool2d(quant::quantized_conv2d(plain, x), 2), got = quant::quantized_conv2d(pooled, x);
      INFO("act ", std::string(activation_name(act)), " output ", ref_float.shape().str());
      CHECK(max_diff(got, want) == 0);
    }
  }
}

TEST_CASE("prepare, calibrate, convert a folded model; save and load give the same outputs") {
  manual_seed(3);
  Net net;
  randomise(net, 5);
  net.eval();
  nn::fuse_modules(net, {{"conv1", "bn1", "relu1"}});
  const TF calib = randn_f({32, 3, 8, 8}, 31), test = randn_f({6, 3, 8, 8}, 32);
  TF y_float;
  {
    InferenceMode g;
    y_float = net.forward(test);
  }
  CHECK(quant::convert(net) == 0);  // nothing prepared
  CHECK(quant::prepare(net, {.activation = {.kind = quant::ObserverKind::histogram, .percentile = 99.99}}) == 3);
  CHECK_THROWS_WITH_AS(quant::convert(net), doctest::Contains("observed no calibration data"), ember::Error);
  {
    InferenceMode g;
    for (i64 b = 0; b < 4; ++b) (void)net.forward(calib.narrow(0, b * 8, 8));
    CHECK(max_diff(net.forward(test), y_float) == 0);  // observing changes nothing
  }
  CHECK(quant::convert(net) == 3);
  CHECK(net.conv1.type_name() == "QuantizedConv2d");
  CHECK(quant::quantized_layer(net, "conv1") != nullptr);
  CHECK(quant::quantized_layer(net, "conv1")->act == Activation::relu);  // the fused ReLU runs in the epilogue
  const auto sd = net.state_dict();
  CHECK(sd.count("conv1.weight") == 0);  // the float weights left the registry
  CHECK(sd.count("fc.bias") == 0);
  TF y_int8;
  {
    InferenceMode g;
    y_int8 = net.forward(test);
  }
  CHECK(max_diff(y_int8, y_float) < 0.08 * max_abs(y_float));
  CHECK(max_diff(y_int8, y_float) > 0);

  TempDir dir;
  const std::string path = dir / "int8.safetensors";
  quant::save(net, path);
  const auto file = io::load_safetensors(path);
  CHECK(io::scalar_type(file.tensors.at("conv2.weight")) == ScalarType::Int8);
  CHECK(io::shape_of(file.tensors.at("conv2.weight_scale")) == Shape{12});
  CHECK(file.metadata.at("input_dtype/fc") == "quint8");

  Net fresh;
  fresh.eval();
  nn::fuse_modules(fresh, {{"conv1", "bn1", "relu1"}});
  quant::load(fresh, path);
  {
    InferenceMode g;
    CHECK(max_diff(fresh.forward(test), y_int8) == 0);
  }
  // A float model that was not folded the same way does not match the file, and nothing changes.
  Net unfolded;
  unfolded.eval();
  CHECK_THROWS_WITH_AS(quant::load(unfolded, path), doctest::Contains("does not match"), ember::Error);
  CHECK(unfolded.conv1.type_name() == "Conv2d");
  CHECK(quant::quantized_layer(unfolded, "conv1") == nullptr);
  // A file of another kind.
  io::save_safetensors(dir / "plain.safetensors", {{"x", io::AnyTensor(TF(zeros<float>(Shape{2})))}});
  CHECK_THROWS_WITH_AS(quant::load(fresh, dir / "plain.safetensors"), doctest::Contains("not an ember int8 model"),
                       ember::Error);
  // The file's values, edited: a NaN bias, an input scale whose reciprocal is infinite, scales whose product
  // overflows. Each would have reached every output silently; each is an error naming the layer, and nothing
  // changes.
  struct Edit {
    const char* key;
    std::int64_t i;
    float v;
  };
  auto tampered = [&](std::initializer_list<Edit> edits) {
    io::SafeTensors f = io::load_safetensors(path);
    for (const Edit& e : edits) {
      TF t = io::get_as<float>(f.tensors.at(e.key), e.key).clone();
      t.data()[e.i] = e.v;
      f.tensors.at(e.key) = io::AnyTensor(t);
    }
    io::save_safetensors(dir / "tampered.safetensors", f.tensors, f.metadata);
    Net target;
    target.eval();
    nn::fuse_modules(target, {{"conv1", "bn1", "relu1"}});
    std::string msg;
    try {
      quant::load(target, dir / "tampered.safetensors");
    } catch (const ember::Error& e) {
      msg = e.what();
    }
    CHECK((quant::quantized_layer(target, "conv2") == nullptr) == !msg.empty());  // all or nothing
    return msg;
  };
  CHECK(tampered({{"conv2.bias", 3, std::nanf("")}}).find("'conv2': bias[3] = nan (must be finite)") !=
        std::string::npos);
  CHECK(tampered({{"conv2.input_scale", 0, 1e-45f}}).find("'conv2': input scale") != std::string::npos);
  CHECK(tampered({{"conv2.input_scale", 0, 1e30f}, {"conv2.weight_scale", 5, 1e10f}})
            .find("times weight_scale[5] = 1e+10 overflows a float") != std::string::npos);
  // Ordinary edits load, and so does a product of scales that underflows (that channel's outputs are that small).
  CHECK(tampered({{"conv2.bias", 3, 0.25f}}).empty());
  CHECK(tampered({{"conv2.weight_scale", 5, 1e-37f}}).empty());
  // Shapes must be exact: a [12, 1] weight_scale or bias where [12] is saved, a [1, 1] input scale, a 0-d zero point.
  auto reshaped = [&](const char* key, Shape to) {
    io::SafeTensors f = io::load_safetensors(path);
    std::visit([&](auto& t) { t = t.reshape(to); }, f.tensors.at(key));
    io::save_safetensors(dir / "reshaped.safetensors", f.tensors, f.metadata);
    Net target;
    target.eval();
    nn::fuse_modules(target, {{"conv1", "bn1", "relu1"}});
    const std::string msg = error_of([&] { quant::load(target, dir / "reshaped.safetensors"); });
    CHECK(quant::quantized_layer(target, "conv2") == nullptr);
    return msg;
  };
  CHECK(reshaped("conv2.weight_scale", Shape{12, 1}).find("'conv2': weight_scale and bias must have shape [12], got "
                                                         "[12, 1]") != std::string::npos);
  CHECK(reshaped("conv2.bias", Shape{1, 12}).find("must have shape [12]") != std::string::npos);
  CHECK(reshaped("conv2.input_scale", Shape{1, 1}).find("of 'conv2' must have shape [1], got [1, 1] and [1]") !=
        std::string::npos);
  CHECK(reshaped("conv2.input_zero_point", Shape{}).find("must have shape [1], got [1] and []") != std::string::npos);
}

TEST_CASE("quantization options and errors") {
  Net net;
  randomise(net, 7);
  CHECK_THROWS_WITH_AS(quant::prepare(net), doctest::Contains("training mode"), ember::Error);
  net.eval();
  CHECK_THROWS_WITH_AS(quant::prepare(net, {.keep_float = {"conv9"}}), doctest::Contains("conv9"), ember::Error);
  CHECK(quant::prepare(net, {.keep_first = true, .keep_last = true}) == 1);
  {
    InferenceMode g;
    (void)net.forward(randn_f({2, 3, 8, 8}, 41));
    CHECK_THROWS_WITH_AS(net.conv2.forward(Tensor<float>()), doctest::Contains(""), ember::Error);
  }
  CHECK(quant::convert(net) == 1);
  CHECK(net.conv1.type_name() == "Conv2d");
  CHECK(net.conv2.type_name() == "QuantizedConv2d");
  CHECK(net.fc.type_name() == "Linear");
  CHECK_THROWS_WITH_AS(quant::prepare(net), doctest::Contains("already converted"), ember::Error);
  // NaN has no int8 value.
  TF bad = randn_f({1, 8, 8, 8}, 42);
  bad.data()[17] = std::nanf("");
  CHECK_THROWS_WITH_AS(net.conv2.forward(bad), doctest::Contains("NaN"), ember::Error);
  // Wrong input shape names the layer.
  CHECK_THROWS_WITH_AS(net.conv2.forward(randn_f({1, 5, 8, 8}, 43)), doctest::Contains("conv2"), ember::Error);
}
