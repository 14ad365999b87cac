// ember vs LibTorch, side by side in one process, 2 threads each (torch::set_num_threads(2),
// at::set_num_interop_threads(1), ember::cpu::set_num_threads(2)).
//
// Method. Each case is the same work written the natural way in both libraries (eager LibTorch code as a
// PyTorch user writes it; every result goes into a new tensor in both). Per case: both sides run once on the
// same inputs and their results are compared (a wrong result prints the max abs diff to stderr and the program
// exits with status 1); then each side is warmed up, its repetition count is calibrated so that one rep set
// takes >= 0.3 s (--quick: 0.03 s), and then rep sets are timed alternately, ember then LibTorch, 7 times each
// (--quick: 3, and no warm-up beyond the check). A figure is the MEDIAN over rep sets of (rep set time / reps).
//
// Output, one line per case on stdout:
//   case=<name> ember=<value><unit> libtorch=<value><unit> speedup=<libtorch time / ember time>
// Units: tiny_add us/op, tiny_grad us/iter (forward + backward), the 16M cases ms per op or per iteration,
// matmul GFLOP/s (2 n^3 flops; speedup = ember GFLOP/s / libtorch GFLOP/s, which is again libtorch time / ember
// time). `case=membw value=<GB/s>` is std::memcpy of a 256 MiB buffer (pre-faulted buffers), counting read +
// write bytes, i.e. 2 x 256 MiB per copy. One sample = one copy on one thread and one split in halves over two
// threads, the faster of the two (the limit for ember's 2 threads); membw is the median of the samples. When
// chain_16M runs, the samples are taken between its rep sets (the load of a shared machine changes over a
// run, so the limit is measured under the same conditions as ember), and chain_16M adds frac_membw = ember's effective bandwidth, counted
// the same way (6 arrays x 64 MiB: 5 read + 1 written), divided by membw. (Stores that miss the cache also read
// the line first unless they stream, so a loop with regular stores moves 7 arrays, where memcpy moves 2.)
//
// loader: ember's DataLoader against torch::data's on the same work: one epoch over Fashion-MNIST's test split
// (10000 images), batch 128, shuffled, 2 worker threads each; per sample: bytes -> float / 255, random 28x28 crop
// of the image zero-padded by 4, random horizontal flip, normalisation; then collation into (128, 1, 28, 28).
// The LibTorch side is a torch::data Dataset doing that with torch ops, mapped through Stack<>. Unit: samples/s.
// Skipped (with a note) when dataset-fashion-mnist is not installed.
//
// mlp_train, cnn_train: one epoch of the Fashion-MNIST examples' models (03: MLP 784-256-128-10, 04: two
// conv-BN-ReLU-maxpool blocks and a linear head), the same architecture in both libraries, batch 128, SGD lr 0.05
// with Nesterov momentum 0.9, over the same pre-normalised, pre-shuffled images (no loader in the timing); one
// timed epoch each (ember first), then `ember_acc` / `libtorch_acc`: each model's test accuracy after that epoch.
// Unit: training images/s. --quick trains 60 batches instead of an epoch.
//
// --precision=bf16 runs matmul_* and *_train in bfloat16: ember's tensors in bf16 and its models under
// amp::bf16_mixed against LibTorch's bf16 torch::mm and its CPU autocast to bf16 around forward and loss (what
// `torch.autocast("cpu", dtype=torch.bfloat16)` does; bench/torch_autocast_peer.py is the Python check of it).
//
// Usage: vs_libtorch [--quick] [--case=NAME] [--precision=fp32|bf16]   (NAME one of the case names above, or membw)
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ember/data.hpp>
#include <ember/ember.hpp>

namespace {

using Clock = std::chrono::steady_clock;
using ember::Tensor;
// As ember's users write it.
using namespace ember;  // NOLINT

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

template <class X>
inline void keep(const X& x) {
  asm volatile("" : : "g"(&x) : "memory");
}

struct Options {
  bool quick = false;
  bool bf16 = false;  // --precision=bf16: the matmul and training cases in bfloat16 (ember bf16_mixed, LibTorch autocast)
  std::string only;
  double target_s() const { return quick ? 0.03 : 0.3; }
  int measurements() const { return quick ? 3 : 7; }
  int warmups() const { return quick ? 0 : 2; }  // the correctness check before timing warms up too
  bool wants(const std::string& name) const { return only.empty() || only == name; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Reps so that one rep set of fn takes about target seconds (fn runs for >= target / 4 to estimate).
long calibrate(const std::function<void()>& fn, double target) {
  long n = 0;
  const auto t0 = Clock::now();
  double el = 0;
  do {
    fn();
    ++n;
    el = seconds_since(t0);
  } while (el < target / 4);
  return std::max(1L, long(std::ceil(target / (el / double(n)))));
}

double time_reps(const std::function<void()>& fn, long reps) {
  const auto t0 = Clock::now();
  for (long i = 0; i < reps; ++i) fn();
  return seconds_since(t0) / double(reps);
}

struct Timing {
  double ember_s, torch_s;  // median seconds per op
};

// Warm-up, calibration, then alternating rep sets: ember, libtorch, ember, libtorch, ... (`between`, if set, runs
// after each pair).
Timing compare(const Options& o, const std::function<void()>& fe, const std::function<void()>& ft,
               const std::function<void()>& between = {}) {
  for (int i = 0; i < o.warmups(); ++i) {
    fe();
    ft();
  }
  const long re = calibrate(fe, o.target_s()), rt = calibrate(ft, o.target_s());
  std::vector<double> te, tt;
  for (int m = 0; m < o.measurements(); ++m) {
    te.push_back(time_reps(fe, re));
    tt.push_back(time_reps(ft, rt));
    if (between) between();
  }
  return {median(te), median(tt)};
}

// ---- correctness -------------------------------------------------------------------------------------------

torch::Tensor to_torch(const Tensor<float>& t) {
  Tensor<float> c = t.contiguous();
  std::vector<int64_t> sizes(c.shape().begin(), c.shape().end());
  return torch::from_blob(c.data(), sizes, torch::kFloat32).clone();
}
template <class C>
Tensor<C> to_c(const Tensor<float>& x) {
  if constexpr (std::is_same_v<C, float>) return x;
  else return Tensor<C>(cast<C>(x));
}
template <class C>
Tensor<float> to_f(const Tensor<C>& y) {
  if constexpr (std::is_same_v<C, float>) return y;
  else return Tensor<float>(cast<float>(y));
}


// LibTorch's CPU autocast to bf16 while in scope (what `with torch.autocast("cpu", dtype=torch.bfloat16):` does):
// matmuls and convolutions run in bf16, other ops per autocast's lists; leaving the outermost scope clears the
// cache of cast weights, as the Python context manager does. A no-op when `on` is false.
// The per-device autocast calls used here are LibTorch 2.4's; older LibTorch (Debian's 1.13) refuses the flag.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define VS_AUTOCAST 1
#else
#define VS_AUTOCAST 0
#endif
struct AutocastBf16 {
  bool on, prev_enabled = false;
  at::ScalarType prev_dtype = at::kFloat;
  explicit AutocastBf16(bool enable) : on(enable) {
    if (!on) return;
#if VS_AUTOCAST
    prev_enabled = at::autocast::is_autocast_enabled(at::kCPU);
    prev_dtype = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::increment_nesting();
#else
    throw std::runtime_error("--precision=bf16 needs LibTorch 2.4 or later (the PyPI wheel) for its autocast");
#endif
  }
  ~AutocastBf16() {
    if (!on) return;
#if VS_AUTOCAST
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, prev_enabled);
    at::autocast::set_autocast_dtype(at::kCPU, prev_dtype);
#endif
  }
  AutocastBf16(const AutocastBf16&) = delete;
  AutocastBf16& operator=(const AutocastBf16&) = delete;
};


bool g_failed = false;

// |e - t| <= atol + rtol * |t| elementwise; reports the max abs diff when it fails.
void check(const char* cas, const char* what, const Tensor<float>& e, const torch::Tensor& t, double atol,
           double rtol) {
  torch::Tensor tc = t.contiguous();
  const auto n = std::int64_t(tc.numel());
  if (!e.defined() || e.numel() != n) {
    std::fprintf(stderr, "%s: %s: ember has %lld elements, libtorch %lld\n", cas, what,
                 e.defined() ? (long long)e.numel() : -1LL, (long long)n);
    g_failed = true;
    return;
  }
  Tensor<float> ec = e.contiguous();
  const float* pe = ec.data();
  const float* pt = tc.data_ptr<float>();
  double maxdiff = 0;
  bool bad = false;
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(pe[i]) - double(pt[i]));
    if (!(d <= atol + rtol * std::fabs(double(pt[i])))) bad = true;  // NaN counts as bad
    if (!(d <= maxdiff)) maxdiff = d;
  }
  if (bad) {
    std::fprintf(stderr, "%s: %s: ember and libtorch differ, max abs diff %g (atol %g, rtol %g)\n", cas, what,
                 maxdiff, atol, rtol);
    g_failed = true;
  }
}

// ---- reporting ---------------------------------------------------------------------------------------------

void print_time(const char* name, const Timing& t, double scale, const char* unit, const char* extra = "") {
  std::printf("case=%s ember=%.4g%s libtorch=%.4g%s speedup=%.2f%s\n", name, t.ember_s * scale, unit,
              t.torch_s * scale, unit, t.torch_s / t.ember_s, extra);
  std::fflush(stdout);
}

// ---- memcpy bandwidth --------------------------------------------------------------------------------------

class Membw {
 public:
  static constexpr std::size_t kBytes = std::size_t(256) << 20;
  Membw() : src_(kBytes, 1), dst_(kBytes, 0) {}  // both pre-faulted
  // One copy on one thread and one split over two threads; records both, and the faster as one sample.
  void sample() {
    const std::size_t half = kBytes / 2;
    auto t0 = Clock::now();
    std::memcpy(dst_.data(), src_.data(), kBytes);
    keep(dst_);
    const double bw1 = 2.0 * double(kBytes) / seconds_since(t0) / 1e9;
    t0 = Clock::now();
    std::thread other([&] { std::memcpy(dst_.data() + half, src_.data() + half, half); });
    std::memcpy(dst_.data(), src_.data(), half);
    other.join();
    keep(dst_);
    const double bw2 = 2.0 * double(kBytes) / seconds_since(t0) / 1e9;
    bw1_.push_back(bw1);
    bw2_.push_back(bw2);
    best_.push_back(std::max(bw1, bw2));
  }
  void clear() { bw1_.clear(), bw2_.clear(), best_.clear(); }
  double gbps() const { return median(best_); }
  void report() const {
    std::fprintf(stderr, "membw: memcpy of 256 MiB, median of %zu samples: 1 thread %.2f GB/s, 2 threads %.2f GB/s "
                 "(read + write)\n", best_.size(), median(bw1_), median(bw2_));
    std::printf("case=membw value=%.2fGB/s\n", gbps());
    std::fflush(stdout);
  }

 private:
  std::vector<char> src_, dst_;
  std::vector<double> bw1_, bw2_, best_;
};

// ---- cases -------------------------------------------------------------------------------------------------

constexpr std::int64_t kBig = 16 << 20;  // 16M floats = 64 MiB per array

// Uniform in [-2, 2): cheap to make (randn's Box-Muller costs ~0.5 s per 16M values).
Tensor<float> big_input() { return ember::rand<float>({kBig}) * 4.f - 2.f; }

void tiny_add(const Options& o) {
  Tensor<float> a = ember::randn<float>({8}), b = ember::randn<float>({8});
  torch::Tensor ta = to_torch(a), tb = to_torch(b);
  {
    Tensor<float> c = a + b;
    check("tiny_add", "c", c, ta + tb, 0, 0);
  }
  auto t = compare(
      o,
      [&] {
        Tensor<float> c = a + b;
        keep(c);
      },
      [&] {
        auto c = ta + tb;
        keep(c);
      });
  print_time("tiny_add", t, 1e6, "us/op");
}

void tiny_grad(const Options& o) {
  Tensor<float> x = ember::randn<float>({8});
  torch::Tensor tx = to_torch(x);
  x.requires_grad_();
  tx.requires_grad_();
  {
    Tensor<float> s = ember::sum(x * 2.f + 1.f);
    s.backward();
    auto ts = (tx * 2 + 1).sum();
    ts.backward();
    check("tiny_grad", "loss", s.detach(), ts.detach(), 1e-5, 1e-5);
    check("tiny_grad", "x.grad", x.grad(), tx.grad(), 0, 0);
    x.grad() = Tensor<float>();
    tx.mutable_grad().reset();
  }
  auto t = compare(
      o,
      [&] {
        Tensor<float> s = ember::sum(x * 2.f + 1.f);
        s.backward();
        x.grad() = Tensor<float>();
      },
      [&] {
        auto s = (tx * 2 + 1).sum();
        s.backward();
        tx.mutable_grad().reset();
      });
  print_time("tiny_grad", t, 1e6, "us/iter");
}

void chain(const Options& o, Membw* membw) {
  Tensor<float> a = big_input(), b = big_input(), c = big_input(), d = big_input(), e = big_input();
  torch::Tensor ta = to_torch(a), tb = to_torch(b), tc = to_torch(c), td = to_torch(d), te = to_torch(e);
  {
    Tensor<float> y = a * b + c * d - e;
    check("chain_16M", "y", y, ta * tb + tc * td - te, 1e-5, 1e-5);
  }
  auto t = compare(
      o,
      [&] {
        Tensor<float> y = a * b + c * d - e;
        keep(y);
      },
      [&] {
        auto y = ta * tb + tc * td - te;
        keep(y);
      },
      [&] {
        if (membw) membw->sample();
      });
  char extra[64] = "";
  if (membw) {
    const double ember_bw = 6.0 * double(kBig) * sizeof(float) / t.ember_s / 1e9;
    std::snprintf(extra, sizeof extra, " frac_membw=%.2f", ember_bw / membw->gbps());
    membw->report();
  }
  print_time("chain_16M", t, 1e3, "ms", extra);
}

void gelu_bwd(const Options& o) {
  Tensor<float> x = big_input(), w = big_input(), b = big_input();
  Tensor<float> g = ember::ones<float>({kBig});
  torch::Tensor tx = to_torch(x), tw = to_torch(w), tb = to_torch(b), tg = torch::ones({kBig});
  for (auto* p : {&x, &w, &b}) p->requires_grad_();
  for (auto* p : {&tx, &tw, &tb}) p->requires_grad_();
  auto ember_iter = [&] {
    Tensor<float> y = ember::gelu(x * w + b);
    y.backward(g);
    return y;
  };
  auto torch_iter = [&] {
    auto y = torch::gelu(tx * tw + tb);
    y.backward(tg);
    return y;
  };
  auto reset = [&] {
    for (auto* p : {&x, &w, &b}) p->grad() = Tensor<float>();
    for (auto* p : {&tx, &tw, &tb}) p->mutable_grad().reset();
  };
  {
    Tensor<float> y = ember_iter();
    torch::Tensor ty = torch_iter();
    check("gelu_bwd_16M", "y", y.detach(), ty.detach(), 1e-5, 1e-5);
    check("gelu_bwd_16M", "x.grad", x.grad(), tx.grad(), 1e-5, 1e-4);
    check("gelu_bwd_16M", "w.grad", w.grad(), tw.grad(), 1e-5, 1e-4);
    check("gelu_bwd_16M", "b.grad", b.grad(), tb.grad(), 1e-5, 1e-4);
    reset();
  }
  auto t = compare(
      o,
      [&] {
        keep(ember_iter());
        for (auto* p : {&x, &w, &b}) p->grad() = Tensor<float>();
      },
      [&] {
        keep(torch_iter());
        for (auto* p : {&tx, &tw, &tb}) p->mutable_grad().reset();
      });
  print_time("gelu_bwd_16M", t, 1e3, "ms");
}

void sum_sq(const Options& o) {
  Tensor<float> a = big_input();
  torch::Tensor ta = to_torch(a);
  {
    Tensor<float> s = ember::sum(a * a);
    check("sum_sq_16M", "sum", s, (ta * ta).sum(), 0, 1e-4);
  }
  auto t = compare(
      o,
      [&] {
        Tensor<float> s = ember::sum(a * a);
        keep(s);
      },
      [&] {
        auto s = (ta * ta).sum();
        keep(s);
      });
  print_time("sum_sq_16M", t, 1e3, "ms");
}

template <class E>
void matmul_as(const Options& o, std::int64_t n, const char* name, torch::ScalarType tt) {
  const Tensor<float> a32 = ember::randn<float>({n, n}), b32 = ember::randn<float>({n, n});
  const Tensor<E> a = to_c<E>(a32), b = to_c<E>(b32);
  torch::Tensor ta = to_torch(a32).to(tt), tb = to_torch(b32).to(tt);
  if constexpr (std::is_same_v<E, float>) {
    Tensor<float> c = ember::matmul(a, b);
    // Entries are sums of n products of N(0,1) values (size ~sqrt(n)); fp32 rounding differs by summation order.
    check(name, "c", c, torch::mm(ta, tb), 1e-4 * std::sqrt(double(n)), 1e-4);
  } else {
    // Both round each fp32-accumulated entry once to bf16: within a few bf16 ulps of each other.
    Tensor<float> c = to_f(Tensor<E>(ember::matmul(a, b)));
    check(name, "c", c, torch::mm(ta, tb).to(torch::kFloat32), 2e-2 * std::sqrt(double(n)), 2e-2);
  }
  auto t = compare(
      o,
      [&] {
        Tensor<E> c = ember::matmul(a, b);
        keep(c);
      },
      [&] {
        auto c = torch::mm(ta, tb);
        keep(c);
      });
  const double flop = 2.0 * double(n) * double(n) * double(n);
  if (flop / t.torch_s / 1e9 < 10)
    std::fprintf(stderr, "note: %s: LibTorch's GEMM runs at %.1f GFLOP/s: it is using the reference BLAS (Debian's "
                 "default libblas3). For an optimised BLAS, install libopenblas0-openmp, or run with "
                 "LD_LIBRARY_PATH=<dir holding openblas-openmp's libblas.so.3>\n", name, flop / t.torch_s / 1e9);
  std::printf("case=%s%s ember=%.1fGFLOP/s libtorch=%.1fGFLOP/s speedup=%.2f\n", name,
              std::is_same_v<E, float> ? "" : "_bf16", flop / t.ember_s / 1e9, flop / t.torch_s / 1e9,
              t.torch_s / t.ember_s);
  std::fflush(stdout);
}
void matmul(const Options& o, std::int64_t n, const char* name) {
  if (o.bf16) matmul_as<bfloat16>(o, n, name, torch::kBFloat16);
  else matmul_as<float>(o, n, name, torch::kFloat32);
}

// ---- loader ------------------------------------------------------------------------------------------------

// Fashion-MNIST as a LibTorch user writes a dataset with augmentation. Random numbers from a per-thread
// std::mt19937, as cheap as ember's per-sample stream, so the comparison is of the pipelines, not of RNGs.
struct TorchFashion : torch::data::datasets::Dataset<TorchFashion> {
  torch::Tensor images;  // (N, 28, 28) uint8
  torch::Tensor labels;  // (N) int64
  bool augment = true;

  torch::data::Example<> get(size_t i) override {
    thread_local std::mt19937 rng(std::random_device{}());
    torch::Tensor x = images[int64_t(i)].to(torch::kFloat32).div(255).unsqueeze(0);  // (1, 28, 28)
    if (augment) {
      x = torch::constant_pad_nd(x, {4, 4, 4, 4}, 0);
      std::uniform_int_distribution<int64_t> pos(0, 8);
      x = x.narrow(1, pos(rng), 28).narrow(2, pos(rng), 28);
      if (std::uniform_real_distribution<float>(0, 1)(rng) < 0.5f) x = x.flip({2});
    }
    x = (x - 0.2860f) / 0.3530f;
    return {x.contiguous(), labels[int64_t(i)]};
  }
  torch::optional<size_t> size() const override { return size_t(images.size(0)); }
};

void loader(const Options& o) {
  std::unique_ptr<data::FashionMNIST> test;
  try {
    test = std::make_unique<data::FashionMNIST>(data::Split::Test);
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "note: loader skipped: %s\n", e.what());
    return;
  }
  namespace T = data::transforms;
  const auto images = torch::from_blob(test->images().data(), {std::int64_t(test->size()), 28, 28}, torch::kUInt8);
  const auto labels = torch::from_blob(test->labels().data(), {std::int64_t(test->size())}, torch::kInt64);
  auto make_torch = [&](bool augment, bool shuffle, std::size_t workers) {
    TorchFashion ds;
    ds.images = images;
    ds.labels = labels;
    ds.augment = augment;
    auto opts = torch::data::DataLoaderOptions().batch_size(128).workers(workers);
    std::function<void(const std::function<void(torch::Tensor&)>&)> run;
    if (shuffle) {
      auto l = std::shared_ptr(torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
          ds.map(torch::data::transforms::Stack<>()), opts));
      run = [l](const std::function<void(torch::Tensor&)>& f) {
        for (auto& b : *l) f(b.data);
      };
    } else {
      auto l = std::shared_ptr(torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
          ds.map(torch::data::transforms::Stack<>()), opts));
      run = [l](const std::function<void(torch::Tensor&)>& f) {
        for (auto& b : *l) f(b.data);
      };
    }
    return run;
  };
  {  // Without augmentation the first batch is the same in both.
    data::DataLoader el(*test, {.batch_size = 128}, T::Normalize({0.2860f}, {0.3530f}));
    auto tl = make_torch(false, false, 0);
    torch::Tensor first;
    tl([&](torch::Tensor& b) {
      if (!first.defined()) first = b.clone();
    });
    check("loader", "first batch", (*el.begin()).data, first, 1e-6, 1e-6);
  }
  data::DataLoader el(*test, {.batch_size = 128, .shuffle = true, .num_workers = 2},
                      T::Compose(T::RandomCrop(28, {.padding = 4}), T::RandomHorizontalFlip{},
                                 T::Normalize({0.2860f}, {0.3530f})));
  auto tl = make_torch(true, true, 2);
  std::uint64_t epoch = 0;
  auto t = compare(
      o,
      [&] {
        el.set_epoch(epoch++);
        for (auto& b : el) keep(b.data);
      },
      [&] { tl([](torch::Tensor& b) { keep(b); }); });
  const double n = double(test->size());
  std::printf("case=loader ember=%.0fsamples/s libtorch=%.0fsamples/s speedup=%.2f\n", n / t.ember_s,
              n / t.torch_s, t.torch_s / t.ember_s);
  std::fflush(stdout);
}
// ---- training: one epoch of the examples' models ------------------------------------------------------------

// The examples' models, under a precision policy (fp32 masters; bf16_mixed computes in bf16).
template <class P>
struct EmberMlp : nn::Module {
  using C = typename P::compute_t;
  nn::LinearT<P> fc1{784, 256}, fc2{256, 128}, fc3{128, 10};
  EmberMlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    const Tensor<C> h1 = relu(fc1(to_c<C>(x.flatten(1))));
    const Tensor<C> h2 = relu(fc2(h1));
    return to_f(fc3(h2));
  }
};

template <class P>
struct EmberCnn : nn::Module {
  using C = typename P::compute_t;
  nn::Conv2dT<P> conv1{1, 32, 3, {.padding = 1, .bias = false}};
  nn::BatchNormT<2, P> bn1{32};
  nn::Conv2dT<P> conv2{32, 64, 3, {.padding = 1, .bias = false}};
  nn::BatchNormT<2, P> bn2{64};
  nn::LinearT<P> fc{64 * 7 * 7, 10};
  EmberCnn() {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    Tensor<C> h = max_pool2d(Tensor<C>(relu(bn1(conv1(to_c<C>(x))))), 2);
    h = max_pool2d(Tensor<C>(relu(bn2(conv2(h)))), 2);
    return to_f(fc(h.flatten(1)));
  }
};

torch::nn::Sequential torch_model(bool cnn) {
  namespace tnn = torch::nn;
  if (!cnn)
    return tnn::Sequential(tnn::Flatten(), tnn::Linear(784, 256), tnn::ReLU(), tnn::Linear(256, 128), tnn::ReLU(),
                           tnn::Linear(128, 10));
  return tnn::Sequential(tnn::Conv2d(tnn::Conv2dOptions(1, 32, 3).padding(1).bias(false)), tnn::BatchNorm2d(32),
                         tnn::ReLU(), tnn::MaxPool2d(tnn::MaxPool2dOptions(2)),
                         tnn::Conv2d(tnn::Conv2dOptions(32, 64, 3).padding(1).bias(false)), tnn::BatchNorm2d(64),
                         tnn::ReLU(), tnn::MaxPool2d(tnn::MaxPool2dOptions(2)), tnn::Flatten(),
                         tnn::Linear(64 * 7 * 7, 10));
}

// Normalised images (N, 1, 28, 28) and labels of a split, the training split in one fixed shuffled order.
struct Split {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};
Split load_split(data::Split which, bool shuffle) {
  data::FashionMNIST ds(which);
  const std::int64_t n = std::int64_t(ds.size());
  Tensor<float> x = empty<float>({n, 1, 28, 28});
  Tensor<std::int64_t> y = empty<std::int64_t>({n});
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[std::size_t(i)] = i;
  if (shuffle) std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  const std::uint8_t* img = ds.images().data();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t s = order[std::size_t(i)];
    for (int p = 0; p < 784; ++p) x.data()[i * 784 + p] = (float(img[s * 784 + p]) / 255.f - 0.2860f) / 0.3530f;
    y.data()[i] = ds.labels().data()[s];
  }
  return {x, y};
}

// One epoch (or `steps` batches) of SGD (lr 0.05, momentum 0.9, Nesterov) at batch 128 in each library, timed
// alternately (ember, libtorch; one run each), then the test accuracy each model reached.
template <class P>
void train_case(const Options& o, bool cnn, const char* name) {
  Split tr, te;
  try {
    tr = load_split(data::Split::Train, true);
    te = load_split(data::Split::Test, false);
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "note: %s skipped: %s\n", name, e.what());
    return;
  }
  const std::int64_t n = tr.x.size(0), bs = 128;
  const std::int64_t steps = o.quick ? 60 : (n + bs - 1) / bs;
  auto to_t = [](const Tensor<float>& t) {
    return torch::from_blob(t.data(), std::vector<int64_t>(t.shape().begin(), t.shape().end()), torch::kFloat32);
  };
  const torch::Tensor txtr = to_t(tr.x), tytr = torch::from_blob(tr.y.data(), {n}, torch::kInt64);

  manual_seed(0);
  torch::manual_seed(0);
  std::unique_ptr<EmberMlp<P>> em;
  std::unique_ptr<EmberCnn<P>> ec;
  if (cnn) ec = std::make_unique<EmberCnn<P>>();
  else em = std::make_unique<EmberMlp<P>>();
  nn::Module& emod = cnn ? static_cast<nn::Module&>(*ec) : static_cast<nn::Module&>(*em);
  auto eforward = [&](const Tensor<float>& x) { return cnn ? ec->forward(x) : em->forward(x); };
  optim::SGD eopt(emod.parameters(), {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  torch::nn::Sequential tm = torch_model(cnn);
  torch::optim::SGD topt(tm->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));

  auto ember_epoch = [&] {
    emod.train();
    for (std::int64_t s = 0; s < steps; ++s) {
      const std::int64_t b0 = s * bs, b = std::min(bs, n - b0);
      Tensor<float> loss = nn::cross_entropy(eforward(tr.x.narrow(0, b0, b)), tr.y.narrow(0, b0, b));
      eopt.zero_grad();
      loss.backward();
      eopt.step();
    }
  };
  auto torch_epoch = [&] {
    tm->train();
    for (std::int64_t s = 0; s < steps; ++s) {
      const std::int64_t b0 = s * bs, b = std::min(bs, n - b0);
      torch::Tensor loss;
      {
        AutocastBf16 autocast(o.bf16);  // forward and loss under autocast, backward outside (as in PyTorch's recipe)
        loss = torch::nn::functional::cross_entropy(tm->forward(txtr.narrow(0, b0, b)), tytr.narrow(0, b0, b));
      }
      topt.zero_grad();
      loss.backward();
      topt.step();
    }
  };
  auto t0 = Clock::now();
  ember_epoch();
  const double te_s = seconds_since(t0);
  t0 = Clock::now();
  torch_epoch();
  const double tt_s = seconds_since(t0);

  // Test accuracy, in eval mode without autograd.
  const std::int64_t nt = te.x.size(0);
  std::int64_t ce = 0, ct = 0;
  {
    emod.eval();
    NoGradGuard ng;
    for (std::int64_t b0 = 0; b0 < nt; b0 += 1000) {
      const std::int64_t b = std::min<std::int64_t>(1000, nt - b0);
      ce += sum(cast<std::int64_t>(argmax(eforward(te.x.narrow(0, b0, b)), 1) == te.y.narrow(0, b0, b))).item();
    }
  }
  {
    tm->eval();
    torch::NoGradGuard ng;
    const torch::Tensor tx = to_t(te.x), ty = torch::from_blob(te.y.data(), {nt}, torch::kInt64);
    AutocastBf16 autocast(o.bf16);
    ct = tm->forward(tx).argmax(1).eq(ty).sum().item<std::int64_t>();
  }
  const double imgs = double(std::min(n, steps * bs));
  std::printf("case=%s%s ember=%.0fimages/s libtorch=%.0fimages/s speedup=%.2f ember_acc=%.4f libtorch_acc=%.4f\n",
              name, o.bf16 ? "_bf16" : "", imgs / te_s, imgs / tt_s, tt_s / te_s, double(ce) / double(nt),
              double(ct) / double(nt));
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") o.quick = true;
    else if (arg.rfind("--case=", 0) == 0) o.only = arg.substr(7);
    else if (arg == "--precision=bf16") o.bf16 = true;
    else if (arg == "--precision=fp32") o.bf16 = false;
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--case=NAME] [--precision=fp32|bf16]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<std::string> names = {"membw",      "tiny_add",    "tiny_grad",   "chain_16M",
                                          "gelu_bwd_16M", "sum_sq_16M", "matmul_1024", "matmul_2048",
                                          "loader",     "mlp_train",   "cnn_train"};
  if (!o.only.empty() && std::find(names.begin(), names.end(), o.only) == names.end()) {
    std::fprintf(stderr, "unknown case '%s'; cases:", o.only.c_str());
    for (auto& n : names) std::fprintf(stderr, " %s", n.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }

  try {
    at::set_num_interop_threads(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "note: at::set_num_interop_threads(1) refused: %s\n", e.what());
  }
  torch::set_num_threads(2);
  ember::cpu::set_num_threads(2);

  try {
    std::unique_ptr<Membw> membw;
    if (o.wants("membw") || o.wants("chain_16M")) {
      membw = std::make_unique<Membw>();
      membw->sample();  // warm-up
      membw->clear();
    }
    if (o.wants("membw") && !o.wants("chain_16M")) {
      for (int i = 0; i < o.measurements(); ++i) membw->sample();
      membw->report();
    }
    if (o.wants("tiny_add")) tiny_add(o);
    if (o.wants("tiny_grad")) tiny_grad(o);
    if (o.wants("chain_16M")) chain(o, membw.get());
    if (o.wants("gelu_bwd_16M")) gelu_bwd(o);
    if (o.wants("sum_sq_16M")) sum_sq(o);
    if (o.wants("matmul_1024")) matmul(o, 1024, "matmul_1024");
    if (o.wants("matmul_2048")) matmul(o, 2048, "matmul_2048");
    if (o.wants("loader")) loader(o);
    if (o.wants("mlp_train"))
      o.bf16 ? train_case<amp::bf16_mixed>(o, false, "mlp_train") : train_case<amp::fp32>(o, false, "mlp_train");
    if (o.wants("cnn_train"))
      o.bf16 ? train_case<amp::bf16_mixed>(o, true, "cnn_train") : train_case<amp::fp32>(o, true, "cnn_train");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (g_failed) {
    std::fprintf(stderr, "vs_libtorch: ember and libtorch results differ (see above)\n");
    return 1;
  }
  return 0;
}
