// CUDA benchmarks of the fused element-wise kernel, against the device's measured copy bandwidth:
//   copy      cudaMemcpyAsync device-to-device of 64M floats (the limit: 2 arrays moved)
//   chain     y = a*b + c*d - e               (6 arrays moved: 5 read, 1 written)
//   gelu fwd  y = gelu(x*w + b)                (4 arrays)
//   gelu bwd  dx, dw, db from dy in one kernel (7 arrays: x, w, b, dy read; dx, dw, db written)
// in float32 and bfloat16 at 64M elements. Each figure is the median of timed runs (CUDA events on the current
// stream), printed as GB/s and as the fraction of the copy bandwidth. Run side by side with
// bench/torch_cuda_peer.py (PyTorch eager and torch.compile on the same expressions).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"

using namespace ember;

namespace {

/// Median milliseconds of `runs` timed calls of f (after warm-up calls), timed with events on the current stream.
double median_ms(const std::function<void()>& f, int runs = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  const cudaStream_t s = cuda::current_stream(0).handle();
  cudaEvent_t a, b;
  EMBER_CUDA_CHECK(cudaEventCreate(&a));
  EMBER_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    EMBER_CUDA_CHECK(cudaEventRecord(a, s));
    f();
    EMBER_CUDA_CHECK(cudaEventRecord(b, s));
    EMBER_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    EMBER_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  EMBER_CUDA_CHECK(cudaEventDestroy(a));
  EMBER_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double copy_gbs = 0;

void report(const char* what, const char* dtype, std::int64_t n, double arrays, std::size_t elem, double ms) {
  const double gbs = arrays * double(n) * double(elem) / (ms * 1e-3) / 1e9;
  std::printf("%-28s %-9s n=%-10lld %9.3f ms %8.1f GB/s  %5.3f of copy\n", what, dtype, static_cast<long long>(n), ms,
              gbs, copy_gbs > 0 ? gbs / copy_gbs : 0.0);
}

/// Random device tensor (generated on the host, copied once).
template <class T>
Tensor<T> dev_randn(std::int64_t n) {
  const Tensor<T> h(cast<T>(randn<float>({n})));
  Tensor<T> d = empty<T>({n}, Device::cuda(0));
  EMBER_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), std::size_t(n) * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
void bench_dtype(std::int64_t n) {
  const char* dt = dtype_name<T>();
  {
    const Tensor<T> a = dev_randn<T>(n), b = dev_randn<T>(n), c = dev_randn<T>(n), d = dev_randn<T>(n),
                    e = dev_randn<T>(n);
    Tensor<T> y = empty<T>({n}, Device::cuda(0));
    const double ms = median_ms([&] { y = a * b + c * d - e; });
    report("chain a*b + c*d - e", dt, n, 6, sizeof(T), ms);
  }
  {
    const Tensor<T> x0 = dev_randn<T>(n), w0 = dev_randn<T>(n), b0 = dev_randn<T>(n), dy = dev_randn<T>(n);
    Tensor<T> x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
    {
      NoGradGuard ng;
      Tensor<T> y = empty<T>({n}, Device::cuda(0));
      report("gelu(x*w + b) forward", dt, n, 4, sizeof(T), median_ms([&] { y = gelu(x * w + b); }));
    }
    auto fwd_bwd = [&] {
      x.grad() = w.grad() = b.grad() = Tensor<T>();  // set_to_none: backward writes fresh gradient buffers
      Tensor<T> y = gelu(x * w + b);
      y.backward(dy);
    };
    report("gelu(x*w + b) fwd + bwd", dt, n, 11, sizeof(T), median_ms(fwd_bwd));
    Tensor<T> yk;
    auto bwd_only = [&] {
      x.grad() = w.grad() = b.grad() = Tensor<T>();
      yk.backward(dy, true);
    };
    yk = gelu(x * w + b);
    report("gelu(x*w + b) backward", dt, n, 7, sizeof(T), median_ms(bwd_only));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::printf("bench_cuda: no CUDA device, nothing measured\n");
    return 0;
  }
  const std::int64_t n = argc > 1 ? std::atoll(argv[1]) : std::int64_t(64) << 20;
  cudaDeviceProp prop{};
  EMBER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int sms = 0;
  EMBER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("device: %s (%d SMs)\n", prop.name, sms);
  {
    const Tensor<float> a = dev_randn<float>(n);
    Tensor<float> b = empty<float>({n}, Device::cuda(0));
    const cudaStream_t s = cuda::current_stream(0).handle();
    const double ms = median_ms([&] {
      EMBER_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), std::size_t(n) * 4, cudaMemcpyDeviceToDevice, s));
    });
    copy_gbs = 2.0 * double(n) * 4 / (ms * 1e-3) / 1e9;
    report("copy D2D (reference)", "float32", n, 2, 4, ms);
  }
  bench_dtype<float>(n);
  bench_dtype<ember::bfloat16>(n);
  return 0;
}
