// CUDA twins of the element-wise, reduction and fused-backward tests (test_expr.cpp, test_reduce.cpp,
// test_autograd.cpp): every result of the CUDA executor is compared with the CPU executor's on the same random
// inputs — every op of the functor table, broadcast and strided operands, aliasing, compound assignment, every
// dtype, the 128-bit path with and without a scalar tail and with misaligned operands, reductions over
// everything and along dims, and the gradients of fused expressions. Each case skips when no device is present.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"

using namespace ember;
using i64 = std::int64_t;
using f16 = ember::half;  // cuda_fp16.h declares a global ::half too
using bf16 = ember::bfloat16;

#define SKIP_WITHOUT_CUDA()                  \
  do {                                       \
    if (!ember::cuda::is_available()) {      \
      MESSAGE("skipped: no CUDA device");    \
      return;                                \
    }                                        \
  } while (0)

namespace {

const Device kDev = Device::cuda(0);

/// A device copy of a CPU tensor (contiguous).
template <class T>
Tensor<T> to_dev(const Tensor<T>& c) {
  const Tensor<T> cc = c.contiguous();
  Tensor<T> d = empty<T>(c.shape(), kDev);
  cuda::current_stream(0).synchronize();
  if (c.numel())
    EMBER_CUDA_CHECK(cudaMemcpy(d.data(), cc.data(), std::size_t(c.numel()) * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// A CPU copy of a device tensor (made contiguous on the device first, by the CUDA executor).
template <class T>
Tensor<T> to_host(const Tensor<T>& d) {
  REQUIRE(d.device() == kDev);
  const Tensor<T> dc = d.is_contiguous() ? d : d.contiguous();
  Tensor<T> c = empty<T>(d.shape());
  cuda::current_stream(0).synchronize();
  if (d.numel())
    EMBER_CUDA_CHECK(cudaMemcpy(c.data(), dc.data(), std::size_t(d.numel()) * sizeof(T), cudaMemcpyDeviceToHost));
  return c;
}

template <class T>
double val(const Tensor<T>& t, i64 i) {
  i64 off = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.shape()[d]) * t.strides()[d];
    i /= t.shape()[d];
  }
  return double(static_cast<compute_t<T>>(t.data()[off]));
}

/// Relative tolerance of one rounding in T (compute in float/double, one rounding to the storage type), with
/// headroom for transcendental functions (libm on the host, CUDA's on the device).
template <class T>
double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 2e-6;
  else if constexpr (std::is_same_v<T, f16>) return 1e-3;
  else if constexpr (std::is_same_v<T, bf16>) return 8e-3;
  else return 0;
}

/// Every element of the device result equals the CPU result (within rtol·|ref| + atol; NaN matches NaN).
template <class T>
void expect_match(const Tensor<T>& cpu, const Tensor<T>& dev, double rtol, double atol, const std::string& what) {
  INFO(what);
  REQUIRE(dev.device() == kDev);
  REQUIRE(cpu.shape() == dev.shape());
  const Tensor<T> h = to_host(dev);
  i64 bad = 0;
  for (i64 i = 0; i < cpu.numel(); ++i) {
    const double a = val(cpu, i), b = val(h, i);
    const bool ok = (std::isnan(a) && std::isnan(b)) || a == b || std::fabs(a - b) <= atol + rtol * std::fabs(a);
    if (!ok && bad++ < 5) FAIL_CHECK(what << ": element " << i << " cpu " << a << " cuda " << b);
  }
  CHECK(bad == 0);
}
/// With the absolute tolerance of the same size: inputs are O(1), and where a result cancels to near 0 (tanh(u) -
/// sigmoid(v), 1 + tanh(z) for z << 0) a contraction to FMA on one side moves it by about that much.
template <class T>
void expect_match(const Tensor<T>& cpu, const Tensor<T>& dev, const std::string& what) {
  expect_match(cpu, dev, tol<T>(), tol<T>(), what);
}

/// Evaluates an expression into a new tensor on its operands' device, without recording it for autograd (so this
/// file does not instantiate a backward kernel for every forward expression it checks).
template <class E>
auto ev(const E& e) {
  using R = typename E::value_type;
  Tensor<R> out = empty<R>(e.shape(), expr::device_of(e));
  ops::assign(out, e);
  return out;
}

template <class T>
Tensor<T> randn_t(const Shape& s) {
  return ev(cast<T>(randn<float>(s)));
}
template <class T>
Tensor<T> uniform_t(const Shape& s, double lo, double hi) {
  return ev(cast<T>(rand<float>(s) * float(hi - lo) + float(lo)));
}

/// f applied to CPU operands and to their device copies gives the same tensor.
template <class T, class F>
void same_unary(const Tensor<T>& x, F f, const std::string& what) {
  const Tensor<T> xd = to_dev(x);
  expect_match(ev(f(x)), ev(f(xd)), what);
}
template <class T, class U, class F>
void same_binary(const Tensor<T>& a, const Tensor<U>& b, F f, const std::string& what) {
  const Tensor<T> ad = to_dev(a);
  const Tensor<U> bd = to_dev(b);
  expect_match(ev(f(a, b)), ev(f(ad, bd)), what);
}

// The sizes every element-wise case runs: below one pack, a pack tail, and large enough for a full grid.
const std::vector<i64> kSizes = {1, 7, 1000, 1 << 20, (1 << 20) + 5};

/// Every unary op for float and double (their math differs: float runs ember's own fast functions, double the
/// device's libm); for half and bfloat16 (float math between 16-bit loads and stores, which the bit-exact
/// conversion test covers) a representative subset.
template <class T>
void every_unary_op() {
  constexpr bool full = std::is_same_v<T, float> || std::is_same_v<T, double>;
  for (i64 n : kSizes) {
    const Shape s{n};
    const Tensor<T> x = randn_t<T>(s) * compute_t<T>(3);
    const Tensor<T> p = uniform_t<T>(s, 0.05, 4);  // positive: log, sqrt, rsqrt, pow
    const std::string sz = " n=" + std::to_string(n) + " " + dtype_name<T>();
    same_unary(x, [](const auto& v) { return -v; }, "neg" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return abs(v); }, "abs" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return sign(v); }, "sign" + sz);
    same_unary(x, [](const auto& v) { return exp(v); }, "exp" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return expm1(v); }, "expm1" + sz);
    same_unary(p, [](const auto& v) { return log(v); }, "log" + sz);
    if constexpr (full) same_unary(p, [](const auto& v) { return log1p(v); }, "log1p" + sz);
    if constexpr (full) same_unary(p, [](const auto& v) { return sqrt(v); }, "sqrt" + sz);
    if constexpr (full) same_unary(p, [](const auto& v) { return rsqrt(v); }, "rsqrt" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return square(v); }, "square" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return sin(v); }, "sin" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return cos(v); }, "cos" + sz);
    same_unary(x, [](const auto& v) { return tanh(v); }, "tanh" + sz);
    same_unary(x, [](const auto& v) { return sigmoid(v); }, "sigmoid" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return relu(v); }, "relu" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return silu(v); }, "silu" + sz);
    if constexpr (full) same_unary(ev(x * compute_t<T>(10)), [](const auto& v) { return softplus(v); }, "softplus" + sz);
    same_unary(x, [](const auto& v) { return gelu(v); }, "gelu" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return gelu_tanh(v); }, "gelu_tanh" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return leaky_relu(v, 0.2); }, "leaky_relu" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return elu(v, 0.7); }, "elu" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return clamp(v, -0.5, 1.5); }, "clamp" + sz);
    if constexpr (full) same_unary(x, [](const auto& v) { return logical_not(v); }, "logical_not" + sz);
    same_unary(x, [](const auto& v) { return cast<double>(v) * 2.0; }, "cast<double>" + sz);
  }
}

template <class T>
void every_binary_op() {
  constexpr bool full = std::is_same_v<T, float> || std::is_same_v<T, double>;
  for (i64 n : kSizes) {
    const Shape s{n};
    const Tensor<T> a = randn_t<T>(s), b = randn_t<T>(s);
    const Tensor<T> p = uniform_t<T>(s, 0.1, 3), q = uniform_t<T>(s, -2, 2);
    // Ties for maximum/minimum/eq: every fourth element of c equals a.
    Tensor<T> c = b.clone();
    c.slice(0, 0, n, 4) = a.slice(0, 0, n, 4);
    const std::string sz = " n=" + std::to_string(n) + " " + dtype_name<T>();
    same_binary(a, b, [](const auto& u, const auto& v) { return u + v; }, "add" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return u - v; }, "sub" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return u * v; }, "mul" + sz);
    same_binary(a, p, [](const auto& u, const auto& v) { return u / v; }, "div" + sz);
    if constexpr (full) same_binary(p, q, [](const auto& u, const auto& v) { return pow(u, v); }, "pow" + sz);
    same_binary(a, c, [](const auto& u, const auto& v) { return maximum(u, v); }, "maximum" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return minimum(u, v); }, "minimum" + sz);
    same_binary(a, c, [](const auto& u, const auto& v) { return u < v; }, "lt" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return u <= v; }, "le" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return u > v; }, "gt" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return u >= v; }, "ge" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return eq(u, v); }, "eq" + sz);
    if constexpr (full) same_binary(a, c, [](const auto& u, const auto& v) { return ne(u, v); }, "ne" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return logical_and(u > 0, v > 0); }, "and" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return logical_or(u > 0, v > 0); }, "or" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return logical_xor(u > 0, v > 0); }, "xor" + sz);
    same_binary(a, b, [](const auto& u, const auto& v) { return where(u > v, u, v * 2); }, "where" + sz);
    same_binary(a, b, [](const auto& u, const auto& v) { return where(u > 0, 1.5, v); }, "where scalar" + sz);
    if constexpr (full) same_binary(a, b, [](const auto& u, const auto& v) { return 2 * u - v / 4 + 1; }, "scalars" + sz);
    same_binary(a, b, [](const auto& u, const auto& v) { return tanh(u * v + exp(-square(u))) - sigmoid(v); },
                "chain" + sz);
  }
}

}  // namespace

TEST_CASE("cuda: every unary op of the table equals the CPU executor (float, double, half, bfloat16)") {
  SKIP_WITHOUT_CUDA();
  manual_seed(1);
  every_unary_op<float>();
  every_unary_op<double>();
  every_unary_op<f16>();
  every_unary_op<bf16>();
}

TEST_CASE("cuda: every binary op, comparison, logic op and where equals the CPU executor") {
  SKIP_WITHOUT_CUDA();
  manual_seed(2);
  every_binary_op<float>();
  every_binary_op<double>();
  every_binary_op<f16>();
  every_binary_op<bf16>();
}

TEST_CASE("cuda: integer and bool tensors: arithmetic, comparisons, logic, casts") {
  SKIP_WITHOUT_CUDA();
  manual_seed(3);
  for (i64 n : kSizes) {
    const Tensor<std::int32_t> a = randint<std::int32_t>(-1000, 1000, {n});
    const Tensor<std::int32_t> b = randint<std::int32_t>(-1000, 1000, {n});
    same_binary(a, b, [](const auto& u, const auto& v) { return u * v - u + 3 * v; }, "int32 arithmetic");
    same_binary(a, b, [](const auto& u, const auto& v) { return maximum(u, v) + minimum(u, v) + abs(u); },
                "int32 max/min/abs");
    same_binary(a, b, [](const auto& u, const auto& v) { return u < v; }, "int32 lt");
    same_binary(a, b, [](const auto& u, const auto& v) { return cast<float>(u) / cast<float>(v + 1001); },
                "int32 cast float");
    const Tensor<bool> m = ev(a > 0), k = ev(b > 0);
    same_binary(m, k, [](const auto& u, const auto& v) { return logical_xor(u, v) | !u; }, "bool logic");
    same_binary(m, a, [](const auto& u, const auto& v) { return where(u, v, 7); }, "int32 where");
    const Tensor<std::int64_t> l = randint<std::int64_t>(-100000, 100000, {n});
    same_unary(l, [](const auto& v) { return v * 3 - 1; }, "int64 arithmetic");
    same_unary(l, [](const auto& v) { return cast<std::uint8_t>(v > 0); }, "bool to uint8");
  }
}

TEST_CASE("cuda: half and bfloat16 convert bit-exactly (every 16-bit pattern round-trips through float)") {
  SKIP_WITHOUT_CUDA();
  std::vector<std::uint16_t> bits(65536);
  for (int i = 0; i < 65536; ++i) bits[std::size_t(i)] = std::uint16_t(i);
  Tensor<f16> h = empty<f16>({65536});
  Tensor<bf16> b = empty<bf16>({65536});
  std::memcpy(static_cast<void*>(h.data()), bits.data(), 65536 * 2);
  std::memcpy(static_cast<void*>(b.data()), bits.data(), 65536 * 2);
  // float -> half/bf16 of float inputs between the representable values (rounding, ties, overflow, subnormals).
  const Tensor<float> f = ev(randn<float>({1 << 16}) * 1e4f);
  const Tensor<float> g = ev(cast<float>(h) * 1.0009765625f);
  for (const Tensor<float>& src : {f, g}) {
    const Tensor<f16> hc = ev(cast<f16>(src));
    const Tensor<bf16> bc = ev(cast<bf16>(src));
    const Tensor<float> sd = to_dev(src);
    const Tensor<f16> hd = to_host(ev(cast<f16>(sd)));
    const Tensor<bf16> bd = to_host(ev(cast<bf16>(sd)));
    CHECK(std::memcmp(hc.data(), hd.data(), 2 * std::size_t(src.numel())) == 0);
    CHECK(std::memcmp(bc.data(), bd.data(), 2 * std::size_t(src.numel())) == 0);
  }
  // 16-bit -> float: compare bit patterns (NaN payloads included).
  const Tensor<float> hf = ev(cast<float>(h)), bfc = ev(cast<float>(b));
  const Tensor<float> hfd = to_host(ev(cast<float>(to_dev(h))));
  const Tensor<float> bfd = to_host(ev(cast<float>(to_dev(b))));
  CHECK(std::memcmp(hf.data(), hfd.data(), 4 * 65536) == 0);
  CHECK(std::memcmp(bfc.data(), bfd.data(), 4 * 65536) == 0);
}

TEST_CASE("cuda: broadcast and strided operands, 0-d tensors") {
  SKIP_WITHOUT_CUDA();
  manual_seed(4);
  const Tensor<float> a = randn<float>({64, 300}), r = randn<float>({300}), c = randn<float>({64, 1});
  const Tensor<float> z = randn<float>({}), big = randn<float>({300, 64}), cube = randn<float>({8, 9, 10});
  const Tensor<float> ad = to_dev(a), rd = to_dev(r), cd = to_dev(c), zd = to_dev(z), bigd = to_dev(big),
                      cubed = to_dev(cube);
  expect_match(ev(a + r), ev(ad + rd), "(B,N)+(N)");
  expect_match(ev(c * r), ev(cd * rd), "(B,1)*(N)");
  expect_match(ev(a * z - c), ev(ad * zd - cd), "0-d operand");
  expect_match(ev(exp(z)), ev(exp(zd)), "0-d result");
  expect_match(ev(a + big.t()), ev(ad + bigd.t()), "transposed operand");
  expect_match(ev(a.slice(1, 1, 300, 3) * 2.f), ev(ad.slice(1, 1, 300, 3) * 2.f),
               "sliced with step");
  expect_match(ev(c.expand({64, 300}) - a), ev(cd.expand({64, 300}) - ad), "expanded");
  expect_match(ev(cube.permute({2, 0, 1}) + cube.permute({2, 0, 1}).slice(0, 0, 10)),
               ev(cubed.permute({2, 0, 1}) + cubed.permute({2, 0, 1}).slice(0, 0, 10)), "permuted");
  expect_match(ev(cube.select(1, 3) * cube.select(2, 4)),
               ev(cubed.select(1, 3) * cubed.select(2, 4)), "selected");
  // Rows shorter and longer than a block, many rows.
  for (i64 w : {3, 33, 257, 1000}) {
    const Tensor<float> m = randn<float>({500, w}), v = randn<float>({w});
    const Tensor<float> md = to_dev(m), vd = to_dev(v);
    expect_match(ev(sigmoid(m * v)), ev(sigmoid(md * vd)), "rows of " + std::to_string(w));
  }
}

TEST_CASE("cuda: 128-bit path: misaligned and odd-sized operands, mixed widths, bool outputs") {
  SKIP_WITHOUT_CUDA();
  manual_seed(5);
  const i64 n = (1 << 18) + 3;
  const Tensor<float> a = randn<float>({n}), b = randn<float>({n});
  const Tensor<float> ad = to_dev(a), bd = to_dev(b);
  for (i64 off : {0, 1, 2, 3}) {
    const Tensor<float> as = a.slice(0, off, n), bs = b.slice(0, 0, n - off);
    const Tensor<float> asd = ad.slice(0, off, n), bsd = bd.slice(0, 0, n - off);
    expect_match(ev(as * bs + 1.f), ev(asd * bsd + 1.f), "offset " + std::to_string(off));
    // Misaligned output too.
    Tensor<float> oc = zeros<float>({n + 4}), od = to_dev(oc);
    oc.slice(0, off, n) = as - bs;
    od.slice(0, off, n) = asd - bsd;
    expect_match(oc, od, "misaligned output, offset " + std::to_string(off));
  }
  const Tensor<f16> h = randn_t<f16>({n});
  const Tensor<f16> hd = to_dev(h);
  expect_match(ev(cast<float>(h) * a), ev(cast<float>(hd) * ad), "half * float");
  expect_match(ev(cast<f16>(cast<float>(h) * a)), ev(cast<f16>(cast<float>(hd) * ad)),
               "float -> half");
  expect_match(ev(cast<float>(h) < a), ev(cast<float>(hd) < ad), "bool output");
  expect_match(ev(cast<double>(h) + cast<double>(a)), ev(cast<double>(hd) + cast<double>(ad)),
               "double output");
}

TEST_CASE("cuda: writing into views, compound assignment, fill, aliasing through a temporary") {
  SKIP_WITHOUT_CUDA();
  manual_seed(6);
  Tensor<float> y = randn<float>({40, 50});
  const Tensor<float> x = randn<float>({40, 50}), r = randn<float>({50});
  Tensor<float> yd = to_dev(y);
  const Tensor<float> xd = to_dev(x), rd = to_dev(r);
  y += x;
  yd += xd;
  expect_match(y, yd, "+= tensor");
  y -= r * 2.f;
  yd -= rd * 2.f;
  expect_match(y, yd, "-= broadcast expression");
  y *= 0.5f;
  yd *= 0.5f;
  expect_match(y, yd, "*= scalar");
  y /= (abs(x) + 1.f);
  yd /= (abs(xd) + 1.f);
  expect_match(y, yd, "/= expression");
  y.t().slice(0, 5, 20) = r.slice(0, 0, 40);
  yd.t().slice(0, 5, 20) = rd.slice(0, 0, 40);
  expect_match(y, yd, "write into a transposed slice");
  y.select(0, 3) += 1.f;
  yd.select(0, 3) += 1.f;
  expect_match(y, yd, "+= into a selected row");
  y.fill_(2.5f);
  yd.fill_(2.5f);
  expect_match(y, yd, "fill_");
  // Aliasing: as if the right-hand side were evaluated into a temporary.
  Tensor<float> s = randn<float>({64, 64});
  Tensor<float> sd = to_dev(s);
  s = s.t() + s * 2.f;  // in place, reading s transposed: through a temporary
  sd = sd.t() + sd * 2.f;
  expect_match(s, sd, "s = s.t() + s");
  Tensor<float> u = randn<float>({64, 64});
  Tensor<float> ud = to_dev(u);
  u += u.t();  // in place, the operand reads u transposed: needs a temporary
  ud += ud.t();
  expect_match(u, ud, "u += u.t()");
  Tensor<float> v = randn<float>({1000});
  Tensor<float> vd = to_dev(v);
  v.slice(0, 1, 1000) += v.slice(0, 0, 999);  // shifted overlap
  vd.slice(0, 1, 1000) += vd.slice(0, 0, 999);
  expect_match(v, vd, "shifted overlap");
}

namespace {
template <class F>
void same_reduction(const Tensor<float>& x, F f, const std::string& what, double rtol = 1e-5, double atol = 1e-5) {
  const auto yc = f(x);
  const Tensor<float> xd = to_dev(x);
  const auto yd = f(xd);
  expect_match(yc, yd, rtol, atol, what);
}
}  // namespace

TEST_CASE("cuda: reductions over everything and along dims, keepdim, non-contiguous, expressions") {
  SKIP_WITHOUT_CUDA();
  manual_seed(7);
  for (const Shape& s : {Shape{5, 6, 7}, Shape{3, 200, 1000}, Shape{1000, 3, 2}, Shape{1, 1, 1}}) {
    const Tensor<float> x = randn<float>(s);
    const Tensor<float> pos = ev(abs(x) * 0.1f + 0.95f);  // products stay in range
    const std::vector<Dims> dimsets = {Dims{}, Dims{0}, Dims{1}, Dims{2}, Dims{0, 2}, Dims{-1, -2}, Dims{0, 1, 2}};
    for (const Dims& d : dimsets) {
      for (bool keep : {false, true}) {
        std::string w = s.str() + " dims";
        for (auto v : d.v) w += " " + std::to_string(v);
        w += keep ? " keepdim" : "";
        // Float sums: the CPU accumulates in double, the device in float (a tree of partials): about 1e-6 of the
        // sum of |x| apart, which near-cancelling sums of a few thousand values turn into ~1e-5 absolute.
        same_reduction(x, [&](const auto& t) { return sum(t, d, keep); }, "sum" + w, 1e-5, 2e-4);
        same_reduction(x, [&](const auto& t) { return mean(t, d, keep); }, "mean" + w, 1e-5, 2e-6);
        same_reduction(x, [&](const auto& t) { return max(t, d, keep); }, "max" + w, 0, 0);
        same_reduction(x, [&](const auto& t) { return min(t, d, keep); }, "min" + w, 0, 0);
        same_reduction(pos, [&](const auto& t) { return prod(t, d, keep); }, "prod" + w, 1e-4, 0);
        same_reduction(x, [&](const auto& t) { return var(t, d, 1, keep); }, "var" + w, 1e-4, 1e-5);
        same_reduction(x, [&](const auto& t) { return std_dev(t, d, 0, keep); }, "std" + w, 1e-4, 1e-5);
        for (double p : {1.0, 2.0, 3.0, double(INFINITY)})
          same_reduction(x, [&](const auto& t) { return norm(t, p, d, keep); }, "norm" + w, 1e-4, 1e-5);
        same_reduction(x, [&](const auto& t) { return sum(t * t - exp(t), d, keep); }, "sum(expr)" + w, 1e-4, 2e-3);
        same_reduction(x, [&](const auto& t) { return sum(t.permute({2, 0, 1}), d, keep); }, "sum permuted" + w, 1e-5, 2e-4);
      }
    }
    for (int dim = 0; dim < 3; ++dim)
      for (bool keep : {false, true}) {
        const std::string w = s.str() + " dim " + std::to_string(dim);
        expect_match(argmax(x, dim, keep), argmax(to_dev(x), dim, keep), 0, 0, "argmax" + w);
        expect_match(argmin(x, dim, keep), argmin(to_dev(x), dim, keep), 0, 0, "argmin" + w);
        expect_match(argmax(x.transpose(0, 2), dim, keep), argmax(to_dev(x).transpose(0, 2), dim, keep), 0, 0, "argmax transposed" + w);
      }
    expect_match(argmax(x), argmax(to_dev(x)), 0, 0, "argmax flat " + s.str());
    expect_match(argmin(x), argmin(to_dev(x)), 0, 0, "argmin flat " + s.str());
  }
}

TEST_CASE("cuda: reduction ties, NaN, integer and bool sums, 16-bit inputs, large sums") {
  SKIP_WITHOUT_CUDA();
  manual_seed(8);
  // Ties: argmax picks the first index, as on the CPU, whichever thread saw which copy.
  Tensor<float> t = ev(cast<float>(randint<std::int32_t>(0, 3, {300000})));
  expect_match(argmax(t), argmax(to_dev(t)), 0, 0, "argmax ties");
  expect_match(argmin(t), argmin(to_dev(t)), 0, 0, "argmin ties");
  Tensor<float> t2 = ev(cast<float>(randint<std::int32_t>(0, 3, {50, 3000})));
  expect_match(argmax(t2, 1), argmax(to_dev(t2), 1), 0, 0, "argmax ties per row");
  expect_match(argmax(t2, 0), argmax(to_dev(t2), 0), 0, 0, "argmax ties per column");
  // NaN wins max/min and argmax.
  Tensor<float> n = randn<float>({1000, 100});
  n.at(123, 45) = NAN;
  n.at(700, 45) = NAN;
  expect_match(max(n), max(to_dev(n)), 0, 0, "max NaN");
  expect_match(min(n, 0), min(to_dev(n), 0), 0, 0, "min NaN along dim 0");
  expect_match(argmax(n), argmax(to_dev(n)), 0, 0, "argmax NaN (first NaN)");
  expect_match(argmax(n, 0), argmax(to_dev(n), 0), 0, 0, "argmax NaN along dim 0");
  // Integers and bools sum to int64, exactly.
  const Tensor<std::int32_t> k = randint<std::int32_t>(-1000000, 1000000, {1000, 1000});
  const Tensor<std::int32_t> kd = to_dev(k);
  expect_match(sum(k), sum(kd), 0, 0, "int32 sum");
  expect_match(sum(k, 0), sum(kd, 0), 0, 0, "int32 sum dim 0");
  expect_match(sum(k > 0, 1), sum(kd > 0, 1), 0, 0, "bool sum dim 1");
  expect_match(max(k, 1), max(kd, 1), 0, 0, "int32 max");
  // 16-bit inputs accumulate in float.
  const Tensor<f16> h = randn_t<f16>({4096, 33});
  const Tensor<bf16> b = randn_t<bf16>({4096, 33});
  expect_match(sum(h, 0), sum(to_dev(h), 0), 2e-3, 1e-2, "half sum dim 0");
  expect_match(sum(b, 1), sum(to_dev(b), 1), 1e-2, 1e-2, "bfloat16 sum dim 1");
  expect_match(mean(h), mean(to_dev(h)), 2e-3, 1e-3, "half mean");
  // A large float sum against a double reference (the tree of partials keeps the float error small).
  const i64 big = (1 << 24) + 3;
  const Tensor<float> u = rand<float>({big});
  double ref = 0;
  for (i64 i = 0; i < big; ++i) ref += u.data()[i];
  const double got = double(to_host(sum(to_dev(u))).item());
  CHECK(std::fabs(got - ref) <= 1e-6 * ref);
  // Empty reductions give the identity.
  const Tensor<float> e = randn<float>({0, 5});
  expect_match(sum(e, 0), sum(to_dev(e), 0), 0, 0, "empty sum");
  expect_match(prod(e, 0), prod(to_dev(e), 0), 0, 0, "empty prod");
}

namespace {
/// Runs loss(leaves...) backward on CPU leaves and on their device copies; compares values and gradients.
template <class F>
void same_gradients(std::vector<Tensor<double>> xs, F loss, const std::string& what, double rtol = 1e-10) {
  std::vector<Tensor<double>> ds;
  for (auto& x : xs) {
    ds.push_back(to_dev(x).requires_grad_());
    x.requires_grad_();
  }
  Tensor<double> lc = loss(xs), ld = loss(ds);
  expect_match(lc, ld, rtol, rtol, what + " (value)");
  lc.backward();
  ld.backward();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    REQUIRE(xs[i].grad().defined());
    REQUIRE(ds[i].grad().defined());
    expect_match(xs[i].grad(), ds[i].grad(), rtol, rtol, what + " grad of leaf " + std::to_string(i));
  }
}
}  // namespace

TEST_CASE("cuda: fused backward equals the CPU gradients (double), broadcast leaves, reductions") {
  SKIP_WITHOUT_CUDA();
  manual_seed(9);
  auto rn = [](const Shape& s) { return randn<double>(s); };
  same_gradients({rn({64, 100}), rn({64, 100}), rn({100})},
                 [](auto& v) { return sum(gelu(v[0] * v[1] + v[2])); }, "sum(gelu(x*w+b)), b broadcast");
  same_gradients({rn({1000}), rn({1000})},
                 [](auto& v) { return mean(tanh(v[0]) * v[1] - v[0] / (square(v[1]) + 1.0)); }, "mean(tanh(a)*b - a/(b^2+1))");
  same_gradients({rn({30, 40}), rn({30, 1})},
                 [](auto& v) { return sum(sum(where(v[0] > v[1], exp(v[0] * 0.1), v[1] * v[0]), {1})); },
                 "where with a broadcast column, sum over dim 1");
  same_gradients({rn({20, 30})}, [](auto& v) { return Tensor<double>(sum(max(v[0], 1)) + min(v[0])); }, "max along dim, min");
  same_gradients({rn({20, 30})}, [](auto& v) { return Tensor<double>(sum(norm(v[0], 2, {0})) + var(v[0]) + std_dev(v[0], 1)); },
                 "norm, var, std");
  same_gradients({rn({50, 60}), rn({60, 50})}, [](auto& v) { return sum(sigmoid(v[0] + v[1].t()) * v[0]); },
                 "transposed leaf");
  // Intermediate tensors on the tape (two materialised expressions).
  same_gradients({rn({256}), rn({256})},
                 [](auto& v) {
                   Tensor<double> h = silu(v[0] * v[1]);
                   return sum(softplus(h) * h);
                 },
                 "two nodes");
}

TEST_CASE("cuda: fused backward in float, half and bfloat16 equals the CPU gradients within rounding") {
  SKIP_WITHOUT_CUDA();
  manual_seed(10);
  const Tensor<float> x0 = randn<float>({4096}), w0 = randn<float>({4096}), b0 = randn<float>({4096});
  {
    Tensor<float> x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Tensor<float> xd = to_dev(x0).requires_grad_(), wd = to_dev(w0).requires_grad_(), bd = to_dev(b0).requires_grad_();
    Tensor<float> y = gelu(x * w + b), yd = gelu(xd * wd + bd);
    expect_match(y, yd, "gelu forward float");
    const Tensor<float> g = randn<float>({4096});
    y.backward(g);
    yd.backward(to_dev(g));
    expect_match(x.grad(), xd.grad(), 1e-5, 1e-6, "dx float");
    expect_match(w.grad(), wd.grad(), 1e-5, 1e-6, "dw float");
    expect_match(b.grad(), bd.grad(), 1e-5, 1e-6, "db float");
  }
  {
    const Tensor<bf16> xb = ev(cast<bf16>(x0)), wb(cast<bf16>(w0));
    Tensor<bf16> x = xb.clone().requires_grad_(), w = wb.clone().requires_grad_();
    Tensor<bf16> xd = to_dev(xb).requires_grad_(), wd = to_dev(wb).requires_grad_();
    Tensor<bf16> y = gelu(x * w), yd = gelu(xd * wd);
    expect_match(y, yd, "gelu forward bf16");
    sum(y).backward();
    sum(yd).backward();
    expect_match(x.grad(), xd.grad(), 8e-3, 1e-3, "dx bf16");
    expect_match(w.grad(), wd.grad(), 8e-3, 1e-3, "dw bf16");
  }
  {
    const Tensor<f16> xh = ev(cast<f16>(x0));
    Tensor<f16> x = xh.clone().requires_grad_();
    Tensor<f16> xd = to_dev(xh).requires_grad_();
    Tensor<f16> y = sigmoid(x) * x, yd = sigmoid(xd) * xd;
    sum(y).backward();
    sum(yd).backward();
    expect_match(x.grad(), xd.grad(), 1e-3, 1e-4, "dx half");
  }
}

TEST_CASE("cuda: mixing devices in one expression is an error naming both") {
  SKIP_WITHOUT_CUDA();
  const Tensor<float> a = randn<float>({10}), ad = to_dev(a);
  std::string msg;
  try {
    Tensor<float> y(a + ad);  // materialising checks the devices first
  } catch (const ember::Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("different devices") != std::string::npos);
  CHECK(msg.find("cpu") != std::string::npos);
  CHECK(msg.find("cuda:0") != std::string::npos);
}

TEST_CASE("cuda: SGD (momentum, Nesterov) and Adam/AdamW (amsgrad) updates equal the CPU's") {
  SKIP_WITHOUT_CUDA();
  manual_seed(11);
  const Tensor<double> p0 = randn<double>({300, 7});
  auto run = [&](auto make_opt, const char* what) {
    Tensor<double> pc = p0.clone().requires_grad_(), pd = to_dev(p0).requires_grad_();
    auto oc = make_opt(pc);
    auto od = make_opt(pd);
    for (int step = 0; step < 4; ++step) {
      const Tensor<double> g = randn<double>({300, 7});
      pc.grad() = g.clone();
      pd.grad() = to_dev(g);
      oc.step();
      od.step();
    }
    expect_match(pc.detach(), pd.detach(), 1e-12, 1e-12, what);
  };
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9,
                                                                               .weight_decay = 0.01}); },
      "SGD momentum");
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9,
                                                                               .nesterov = true}); },
      "SGD Nesterov");
  run([](Tensor<double>& p) { return optim::SGD<double>({p}, optim::SGDOptions{.lr = 0.05}); }, "SGD plain");
  run([](Tensor<double>& p) { return optim::Adam<double>({p}, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1}); },
      "Adam");
  run([](Tensor<double>& p) { return optim::AdamW<double>({p}, optim::AdamOptions{.lr = 0.01, .weight_decay = 0.1,
                                                                                  .amsgrad = true}); },
      "AdamW amsgrad");
}
