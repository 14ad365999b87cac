// Checks shared by the tests that compare ops with PyTorch fixtures and gradcheck them in double (test_loss,
// test_norm, test_softmax, test_fuse, test_index, test_sort, test_manip, test_functional, test_transformer,
// test_quant): element-wise closeness to a double reference, a gradcheck that reports its message, seeded normal
// inputs, one fixture case's value, gradients and gradcheck, the fixture files they read, and the small conversions
// they share (leaf, to_float, to_double, mask_of).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

namespace ember_test {

/// Every element of `got` within atol + rtol * |want| of `want` (same shape).
template <class T>
void check_close(const ember::Tensor<T>& got, const ember::Tensor<double>& want, double rtol = 1e-9,
                 double atol = 1e-11) {
  REQUIRE(got.defined());
  REQUIRE(got.shape() == want.shape());
  const auto g = got.to_vector();
  const auto w = want.to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i << ": got " << double(g[i]) << ", want " << w[i]);
    CHECK(std::fabs(double(g[i]) - w[i]) <= atol + rtol * std::fabs(w[i]));
  }
}

using GradFn = std::function<ember::Tensor<double>(const std::vector<ember::Tensor<double>>&)>;

/// gradcheck in double with the tolerances these tests use; the failure message names `what`.
inline void check_grad(const std::string& what, const GradFn& f, const std::vector<ember::Tensor<double>>& in) {
  INFO(what);
  ember::GradcheckResult r = ember::gradcheck(f, in, 1e-6, 1e-6, 1e-5);
  CHECK_MESSAGE(r.ok, r.message);
}

/// Seeded normal values, scaled and shifted.
inline ember::Tensor<double> normal(const ember::Shape& s, std::uint64_t seed, double scale = 1, double shift = 0) {
  ember::Generator g(seed);
  ember::Tensor<double> t = ember::randn<double>(s, g);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = t.data()[i] * scale + shift;
  return t;
}

/// Runs `f` on the inputs of fixture case `name` in `src` (name.in0, ...): the value against name.y, the gradients
/// for upstream name.g against name.d0, ..., then gradcheck on the same inputs (without the gradients when `grad` is
/// false). The records are those of tests/fixtures/gen_manip.py and gen_parity.py.
inline void check_fixture_case(const Fixtures& src, const std::string& name, std::size_t n_inputs, const GradFn& f,
                               bool grad = true) {
  using TD = ember::Tensor<double>;
  using Inputs = std::vector<TD>;
  INFO("case " << name);
  Inputs in;
  for (std::size_t i = 0; i < n_inputs; ++i) in.push_back(src[name + ".in" + std::to_string(i)].requires_grad_(true));
  TD y = f(in);
  ember_test::check_close(y, src[name + ".y"], 1e-12, 1e-12);
  if (!grad) return;
  y.backward(src[name + ".g"]);
  for (std::size_t i = 0; i < n_inputs; ++i) {
    INFO("gradient of input " << i);
    REQUIRE(in[i].grad().defined());
    ember_test::check_close(in[i].grad(), src[name + ".d" + std::to_string(i)], 1e-12, 1e-12);
  }
  Inputs fresh;
  for (std::size_t i = 0; i < n_inputs; ++i)
    fresh.push_back(src[name + ".in" + std::to_string(i)].requires_grad_(true));
  ember_test::check_grad(name, f, fresh);
}

using TD = ember::Tensor<double>;
using TF = ember::Tensor<float>;
using Inputs = std::vector<TD>;

/// tests/fixtures/manip.txt (gen_manip.py), read once per program.
inline const Fixtures& manip_fixtures() {
  static const Fixtures f("manip.txt");
  return f;
}
/// tests/fixtures/parity.txt (gen_parity.py): options beyond the basics, PyTorch's less obvious rules.
inline const Fixtures& parity_fixtures() {
  static const Fixtures f("parity.txt");
  return f;
}
/// tests/fixtures/norm.txt (gen_norm_loss.py): the normalization and softmax cases.
inline const Fixtures& norm_fixtures() {
  static const Fixtures f("norm.txt");
  return f;
}

/// check_fixture_case on a case of manip.txt, or of `src`.
inline void check_case(const std::string& name, std::size_t n_inputs, const GradFn& f, bool grad = true,
                       const Fixtures& src = manip_fixtures()) {
  check_fixture_case(src, name, n_inputs, f, grad);
}

/// t, now requiring its gradient.
inline TD leaf(TD t) {
  t.requires_grad_(true);
  return t;
}
/// t's values rounded to float (any layout in, contiguous out).
inline TF to_float(const TD& t) {
  TF r = ember::empty<float>(t.shape());
  const TD c = t.contiguous();
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data()[i] = float(c.data()[i]);
  return r;
}
/// t's values in double.
inline TD to_double(const TF& t) {
  TD r = ember::empty<double>(t.shape());
  const TF c = t.contiguous();
  for (std::int64_t i = 0; i < t.numel(); ++i) r.data()[i] = double(c.data()[i]);
  return r;
}
/// The nonzero elements of a contiguous t, as a mask.
inline ember::Tensor<bool> mask_of(const TD& t) {
  ember::Tensor<bool> m = ember::empty<bool>(t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t.data()[i] != 0;
  return m;
}

}  // namespace ember_test
