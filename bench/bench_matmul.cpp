// Matrix multiply (n, n) @ (n, n) through ember::matmul (the packed GEMM, split over the thread pool), as FLOP/s
// (2 n^3 per product; the "FLOP/s" counter). Wall-clock time because the work runs on the thread pool. The dtype
// cases run fp32, bfloat16 and half side by side in one process: 16-bit operands are converted while packed and
// accumulate in fp32, so their ratio to fp32 shows the cost (or, with a bf16 dot-product kernel, the gain).
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

BENCHMARK(BM_Matmul)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulTransposedB)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
