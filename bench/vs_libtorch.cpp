// ember vs LibTorch: the same work written the natural way in both libraries (eager LibTorch code as a PyTorch user
// writes it; every result goes into a new tensor in both), 2 threads each (ember::cpu::set_num_threads(2);
// torch::set_num_threads(2), at::set_num_interop_threads(1)). The peer is LibTorch from the current PyPI wheel
// (scripts/deps.sh --bench), its CPU libraries only.
//
// Method. The program is a driver that runs itself as child processes, so that neither library can disturb the
// other's timing (LibTorch's OpenMP threads spin after each parallel region and, in one process, halve ember's
// GEMM; ember's workers block on a condition variable between loops). Per case:
//   1. a check child runs both libraries once on the same inputs and compares the results (a wrong result prints
//      the max abs diff to stderr and the run fails); the training cases train one epoch each (--quick: 60 steps)
//      and report each model's test accuracy;
//   2. then `--rounds` rounds (default 5), each running, for each allocator setting, an ember child and two LibTorch
//      children, OpenMP's default wait policy and OMP_WAIT_POLICY=PASSIVE (and with --python, a torch.compile
//      child, bench/torch_compile_peer.py, likewise under both policies). A timing child touches one library only:
//      it warms the case up, calibrates the repetitions so that one rep set takes >= 0.3 s (--quick: 0.03 s), times
//      5 rep sets (--quick: 3) and prints the median time per repetition.
// Allocator settings: glibc's default, and "tuned": MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
// MALLOC_TOP_PAD_=268435456 for both libraries (glibc keeps freed memory, as jemalloc and tcmalloc do; otherwise
// every large LibTorch tensor is a fresh mmap whose pages fault in). The driver removes those variables and
// OMP_WAIT_POLICY from the children's environment and sets them per child.
// A figure is the median over rounds; each library is quoted at its faster wait policy (by that median; ember does
// not use OpenMP, its children run once per round); speedup = LibTorch's time / ember's time.
//
// Output, per case and allocator setting, on stdout:
//   case=<name> alloc=<default|tuned> ember=<v><unit> libtorch=<v><unit> speedup=<x> libtorch_omp=<policy>
//       rounds=<per-round speedups> [compiled=<v><unit> vs_compiled=<compiled time / ember time>
//       compiled_omp=<policy>] [case extras]
// Units: tiny_add us/op, tiny_grad us/iter (forward + backward), the 16M and conv cases ms per op or iteration,
// matmul GFLOP/s (2 n^3 flops), loader samples/s, training images/s. `case=membw` is std::memcpy of a 256 MiB buffer
// (pre-faulted), counting read + write bytes; one sample is the faster of one copy on one thread and one split over
// two threads (the limit for ember's 2 threads). With chain_16M, membw is sampled in the same rounds, and chain_16M
// adds frac_membw = ember's effective bandwidth (6 arrays x 64 MiB: 5 read + 1 written) / membw.
//
// conv3x3_fwd, conv3x3_train: conv2d 3x3, 64 -> 64 channels, 32x32 images, padding 1, bias, batch 32; forward, and
// forward + backward to the input, weight and bias (upstream gradient fixed).
//
// loader: ember's DataLoader against torch::data's on the same work: one epoch over Fashion-MNIST's test split
// (10000 images), batch 128, shuffled, 2 worker threads each; per sample: bytes -> float / 255, random 28x28 crop
// of the image zero-padded by 4, random horizontal flip, normalisation; then collation into (128, 1, 28, 28).
// The LibTorch side is a torch::data Dataset doing that with torch ops, mapped through Stack<>.
//
// mlp_train, cnn_train: training steps of the Fashion-MNIST examples' models (03: MLP 784-256-128-10, 04: two
// conv-BN-ReLU-maxpool blocks and a linear head), the same architecture in both libraries, batch 128, SGD lr 0.05
// with Nesterov momentum 0.9, over the same pre-normalised, pre-shuffled images (no loader in the timing). One
// repetition is one step. The check child's epoch gives `ember_acc` / `libtorch_acc`, each model's test accuracy.
// The cases that need Fashion-MNIST (dataset-fashion-mnist) are skipped with a note without it.
//
// --precision=bf16 runs matmul_* and *_train in bfloat16: ember's tensors in bf16 and its models under
// amp::bf16_mixed against LibTorch's bf16 torch::mm and its CPU autocast to bf16 around forward and loss (what
// `torch.autocast("cpu", dtype=torch.bfloat16)` does; bench/torch_autocast_peer.py is the Python check of it).
//
// Usage: vs_libtorch [--quick] [--case=NAME] [--precision=fp32|bf16] [--rounds=N] [--python=PYTHON]
//        (NAME one of the case names above, or membw; PYTHON an interpreter whose torch has its dependencies,
//        scripts/deps.sh --bench-python, for the torch.compile column of chain_16M, gelu_bwd_16M, sum_sq_16M and
//        the training cases)
// Internal: --side=check|ember|libtorch runs one child's part of one case.
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ember/data.hpp>
#include <ember/ember.hpp>

extern char** environ;

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

enum class Side { driver, check, ember, libtorch };

struct Options {
  Side side = Side::driver;
  bool quick = false;
  bool bf16 = false;  // --precision=bf16: the matmul and training cases in bfloat16 (ember bf16_mixed, LibTorch autocast)
  std::string only;
  int rounds = 5;
  std::string python;  // --python: the torch.compile peer's interpreter
  double target_s() const { return quick ? 0.03 : 0.3; }
  int measurements() const { return quick ? 3 : 5; }
  int warmups() const { return quick ? 1 : 2; }
  bool wants(const std::string& name) const { return only.empty() || only == name; }
  bool ember() const { return side == Side::ember; }
  bool torch() const { return side == Side::libtorch; }
  bool checking() const { return side == Side::check; }
};

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
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

// A timing child's work: warm-up, calibration, rep sets; prints the median seconds per repetition.
void measure(const Options& o, const char* name, const std::function<void()>& fn) {
  for (int i = 0; i < o.warmups(); ++i) fn();
  const long reps = calibrate(fn, o.target_s());
  std::vector<double> t;
  for (int m = 0; m < o.measurements(); ++m) t.push_back(time_reps(fn, reps));
  std::printf("case=%s seconds=%.9g\n", name, median(t));
  std::fflush(stdout);
}

// Runs the side this process was started for: fe (ember) or ft (LibTorch). The check side runs neither here.
void measure_side(const Options& o, const char* name, const std::function<void()>& fe,
                  const std::function<void()>& ft) {
  if (o.ember()) measure(o, name, fe);
  else if (o.torch()) measure(o, name, ft);
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
bool g_reported = false;  // a check side printed its case line itself

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

// ---- memcpy bandwidth --------------------------------------------------------------------------------------

// One sample: one copy on one thread and one split over two threads; the faster of the two, as seconds per copy.
void membw(const Options& o) {
  if (!o.ember()) return;
  constexpr std::size_t kBytes = std::size_t(256) << 20;
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);  // both pre-faulted
  auto sample = [&] {
    const std::size_t half = kBytes / 2;
    auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), kBytes);
    keep(dst);
    const double one = seconds_since(t0);
    t0 = Clock::now();
    std::thread other([&] { std::memcpy(dst.data() + half, src.data() + half, half); });
    std::memcpy(dst.data(), src.data(), half);
    other.join();
    keep(dst);
    return std::min(one, seconds_since(t0));
  };
  sample();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < o.measurements(); ++i) t.push_back(sample());
  std::printf("case=membw seconds=%.9g\n", median(t));
  std::fflush(stdout);
}

// ---- cases -------------------------------------------------------------------------------------------------

constexpr std::int64_t kBig = 16 << 20;  // 16M floats = 64 MiB per array

// Uniform in [-2, 2): cheap to make (randn's Box-Muller costs ~0.5 s per 16M values).
Tensor<float> big_input() { return ember::rand<float>({kBig}) * 4.f - 2.f; }

void tiny_add(const Options& o) {
  Tensor<float> a = ember::randn<float>({8}), b = ember::randn<float>({8});
  if (o.ember()) return measure(o, "tiny_add", [&] {
    Tensor<float> c = a + b;
    keep(c);
  });
  torch::Tensor ta = to_torch(a), tb = to_torch(b);
  if (o.checking()) return check("tiny_add", "c", Tensor<float>(a + b), ta + tb, 0, 0);
  measure(o, "tiny_add", [&] {
    auto c = ta + tb;
    keep(c);
  });
}

void tiny_grad(const Options& o) {
  Tensor<float> x = ember::randn<float>({8});
  torch::Tensor tx = o.ember() ? torch::Tensor() : to_torch(x);
  x.requires_grad_();
  if (tx.defined()) tx.requires_grad_();
  if (o.checking()) {
    Tensor<float> s = ember::sum(x * 2.f + 1.f);
    s.backward();
    auto ts = (tx * 2 + 1).sum();
    ts.backward();
    check("tiny_grad", "loss", s.detach(), ts.detach(), 1e-5, 1e-5);
    check("tiny_grad", "x.grad", x.grad(), tx.grad(), 0, 0);
    return;
  }
  measure_side(
      o, "tiny_grad",
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
}

void chain(const Options& o) {
  Tensor<float> a = big_input(), b = big_input(), c = big_input(), d = big_input(), e = big_input();
  if (o.ember()) return measure(o, "chain_16M", [&] {
    Tensor<float> y = a * b + c * d - e;
    keep(y);
  });
  torch::Tensor ta = to_torch(a), tb = to_torch(b), tc = to_torch(c), td = to_torch(d), te = to_torch(e);
  if (o.checking())
    return check("chain_16M", "y", Tensor<float>(a * b + c * d - e), ta * tb + tc * td - te, 1e-5, 1e-5);
  measure(o, "chain_16M", [&] {
    auto y = ta * tb + tc * td - te;
    keep(y);
  });
}

void gelu_bwd(const Options& o) {
  Tensor<float> x = big_input(), w = big_input(), b = big_input();
  Tensor<float> g = ember::ones<float>({kBig});
  for (auto* p : {&x, &w, &b}) p->requires_grad_();
  auto ember_iter = [&] {
    Tensor<float> y = ember::gelu(x * w + b);
    y.backward(g);
    return y;
  };
  if (o.ember()) return measure(o, "gelu_bwd_16M", [&] {
    keep(ember_iter());
    for (auto* p : {&x, &w, &b}) p->grad() = Tensor<float>();
  });
  torch::Tensor tx = to_torch(x.detach()), tw = to_torch(w.detach()), tb = to_torch(b.detach());
  const torch::Tensor tg = torch::ones({kBig});
  for (auto* p : {&tx, &tw, &tb}) p->requires_grad_();
  auto torch_iter = [&] {
    auto y = torch::gelu(tx * tw + tb);
    y.backward(tg);
    return y;
  };
  if (o.checking()) {
    Tensor<float> y = ember_iter();
    torch::Tensor ty = torch_iter();
    check("gelu_bwd_16M", "y", y.detach(), ty.detach(), 1e-5, 1e-5);
    check("gelu_bwd_16M", "x.grad", x.grad(), tx.grad(), 1e-5, 1e-4);
    check("gelu_bwd_16M", "w.grad", w.grad(), tw.grad(), 1e-5, 1e-4);
    check("gelu_bwd_16M", "b.grad", b.grad(), tb.grad(), 1e-5, 1e-4);
    return;
  }
  measure(o, "gelu_bwd_16M", [&] {
    keep(torch_iter());
    for (auto* p : {&tx, &tw, &tb}) p->mutable_grad().reset();
  });
}

// Causal scaled dot-product attention, forward and backward, (B, H, L, D) = (8, 4, 256, 64) fp32: ember's blocked
// kernel against LibTorch's at::scaled_dot_product_attention (its CPU flash-attention kernel for fp32).
void sdpa_causal(const Options& o) {
  Generator gen(41);
  Tensor<float> q = randn<float>({8, 4, 256, 64}, gen), k = randn<float>({8, 4, 256, 64}, gen),
                v = randn<float>({8, 4, 256, 64}, gen), g = randn<float>({8, 4, 256, 64}, gen);
  for (auto* p : {&q, &k, &v}) p->requires_grad_();
  SdpaOptions<float> so;
  so.is_causal = true;
  auto ember_iter = [&] {
    Tensor<float> y = scaled_dot_product_attention(q, k, v, so);
    y.backward(g);
    return y;
  };
  if (o.ember()) return measure(o, "sdpa_causal", [&] {
    keep(ember_iter());
    for (auto* p : {&q, &k, &v}) p->grad() = Tensor<float>();
  });
  torch::Tensor tq = to_torch(q.detach()), tk = to_torch(k.detach()), tv = to_torch(v.detach()), tg = to_torch(g);
  for (auto* p : {&tq, &tk, &tv}) p->requires_grad_();
  auto torch_iter = [&] {
    auto y = at::scaled_dot_product_attention(tq, tk, tv, {}, 0.0, true);
    y.backward(tg);
    return y;
  };
  if (o.checking()) {
    Tensor<float> y = ember_iter();
    torch::Tensor ty = torch_iter();
    check("sdpa_causal", "y", y.detach(), ty.detach(), 1e-5, 1e-4);
    check("sdpa_causal", "q.grad", q.grad(), tq.grad(), 1e-4, 1e-3);
    check("sdpa_causal", "k.grad", k.grad(), tk.grad(), 1e-4, 1e-3);
    check("sdpa_causal", "v.grad", v.grad(), tv.grad(), 1e-4, 1e-3);
    return;
  }
  measure(o, "sdpa_causal", [&] {
    keep(torch_iter());
    for (auto* p : {&tq, &tk, &tv}) p->mutable_grad().reset();
  });
}

void sum_sq(const Options& o) {
  Tensor<float> a = big_input();
  if (o.ember()) return measure(o, "sum_sq_16M", [&] {
    Tensor<float> s = ember::sum(a * a);
    keep(s);
  });
  torch::Tensor ta = to_torch(a);
  if (o.checking()) return check("sum_sq_16M", "sum", Tensor<float>(ember::sum(a * a)), (ta * ta).sum(), 0, 1e-4);
  measure(o, "sum_sq_16M", [&] {
    auto s = (ta * ta).sum();
    keep(s);
  });
}

template <class E>
void matmul_as(const Options& o, std::int64_t n, const char* name, torch::ScalarType tt) {
  const Tensor<float> a32 = ember::randn<float>({n, n}), b32 = ember::randn<float>({n, n});
  const Tensor<E> a = to_c<E>(a32), b = to_c<E>(b32);
  if (o.ember()) return measure(o, name, [&] {
    Tensor<E> c = ember::matmul(a, b);
    keep(c);
  });
  torch::Tensor ta = to_torch(a32).to(tt), tb = to_torch(b32).to(tt);
  if (o.checking()) {
    if constexpr (std::is_same_v<E, float>) {
      // Entries are sums of n products of N(0,1) values (size ~sqrt(n)); fp32 rounding differs by summation order.
      check(name, "c", ember::matmul(a, b), torch::mm(ta, tb), 1e-4 * std::sqrt(double(n)), 1e-4);
    } else {
      // Both round each fp32-accumulated entry once to bf16: within a few bf16 ulps of each other.
      Tensor<float> c = to_f(Tensor<E>(ember::matmul(a, b)));
      check(name, "c", c, torch::mm(ta, tb).to(torch::kFloat32), 2e-2 * std::sqrt(double(n)), 2e-2);
    }
    return;
  }
  measure(o, name, [&] {
    auto c = torch::mm(ta, tb);
    keep(c);
  });
}
void matmul(const Options& o, std::int64_t n, const char* name) {
  if (o.bf16) matmul_as<bfloat16>(o, n, (std::string(name) + "_bf16").c_str(), torch::kBFloat16);
  else matmul_as<float>(o, n, name, torch::kFloat32);
}
void matmul_1024(const Options& o) { matmul(o, 1024, "matmul_1024"); }
void matmul_2048(const Options& o) { matmul(o, 2048, "matmul_2048"); }

// conv2d 3x3, 64 -> 64 channels, 32x32, padding 1, with bias, batch 32: forward, or forward + backward.
void conv3x3(const Options& o, bool train) {
  const char* name = train ? "conv3x3_train" : "conv3x3_fwd";
  Tensor<float> x = ember::randn<float>({32, 64, 32, 32});
  Tensor<float> w = ember::randn<float>({64, 64, 3, 3}) * (1.f / 24.f);  // PyTorch's default init scale
  Tensor<float> b = ember::randn<float>({64}) * 0.1f;
  const Tensor<float> g = ember::randn<float>({32, 64, 32, 32});
  if (train)
    for (auto* p : {&x, &w, &b}) p->requires_grad_();
  auto ember_iter = [&] {
    Tensor<float> y = ember::conv2d(x, w, b, {.padding = 1});
    if (train) {
      y.backward(g);
      for (auto* p : {&x, &w, &b}) p->grad() = Tensor<float>();
    }
    return y;
  };
  if (o.ember()) return measure(o, name, [&] { keep(ember_iter()); });
  torch::Tensor tx = to_torch(x.detach()), tw = to_torch(w.detach()), tb = to_torch(b.detach()), tg = to_torch(g);
  if (train)
    for (auto* p : {&tx, &tw, &tb}) p->requires_grad_();
  auto torch_iter = [&] {
    auto y = torch::conv2d(tx, tw, tb, 1, 1);
    if (train) {
      y.backward(tg);
      for (auto* p : {&tx, &tw, &tb}) p->mutable_grad().reset();
    }
    return y;
  };
  if (o.checking()) {
    Tensor<float> y = ember::conv2d(x, w, b, {.padding = 1});
    torch::Tensor ty = torch::conv2d(tx, tw, tb, 1, 1);
    check(name, "y", y.detach(), ty.detach(), 1e-4, 1e-4);
    if (train) {
      y.backward(g);
      ty.backward(tg);
      // Sums over 32 x 32 x 32 positions (and 576 taps for x.grad) of N(0,1)-sized products.
      check(name, "x.grad", x.grad(), tx.grad(), 1e-3, 1e-4);
      check(name, "w.grad", w.grad(), tw.grad(), 2e-2, 1e-4);
      check(name, "b.grad", b.grad(), tb.grad(), 2e-2, 1e-4);
    }
    return;
  }
  measure(o, name, [&] { keep(torch_iter()); });
}
void conv3x3_fwd(const Options& o) { conv3x3(o, false); }
void conv3x3_train(const Options& o) { conv3x3(o, true); }

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
    std::printf("case=loader skipped\n");
    g_reported = true;
    return;
  }
  namespace T = data::transforms;
  auto make_torch = [&](bool augment, bool shuffle, std::size_t workers) {
    TorchFashion ds;
    ds.images = torch::from_blob(test->images().data(), {std::int64_t(test->size()), 28, 28}, torch::kUInt8);
    ds.labels = torch::from_blob(test->labels().data(), {std::int64_t(test->size())}, torch::kInt64);
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
  if (o.checking()) {  // Without augmentation the first batch is the same in both.
    data::DataLoader el(*test, {.batch_size = 128}, T::Normalize({0.2860f}, {0.3530f}));
    auto tl = make_torch(false, false, 0);
    torch::Tensor first;
    tl([&](torch::Tensor& b) {
      if (!first.defined()) first = b.clone();
    });
    return check("loader", "first batch", (*el.begin()).data, first, 1e-6, 1e-6);
  }
  if (o.ember()) {
    data::DataLoader el(*test, {.batch_size = 128, .shuffle = true, .num_workers = 2},
                        T::Compose(T::RandomCrop(28, {.padding = 4}), T::RandomHorizontalFlip{},
                                   T::Normalize({0.2860f}, {0.3530f})));
    std::uint64_t epoch = 0;
    return measure(o, "loader", [&] {
      el.set_epoch(epoch++);
      for (auto& b : el) keep(b.data);
    });
  }
  auto tl = make_torch(true, true, 2);
  measure(o, "loader", [&] { tl([](torch::Tensor& b) { keep(b); }); });
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
    // Each Linear -> ReLU as one op (the ReLU in the GEMM's write-back), as an nn::Sequential of the modules runs it.
    const Tensor<C> h1 = fc1.forward(to_c<C>(x.flatten(1)), Activation::relu);
    const Tensor<C> h2 = fc2.forward(h1, Activation::relu);
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
    // Each conv -> batch norm -> ReLU -> pool block as one fused op in training (nn/conv_bn.hpp), as an
    // nn::Sequential of the same fp32 modules runs it; under bf16_mixed the convolutions run in bf16 and the batch
    // norms keep fp32 parameters and statistics.
    Tensor<C> h = nn::conv_bn_forward(conv1, bn1, to_c<C>(x), {.relu = true, .pool2 = true});
    h = nn::conv_bn_forward(conv2, bn2, h, {.relu = true, .pool2 = true});
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

// SGD (lr 0.05, momentum 0.9, Nesterov) at batch 128. The check side trains one epoch (or 60 steps) in each
// library and prints the test accuracy each model reached; a timing side times single steps, going round the
// epoch's full batches.
template <class P>
void train_case(const Options& o, bool cnn, const char* name) {
  Split tr, te;
  try {
    tr = load_split(data::Split::Train, true);
    te = load_split(data::Split::Test, false);
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "note: %s skipped: %s\n", name, e.what());
    std::printf("case=%s%s skipped\n", name, o.bf16 ? "_bf16" : "");
    g_reported = true;
    return;
  }
  const std::int64_t n = tr.x.size(0), bs = 128;
  const std::int64_t steps = o.quick ? 60 : (n + bs - 1) / bs;
  auto to_t = [](const Tensor<float>& t) {
    return torch::from_blob(t.data(), std::vector<int64_t>(t.shape().begin(), t.shape().end()), torch::kFloat32);
  };
  const std::string label = std::string(name) + (o.bf16 ? "_bf16" : "");
  const std::int64_t full = n / bs;  // the timing sides go round the full batches (a step is bs images)
  std::int64_t next = 0;

  // ember
  std::unique_ptr<EmberMlp<P>> em;
  std::unique_ptr<EmberCnn<P>> ec;
  std::unique_ptr<optim::SGD<float>> eopt;
  auto eforward = [&](const Tensor<float>& x) { return cnn ? ec->forward(x) : em->forward(x); };
  auto ember_step = [&](std::int64_t s) {
    const std::int64_t b0 = s * bs, b = std::min(bs, n - b0);
    Tensor<float> loss = nn::cross_entropy(eforward(tr.x.narrow(0, b0, b)), tr.y.narrow(0, b0, b));
    eopt->zero_grad();
    loss.backward();
    eopt->step();
  };
  if (!o.torch()) {
    manual_seed(0);
    if (cnn) ec = std::make_unique<EmberCnn<P>>();
    else em = std::make_unique<EmberMlp<P>>();
    nn::Module& emod = cnn ? static_cast<nn::Module&>(*ec) : static_cast<nn::Module&>(*em);
    eopt = std::make_unique<optim::SGD<float>>(emod.parameters(),
                                               optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
    emod.train();
    if (o.ember()) return measure(o, label.c_str(), [&] { ember_step(next++ % full); });
  }

  // LibTorch
  const torch::Tensor txtr = to_t(tr.x), tytr = torch::from_blob(tr.y.data(), {n}, torch::kInt64);
  torch::manual_seed(0);
  torch::nn::Sequential tm = torch_model(cnn);
  torch::optim::SGD topt(tm->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
  tm->train();
  auto torch_step = [&](std::int64_t s) {
    const std::int64_t b0 = s * bs, b = std::min(bs, n - b0);
    torch::Tensor loss;
    {
      AutocastBf16 autocast(o.bf16);  // forward and loss under autocast, backward outside (as in PyTorch's recipe)
      loss = torch::nn::functional::cross_entropy(tm->forward(txtr.narrow(0, b0, b)), tytr.narrow(0, b0, b));
    }
    topt.zero_grad();
    loss.backward();
    topt.step();
  };
  if (o.torch()) return measure(o, label.c_str(), [&] { torch_step(next++ % full); });

  // The check: one epoch each, then the test accuracy, in eval mode without autograd.
  for (std::int64_t s = 0; s < steps; ++s) ember_step(s);
  for (std::int64_t s = 0; s < steps; ++s) torch_step(s);
  const std::int64_t nt = te.x.size(0);
  std::int64_t ce = 0, ct = 0;
  {
    nn::Module& emod = cnn ? static_cast<nn::Module&>(*ec) : static_cast<nn::Module&>(*em);
    emod.eval();
    InferenceMode guard;
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
  g_reported = true;
  std::printf("case=%s check ember_acc=%.4f libtorch_acc=%.4f\n", label.c_str(), double(ce) / double(nt),
              double(ct) / double(nt));
  std::fflush(stdout);
}
void mlp_train(const Options& o) {
  o.bf16 ? train_case<amp::bf16_mixed>(o, false, "mlp_train") : train_case<amp::fp32>(o, false, "mlp_train");
}
void cnn_train(const Options& o) {
  o.bf16 ? train_case<amp::bf16_mixed>(o, true, "cnn_train") : train_case<amp::fp32>(o, true, "cnn_train");
}

// ---- the driver ---------------------------------------------------------------------------------------------

struct Case {
  const char* name;
  void (*run)(const Options&);
  const char* unit;
  double scale;  // rate: value = scale / seconds (work per repetition); else value = seconds * scale
  bool rate;
  bool compiled;  // bench/torch_compile_peer.py times it too
  bool precision;  // --precision=bf16 changes it (its name gains _bf16)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {"membw", membw, "GB/s", 2.0 * double(std::size_t(256) << 20) / 1e9, true, false, false},
      {"tiny_add", tiny_add, "us/op", 1e6, false, false, false},
      {"tiny_grad", tiny_grad, "us/iter", 1e6, false, false, false},
      {"chain_16M", chain, "ms", 1e3, false, true, false},
      {"gelu_bwd_16M", gelu_bwd, "ms", 1e3, false, true, false},
      {"sum_sq_16M", sum_sq, "ms", 1e3, false, true, false},
      {"sdpa_causal", sdpa_causal, "ms", 1e3, false, false, false},
      {"matmul_1024", matmul_1024, "GFLOP/s", 2.0 * 1024 * 1024 * 1024 / 1e9, true, false, true},
      {"matmul_2048", matmul_2048, "GFLOP/s", 2.0 * 2048 * 2048 * 2048 / 1e9, true, false, true},
      {"conv3x3_fwd", conv3x3_fwd, "ms", 1e3, false, false, false},
      {"conv3x3_train", conv3x3_train, "ms", 1e3, false, false, false},
      {"loader", loader, "samples/s", 10000, true, false, false},
      {"mlp_train", mlp_train, "images/s", 128, true, true, true},
      {"cnn_train", cnn_train, "images/s", 128, true, true, true},
  };
  return all;
}

struct ChildResult {
  int status = 0;
  std::string out;
};

// Runs argv with the driver's environment minus `drop` plus `set`; returns its exit status and stdout (stderr goes
// to the driver's).
ChildResult spawn(const std::vector<std::string>& argv, const std::vector<std::string>& drop,
                  const std::vector<std::string>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string key = kv.substr(0, kv.find('='));
    if (std::find(drop.begin(), drop.end(), key) == drop.end()) env.push_back(kv);
  }
  env.insert(env.end(), set.begin(), set.end());
  std::vector<char*> av, ev;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  int fd[2];
  if (::pipe(fd) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
  posix_spawn_file_actions_addclose(&fa, fd[0]);
  posix_spawn_file_actions_addclose(&fa, fd[1]);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, av[0], &fa, nullptr, av.data(), ev.data());  // --python=python3 works too
  posix_spawn_file_actions_destroy(&fa);
  ::close(fd[1]);
  if (rc != 0) {
    ::close(fd[0]);
    throw std::runtime_error("cannot start " + argv[0] + ": " + std::strerror(rc));
  }
  ChildResult r;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(fd[0], buf, sizeof buf);
    if (k > 0) r.out.append(buf, std::size_t(k));
    else if (k == 0 || errno != EINTR) break;
  }
  ::close(fd[0]);
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  return r;
}

// The value of `key=` on the line of `out` that starts with "case=<name> " (NaN when absent).
double field(const std::string& out, const std::string& name, const std::string& key) {
  const std::string head = "case=" + name + " ";
  for (std::size_t p = 0; (p = out.find(head, p)) != std::string::npos; p += head.size()) {
    if (p != 0 && out[p - 1] != '\n') continue;
    const std::size_t eol = out.find('\n', p);
    const std::string line = out.substr(p, eol == std::string::npos ? std::string::npos : eol - p);
    const std::size_t k = line.find(" " + key + "=");
    if (k != std::string::npos) return std::strtod(line.c_str() + k + key.size() + 2, nullptr);
  }
  return NAN;
}

std::string self_path() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  return std::string(buf, std::size_t(n));
}

const std::vector<std::string> kControlled = {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                                              "OMP_WAIT_POLICY"};
const std::vector<std::string> kTuned = {"MALLOC_MMAP_MAX_=0", "MALLOC_TRIM_THRESHOLD_=68719476736",
                                         "MALLOC_TOP_PAD_=268435456"};

// One timing child; its seconds per repetition (exits on failure).
double timed_child(const std::vector<std::string>& argv, const std::string& name, bool tuned, bool passive) {
  std::vector<std::string> set = tuned ? kTuned : std::vector<std::string>{};
  if (passive) set.push_back("OMP_WAIT_POLICY=PASSIVE");
  const ChildResult r = spawn(argv, kControlled, set);
  const double s = field(r.out, name, "seconds");
  if (r.status != 0 || !(s > 0)) {
    std::fprintf(stderr, "vs_libtorch: child '%s %s' failed (status %d), output:\n%s\n", argv[0].c_str(),
                 argv.size() > 1 ? argv[1].c_str() : "", r.status, r.out.c_str());
    std::exit(1);
  }
  return s;
}

std::string fmt_value(const Case& c, double seconds) {
  char b[64];
  const double v = c.rate ? c.scale / seconds : seconds * c.scale;
  if (v >= 1e4) std::snprintf(b, sizeof b, "%.0f%s", v, c.unit);
  else std::snprintf(b, sizeof b, "%.4g%s", v, c.unit);
  return b;
}

int drive(const Options& o) {
  const std::string self = self_path();
  std::vector<const Case*> todo;
  for (const Case& c : cases())
    if (o.wants(c.name) || (std::string(c.name) == "membw" && o.wants("chain_16M"))) todo.push_back(&c);
  std::string script;
#ifdef EMBER_BENCH_DIR
  script = std::string(EMBER_BENCH_DIR) + "/torch_compile_peer.py";
#endif
  std::vector<std::string> common;
  if (o.quick) common.push_back("--quick");
  if (o.bf16) common.push_back("--precision=bf16");
  double membw_s = NAN;
  for (const Case* c : todo) {
    const std::string name = std::string(c->name) + (c->precision && o.bf16 ? "_bf16" : "");
    auto args = [&](const char* side) {
      std::vector<std::string> a = {self, std::string("--side=") + side, std::string("--case=") + c->name};
      a.insert(a.end(), common.begin(), common.end());
      return a;
    };
    const bool is_membw = std::string(c->name) == "membw";
    std::string extras;  // from the check child: accuracies
    if (!is_membw) {
      const ChildResult r = spawn(args("check"), kControlled, {});
      if (r.status != 0) {
        std::fprintf(stderr, "vs_libtorch: %s: the check failed (status %d)\n%s", name.c_str(), r.status,
                     r.out.c_str());
        return 1;
      }
      const std::string head = "case=" + name + " check";
      const std::size_t p = r.out.find(head);
      if (p != std::string::npos) extras = r.out.substr(p + head.size(), r.out.find('\n', p) - p - head.size());
      if (r.out.find("case=" + name + " skipped") != std::string::npos) {
        std::printf("case=%s skipped (see the note above)\n", name.c_str());
        std::fflush(stdout);
        continue;
      }
    }
    const bool compiled = c->compiled && !o.python.empty() && !o.bf16;
    // [alloc] -> per-round seconds; LibTorch and the compiled peer under [policy] too
    std::vector<double> te[2], tt[2][2], tc[2][2];
    for (int round = 0; round < (o.quick ? 1 : o.rounds); ++round)
      for (int alloc = 0; alloc < 2; ++alloc) {
        te[alloc].push_back(timed_child(args("ember"), name, alloc == 1, false));
        if (is_membw) continue;
        for (int pol = 0; pol < 2; ++pol)
          tt[alloc][pol].push_back(timed_child(args("libtorch"), name, alloc == 1, pol));
        if (compiled)
          for (int pol = 0; pol < 2; ++pol) {
            std::vector<std::string> a = {o.python, script, std::string("--case=") + c->name};
            if (o.quick) a.push_back("--quick");
            tc[alloc][pol].push_back(timed_child(a, name, alloc == 1, pol));
          }
      }
    if (is_membw) {
      membw_s = median(te[0]);
      std::printf("case=membw value=%s rounds=%zu\n", fmt_value(*c, membw_s).c_str(), te[0].size());
      std::fflush(stdout);
      continue;
    }
    for (int alloc = 0; alloc < 2; ++alloc) {
      const double e = median(te[alloc]);
      const int pol = median(tt[alloc][1]) < median(tt[alloc][0]) ? 1 : 0;
      const double t = median(tt[alloc][pol]);
      std::string line = "case=" + name + " alloc=" + (alloc ? "tuned" : "default") + " ember=" + fmt_value(*c, e) +
                         " libtorch=" + fmt_value(*c, t);
      char b[128];
      std::snprintf(b, sizeof b, " speedup=%.2f libtorch_omp=%s rounds=", t / e, pol ? "passive" : "default");
      line += b;
      for (std::size_t r = 0; r < te[alloc].size(); ++r) {
        std::snprintf(b, sizeof b, "%s%.2f", r ? "," : "", tt[alloc][pol][r] / te[alloc][r]);
        line += b;
      }
      if (compiled) {
        const int cp = median(tc[alloc][1]) < median(tc[alloc][0]) ? 1 : 0;
        const double k = median(tc[alloc][cp]);
        std::snprintf(b, sizeof b, " vs_compiled=%.2f compiled_omp=%s", k / e, cp ? "passive" : "default");
        line += " compiled=" + fmt_value(*c, k) + b;
      }
      if (std::string(c->name) == "chain_16M" && membw_s > 0) {
        // 6 arrays of 64 MiB move per op (5 read, 1 written); membw moves 2 x 256 MiB per copy.
        std::snprintf(b, sizeof b, " frac_membw=%.2f", (6.0 * 64 / e) / (2.0 * 256 / membw_s));
        line += b;
      }
      std::printf("%s%s\n", line.c_str(), extras.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  auto usage = [&] {
    std::fprintf(stderr, "usage: %s [--quick] [--case=NAME] [--precision=fp32|bf16] [--rounds=N] [--python=PYTHON]\n",
                 argv[0]);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") o.quick = true;
    else if (arg.rfind("--case=", 0) == 0) o.only = arg.substr(7);
    else if (arg == "--precision=bf16") o.bf16 = true;
    else if (arg == "--precision=fp32") o.bf16 = false;
    else if (arg.rfind("--rounds=", 0) == 0) o.rounds = std::max(1, std::atoi(arg.c_str() + 9));
    else if (arg.rfind("--python=", 0) == 0) o.python = arg.substr(9);
    else if (arg == "--side=check") o.side = Side::check;
    else if (arg == "--side=ember") o.side = Side::ember;
    else if (arg == "--side=libtorch") o.side = Side::libtorch;
    else return usage();
  }
  bool known = o.only.empty();
  for (const Case& c : cases()) known |= o.only == c.name;
  if (!known) {
    std::fprintf(stderr, "unknown case '%s'; cases:", o.only.c_str());
    for (const Case& c : cases()) std::fprintf(stderr, " %s", c.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  try {
    if (o.side == Side::driver) return drive(o);
    if (o.only.empty()) return usage();  // a child runs one case
    ember::cpu::set_num_threads(2);
    if (!o.ember()) {  // the ember side never touches LibTorch, so its OpenMP threads never start
      try {
        at::set_num_interop_threads(1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "note: at::set_num_interop_threads(1) refused: %s\n", e.what());
      }
      torch::set_num_threads(2);
    }
    for (const Case& c : cases())
      if (o.only == c.name) c.run(o);
    if (o.checking() && !g_reported && !g_failed) std::printf("case=%s check\n", o.only.c_str());
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
