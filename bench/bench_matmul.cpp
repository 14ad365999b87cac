// fp32 matrix multiply (n, n) @ (n, n) through ember::matmul (Eigen, split over the thread pool), as FLOP/s
// (2 n^3 per product; the "FLOP/s" counter). Wall-clock time because the work runs on the thread pool.
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

BENCHMARK(BM_Matmul)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulTransposedB)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
