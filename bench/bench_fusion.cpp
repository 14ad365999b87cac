// Fused vs unfused element-wise work, fused backward and fused reductions, as bytes/s.
//
// bytes_per_second counts the bytes each variant actually moves through memory (every array read or written
// once per pass, 4 bytes per float), so it shows how close a variant runs to memory bandwidth; the time column
// shows what fusion saves. Arrays are contiguous floats; ember's default thread count (EMBER_NUM_THREADS, else
// all cores). Wall-clock time (UseRealTime) because the work runs on the thread pool.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <ember/ember.hpp>

using namespace ember;  // as ember's users write it

namespace {

constexpr double kF = sizeof(float);

// y = a*b + c*d - e in ONE pass into a new tensor: reads 5 arrays, writes 1.
void BM_ChainFused(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n}), b = ember::randn<float>({n}), c = ember::randn<float>({n}),
                d = ember::randn<float>({n}), e = ember::randn<float>({n});
  for (auto _ : state) {
    Tensor<float> y = a * b + c * d - e;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(6 * n * kF));
}

// The same, written into an existing tensor (no allocation).
void BM_ChainFusedInto(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n}), b = ember::randn<float>({n}), c = ember::randn<float>({n}),
                d = ember::randn<float>({n}), e = ember::randn<float>({n}), y = ember::empty<float>({n});
  for (auto _ : state) {
    y = a * b + c * d - e;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(6 * n * kF));
}

// The same op by op, materialising every intermediate (what an eager library does): 4 passes of
// 2 reads + 1 write each = 12 arrays moved.
void BM_ChainUnfused(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n}), b = ember::randn<float>({n}), c = ember::randn<float>({n}),
                d = ember::randn<float>({n}), e = ember::randn<float>({n});
  for (auto _ : state) {
    Tensor<float> ab = a * b;
    Tensor<float> cd = c * d;
    Tensor<float> s = ab + cd;
    Tensor<float> y = s - e;
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(12 * n * kF));
}

// gelu(x*w + b) forward and backward (all-ones upstream gradient), grads reset to none each iteration.
// Forward: 3 reads + 1 write; fused backward: reads x, w, b, g, writes 3 grads. 11 arrays.
void BM_GeluFwdBwd(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> x = ember::randn<float>({n}), w = ember::randn<float>({n}), b = ember::randn<float>({n});
  Tensor<float> g = ember::ones<float>({n});
  for (auto* p : {&x, &w, &b}) p->requires_grad_();
  for (auto _ : state) {
    Tensor<float> y = ember::gelu(x * w + b);
    y.backward(g);
    benchmark::DoNotOptimize(x.grad().data());
    for (auto* p : {&x, &w, &b}) p->grad() = Tensor<float>();
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(11 * n * kF));
}

// sum(a*a): the square is evaluated inside the reduction, so a is read once and nothing is written.
void BM_SumSquares(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n});
  for (auto _ : state) {
    Tensor<float> s = ember::sum(a * a);
    benchmark::DoNotOptimize(s.item());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n * kF));
}

// The unfused version: materialise a*a (read 1, write 1), then sum it (read 1).
void BM_SumSquaresUnfused(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n});
  for (auto _ : state) {
    Tensor<float> sq = a * a;
    Tensor<float> s = ember::sum(sq);
    benchmark::DoNotOptimize(s.item());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(3 * n * kF));
}

// What holding tensor operands by value costs (expressions own a shared handle to each operand, so they cannot
// dangle): the same expressions built with leaves that point at the tensors, as lvalue operands were held before.
// Compare each pair in one run (--benchmark_repetitions, medians): tiny_add is dominated by the allocation and the
// reference counts, chain_16M by memory.
using PtrLeaf = expr::TensorLeaf<float, false>;

void BM_TinyAdd(benchmark::State& state) {
  Tensor<float> a = ember::randn<float>({8}), b = ember::randn<float>({8});
  for (auto _ : state) {
    Tensor<float> c = a + b;
    benchmark::DoNotOptimize(c.data());
  }
}
void BM_TinyAddLeavesByPointer(benchmark::State& state) {
  Tensor<float> a = ember::randn<float>({8}), b = ember::randn<float>({8});
  for (auto _ : state) {
    Tensor<float> c = expr::BinaryExpr<ops_table::Add, PtrLeaf, PtrLeaf>{{}, PtrLeaf{&a}, PtrLeaf{&b}};
    benchmark::DoNotOptimize(c.data());
  }
}
// The pair above timed side by side, block by block, in one benchmark: separate benchmarks land in whichever of
// this VM's two speed modes (0.13 and 0.27 us for tiny_add) holds at the time, so their medians can differ by 30%
// while the two forms never differ by more than a few percent when they alternate. Each iteration times a block of
// 10,000 ops held by pointer, then 10,000 held by value; the counter is the median ratio over the iterations.
void BM_TinyAddOwnedOverPointerPaired(benchmark::State& state) {
  Tensor<float> a = ember::randn<float>({8}), b = ember::randn<float>({8});
  auto block = [&](auto make) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10000; ++i) {
      Tensor<float> c = make();
      benchmark::DoNotOptimize(c.data());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> ratios;
  for (auto _ : state) {
    const double by_pointer =
        block([&] { return Tensor<float>(expr::BinaryExpr<ops_table::Add, PtrLeaf, PtrLeaf>{{}, PtrLeaf{&a}, PtrLeaf{&b}}); });
    const double by_value = block([&] { return Tensor<float>(a + b); });
    ratios.push_back(by_value / by_pointer);
  }
  std::sort(ratios.begin(), ratios.end());
  state.counters["owned_over_pointer"] = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
}
void BM_ChainFusedLeavesByPointer(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  Tensor<float> a = ember::randn<float>({n}), b = ember::randn<float>({n}), c = ember::randn<float>({n}),
                d = ember::randn<float>({n}), e = ember::randn<float>({n});
  using M = expr::BinaryExpr<ops_table::Mul, PtrLeaf, PtrLeaf>;
  using S = expr::BinaryExpr<ops_table::Sub, expr::BinaryExpr<ops_table::Add, M, M>, PtrLeaf>;
  for (auto _ : state) {
    Tensor<float> y = S{{}, {{}, M{{}, {&a}, {&b}}, M{{}, {&c}, {&d}}}, PtrLeaf{&e}};
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(6 * n * kF));
}

// Streaming stores (cpu/detail/stream_store.hpp) off and on, alternated within each iteration (the VM's speed
// changes between benchmarks): the chain into an existing tensor, and its forward + backward (five fresh gradients
// in one multi-output pass), over 16M floats. Counters: the median of (time with ordinary stores / time streamed),
// so > 1 means streaming is faster; streamed_passes_per_iter says how many passes of the streamed half streamed
// (3: the chain, and the forward and the backward of the second; 0 with one thread). Streaming is off by default:
// the streamed half uses EMBER_STREAM_STORES=1's threshold, the last-level cache's size.
void BM_StreamingStoresPaired(benchmark::State& state) {
  const std::int64_t n = 1 << 24;
  Tensor<float> a = ember::randn<float>({n}), b = ember::randn<float>({n}), c = ember::randn<float>({n}),
                d = ember::randn<float>({n}), e = ember::randn<float>({n}), y = ember::empty<float>({n}),
                g = ember::ones<float>({n});
  const std::int64_t saved = cpu::streaming_store_min_bytes();
  auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto fwd = [&] { y = a * b + c * d - e; };
  auto fwd_bwd = [&] {
    for (auto* p : {&a, &b, &c, &d, &e}) p->requires_grad_(true);
    {
      Tensor<float> z = a * b + c * d - e;
      z.backward(g);
    }
    for (auto* p : {&a, &b, &c, &d, &e}) {
      p->grad() = Tensor<float>();
      p->requires_grad_(false);
    }
  };
  std::vector<double> r_fwd, r_bwd;
  std::uint64_t streamed = 0;
  for (auto _ : state) {
    cpu::set_streaming_stores(-1);
    const double f0 = timed(fwd), b0 = timed(fwd_bwd);
    cpu::set_streaming_stores(cpu::detail::stream::last_level_cache_bytes());
    const std::uint64_t p0 = cpu::detail::stream::streamed_passes().load();
    const double f1 = timed(fwd), b1 = timed(fwd_bwd);
    streamed += cpu::detail::stream::streamed_passes().load() - p0;
    r_fwd.push_back(f0 / f1);
    r_bwd.push_back(b0 / b1);
  }
  cpu::set_streaming_stores(saved);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["chain_ordinary_over_streamed"] = median(r_fwd);
  state.counters["chain_fwd_bwd_ordinary_over_streamed"] = median(r_bwd);
  state.counters["streamed_passes_per_iter"] = double(streamed) / double(std::max<std::int64_t>(1, state.iterations()));
}

// 64K floats stays in L2; 16M floats (64 MiB per array) is bound by DRAM.
#define EMBER_SIZES ->Arg(1 << 16)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond)
BENCHMARK(BM_ChainFused) EMBER_SIZES;
BENCHMARK(BM_ChainFusedLeavesByPointer) EMBER_SIZES;
BENCHMARK(BM_TinyAdd)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_TinyAddLeavesByPointer)->Unit(benchmark::kNanosecond);
BENCHMARK(BM_TinyAddOwnedOverPointerPaired)->Iterations(41)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChainFusedInto) EMBER_SIZES;
BENCHMARK(BM_ChainUnfused) EMBER_SIZES;
BENCHMARK(BM_GeluFwdBwd) EMBER_SIZES;
BENCHMARK(BM_SumSquares) EMBER_SIZES;
BENCHMARK(BM_SumSquaresUnfused) EMBER_SIZES;
BENCHMARK(BM_StreamingStoresPaired)->Iterations(21)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
