// Matrix multiply (n, n) @ (n, n) through ember::matmul (the packed GEMM, split over the thread pool), as FLOP/s
// (2 n^3 per product; the "FLOP/s" counter). Wall-clock time because the work runs on the thread pool. The dtype
// cases run fp32, bfloat16 and half side by side in one process: 16-bit operands are converted while packed and
// accumulate in fp32, so their ratio to fp32 shows the cost (or, with a bf16 dot-product kernel, the gain). Also:
// the MLP training step's GEMMs, and the thread pool's cost to start and join a loop.
#include <benchmark/benchmark.h>

#include <cstdint>

#include <ember/ember.hpp>

using namespace ember;  // as ember's users write it

namespace {

void set_flops(benchmark::State& state, std::int64_t m, std::int64_t n, std::int64_t k) {
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * double(m) * double(n) * double(k) * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

// C = A @ B, result into a new tensor.
void BM_Matmul(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n, n}), b = ember::randn<float>({n, n});
  for (auto _ : state) {
    Tensor<float> c = ember::matmul(a, b);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, n, n, n);
}

// C = A @ Bᵀ with B a transposed view (a linear layer's x @ wᵀ): read in place, no copy.
void BM_MatmulTransposedB(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n, n}), w = ember::randn<float>({n, n});
  for (auto _ : state) {
    Tensor<float> c = ember::matmul(a, w.t());
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, n, n, n);
}

// C = A @ B in T (fp32 accumulation for the 16-bit types), the result written in T.
template <class T>
void BM_MatmulDtype(benchmark::State& state) {
  const std::int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  Tensor<T> a = cast<T>(ember::randn<float>({m, k})), b = cast<T>(ember::randn<float>({k, n}));
  for (auto _ : state) {
    Tensor<T> c = ember::matmul(a, b);
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, m, n, k);
}

void dtype_args(benchmark::internal::Benchmark* b) {
  b->Args({1024, 1024, 1024})->Args({2048, 2048, 2048})->Args({128, 784, 256});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_MatmulDtype<float>)->Apply(dtype_args);
BENCHMARK(BM_MatmulDtype<bfloat16>)->Apply(dtype_args);
BENCHMARK(BM_MatmulDtype<half>)->Apply(dtype_args);

// The eight GEMMs of one training step of example 03's MLP (784-256-128-10, batch 128) through cpu::gemm, with the
// operand layouts linear and linear_backward pass: forward x @ wᵀ, input gradients gz @ w, weight gradients gzᵀ @ x.
// Small GEMMs split in two across the threads, where waking the pool's worker is part of the cost.
void BM_MlpStepGemms(benchmark::State& state) {
  struct G {
    std::int64_t m, n, k, ars, acs, brs, bcs;
  };
  const G gs[] = {{128, 256, 784, 784, 1, 1, 784}, {128, 128, 256, 256, 1, 1, 256}, {128, 10, 128, 128, 1, 1, 128},
                  {128, 128, 10, 10, 1, 128, 1},   {10, 128, 128, 1, 10, 128, 1},   {128, 256, 128, 128, 1, 256, 1},
                  {128, 256, 128, 1, 128, 256, 1}, {256, 784, 128, 1, 256, 784, 1}};
  const Tensor<float> a = ember::randn<float>({1 << 17}), b = ember::randn<float>({1 << 18});
  Tensor<float> c = ember::empty<float>({1 << 18});
  double flops = 0;
  for (const G& g : gs) flops += 2.0 * double(g.m * g.n * g.k);
  for (auto _ : state)
    for (const G& g : gs) {
      cpu::gemm<float>(g.m, g.n, g.k, {a.data(), g.ars, g.acs}, {b.data(), g.brs, g.bcs}, c.data(), g.n);
      benchmark::ClobberMemory();
    }
  state.counters["FLOP/s"] = benchmark::Counter(flops * double(state.iterations()), benchmark::Counter::kIsRate);
}

// The thread pool's fork and join: parallel_for over two chunks of about `work` microseconds of arithmetic each,
// after `gap` microseconds of serial work on the calling thread (a training step's small ops between GEMMs; 0:
// loops back to back). The time includes the gap; compare with EMBER_SPIN_US=0 (workers sleep at once) and with
// one thread.
void BM_ParallelForTwoChunks(benchmark::State& state) {
  const std::int64_t work = state.range(0), gap = state.range(1);
  auto spin = [](std::int64_t us) {  // a dependent chain of 1000 multiply-adds per microsecond asked, roughly
    double v = 1.0;
    for (std::int64_t i = 0; i < us * 1000; ++i) v = v * 0.9999999 + 1e-9;
    return v;
  };
  double sink = 0;
  for (auto _ : state) {
    sink += spin(gap);
    cpu::parallel_for(0, 2, 1, [&](std::int64_t a, std::int64_t b) {
      double s = 0;
      for (std::int64_t i = a; i < b; ++i) s += spin(work);
      benchmark::DoNotOptimize(s);
    });
  }
  benchmark::DoNotOptimize(sink);
}

BENCHMARK(BM_MlpStepGemms)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ParallelForTwoChunks)->ArgsProduct({{5, 50}, {0, 50}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulTransposedB)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
