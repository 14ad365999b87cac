// Matrix multiply (n, n) @ (n, n) through ember::matmul (the packed GEMM, split over the thread pool), as FLOP/s
// (2 n^3 per product; the "FLOP/s" counter). Wall-clock time because the work runs on the thread pool. The dtype
// cases run fp32, bfloat16 and half side by side in one process: 16-bit operands are converted while packed and
// accumulate in fp32, so their ratio to fp32 shows the cost; BM_MatmulBf16Amx runs bfloat16 on AMX tiles (the
// gain, where the CPU has them). Also:
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

// bfloat16 with AMX switched off (the AVX512-BF16 dot products, or the fp32 kernel converting while it packs), and
// on AMX tiles (the default where the CPU and OS run them; skipped elsewhere).
void BM_MatmulBf16NoAmx(benchmark::State& state) {
  const bool was = cpu::amx_active();
  cpu::set_amx(false);
  BM_MatmulDtype<bfloat16>(state);
  cpu::set_amx(was);
}
void BM_MatmulBf16Amx(benchmark::State& state) {
  if (!cpu::amx_available()) {
    state.SkipWithError("no AMX-BF16 tiles on this CPU or OS");
    return;
  }
  const bool was = cpu::amx_active();
  cpu::set_amx(true);
  BM_MatmulDtype<bfloat16>(state);
  cpu::set_amx(was);
}

void dtype_args(benchmark::internal::Benchmark* b) {
  b->Args({1024, 1024, 1024})->Args({2048, 2048, 2048})->Args({128, 784, 256});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_MatmulDtype<float>)->Apply(dtype_args);
BENCHMARK(BM_MatmulDtype<bfloat16>)->Apply(dtype_args);
BENCHMARK(BM_MatmulBf16NoAmx)->Apply(dtype_args);
BENCHMARK(BM_MatmulBf16Amx)->Apply(dtype_args);
BENCHMARK(BM_MatmulDtype<half>)->Apply(dtype_args);

// The eight GEMMs of one training step of example 03's MLP (784-256-128-10, batch 128) through cpu::gemm, with the
// operand layouts linear and linear_backward pass: forward x @ wᵀ, input gradients gz @ w, weight gradients gzᵀ @ x.
// Small GEMMs split in two across the threads, where waking the pool's worker is part of the cost. Argument 8: all
// eight in turn; 0 to 7: that one alone (the order of gs).
void BM_MlpStepGemms(benchmark::State& state) {
  struct G {
    std::int64_t m, n, k, ars, acs, brs, bcs;
  };
  const G gs[] = {{128, 256, 784, 784, 1, 1, 784}, {128, 128, 256, 256, 1, 1, 256}, {128, 10, 128, 128, 1, 1, 128},
                  {128, 128, 10, 10, 1, 128, 1},   {10, 128, 128, 1, 10, 128, 1},   {128, 256, 128, 128, 1, 256, 1},
                  {128, 256, 128, 1, 128, 256, 1}, {256, 784, 128, 1, 256, 784, 1}};
  const Tensor<float> a = ember::randn<float>({1 << 17}), b = ember::randn<float>({1 << 18});
  Tensor<float> c = ember::empty<float>({1 << 18});
  const std::int64_t only = state.range(0);
  double flops = 0;
  for (std::int64_t i = 0; i < 8; ++i)
    if (only == 8 || only == i) flops += 2.0 * double(gs[i].m * gs[i].n * gs[i].k);
  for (auto _ : state)
    for (std::int64_t i = 0; i < 8; ++i) {
      if (only != 8 && only != i) continue;
      const G& g = gs[i];
      cpu::gemm<float>(g.m, g.n, g.k, {a.data(), g.ars, g.acs}, {b.data(), g.brs, g.bcs}, c.data(), g.n);
      benchmark::ClobberMemory();
    }
  state.counters["FLOP/s"] = benchmark::Counter(flops * double(state.iterations()), benchmark::Counter::kIsRate);
}

// The MLP's forward GEMMs x @ wᵀ (x 128 x 784 by w 256 x 784, and 128 x 256 by 128 x 256) three ways: cpu::gemm
// (each thread packs its columns of wᵀ and all of x), cpu::PackedB built for the call (wᵀ packed once, the threads
// sharing the work, then each packs its rows of x: what pre-packing a weight once per training step costs), and a
// PackedB built once and reused (the weight unchanged between calls, as in evaluation); mode 3 builds the PackedB
// alone (what modes 1 and 2 leave out of the difference: mode 1 - mode 2 - mode 3 is the cost of one core reading
// panels the other packed).
void BM_LinearPackedWeight(benchmark::State& state) {
  const std::int64_t m = 128, k = state.range(0) == 0 ? 784 : 256, n = state.range(0) == 0 ? 256 : 128;
  const int mode = int(state.range(1));
  const Tensor<float> x = ember::randn<float>({m, k}), w = ember::randn<float>({n, k});
  Tensor<float> y = ember::empty<float>({m, n});
  const cpu::MatView<float> xv{x.data(), k, 1}, wt{w.data(), 1, k};
  const cpu::PackedB<float> reused(k, n, wt);
  for (auto _ : state) {
    if (mode == 0) {
      cpu::gemm<float>(m, n, k, xv, wt, y.data(), n);
    } else if (mode == 1) {
      const cpu::PackedB<float> pb(k, n, wt);
      pb.gemm(m, xv, y.data(), n);
    } else if (mode == 2) {
      reused.gemm(m, xv, y.data(), n);
    } else {
      const cpu::PackedB<float> pb(k, n, wt);
      benchmark::DoNotOptimize(&pb);
    }
    benchmark::ClobberMemory();
  }
  const char* labels[] = {"gemm", "PackedB per call", "PackedB reused", "PackedB construction"};
  state.SetLabel(labels[mode]);
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

BENCHMARK(BM_MlpStepGemms)->DenseRange(0, 8)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearPackedWeight)->ArgsProduct({{0, 1}, {0, 1, 2, 3}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ParallelForTwoChunks)->ArgsProduct({{5, 50}, {0, 50}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Matmul)->RangeMultiplier(2)->Range(256, 2048)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MatmulTransposedB)->Arg(1024)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
