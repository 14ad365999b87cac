// CUDA twins of test_expr.cpp, part 1: every unary op of the functor table, integer and bool tensors, and the
// bit-exact 16-bit conversions; every result of the CUDA executor compared with the CPU executor's on the same
// random inputs. Each case skips when no device is present.
#include "cuda_compare.hpp"

namespace {

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

}  // namespace

TEST_CASE("cuda: every unary op of the table equals the CPU executor (float, double, half, bfloat16)") {
  SKIP_WITHOUT_CUDA();
  manual_seed(1);
  every_unary_op<float>();
  every_unary_op<double>();
  every_unary_op<f16>();
  every_unary_op<bf16>();
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
