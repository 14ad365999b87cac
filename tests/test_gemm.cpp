// The CPU GEMM (cpu/gemm.hpp) against a naive double-precision reference: odd sizes around the micro-tile and
// cache-block edges, all four transpose combinations, accumulate mode, padded leading dims, 1 and 2 threads,
// float and double. Integer-valued operands make every product and partial sum exact, so those results must
// match bit for bit whatever the summation order; real-valued operands are checked against the worst-case
// rounding bound.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "helpers.hpp"

namespace {

using namespace ember_test;

// A column-major or row-major matrix with a padded leading dimension, stored in a plain vector.
template <class T>
struct Mat {
  i64 rows, cols, ld;
  bool col_major;
  std::vector<T> v;
  Mat(i64 r, i64 c, bool cm, i64 pad) : rows(r), cols(c), ld((cm ? r : c) + pad), col_major(cm) {
    v.assign(std::size_t((cm ? c : r) * ld + 1), T(-777));  // padding holds a sentinel
  }
  i64 rs() const { return col_major ? 1 : ld; }
  i64 cs() const { return col_major ? ld : 1; }
  T& at(i64 i, i64 j) { return v[std::size_t(i * rs() + j * cs())]; }
  T at(i64 i, i64 j) const { return v[std::size_t(i * rs() + j * cs())]; }
  cpu::MatView<T> view() const { return {v.data(), rs(), cs()}; }
};

template <class T>
void fill(Mat<T>& m, std::mt19937& g, bool integers) {
  std::uniform_int_distribution<int> di(-3, 3);
  std::normal_distribution<double> dn(0.0, 1.0);
  for (i64 i = 0; i < m.rows; ++i)
    for (i64 j = 0; j < m.cols; ++j) m.at(i, j) = integers ? T(di(g)) : T(dn(g));
}

// Elements of two same-shaped matrices (their padding included) whose bit patterns differ (the data are NaN-free;
// -0 and +0 would differ).
template <class T>
int bit_diffs(const Mat<T>& got, const Mat<T>& want) {
  int diff = 0;
  for (std::size_t i = 0; i < got.v.size(); ++i) diff += std::memcmp(&got.v[i], &want.v[i], sizeof(T)) != 0;
  return diff;
}

struct Case {
  i64 m, n, k;
  bool ta, tb, accumulate;
  i64 pad;
};

// Runs C = [C +] A @ B through cpu::gemm and compares with the double reference. Returns the number of wrong
// elements (a padding element that changed counts as wrong). T is the operands' type, TC the output's: for 16-bit
// operands the products are exact in fp32 and the sum is accumulated in fp32, so the result must be the fp32 sum
// rounded once into TC (bit for bit with integer values, whose fp32 sums are exact).
template <class T, class TC = T>
int run_case(const Case& c, bool integers, std::uint32_t seed) {
  std::mt19937 g(seed);
  Mat<T> a(c.m, c.k, c.ta, c.pad), b(c.k, c.n, c.tb, c.pad);
  Mat<TC> out(c.m, c.n, false, c.pad);
  fill(a, g, integers);
  fill(b, g, integers);
  fill(out, g, integers);
  const std::vector<TC> before = out.v;
  cpu::gemm<T, TC>(c.m, c.n, c.k, a.view(), b.view(), out.v.data(), out.ld, c.accumulate);
  using Acc = cpu::acc_t<T>;
  // The operands in double (exact for every T), A by rows and B by columns, so the reference's inner loop reads two
  // contiguous runs: the same sums in the same order, without a conversion per product (the sanitizer job runs this
  // at -O0, where those conversions were most of the suite's time).
  std::vector<double> ad(std::size_t(c.m * c.k)), bd(std::size_t(c.k * c.n));
  for (i64 i = 0; i < c.m; ++i)
    for (i64 p = 0; p < c.k; ++p) ad[std::size_t(i * c.k + p)] = double(a.at(i, p));
  for (i64 j = 0; j < c.n; ++j)
    for (i64 p = 0; p < c.k; ++p) bd[std::size_t(j * c.k + p)] = double(b.at(p, j));
  int wrong = 0;
  for (i64 i = 0; i < c.m; ++i)
    for (i64 j = 0; j < c.n; ++j) {
      double ref = c.accumulate ? double(before[std::size_t(i * out.ld + j)]) : 0.0, mag = std::abs(ref);
      const double* ar = ad.data() + i * c.k;
      const double* bc = bd.data() + j * c.k;
      for (i64 p = 0; p < c.k; ++p) {
        const double t = ar[p] * bc[p];
        ref += t;
        mag += std::abs(t);
      }
      const double got = double(out.at(i, j));
      if (integers) {  // an exact sum, rounded once into TC
        if (got != double(TC(Acc(ref)))) ++wrong;
        continue;
      }
      // Worst-case bound of a sum of k + 1 rounded products (any order): (k + 2) u sum |terms|, plus the final
      // rounding to nearest into TC (half an ulp: eps/2 relative, or half the subnormal spacing near zero).
      using L = std::numeric_limits<TC>;
      const double acc_tol = double(c.k + 2) * double(std::numeric_limits<Acc>::epsilon()) * mag;
      const double tol =
          acc_tol + (std::is_same_v<TC, Acc> ? 0.0
                                             : 0.5 * double(L::epsilon()) * (std::abs(ref) + acc_tol) +
                                                   0.5 * double(L::denorm_min()));
      if (!(std::abs(got - ref) <= tol)) ++wrong;
    }
  for (i64 i = 0; i < c.m; ++i)
    for (i64 j = c.n; j < out.ld; ++j)
      if (out.v[std::size_t(i * out.ld + j)] != before[std::size_t(i * out.ld + j)]) ++wrong;
  return wrong;
}

template <class T, class TC = T>
void sweep(const std::vector<i64>& sizes, bool integers) {
  std::uint32_t seed = 1;
  for (i64 m : sizes)
    for (i64 n : sizes)
      for (i64 k : sizes)
        for (int t = 0; t < 4; ++t) {
          const Case c{m, n, k, (t & 1) != 0, (t & 2) != 0, ((m + n + k + t) & 1) != 0, (m + k) % 3};
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(c.ta);
          CAPTURE(c.tb);
          CAPTURE(c.accumulate);
          CAPTURE(c.pad);
          CHECK(run_case<T, TC>(c, integers, seed++) == 0);
        }
}

}  // namespace

TEST_CASE("gemm: odd sizes, all transposes, accumulate, padded leading dims (float, exact)") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    sweep<float>({1, 7, 17, 63, 129}, true);
  }
}

TEST_CASE("gemm: odd sizes, all transposes (double, exact and rounded)") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    sweep<double>({1, 5, 33, 130}, true);
    sweep<double>({3, 65}, false);
  }
}

TEST_CASE("gemm: real values within the rounding bound (float)") {
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  sweep<float>({2, 31, 100}, false);
}

TEST_CASE("gemm: sizes past every cache block (k > kc, m > mc, n > nc) and skinny shapes") {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    std::uint32_t seed = 100;
    for (const Case& c : {Case{300, 70, 1100, false, false, false, 1}, Case{13, 4200, 40, false, true, true, 2},
                          Case{37, 300, 2100, false, true, false, 0}, Case{290, 4111, 9, true, false, true, 3},
                          Case{1, 1000, 513, true, true, false, 0}, Case{1000, 1, 300, false, false, true, 1}}) {
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      CHECK(run_case<float>(c, true, seed++) == 0);
      CHECK(run_case<float>(c, false, seed++) == 0);
    }
  }
}

TEST_CASE("gemm: k == 0 writes zeros, or leaves C alone when accumulating") {
  std::vector<float> c(6, 5.0f), a(1), b(1);
  cpu::gemm<float>(2, 3, 0, {a.data(), 0, 1}, {b.data(), 3, 1}, c.data(), 3, true);
  for (float x : c) CHECK(x == 5.0f);
  cpu::gemm<float>(2, 3, 0, {a.data(), 0, 1}, {b.data(), 3, 1}, c.data(), 3, false);
  for (float x : c) CHECK(x == 0.0f);
}

TEST_CASE("mm: transposed and sliced views agree with contiguous copies") {
  ThreadsGuard guard;
  cpu::set_num_threads(2);
  Generator g(7);
  const Tensor<float> a = randn<float>({70, 90}, g), b = randn<float>({90, 50}, g);
  const Tensor<float> want = mm(a.contiguous(), b.contiguous());
  // a^T^T and b^T^T: column-major views of the same values.
  const Tensor<float> at = a.t().contiguous().t(), bt = b.t().contiguous().t();
  const Tensor<float> got = mm(at, bt);
  const Tensor<float> acc = zeros<float>({70, 50});
  ops::mm_into(acc, a, b, /*accumulate=*/true);
  ops::mm_into(acc, at, bt, /*accumulate=*/true);
  for (i64 i = 0; i < want.numel(); ++i) {
    CHECK(rd(got, i) == doctest::Approx(rd(want, i)).epsilon(1e-5));
    CHECK(rd(acc, i) == doctest::Approx(2 * rd(want, i)).epsilon(1e-5));
  }
}

TEST_CASE("ops::linear: bias and activation in one pass equal matmul, add and the activation") {
  Generator g(11);
  const Tensor<double> x = randn<double>({2, 5, 7}, g), w = randn<double>({4, 7}, g), b = randn<double>({4}, g);
  const Tensor<double> base = matmul(x, w.t());
  const Tensor<double> plus = base + b;
  const Tensor<double> want_relu = relu(plus), want_gelu = gelu_tanh(plus), want_gelu_nb = gelu_tanh(base);
  auto max_abs = [](const Tensor<double>& p, const Tensor<double>& q) {
    REQUIRE(p.shape() == q.shape());
    double m = 0;
    for (i64 i = 0; i < p.numel(); ++i) m = std::max(m, std::abs(rd(p, i) - rd(q, i)));
    return m;
  };
  CHECK(max_abs(ops::linear(x, w), base) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b), plus) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b, Activation::relu), want_relu) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, b, Activation::gelu_tanh), want_gelu) < 1e-12);
  CHECK(max_abs(ops::linear(x, w, Tensor<double>(), Activation::gelu_tanh), want_gelu_nb) < 1e-12);
  // A transposed weight view and a 1-D input.
  const Tensor<double> wt = w.t().contiguous();
  CHECK(max_abs(ops::linear(x, wt.t(), b, Activation::relu), want_relu) < 1e-12);
  const Tensor<double> x1 = x.select(0, 1).select(0, 2);
  CHECK(max_abs(ops::linear(x1, w, b), plus.select(0, 1).select(0, 2)) < 1e-12);
  // No autograd record, whatever the inputs need.
  Tensor<double> wg = w.detach().clone();
  wg.requires_grad_();
  CHECK_FALSE(ops::linear(x, wg, b, Activation::relu).requires_grad());
  CHECK(error_of([&] { (void)ops::linear(x, w, randn<double>({5}, g)); }).find("bias of shape [5]") !=
        std::string::npos);
}

// bfloat16 and half operands are converted while packed (never copied whole) and accumulate in fp32; the output is
// written once, in the operands' type or in float.
// Small sizes on one and two threads: exact integer sums and real values, T and float outputs.
template <class T>
void sweeps_16bit() {
  ThreadsGuard guard;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    sweep<T>({1, 7, 17, 63}, true);
    sweep<T, float>({1, 17, 63}, true);
    sweep<T>({2, 31, 100}, false);
    sweep<T, float>({5, 40}, false);
  }
}

// 16-bit GEMMs of the given shapes: exact integer sums, and real values with a T and a float output.
template <class T>
void big_16bit_cases(std::initializer_list<Case> cases, std::uint32_t& seed) {
  for (const Case& c : cases) {
    CAPTURE(c.m);
    CAPTURE(c.n);
    CAPTURE(c.k);
    CHECK(run_case<T>(c, true, seed++) == 0);
    CHECK(run_case<T>(c, false, seed++) == 0);
    CHECK(run_case<T, float>(c, false, seed++) == 0);
  }
}

TEST_CASE_TEMPLATE("gemm: 16-bit operands, fp32 accumulation, one rounding into the output type", T, bfloat16, half) {
  sweeps_16bit<T>();
  // Every cache block and the fp32 accumulation block of a 16-bit output (k > kc), transposed views included.
  std::uint32_t seed = 500;
  big_16bit_cases<T>({Case{300, 70, 1100, false, false, true, 1}, Case{13, 4200, 40, false, true, true, 2},
                        Case{37, 300, 2100, true, true, false, 0}, Case{1, 1000, 513, true, false, true, 0},
                        Case{129, 45, 600, false, true, true, 3}}, seed);
}

// A NaN in A makes its row NaN; an infinity its row infinite (with the sign of the products): a bfloat16 GEMM
// through whichever kernel is on.
void nan_and_infinity_rows() {
  std::vector<bfloat16> a(3 * 4, bfloat16(1.0f)), b(4 * 5, bfloat16(0.5f));
  a[1] = bfloat16(std::numeric_limits<float>::quiet_NaN());
  a[4 + 2] = bfloat16(-std::numeric_limits<float>::infinity());
  std::vector<float> c(3 * 5);
  cpu::gemm<bfloat16, float>(3, 5, 4, {a.data(), 4, 1}, {b.data(), 5, 1}, c.data(), 5, false);
  for (int j = 0; j < 5; ++j) {
    CHECK(std::isnan(c[std::size_t(j)]));
    CHECK(c[std::size_t(5 + j)] == -std::numeric_limits<float>::infinity());
    CHECK(c[std::size_t(10 + j)] == 2.0f);
  }
}

// Restores the AMX switch as it was when made.
struct AmxRestore {
  bool was = cpu::amx_active();
  ~AmxRestore() { cpu::set_amx(was); }
};

// bfloat16 on Intel AMX tiles (cpu::set_amx; on by default where the CPU and OS run them): the same checks as the
// AVX-512 kernel's above (exact integer sums rounded once, real values within the rounding bound of any summation
// order), every layout and edge, both thread counts, k past the AMX panel (kKC) with fp32 and bfloat16 outputs;
// NaN and infinity carried through; a PackedA or PackedB multiplies on the tiles too, bit for bit as gemm.
TEST_CASE("gemm: bfloat16 on AMX tiles (cpu::set_amx) within the rounding bound, every layout") {
  if (!cpu::amx_available()) {
    MESSAGE("this CPU or OS runs no AMX-BF16 tiles: the AMX kernel is not tested here");
    cpu::set_amx(true);
    CHECK_FALSE(cpu::amx_active());
    cpu::set_amx(false);
    return;
  }
  // On by default (the other tests restore what they switch), unless the environment says otherwise.
  const char* env = std::getenv("EMBER_AMX");
  if (!env || std::strcmp(env, "0") != 0) CHECK(cpu::amx_active());
  AmxRestore restore;
  cpu::set_amx(true);
  REQUIRE(cpu::amx_active());
  sweeps_16bit<bfloat16>();
  std::uint32_t seed = 600;
  big_16bit_cases<bfloat16>({Case{300, 70, 2100, false, false, true, 1}, Case{13, 1100, 40, false, true, true, 2},
                        Case{37, 600, 4300, true, true, false, 0}, Case{1, 1000, 513, true, false, true, 0},
                        Case{129, 45, 600, false, true, true, 3}, Case{260, 530, 64, true, false, false, 1}}, seed);
  nan_and_infinity_rows();
  const Case big{64, 96, 700, false, false, false, 0};
  std::mt19937 g(78);
  Mat<bfloat16> ma(big.m, big.k, false, 0), mb(big.k, big.n, false, 0);
  fill(ma, g, false);
  fill(mb, g, false);
  Mat<float> on(big.m, big.n, false, 0), off = on, pa_out = on, pb_out = on;
  cpu::gemm<bfloat16, float>(big.m, big.n, big.k, ma.view(), mb.view(), on.v.data(), on.ld, false);
  const cpu::PackedA<bfloat16> pa(big.m, big.k, ma.view());
  pa.gemm(big.n, mb.view(), pa_out.v.data(), pa_out.ld, false);
  const cpu::PackedB<bfloat16> pb(big.k, big.n, mb.view());
  pb.gemm(big.m, ma.view(), pb_out.v.data(), pb_out.ld, false);
  CHECK(bit_diffs(pa_out, on) == 0);
  CHECK(bit_diffs(pb_out, on) == 0);
  // Switched off, another kernel runs (the sums come in another order: some element differs).
  cpu::set_amx(false);
  CHECK_FALSE(cpu::amx_active());
  cpu::gemm<bfloat16, float>(big.m, big.n, big.k, ma.view(), mb.view(), off.v.data(), off.ld, false);
  CHECK(bit_diffs(on, off) > 0);
}

// bfloat16 on AVX512-BF16 dot products (cpu::set_bf16_dot; on by default where they pay, cpu::bf16_dot_pays): the
// same checks as the fp32 kernel's (exact integer sums rounded once, real values within the rounding bound of any
// summation order), every layout and edge, both thread counts, k past the kernel's panel with fp32 and bfloat16
// outputs, NaN and infinity carried through; switched off, the fp32 kernel runs again (its results are the ones
// above); and a PackedA or PackedB made while the kernel is on multiplies through it, bit for bit as gemm.
TEST_CASE("gemm: bfloat16 on AVX512-BF16 dot products (cpu::set_bf16_dot) within the rounding bound, every layout") {
  struct DotGuard {
    bool was = cpu::bf16_dot_active();
    ~DotGuard() { cpu::set_bf16_dot(was); }
  } restore;
  AmxRestore restore_amx;
  cpu::set_amx(false);  // (AMX comes first where it runs)
  if (!cpu::bf16_dot_available()) {
    MESSAGE("this CPU has no AVX512-BF16 (or this build no AVX-512 kernel): the dot-product kernel is not tested here");
    cpu::set_bf16_dot(true);
    CHECK_FALSE(cpu::bf16_dot_active());
    return;
  }
  cpu::set_bf16_dot(true);
  REQUIRE(cpu::bf16_dot_active());
  sweeps_16bit<bfloat16>();
  std::uint32_t seed = 700;
  big_16bit_cases<bfloat16>({Case{300, 70, 1100, false, false, true, 1}, Case{13, 4200, 40, false, true, true, 2},
                        Case{37, 600, 1300, true, true, false, 0}, Case{1, 1000, 513, true, false, true, 0},
                        Case{129, 45, 600, false, true, true, 3}, Case{260, 530, 64, true, false, false, 1},
                        Case{24, 64, 511, false, false, false, 1}}, seed);
  nan_and_infinity_rows();
  // The kernel's sums are not the fp32 kernel's bit for bit (another order): on real values some element differs,
  // which shows that the switch selects another kernel, both ways.
  const Case big{64, 96, 700, false, false, false, 0};
  std::mt19937 g(77);
  Mat<bfloat16> ma(big.m, big.k, false, 0), mb(big.k, big.n, false, 0);
  fill(ma, g, false);
  fill(mb, g, false);
  Mat<float> on(big.m, big.n, false, 0), off = on, on2 = on;
  cpu::gemm<bfloat16, float>(big.m, big.n, big.k, ma.view(), mb.view(), on.v.data(), on.ld, false);
  cpu::set_bf16_dot(false);
  CHECK_FALSE(cpu::bf16_dot_active());
  cpu::gemm<bfloat16, float>(big.m, big.n, big.k, ma.view(), mb.view(), off.v.data(), off.ld, false);
  sweeps_16bit<bfloat16>();  // the fp32 kernel's conversion path, which the test above runs here with the dot kernel
  cpu::set_bf16_dot(true);
  cpu::gemm<bfloat16, float>(big.m, big.n, big.k, ma.view(), mb.view(), on2.v.data(), on2.ld, false);
  CHECK(bit_diffs(on, off) > 0);
  CHECK(bit_diffs(on, on2) == 0);
  // Packed once while the kernel is on: the same bits as gemm.
  Mat<float> pa_out(big.m, big.n, false, 0), pb_out = pa_out;
  const cpu::PackedA<bfloat16> pa(big.m, big.k, ma.view());
  pa.gemm(big.n, mb.view(), pa_out.v.data(), pa_out.ld, false);
  const cpu::PackedB<bfloat16> pb(big.k, big.n, mb.view());
  pb.gemm(big.m, ma.view(), pb_out.v.data(), pb_out.ld, false);
  CHECK(bit_diffs(pa_out, on) == 0);
  CHECK(bit_diffs(pb_out, on) == 0);
}

TEST_CASE("gemm: 16-bit outputs round to nearest even and keep NaN and infinity") {
  // 16 x 16 outputs through the vector store (and the scalar tail for a 16 x 17 C): exact fp32 sums 1 + i * 2^-8,
  // half of them ties in bfloat16, and NaN in every other column.
  for (i64 n : {16, 17}) {
    std::vector<bfloat16> a(16 * 2), b(std::size_t(2 * n)), c(std::size_t(16 * n));
    for (int i = 0; i < 16; ++i) {
      a[std::size_t(i * 2)] = bfloat16(1.0f);
      a[std::size_t(i * 2 + 1)] = bfloat16(0x1p-8f * float(i % 4));
    }
    for (i64 j = 0; j < n; ++j) {
      b[std::size_t(j)] = bfloat16(1.0f);
      b[std::size_t(n + j)] = bfloat16(j % 2 ? 1.0f : std::numeric_limits<float>::quiet_NaN());
    }
    cpu::gemm<bfloat16>(16, n, 2, {a.data(), 2, 1}, {b.data(), n, 1}, c.data(), n, false);
    for (int i = 0; i < 16; ++i)
      for (i64 j = 0; j < n; ++j) {
        const bfloat16 got = c[std::size_t(i * n + j)];
        if (j % 2) CHECK(got.bits == bfloat16(1.0f + 0x1p-8f * float(i % 4)).bits);
        else CHECK(std::isnan(float(got)));
      }
  }
  // Sums past the format's range become infinity, with their sign.
  const half ha[2] = {half(60000.0f), half(60000.0f)}, hb[4] = {half(1.0f), half(-1.0f), half(1.0f), half(-1.0f)};
  half hc[2];
  cpu::gemm<half>(1, 2, 1, {ha, 1, 1}, {hb, 2, 1}, hc, 2, false);  // 60000 * [1, -1]
  CHECK(float(hc[0]) == 60000.0f);
  CHECK(float(hc[1]) == -60000.0f);
  cpu::gemm<half>(1, 2, 2, {ha, 2, 1}, {hb, 1, 2}, hc, 2, false);  // 60000 * 1 + 60000 * -1 = 0, twice
  CHECK(float(hc[0]) == 0.0f);
  CHECK(float(hc[1]) == 0.0f);
  const half hd[2] = {half(1.0f), half(1.0f)};
  cpu::gemm<half>(1, 1, 2, {ha, 2, 1}, {hd, 1, 1}, hc, 1, false);
  CHECK(std::isinf(float(hc[0])));
  CHECK(float(hc[0]) > 0);
}

#if EMBER_GEMM_PACKED  // (a property of ember's packed kernel; Eigen's fallback does not promise it)
// One or two rows (a batch of one) take a path without packing; each row must equal the same row of a taller
// product bit for bit (the packed kernel's order of operations), over panels of k, transposes, accumulation and
// the column split across threads.
TEST_CASE_TEMPLATE("gemm: one or two rows equal those rows of a taller product bit for bit", T, float, double) {
  ThreadsGuard guard;
  std::uint32_t seed = 700;
  for (int threads : {1, 2})
    for (const Case& c : {Case{1, 10, 3136, false, true, false, 0}, Case{2, 37, 700, true, false, true, 1},
                          Case{1, 1, 5, false, false, true, 0}, Case{2, 9, 257, true, true, false, 2},
                          Case{1, 3000, 700, false, true, false, 0}, Case{2, 2500, 513, false, false, true, 1}}) {
      CAPTURE(threads);
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      cpu::set_num_threads(threads);
      std::mt19937 g(seed++);
      const i64 tall = 13;  // rows of the product through the packed kernel
      Mat<T> a(tall, c.k, c.ta, c.pad), b(c.k, c.n, c.tb, c.pad);
      Mat<T> want(tall, c.n, false, c.pad);
      fill(a, g, false);
      fill(b, g, false);
      fill(want, g, false);
      Mat<T> got = want;
      cpu::gemm<T>(tall, c.n, c.k, a.view(), b.view(), want.v.data(), want.ld, c.accumulate);
      cpu::gemm<T>(c.m, c.n, c.k, a.view(), b.view(), got.v.data(), got.ld, c.accumulate);
      int diff = 0;
      for (i64 i = 0; i < c.m; ++i)
        for (i64 j = 0; j < got.ld; ++j)  // the padding included: it must be left alone
          diff += std::memcmp(&got.v[std::size_t(i * got.ld + j)], &want.v[std::size_t(i * want.ld + j)], sizeof(T)) != 0;
      CHECK(diff == 0);
    }
}

#endif

// A packed once (a convolution's weights reused over a batch) gives what gemm gives, bit for bit: every k panel,
// row blocks past mc, thread splits by rows and by columns, transposed A, accumulation, 16-bit operands and outputs.
TEST_CASE_TEMPLATE("PackedA: GEMMs with A packed once equal gemm bit for bit", T, float, double, bfloat16) {
  ThreadsGuard guard;
  std::uint32_t seed = 900;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    for (const Case& c : {Case{64, 196, 288, false, false, false, 0}, Case{300, 70, 1100, true, false, true, 1},
                          Case{13, 4200, 40, false, true, true, 2}, Case{7, 5, 3, false, false, false, 0},
                          Case{1000, 30, 513, false, true, false, 1}}) {
      CAPTURE(threads);
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      std::mt19937 g(seed++);
      Mat<T> a(c.m, c.k, c.ta, c.pad), b(c.k, c.n, c.tb, c.pad);
      Mat<T> want(c.m, c.n, false, c.pad);
      fill(a, g, false);
      fill(b, g, false);
      fill(want, g, false);
      Mat<T> got = want;
      cpu::gemm<T>(c.m, c.n, c.k, a.view(), b.view(), want.v.data(), want.ld, c.accumulate);
      const cpu::PackedA<T> pa(c.m, c.k, a.view());
      pa.gemm(c.n, b.view(), got.v.data(), got.ld, c.accumulate);
      CHECK(bit_diffs(got, want) == 0);
      // The same packed A serves another right-hand side (it is not consumed).
      if constexpr (sizeof(T) == 2) {
        Mat<float> w32(c.m, c.n, false, 0), g32(c.m, c.n, false, 0);
        cpu::gemm<T, float>(c.m, c.n, c.k, a.view(), b.view(), w32.v.data(), w32.ld, false);
        pa.gemm(c.n, b.view(), g32.v.data(), g32.ld, false);
        CHECK(w32.v == g32.v);
      }
    }
  }
}

// B packed once (a weight applied to many batches) likewise, and the same packed B serves several left operands.
TEST_CASE_TEMPLATE("PackedB: GEMMs with B packed once equal gemm bit for bit", T, float, double, bfloat16) {
  ThreadsGuard guard;
  std::uint32_t seed = 950;
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    // k past one panel and n past one block of columns (a 16-bit output's fp32 blocks), one tile of rows (split
    // along the columns), one and two rows, edges.
    for (const Case& c : {Case{64, 196, 288, false, true, false, 0}, Case{300, 70, 1100, true, true, true, 1},
                          Case{13, 4200, 300, false, false, true, 2}, Case{10, 700, 600, true, true, false, 1},
                          Case{7, 5, 3, false, false, false, 0}, Case{2, 100, 700, false, true, true, 0},
                          Case{1000, 30, 513, true, false, false, 1}}) {
      CAPTURE(threads);
      CAPTURE(c.m);
      CAPTURE(c.n);
      CAPTURE(c.k);
      std::mt19937 g(seed++);
      Mat<T> a(c.m, c.k, c.ta, c.pad), b(c.k, c.n, c.tb, c.pad);
      Mat<T> want(c.m, c.n, false, c.pad);
      fill(a, g, false);
      fill(b, g, false);
      fill(want, g, false);
      Mat<T> got = want;
      cpu::gemm<T>(c.m, c.n, c.k, a.view(), b.view(), want.v.data(), want.ld, c.accumulate);
      const cpu::PackedB<T> pb(c.k, c.n, b.view());
      pb.gemm(c.m, a.view(), got.v.data(), got.ld, c.accumulate);
      CHECK(bit_diffs(got, want) == 0);
      // The same packed B serves another left-hand side (it is not consumed); a 16-bit one also an fp32 output.
      Mat<T> a2(c.m, c.k, !c.ta, 0);
      fill(a2, g, false);
      Mat<T> w2(c.m, c.n, false, 0), g2(c.m, c.n, false, 0);
      cpu::gemm<T>(c.m, c.n, c.k, a2.view(), b.view(), w2.v.data(), w2.ld, false);
      pb.gemm(c.m, a2.view(), g2.v.data(), g2.ld, false);
      CHECK(bit_diffs(g2, w2) == 0);
      if constexpr (sizeof(T) == 2) {
        Mat<float> w32(c.m, c.n, false, 0), g32(c.m, c.n, false, 0);
        cpu::gemm<T, float>(c.m, c.n, c.k, a.view(), b.view(), w32.v.data(), w32.ld, false);
        pb.gemm(c.m, a.view(), g32.v.data(), g32.ld, false);
        CHECK(w32.v == g32.v);
      }
    }
  }
}

// ============================================================================ conversion runs (cpu/detail/cast16.hpp)

namespace {
// Floats that probe rounding to T: every T value, the midpoints between neighbours (ties) and the floats one ulp
// either side of them, NaNs with payloads in the bits that rounding drops, and a sweep over all exponents.
template <class T>
std::vector<float> rounding_probes() {
  std::vector<float> v;
  auto bits = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  auto from = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = float(T::from_bits(std::uint16_t(b)));
    v.push_back(f);
    const float g = float(T::from_bits(std::uint16_t(b + 1)));
    if (std::isfinite(f) && std::isfinite(g) && std::signbit(f) == std::signbit(g) && (b & 0x7fffu) != 0x7fffu) {
      const float mid = (f + g) / 2;  // exact: float has 13 (half) or 16 (bfloat16) more significand bits
      v.insert(v.end(), {mid, from(bits(mid) - 1), from(bits(mid) + 1)});
    }
  }
  for (std::uint32_t payload : {0x1u, 0x7fffu, 0x8000u, 0xffffu, 0x400000u, 0x7fffffu})
    for (std::uint32_t sign : {0u, 0x80000000u}) v.push_back(from(sign | 0x7f800000u | payload));
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65537) v.push_back(from(std::uint32_t(u)));
  v.push_back(std::numeric_limits<float>::max());
  v.push_back(-std::numeric_limits<float>::max());
  return v;
}
}  // namespace

TEST_CASE_TEMPLATE("conversion runs: float to bfloat16/half and back, and the executor's cast, are the scalar "
                   "conversions bit for bit (this binary's tier)",
                   T, bfloat16, half) {
  namespace cv = cpu::detail::cast16;
  const std::vector<float> src = rounding_probes<T>();
  const i64 n = i64(src.size());
  // Every start offset within a vector and a length that is not a whole number of vectors: the loops' tails.
  for (i64 off : {i64(0), i64(1), i64(7), i64(15)}) {
    const i64 len = n - off - 3;
    std::vector<T> got(std::size_t(len), T::from_bits(0x1234));
    cv::store_run(got.data(), src.data() + off, len, false);
    i64 bad = 0;
    for (i64 i = 0; i < len; ++i) bad += got[std::size_t(i)].bits != T(src[std::size_t(off + i)]).bits;
    CHECK_MESSAGE(bad == 0, "store_run, offset " << off);
    // Accumulating: round(dst + src), one rounding.
    std::vector<T> acc(static_cast<std::size_t>(len)), want(static_cast<std::size_t>(len));
    for (i64 i = 0; i < len; ++i) {
      acc[std::size_t(i)] = T(float((i % 13) - 6) * 0.375f);
      want[std::size_t(i)] = T(float(acc[std::size_t(i)]) + src[std::size_t(off + i)]);
    }
    cv::store_run(acc.data(), src.data() + off, len, true);
    bad = 0;
    for (i64 i = 0; i < len; ++i) {
      const bool both_nan = ember::isnan(acc[std::size_t(i)]) && ember::isnan(want[std::size_t(i)]);
      bad += !both_nan && acc[std::size_t(i)].bits != want[std::size_t(i)].bits;
    }
    CHECK_MESSAGE(bad == 0, "store_run accumulating, offset " << off);
  }
  // Widening every bit pattern (exact).
  std::vector<T> all(0x10000u + 5);
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = T::from_bits(std::uint16_t(b));
  for (i64 off : {i64(0), i64(3)}) {
    std::vector<float> wide(all.size() - std::size_t(off));
    cv::to_compute_run(all.data() + off, wide.data(), i64(wide.size()));
    i64 bad = 0;
    for (std::size_t i = 0; i < wide.size(); ++i) {
      const float w = float(all[i + std::size_t(off)]);
      bad += std::memcmp(&wide[i], &w, 4) != 0;
    }
    CHECK_MESSAGE(bad == 0, "to_compute_run, offset " << off);
  }
  // The executor's plain casts take these runs (cpu/executor.hpp), threaded over chunks.
  const Tensor<float> x = from_vector(src, {n});
  const Tensor<T> y = cast<T>(x);
  const Tensor<float> z = cast<float>(y);
  i64 bad_y = 0, bad_z = 0;
  for (i64 i = 0; i < n; ++i) {
    const T want = T(src[std::size_t(i)]);
    bad_y += y.data()[i].bits != want.bits;
    const float back = float(want);
    bad_z += std::memcmp(&z.data()[i], &back, 4) != 0;
  }
  CHECK(bad_y == 0);
  CHECK(bad_z == 0);
}
