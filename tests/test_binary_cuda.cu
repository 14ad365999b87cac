// CUDA twins of test_expr.cpp, part 2: every binary op, comparison, logic op and where; broadcast and strided
// operands, the 128-bit path (misaligned and odd-sized operands, mixed widths), writing into views, compound
// assignment and aliasing. Each case skips when no device is present.
#include "cuda_compare.hpp"

namespace {

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

TEST_CASE("cuda: every binary op, comparison, logic op and where equals the CPU executor") {
  SKIP_WITHOUT_CUDA();
  manual_seed(2);
  every_binary_op<float>();
  every_binary_op<double>();
  every_binary_op<f16>();
  every_binary_op<bf16>();
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
  expect_match(ev(cube.select(1, 3).slice(1, 0, 9) * cube.select(2, 4)),
               ev(cubed.select(1, 3).slice(1, 0, 9) * cubed.select(2, 4)), "selected");
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
