// conv2d (fp32, bfloat16, half) and fp32 max_pool2d at the Fashion-MNIST CNN's shapes (batch 128), through ember's autograd API, as
// FLOP/s (2 * N * O * oh * ow * C/groups * kh * kw per convolution; a training step is the forward plus the
// weight gradient, plus the input gradient when the input needs one) and bytes/s for pooling (input read plus
// output written). Wall-clock time because the work runs on the thread pool.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <ember/ember.hpp>
#include <ember/quant/layers.hpp>
#include <ember/quant/quantize.hpp>

using namespace ember;  // as ember's users write it

namespace {

struct ConvShape {
  std::int64_t n, c, h, w, o, k, pad;
  bool input_grad;  // the first layer's input (the images) needs no gradient
};
// 0: conv1 of the CNN (1 -> 32 on 28x28); 1: conv2 (32 -> 64 on 14x14, after a 2x2 pool); 2: conv2 on 28x28;
// 3: vs_libtorch's conv3x3 case (64 -> 64 on 32x32, N = 32); 4: the fewest channels the Winograd kernel takes
// (16 -> 16 on 28x28).
constexpr ConvShape kShapes[] = {{128, 1, 28, 28, 32, 3, 1, false}, {128, 32, 14, 14, 64, 3, 1, true},
                                 {128, 32, 28, 28, 64, 3, 1, true},  {32, 64, 32, 32, 64, 3, 1, true},
                                 {128, 16, 28, 28, 16, 3, 1, true}};

double conv_flops(const ConvShape& s) {
  return 2.0 * double(s.n * s.o * s.h * s.w) * double(s.c * s.k * s.k);  // stride 1, "same" padding
}

template <class T>
Tensor<T> randn_as(const Shape& s) {
  return cast<T>(randn<float>(s));
}

template <class T>
void BM_Conv2dForward(benchmark::State& state) {
  const ConvShape s = kShapes[state.range(0)];
  Tensor<T> x = randn_as<T>({s.n, s.c, s.h, s.w}), w = randn_as<T>({s.o, s.c, s.k, s.k}), b = randn_as<T>({s.o});
  NoGradGuard ng;
  for (auto _ : state) {
    Tensor<T> y = conv2d(x, w, b, {.padding = s.pad});
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(conv_flops(s) * double(state.iterations()), benchmark::Counter::kIsRate);
}

// The fp32 forward through im2col + GEMM (range(1) = 0), the direct kernel (1; cpu/conv_direct.hpp, AVX-512 builds)
// or the Winograd kernel where it applies (2; cpu/conv_winograd.hpp, the default for shapes 1-4), side by side on
// the shapes above.
void BM_Conv2dForwardAlgo(benchmark::State& state) {
  const ConvShape s = kShapes[state.range(0)];
  Tensor<float> x = randn<float>({s.n, s.c, s.h, s.w}), w = randn<float>({s.o, s.c, s.k, s.k}), b = randn<float>({s.o});
  NoGradGuard ng;
  cpu::conv_direct_enabled() = state.range(1) != 0;
  cpu::conv_winograd_enabled() = state.range(1) == 2;
  for (auto _ : state) {
    Tensor<float> y = conv2d(x, w, b, {.padding = s.pad});
    benchmark::DoNotOptimize(y.data());
  }
  cpu::conv_direct_enabled() = true;
  cpu::conv_winograd_enabled() = true;
  state.counters["FLOP/s"] = benchmark::Counter(conv_flops(s) * double(state.iterations()), benchmark::Counter::kIsRate);
}

// Forward and backward (weight, bias and, where the CNN needs it, input gradients).
template <class T>
void BM_Conv2dTrain(benchmark::State& state) {
  const ConvShape s = kShapes[state.range(0)];
  Tensor<T> x = randn_as<T>({s.n, s.c, s.h, s.w}), w = randn_as<T>({s.o, s.c, s.k, s.k}), b = randn_as<T>({s.o});
  Tensor<T> gy = randn_as<T>({s.n, s.o, s.h, s.w});
  if (s.input_grad) x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  for (auto _ : state) {
    Tensor<T> y = conv2d(x, w, b, {.padding = s.pad});
    y.backward(gy);
    benchmark::DoNotOptimize(w.grad().data());
    w.grad() = Tensor<T>();
    b.grad() = Tensor<T>();
    if (s.input_grad) x.grad() = Tensor<T>();
  }
  state.counters["FLOP/s"] = benchmark::Counter(conv_flops(s) * (s.input_grad ? 3.0 : 2.0) * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

// The fp32 training step with the input gradient through the Winograd kernel (range(1) = 1, the default) or through
// GEMM + col2im (0), and the forward through Winograd or the direct kernel alike.
void BM_Conv2dTrainAlgo(benchmark::State& state) {
  cpu::conv_winograd_enabled() = state.range(1) != 0;
  BM_Conv2dTrain<float>(state);
  cpu::conv_winograd_enabled() = true;
}

// 2x2 max pooling after conv1 (128, 32, 28, 28) and after conv2 (128, 64, 14, 14), forward and backward.
void BM_MaxPool2dTrain(benchmark::State& state) {
  const std::int64_t c = state.range(0), hw = state.range(1), n = 128;
  Tensor<float> x = randn<float>({n, c, hw, hw}), gy = randn<float>({n, c, hw / 2, hw / 2});
  x.requires_grad_();
  for (auto _ : state) {
    Tensor<float> y = max_pool2d(x, 2);
    y.backward(gy);
    benchmark::DoNotOptimize(x.grad().data());
    x.grad() = Tensor<float>();
  }
  // forward: read x, write y and the indices; backward: read gy and the indices, write gx
  const double bytes = double(n * c * hw * hw) * 4 * 2 + double(n * c * hw * hw / 4) * (4 + 8) * 2;
  state.counters["bytes/s"] = benchmark::Counter(bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

// Inference with the Fashion-MNIST CNN of examples/04 (conv-BN-ReLU-pool twice, then Linear), in eval mode under
// InferenceMode, as images/s. range(0): 0 evaluates the model as trained, 1 after nn::fuse_conv_bn folded its two
// BatchNorms into the convolutions, 2 with the ReLUs and max pools moved into the convolutions' epilogues too, 3 as
// 2 and then quantized to int8 (quant::prepare, 8 calibration batches of 64 random images, quant::convert);
// range(1): the batch size. The variants run side by side in one process.
void BM_CnnInference(benchmark::State& state) {
  const std::int64_t variant = state.range(0);
  const std::int64_t n = state.range(1);
  manual_seed(3);
  nn::Sequential model(nn::Conv2d(1, 32, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(32), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Conv2d(32, 64, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(64),
                       nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(), nn::Linear(64 * 7 * 7, 10));
  model.eval();
  if (variant > 0) nn::fuse_conv_bn(model, {.activations = variant > 1});
  if (variant > 2) {
    quant::prepare(model);
    InferenceMode im;
    for (int i = 0; i < 8; ++i) (void)model(randn<float>({64, 1, 28, 28}));
    quant::convert(model);
  }
  const Tensor<float> x = randn<float>({n, 1, 28, 28});
  for (auto _ : state) {
    InferenceMode im;
    Tensor<float> y = model(x);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["images/s"] = benchmark::Counter(double(n * state.iterations()), benchmark::Counter::kIsRate);
}

// One int8 convolution, example 04's second block (32->64, 3x3, padding 1, ReLU and the 2x2 max pool fused), batch 64,
// on one int8 path: range(0) 0 vnni512, 1 vnni256, 2 avx2 (skipped where the build lacks it); range(1) 0 the direct
// kernel (channel quads, as prepared), 1 the uint8 columns and the GEMM (the layer's blocked weight cleared).
void BM_Int8ConvPath(benchmark::State& state) {
  namespace q = cpu::q;
  const q::Path path = state.range(0) == 0 ? q::Path::vnni512 : state.range(0) == 1 ? q::Path::vnni256 : q::Path::avx2;
  if (!q::path_compiled(path)) {
    state.SkipWithError("this build has no such int8 path");
    return;
  }
  manual_seed(1);
  const Tensor<float> x = randn<float>({64, 32, 14, 14}), w = randn<float>({64, 32, 3, 3}), b = randn<float>({64});
  quant::Observer obs;
  obs.observe(x.data(), x.numel());
  quant::QuantizedLayer l;
  l.conv = true;
  l.name = "conv";
  const std::vector<float> scales = quant::symmetric_scales(w.data(), 64, 32 * 9);
  l.weight = empty<std::int8_t>(w.shape());
  l.weight_scale = empty<float>(Shape{64});
  std::copy(scales.begin(), scales.end(), l.weight_scale.data());
  q::quantize_weights(w.data(), scales.data(), 64, 32 * 9, l.weight.data());
  l.bias = b;
  l.input = obs.qparams();
  l.act = Activation::relu;
  l.pool = true;
  l.conv_options = Conv2dOptions{.padding = 1};
  l.prepare();
  if (state.range(1) == 1) l.blocked.clear();
  for (auto _ : state) {
    Tensor<float> y = quant::quantized_conv2d(l, x, path);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["images/s"] = benchmark::Counter(double(64 * state.iterations()), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_CnnInference)->ArgsProduct({{0, 1, 2, 3}, {1, 64}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Int8ConvPath)->ArgsProduct({{0, 1, 2}, {0, 1}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Conv2dForward<float>)->DenseRange(0, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dForwardAlgo)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1, 2}})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dTrain<float>)->DenseRange(0, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dTrainAlgo)->ArgsProduct({{1, 2, 3, 4}, {0, 1}})->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dForward<bfloat16>)->DenseRange(1, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dTrain<bfloat16>)->DenseRange(1, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dForward<half>)->DenseRange(1, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Conv2dTrain<half>)->DenseRange(1, 2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MaxPool2dTrain)->Args({32, 28})->Args({64, 14})->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
