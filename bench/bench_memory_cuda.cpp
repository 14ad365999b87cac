// CUDA memory: copies between host and device through ember (Tensor::cuda(), cpu(), non_blocking from pinned memory)
// against raw cudaMemcpy between pinned buffers, the measured limit of the link (bytes_per_second; compare each
// Ember line with the Raw line of the same direction and size: the target is the raw figure for pinned sources and
// well below it for pageable ones, which is why pin_memory exists), and the cost of an allocation from ember's
// caching allocators against cudaMalloc/cudaFree and cudaHostAlloc/cudaFreeHost (items_per_second = allocations).
// Host-compiled (runtime calls only): links ember::cuda. Every case reports an error and skips without a device.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>

#include <ember/ember.hpp>

using namespace ember;  // as ember's users write it

namespace {

bool no_device(benchmark::State& state) {
  if (cuda::is_available()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

// Raw cudaMemcpyAsync between pinned host memory and device memory: the link's bandwidth. range(0) = MiB,
// range(1) = 1 for host -> device, 0 for device -> host.
void BM_RawCopy(benchmark::State& state) {
  if (no_device(state)) return;
  const std::size_t n = std::size_t(state.range(0)) << 20;
  const bool h2d = state.range(1) != 0;
  void *host = nullptr, *dev = nullptr;
  EMBER_CUDA_CHECK(cudaHostAlloc(&host, n, cudaHostAllocPortable));
  EMBER_CUDA_CHECK(cudaMalloc(&dev, n));
  std::memset(host, 1, n);
  const cudaStream_t s = cuda::current_stream(0).handle();
  for (auto _ : state) {
    EMBER_CUDA_CHECK(cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, n,
                                     h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, s));
    EMBER_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(n));
  EMBER_CUDA_CHECK(cudaFree(dev));
  EMBER_CUDA_CHECK(cudaFreeHost(host));
}

// ember's host -> device copy. range(0) = MiB, range(1): 0 pageable source, 1 pinned, 2 pinned and non_blocking
// (synchronised once per iteration, as a training step would before using the batch).
void BM_EmberToDevice(benchmark::State& state) {
  if (no_device(state)) return;
  const std::int64_t n = state.range(0) << 18;  // floats
  Tensor<float> x = ones<float>({n});
  if (state.range(1) > 0) x = x.pin_memory();
  const bool nb = state.range(1) == 2;
  const cuda::Stream s = cuda::current_stream(0);
  for (auto _ : state) {
    Tensor<float> g = x.to(Device::cuda(), nb);
    if (nb) s.synchronize();
    benchmark::DoNotOptimize(g.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * n * 4);
  state.counters["cuda_mallocs"] = double(cuda::memory_stats(0).num_cuda_mallocs);
}

// ember's device -> host copy: range(1) 0 = blocking into pageable memory, 1 = non_blocking into pinned memory.
void BM_EmberToHost(benchmark::State& state) {
  if (no_device(state)) return;
  const std::int64_t n = state.range(0) << 18;
  const Tensor<float> g = ones<float>({n}).cuda();
  const bool nb = state.range(1) == 1;
  const cuda::Stream s = cuda::current_stream(0);
  for (auto _ : state) {
    Tensor<float> h = g.to(Device::cpu(), nb);
    if (nb) s.synchronize();
    benchmark::DoNotOptimize(h.data());
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * n * 4);
}

// An allocation and a free of range(0) KiB: ember's caching allocator (0) against cudaMalloc/cudaFree (1).
void BM_DeviceAlloc(benchmark::State& state) {
  if (no_device(state)) return;
  const std::size_t bytes = std::size_t(state.range(0)) << 10;
  const bool raw = state.range(1) == 1;
  auto& a = cuda::CudaCachingAllocator::get(0);
  for (auto _ : state) {
    if (raw) {
      void* p = nullptr;
      EMBER_CUDA_CHECK(cudaMalloc(&p, bytes));
      benchmark::DoNotOptimize(p);
      EMBER_CUDA_CHECK(cudaFree(p));
    } else {
      void* p = a.allocate(bytes);
      benchmark::DoNotOptimize(p);
      a.deallocate(p, bytes);
    }
  }
  state.SetItemsProcessed(std::int64_t(state.iterations()));
}

// The same for pinned host memory: ember's pinned allocator (0) against cudaHostAlloc/cudaFreeHost (1).
void BM_PinnedAlloc(benchmark::State& state) {
  if (no_device(state)) return;
  const std::size_t bytes = std::size_t(state.range(0)) << 10;
  const bool raw = state.range(1) == 1;
  auto& a = cuda::PinnedAllocator::instance();
  for (auto _ : state) {
    if (raw) {
      void* p = nullptr;
      EMBER_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
      benchmark::DoNotOptimize(p);
      EMBER_CUDA_CHECK(cudaFreeHost(p));
    } else {
      void* p = a.allocate(bytes);
      benchmark::DoNotOptimize(p);
      a.deallocate(p, bytes);
    }
  }
  state.SetItemsProcessed(std::int64_t(state.iterations()));
}

}  // namespace

BENCHMARK(BM_RawCopy)->ArgsProduct({{1, 64}, {1, 0}})->UseRealTime();
BENCHMARK(BM_EmberToDevice)->ArgsProduct({{1, 64}, {0, 1, 2}})->UseRealTime();
BENCHMARK(BM_EmberToHost)->ArgsProduct({{1, 64}, {0, 1}})->UseRealTime();
BENCHMARK(BM_DeviceAlloc)->ArgsProduct({{4, 4096}, {0, 1}})->UseRealTime();
BENCHMARK(BM_PinnedAlloc)->ArgsProduct({{4, 4096}, {0, 1}})->UseRealTime();
BENCHMARK_MAIN();
