// Checks shared by the tests that compare ops with PyTorch fixtures and gradcheck them in double (test_loss,
// test_norm): element-wise closeness to a double reference, a gradcheck that reports its message, and seeded
// normal inputs.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"

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

}  // namespace ember_test
