// nn::functional's pad, interpolate and one_hot (nn/functional.hpp; interpolate's passes are autograd/interpolate.hpp,
// their loops cpu/interpolate.hpp): every pad mode, every interpolate mode (nearest, nearest-exact, linear, bilinear,
// bicubic, trilinear, area; sizes and scale factors, align_corners), one_hot. Values and gradients against PyTorch
// (fixtures written by tests/fixtures/gen_manip.py and gen_parity.py with the PyPI wheel), gradcheck in double, float
// and bfloat16 against double, and the errors bad arguments get.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"
#include "reference_checks.hpp"

using namespace ember;
using ember_test::Fixtures;

namespace {

using ember_test::TD;
using ember_test::Inputs;
using Fn = ember_test::GradFn;
namespace F = ember::nn::functional;

constexpr auto fx = &ember_test::manip_fixtures;

constexpr auto pfx = &ember_test::parity_fixtures;

using ember_test::check_case;

}  // namespace

TEST_CASE("nn::functional pad, interpolate and one_hot match PyTorch, gradients included") {
  check_case("pad.constant", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2}, F::PadMode::constant, 0.5); });
  check_case("pad.crop", 1, [](const Inputs& v) { return F::pad(v[0], {1, 1, -1, 2}); });
  check_case("pad.reflect", 1, [](const Inputs& v) { return F::pad(v[0], {2, 1, 1, 2}, F::PadMode::reflect); });
  check_case("pad.replicate", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2, 2, 0}, F::PadMode::replicate); });
  check_case("pad.circular", 1, [](const Inputs& v) { return F::pad(v[0], {1, 2}, F::PadMode::circular); });
  using M = F::InterpolateMode;
  const std::vector<std::pair<std::string, F::InterpolateOptions>> cases = {
      {"nearest.size", {{5, 7}, {}, M::nearest, false}},
      {"nearest.scale", {{}, {2.0}, M::nearest, false}},
      {"nearest.down", {{2, 3}, {}, M::nearest, false}},
      {"bilinear.size", {{5, 7}, {}, M::bilinear, false}},
      {"bilinear.corners", {{5, 7}, {}, M::bilinear, true}},
      {"bilinear.scale", {{}, {1.5}, M::bilinear, false}},
      {"bilinear.down", {{2, 3}, {}, M::bilinear, false}},
      {"linear", {{7}, {}, M::linear, false}}};
  for (const auto& [name, o] : cases) {
    const F::InterpolateOptions opt = o;
    check_case("interpolate." + name, 1, [opt](const Inputs& v) { return F::interpolate(v[0], opt); });
  }
  const Tensor<std::int64_t> oi = fx().index("one_hot.index");
  CHECK(F::one_hot(oi).to_vector() == fx().index("one_hot.auto").to_vector());
  CHECK(F::one_hot(oi, 5).shape() == Shape{2, 2, 5});
  CHECK(F::one_hot(oi, 5).to_vector() == fx().index("one_hot.5").to_vector());
  EXPECT_ERROR([] { (void)F::pad(ones<double>({1, 2, 3}), {3, 0}, F::PadMode::reflect); }, {"pad", "reflect",
               "smaller than its size 3"});
  EXPECT_ERROR([] { (void)F::pad(ones<double>({3}), {1, 1}, F::PadMode::replicate); }, {"pad", "2-D or 3-D"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 1, 2, 2}), {{3, 3}, {2.0}, M::nearest, false}); },
               {"interpolate", "not both"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 2}), {{3, 3}, {}, M::bilinear, false}); },
               {"interpolate", "bilinear needs a 4-D input"});
  EXPECT_ERROR([] { (void)F::one_hot(tensor<std::int64_t>({0, 5}), 3); }, {"one_hot", "class value 5"});
  // An output size beyond any int64 is refused before it is converted (the conversion would be undefined).
  for (const double factor : {1e30, 1e300}) {
    INFO("scale_factor " << factor);
    std::string msg;
    try {
      (void)F::interpolate(ones<double>({1, 1, 2, 2}), {{}, {factor}, M::nearest, false});
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK(msg.find("interpolate") != std::string::npos);
    CHECK(msg.find("scale_factor") != std::string::npos);
    CHECK(msg.find("too large") != std::string::npos);
    CHECK(msg.find("-9223372036854775808") == std::string::npos);
  }
}

TEST_CASE("interpolate: bicubic, area, nearest-exact, trilinear and 5-D nearest match PyTorch, gradients included") {
  using M = F::InterpolateMode;
  const std::vector<std::pair<std::string, F::InterpolateOptions>> cases = {
      {"bicubic.size", {{7, 8}, {}, M::bicubic, false}},
      {"bicubic.corners", {{7, 8}, {}, M::bicubic, true}},
      {"bicubic.scale", {{}, {1.7}, M::bicubic, false}},
      {"bicubic.scale2", {{}, {0.6, 2.0}, M::bicubic, false}},
      {"bicubic.down", {{3, 2}, {}, M::bicubic, false}},
      {"bicubic.down_corners", {{2, 3}, {}, M::bicubic, true}},
      {"bicubic.one", {{1, 3}, {}, M::bicubic, true}},
      {"area.1d", {{3}, {}, M::area, false}},
      {"area.2d", {{3, 4}, {}, M::area, false}},
      {"area.3d", {{2, 3, 4}, {}, M::area, false}},
      {"area.up", {{9, 8}, {}, M::area, false}},
      {"area.scale", {{}, {0.5}, M::area, false}},
      {"nearest_exact.1d", {{7}, {}, M::nearest_exact, false}},
      {"nearest_exact.2d", {{7, 3}, {}, M::nearest_exact, false}},
      {"nearest_exact.3d", {{}, {1.5}, M::nearest_exact, false}},
      {"nearest_exact.scale", {{}, {0.7}, M::nearest_exact, false}},
      {"nearest.3d", {{3, 5, 7}, {}, M::nearest, false}},
      {"nearest.twice2d", {{}, {2.3, 1.1}, M::nearest, false}},
      {"trilinear.size", {{5, 6, 4}, {}, M::trilinear, false}},
      {"trilinear.corners", {{5, 6, 4}, {}, M::trilinear, true}},
      {"trilinear.scale", {{}, {1.5, 0.5, 2.0}, M::trilinear, false}}};
  for (const auto& [name, o] : cases) {
    const F::InterpolateOptions opt = o;
    check_case("interp." + name, 1, [opt](const Inputs& v) { return F::interpolate(v[0], opt); }, true, pfx());
  }
  // A 1-D input whose output is twice as long: PyTorch's forward reads floor(j / 2.3), not j / 2 as for 2-D
  // inputs; its backward takes the j / 2 shortcut all the same, so only the value is PyTorch's, and ember's gradient
  // is the adjoint of its forward (README, differences from PyTorch).
  const F::InterpolateOptions twice{{}, {2.3}, M::nearest, false};
  check_case("interp.nearest.twice", 1, [twice](const Inputs& v) { return F::interpolate(v[0], twice); }, false,
             pfx());
  ember_test::check_grad("interp.nearest.twice", [twice](const Inputs& v) { return F::interpolate(v[0], twice); },
                         {pfx()["interp.nearest.twice.in0"].requires_grad_(true)});
  // float and bfloat16 follow double (the passes compute in fp32).
  const TD xd = ember_test::normal({2, 3, 5, 6}, 12);
  const F::InterpolateOptions bic{{7, 4}, {}, M::bicubic, false};
  const TD want = F::interpolate(xd, bic);
  ember_test::check_close(F::interpolate(Tensor<float>(cast<float>(xd)), bic), want, 1e-5, 1e-5);
  ember_test::check_close(F::interpolate(Tensor<bfloat16>(cast<bfloat16>(xd)), bic), want, 0.05, 0.05);
  // Area bins of different widths: a bin that does not cover an inf stays finite (unused taps read nothing).
  TD xi = ones<double>({1, 1, 5});
  xi.at(0, 0, 0) = std::numeric_limits<double>::infinity();
  const TD ya = F::interpolate(xi, {{3}, {}, M::area, false});  // bins [0, 2), [1, 4), [3, 5)
  CHECK(std::isinf(ya.at(0, 0, 0)));
  CHECK(ya.at(0, 0, 2) == 1.0);
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3}), {{4}, {}, M::bicubic, false}); },
               {"interpolate", "bicubic needs a 4-D input"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3, 3}), {{4, 4}, {}, M::trilinear, false}); },
               {"interpolate", "trilinear needs a 5-D input"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 2, 3, 3}), {{4, 4}, {}, M::area, true}); },
               {"interpolate", "align_corners", "not mode area"});
  EXPECT_ERROR([] { (void)F::interpolate(ones<double>({1, 1, 2, 2, 2, 2}), {{3}, {}, M::nearest, false}); },
               {"interpolate", "5-D", "[1, 1, 2, 2, 2, 2]"});
}
