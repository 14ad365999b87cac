// softmax / log_softmax (ops/softmax.hpp, autograd/softmax.hpp, cpu/softmax.hpp): values and gradients against
// PyTorch 1.13 (fixtures written by tests/fixtures/gen_norm_loss.py, in norm.txt), gradcheck in double along every
// dim (contiguous and strided inputs), stability for large logits, float vs double, 16-bit inputs, 0-d and empty
// tensors, and the error for a dim out of range. CUDA twin: the softmax case of test_nn_cuda.cu.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"
#include "ember/autograd/softmax.hpp"

using namespace ember;

namespace {

using ember_test::TD;
using ember_test::TF;
using ember_test::Inputs;
using Fn = ember_test::GradFn;

using ember_test::Fixtures;

constexpr auto norm_fx = &ember_test::norm_fixtures;

using ember_test::check_close;
using ember_test::check_grad;
using ember_test::normal;

using ember_test::leaf;
using ember_test::to_float;
using ember_test::to_double;

}  // namespace

// ============================================================================================== softmax

TEST_CASE("softmax / log_softmax: values and gradients match PyTorch along every dim") {
  const auto& fx = norm_fx();
  const TD x = fx["sm.x"], g = fx["sm.g"];
  for (int d = 0; d < 3; ++d) {
    INFO("dim " << d);
    TD a = leaf(x.clone());
    TD y = softmax(a, d);
    check_close(y, fx["softmax." + std::to_string(d) + ".y"]);
    y.backward(g);
    check_close(a.grad(), fx["softmax." + std::to_string(d) + ".dx"]);
    TD b = leaf(x.clone());
    TD z = log_softmax(b, d - 3);  // negative dims count from the end
    check_close(z, fx["log_softmax." + std::to_string(d) + ".y"]);
    z.backward(g);
    check_close(b.grad(), fx["log_softmax." + std::to_string(d) + ".dx"]);
  }
}

TEST_CASE("gradcheck: softmax and log_softmax along every dim, contiguous and strided") {
  const TD x = normal({3, 4, 5}, 11, 2);
  for (int d = 0; d < 3; ++d) {
    check_grad("softmax dim " + std::to_string(d), [d](const Inputs& v) { return softmax(v[0], d); }, {x});
    check_grad("log_softmax dim " + std::to_string(d), [d](const Inputs& v) { return log_softmax(v[0], d); }, {x});
    // Non-contiguous inputs: a transposed view and a strided slice.
    check_grad("softmax of a transpose, dim " + std::to_string(d),
               [d](const Inputs& v) { return softmax(v[0].transpose(0, 2), d); }, {x});
    check_grad("log_softmax of a strided slice, dim " + std::to_string(d),
               [d](const Inputs& v) { return log_softmax(v[0].slice(2, 0, 5, 2), d); }, {x});
  }
  // More inner positions than one block of columns (64), and a 1-d input.
  check_grad("softmax dim 0 with 70 inner positions", [](const Inputs& v) { return softmax(v[0], 0); },
             {normal({3, 70}, 12)});
  check_grad("log_softmax of a vector", [](const Inputs& v) { return log_softmax(v[0], 0); }, {normal({7}, 13)});
}

TEST_CASE("softmax is stable for logits of 1e4 and beyond") {
  TF x = tensor<float>({{1e4f, 0.f, -1e4f}, {3e38f, 3e38f, -3e38f}, {-1e4f, -1e4f + 1, -1e4f + 2}});
  TF y = softmax(x, 1);
  TF z = log_softmax(x, 1);
  const auto yv = y.to_vector(), zv = z.to_vector();
  for (float v : yv) CHECK(std::isfinite(v));
  for (float v : zv) CHECK(!std::isnan(v));
  CHECK(yv[0] == 1.f);
  CHECK(yv[1] == 0.f);
  CHECK(zv[0] == 0.f);
  CHECK(zv[1] == -1e4f);
  CHECK(zv[2] == -2e4f);
  CHECK(yv[3] == doctest::Approx(0.5));
  CHECK(yv[4] == doctest::Approx(0.5));
  // Shifted logits give the same probabilities as unshifted ones.
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), s = 1 + e1 + e2;
  CHECK(yv[6] == doctest::Approx(1 / s).epsilon(1e-6));
  CHECK(yv[8] == doctest::Approx(e2 / s).epsilon(1e-6));
  CHECK(zv[8] == doctest::Approx(2 - std::log(s)).epsilon(1e-6));
}

TEST_CASE("softmax in float agrees with double, forward and backward, on larger shapes") {
  struct Case {
    Shape s;
    int dim;
  };
  for (const Case& c : {Case{{7, 300}, 1}, Case{{5, 37, 70}, 1}, Case{{4, 3, 129}, 0}, Case{{2, 9, 5}, 2}}) {
    INFO("shape " << c.s.str() << " dim " << c.dim);
    const TD xd = normal(c.s, 21, 4), gd = normal(c.s, 22);
    for (bool log : {false, true}) {
      TD a = leaf(xd.clone());
      TF af = to_float(xd);
      af.requires_grad_(true);
      TD y = log ? log_softmax(a, c.dim) : softmax(a, c.dim);
      TF yf = log ? log_softmax(af, c.dim) : softmax(af, c.dim);
      check_close(yf, y, 1e-5, 1e-6);
      y.backward(gd);
      yf.backward(to_float(gd));
      check_close(af.grad(), a.grad(), 1e-4, 1e-5);
    }
  }
}

TEST_CASE("softmax in half and bfloat16 computes in float") {
  const TD xd = normal({6, 33}, 23, 3);
  TF xf = to_float(xd);
  Tensor<half> xh = cast<half>(xf);
  Tensor<bfloat16> xb = cast<bfloat16>(xf);
  TF yh = cast<float>(softmax(xh, 1)), yb = cast<float>(log_softmax(xb, 1));
  TF rh = softmax(TF(cast<float>(xh)), 1), rb = log_softmax(TF(cast<float>(xb)), 1);
  check_close(yh, to_double(rh), 2e-3, 1e-4);
  check_close(yb, to_double(rb), 1e-2, 2e-2);
}

TEST_CASE("softmax of a 0-d tensor and of an empty tensor") {
  TD s = full<double>(Shape{}, 3.0);
  CHECK(softmax(s, 0).item() == 1.0);
  CHECK(log_softmax(s, -1).item() == 0.0);
  TD e = empty<double>(Shape{0, 4});
  CHECK(softmax(e, 1).shape() == Shape{0, 4});
  CHECK(log_softmax(e, 0).numel() == 0);
}

TEST_CASE("softmax / log_softmax: a dim out of range is an error naming the op and the shape") {
  TD x = normal({2, 3}, 1);
  CHECK_THROWS_WITH_AS(softmax(x, 2), doctest::Contains("softmax: dim 2 is out of range for a tensor of shape [2, 3]"),
                       Error);
  CHECK_THROWS_WITH_AS(log_softmax(x, -3), doctest::Contains("log_softmax: dim -3 is out of range"), Error);
}
