// ember's vendor-library paths on CUDA: matmul through cuBLAS (4096^3 in bf16, and fp32 with TF32) in TFLOP/s, and a
// ResNet-like conv layer's forward + backward (input and weight gradients) through cuDNN with benchmark mode off
// and on, in ms. Each figure is the median of several runs timed with CUDA events on ember's current stream.
// bench/torch_cuda_libs_peer.py prints the same lines for PyTorch; run both on one device to compare.
//   bench_cuda_libs [--n=4096] [--reps=20]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <ember/ember.hpp>

using namespace ember;  // as ember's users write it

namespace {

/// A device tensor of normal values (scaled), made on the host and copied over.
template <class T>
Tensor<T> dev_randn(const Shape& s, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<T> h(static_cast<std::size_t>(s.numel()));
  for (auto& v : h) v = convert<T>(double(nd(rng)) * scale);
  Tensor<T> d = empty<T>(s, Device::cuda(0));
  EMBER_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// Median milliseconds of fn over `reps` runs (after `warm` untimed ones), each between two events.
double median_ms(const std::function<void()>& fn, int reps, int warm = 3) {
  for (int i = 0; i < warm; ++i) fn();
  cuda::synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cuda::Event a(true), b(true);
    a.record();
    fn();
    b.record();
    b.synchronize();
    ms.push_back(a.elapsed_ms(b));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class T>
void bench_matmul(const char* name, std::int64_t n, int reps) {
  const Tensor<T> a = dev_randn<T>({n, n}, 1), b = dev_randn<T>({n, n}, 2);
  Tensor<T> c = empty<T>({n, n}, Device::cuda(0));
  const double ms = median_ms([&] { ops::mm_into(c, a, b); }, reps);
  std::printf("case=matmul_%s_%lld ms=%.3f tflops=%.1f\n", name, static_cast<long long>(n), ms,
              2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12);
}

template <class T>
void bench_conv(const char* name, int reps) {
  const std::int64_t N = 64, C = 128, K = 128, H = 56, W = 56;
  const Tensor<T> x = dev_randn<T>({N, C, H, W}, 3), w = dev_randn<T>({K, C, 3, 3}, 4, 0.03);
  const Tensor<T> gy = dev_randn<T>({N, K, H, W}, 5);
  Conv2dOptions o;
  o.padding = Size2(1);
  for (bool bench : {false, true}) {
    cuda::set_benchmark(bench);
    const double fwd = median_ms([&] { (void)ops::conv2d(x, w, Tensor<T>(), o); }, reps);
    const double both = median_ms(
        [&] {
          (void)ops::conv2d(x, w, Tensor<T>(), o);
          (void)ops::conv2d_backward(gy, x, w, o, true, true, false);
        },
        reps);
    std::printf("case=conv_%s_n64_c128_56x56_3x3 benchmark=%d fwd_ms=%.3f fwd_bwd_ms=%.3f\n", name, int(bench), fwd,
                both);
  }
  cuda::set_benchmark(false);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t n = 4096;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--n=", 4) == 0) n = std::atoll(argv[i] + 4);
    else if (std::strncmp(argv[i], "--reps=", 7) == 0) reps = std::atoi(argv[i] + 7);
  }
  if (!cuda::is_available()) {
    std::printf("bench_cuda_libs: no CUDA device, nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  EMBER_CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda::current_device()));
  std::printf("device %s\n", prop.name);

  bench_matmul<bfloat16>("bf16", n, reps);
  cuda::set_allow_tf32(true);
  bench_matmul<float>("fp32_tf32", n, reps);
  cuda::set_allow_tf32(false);
  bench_matmul<float>("fp32", n, reps);

#if EMBER_USE_CUDNN
  cuda::set_cudnn_allow_tf32(true);  // as torch.backends.cudnn.allow_tf32's default
  bench_conv<float>("fp32_tf32", reps);
  cuda::set_cudnn_allow_tf32(false);
  bench_conv<bfloat16>("bf16", reps);
#else
  std::printf("conv: skipped (built without cuDNN)\n");
#endif
  return 0;
}
