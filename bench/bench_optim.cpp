// One optimizer step over one fp32 parameter of 1M and 16M elements: SGD with momentum, Nesterov and weight decay,
// Adam, AdamW, and AdamW with amsgrad, as bytes/s.
//
// bytes_per_second counts each array the update reads or writes once (4 bytes per float): SGD with momentum reads
// p, grad, buf and writes p, buf (20 B/element); Adam/AdamW read p, grad, m, v and write p, m, v (28 B), amsgrad
// adds vmax both ways (36 B). The gradient stays the same between steps. Wall-clock time (UseRealTime) because the
// update runs on the thread pool; ember's default thread count (EMBER_NUM_THREADS, else all cores).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <ember/ember.hpp>

using namespace ember;  // as ember's users write it

namespace {

constexpr double kF = sizeof(float);

template <class Make>
void run_steps(benchmark::State& state, Make make, int arrays) {
  const std::int64_t n = state.range(0);
  Tensor<float> p = ember::randn<float>({n});
  p.requires_grad_();
  p.grad() = ember::randn<float>({n}) * 1e-3f;
  std::unique_ptr<optim::Optimizer> opt = make(std::vector<Tensor<float>>{p});
  opt->step();  // the state exists from here on
  for (auto _ : state) {
    opt->step();
    benchmark::DoNotOptimize(p.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(double(arrays) * double(n) * kF));
}

void BM_SGDNesterov(benchmark::State& state) {
  run_steps(state, [](std::vector<Tensor<float>> ps) {
    return std::make_unique<optim::SGD<float>>(ps, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9,
                                                                     .weight_decay = 5e-4, .nesterov = true});
  }, 5);
}
void BM_Adam(benchmark::State& state) {
  run_steps(state, [](std::vector<Tensor<float>> ps) {
    return std::make_unique<optim::Adam<float>>(ps, optim::AdamOptions{.lr = 1e-3});
  }, 7);
}
void BM_AdamW(benchmark::State& state) {
  run_steps(state, [](std::vector<Tensor<float>> ps) {
    return std::make_unique<optim::AdamW<float>>(ps, optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1});
  }, 7);
}
void BM_AdamWAmsgrad(benchmark::State& state) {
  run_steps(state, [](std::vector<Tensor<float>> ps) {
    return std::make_unique<optim::AdamW<float>>(ps, optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1,
                                                                        .amsgrad = true});
  }, 9);
}

}  // namespace

BENCHMARK(BM_SGDNesterov)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Adam)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamW)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamWAmsgrad)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
