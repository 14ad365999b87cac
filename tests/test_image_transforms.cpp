// Image transforms (data/image_transforms.hpp, data/image_resample.hpp) against torchvision.transforms.v2 on a
// photograph: from float tensors (the same arithmetic: within float rounding) and from uint8 tensors (torchvision
// rounds between passes and truncates after colour blends: under a grey level on average). RandomResizedCrop's
// distribution of crops against torchvision's. Fixtures: tests/fixtures/gen_images.py.
#include <doctest/doctest.h>

#include <ember/data/image_transforms.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>
#include "image_helpers.hpp"

using namespace ember;
using ember_test::bytes_of;
namespace tr = ember::data::transforms;

namespace {

const std::string kDir = std::string(EMBER_TEST_FIXTURES) + "/images/";

// transforms/photo.ppm (djpeg's decode of photo.jpg, 96x72) as a (3, H, W) float image in [0, 1]; small: its 24x32
// window at the top left.
Tensor<float> photo(bool small) {
  const std::vector<unsigned char> b = bytes_of(kDir + "transforms/photo.ppm");
  const std::string head = "P6\n96 72\n255\n";
  REQUIRE(std::memcmp(b.data(), head.data(), head.size()) == 0);
  const std::int64_t H = small ? 24 : 72, W = small ? 32 : 96;
  Tensor<float> t = empty<float>(Shape{3, H, W});
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t y = 0; y < H; ++y)
      for (std::int64_t x = 0; x < W; ++x)
        t.data()[(c * H + y) * W + x] = float(b[head.size() + std::size_t((y * 96 + x) * 3 + c)]) / 255.0f;
  return t;
}

struct Case {
  std::string name, op;
  std::int64_t C = 0, H = 0, W = 0;
  bool small = false;
  std::vector<double> params;
};
std::vector<Case> cases() {
  std::ifstream f(kDir + "transforms.txt");
  REQUIRE(f.good());
  std::vector<Case> v;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    Case c;
    std::string size;
    s >> c.name >> c.C >> c.H >> c.W >> size >> c.op;
    c.small = size == "small";
    for (double p; s >> p;) c.params.push_back(p);
    v.push_back(c);
  }
  return v;
}

Tensor<float> run(const Case& c, const Tensor<float>& x) {
  data::Rng g(0);
  const auto& p = c.params;
  if (c.op == "resize") return p.size() == 1 ? tr::Resize(std::int64_t(p[0]))(x, g)
                                             : tr::Resize(std::int64_t(p[0]), std::int64_t(p[1]))(x, g);
  if (c.op == "resize_center") return tr::CenterCrop(std::int64_t(p[1]))(tr::Resize(std::int64_t(p[0]))(x, g), g);
  if (c.op == "center_crop") return tr::CenterCrop(std::int64_t(p[0]), std::int64_t(p[1]))(x, g);
  if (c.op == "resized_crop") {
    const std::int64_t t = std::int64_t(p[0]), l = std::int64_t(p[1]), h = std::int64_t(p[2]), w = std::int64_t(p[3]);
    return tr::detail::resample_chw(x, double(t), double(l), double(h), double(w), std::int64_t(p[4]),
                                    std::int64_t(p[5]), t, t + h, l, l + w, true);
  }
  Tensor<float> o = empty<float>(x.shape());
  std::memcpy(o.data(), x.data(), std::size_t(x.numel()) * sizeof(float));
  const float f = float(p[0]);
  if (c.op == "brightness") tr::color::adjust_brightness(o.data(), x.size(1), x.size(2), f);
  else if (c.op == "contrast") tr::color::adjust_contrast(o.data(), x.size(1), x.size(2), f);
  else if (c.op == "saturation") tr::color::adjust_saturation(o.data(), x.size(1), x.size(2), f);
  else if (c.op == "hue") tr::color::adjust_hue(o.data(), x.size(1), x.size(2), f);
  else FAIL("unknown op " << c.op);
  return o;
}

}  // namespace

TEST_CASE("image transforms equal torchvision.transforms.v2 (Resize, CenterCrop, resized_crop, colour)") {
  const Tensor<float> full = photo(false), small = photo(true);
  const std::vector<Case> all = cases();
  REQUIRE(all.size() >= 18);
  for (const Case& c : all) {
    CAPTURE(c.name);
    const Tensor<float> out = run(c, c.small ? small : full);
    REQUIRE(out.shape() == Shape{c.C, c.H, c.W});
    const std::size_t n = std::size_t(out.numel());
    const std::vector<unsigned char> f32 = bytes_of(kDir + "transforms/" + c.name + ".f32");
    const std::vector<unsigned char> u8 = bytes_of(kDir + "transforms/" + c.name + ".u8");
    REQUIRE(f32.size() == 4 * n);
    REQUIRE(u8.size() == n);
    double worst_f = 0, sum_u = 0, worst_u = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float ref;
      std::memcpy(&ref, f32.data() + 4 * i, 4);
      worst_f = std::max(worst_f, std::abs(double(out.data()[i]) - double(ref)) * 255.0);
      const double d = std::abs(double(out.data()[i]) * 255.0 - double(u8[i]));
      sum_u += d;
      worst_u = std::max(worst_u, d);
    }
    // From float inputs the arithmetic is torchvision's: differences are float rounding (hue: HSV round trips).
    CHECK(worst_f < (c.op == "hue" ? 2e-3 : 2e-4));
    // From uint8 inputs torchvision rounds after each pass (and truncates after colour blends).
    CHECK(sum_u / double(n) < 1.0);
    CHECK(worst_u < 2.0);
  }
}

TEST_CASE("RandomResizedCrop: the distribution of crops equals torchvision's") {
  std::ifstream f(kDir + "rrc.txt");
  REQUIRE(f.good());
  std::string line;
  int sizes = 0;
  const double lo = std::log(3.0 / 4.0), hi = std::log(4.0 / 3.0);
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::int64_t H, W;
    s >> H >> W;
    std::vector<double> ref_area(20), ref_ratio(20);
    for (double& v : ref_area) s >> v;
    for (double& v : ref_ratio) s >> v;
    CAPTURE(H);
    CAPTURE(W);
    const tr::RandomResizedCrop rrc(224);
    const int n = 200000;
    std::vector<double> area(20), ratio(20);
    int outside = 0;  // crops not inside the image
    for (int k = 0; k < n; ++k) {
      data::Rng g(7, 0, std::uint64_t(k));
      const tr::RandomResizedCrop::Box b = rrc.get_params(H, W, g);
      outside += !(b.h > 0 && b.w > 0 && b.top >= 0 && b.left >= 0 && b.top + b.h <= H && b.left + b.w <= W);
      const double a = double(b.h * b.w) / double(H * W);
      area[std::min<std::size_t>(19, std::size_t(a * 20))] += 1;
      const double r = std::clamp(std::log(double(b.w) / double(b.h)), lo, hi);
      ratio[std::min<std::size_t>(19, std::size_t((r - lo) / (hi - lo) * 20))] += 1;
    }
    CHECK(outside == 0);
    // Both histograms of 200000 draws: each bin within 5 standard deviations of the reference's count.
    for (int i = 0; i < 20; ++i) {
      CAPTURE(i);
      const double sa = 5 * std::sqrt(ref_area[std::size_t(i)] + 1) + 10;
      const double sr = 5 * std::sqrt(ref_ratio[std::size_t(i)] + 1) + 10;
      CHECK(std::abs(area[std::size_t(i)] - ref_area[std::size_t(i)]) < sa);
      CHECK(std::abs(ratio[std::size_t(i)] - ref_ratio[std::size_t(i)]) < sr);
    }
    ++sizes;
  }
  CHECK(sizes == 3);
}

TEST_CASE("ColorJitter: factors in torchvision's ranges, a random order, RGB only") {
  const Tensor<float> x = photo(true);
  const tr::ColorJitter off;
  CHECK_FALSE(off.active());
  const tr::ColorJitter j(0.4f, 0.4f, 0.4f, 0.1f);
  data::Rng g(3);
  const Tensor<float> y = j(x, g);
  CHECK(y.shape() == x.shape());
  bool changed = false;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    CHECK(y.data()[i] >= 0.0f);
    CHECK(y.data()[i] <= 1.0f);
    changed |= y.data()[i] != x.data()[i];
  }
  CHECK(changed);
  // Brightness only: a factor in [0.6, 1.4], so each pixel scales by one factor (clamped).
  data::Rng g2(4);
  const Tensor<float> b = tr::ColorJitter(0.4f)(x, g2);
  const float f = b.data()[0] / x.data()[0];
  CHECK(f >= 0.6f);
  CHECK(f <= 1.4f);
  CHECK_THROWS_AS(tr::ColorJitter(0, 0, 0, 0.6f), Error);
  CHECK_THROWS_AS(tr::ColorJitter(-1.0f), Error);
  Tensor<float> gray = empty<float>(Shape{1, 4, 4});
  CHECK_THROWS_AS(j(gray, g), Error);
}

TEST_CASE("Resize: torchvision's output sizes") {
  using Size = std::pair<std::int64_t, std::int64_t>;
  CHECK(tr::Resize(256).output_size(375, 500) == Size{256, 341});
  CHECK(tr::Resize(256).output_size(500, 375) == Size{341, 256});
  tr::Resize capped(100);
  capped.max_size = 150;
  CHECK(capped.output_size(100, 400) == Size{37, 150});
  CHECK(tr::Resize(30, 40).output_size(1, 1) == Size{30, 40});
  CHECK_THROWS_AS(tr::Resize(0), Error);
  CHECK(tr::CenterCrop(15, 20).offset(24, 32) == Size{4, 6});
  CHECK(tr::CenterCrop(30, 40).offset(24, 32) == Size{-3, -4});
}
