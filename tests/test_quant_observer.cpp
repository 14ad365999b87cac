// quant/observer.hpp: PyTorch's affine qparams formula, min-max and moving-average ranges, the histogram's
// percentile range against exact sorted-sample quantiles (also after the grid grows), quantize / dequantize
// rounding and clamping, symmetric per-channel weight scales, and the error messages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ember/quant/observer.hpp"

namespace {

using namespace ember::quant;
using i64 = std::int64_t;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ember::Error& e) {
    return e.what();
  } catch (...) {
    return "<not an ember::Error>";
  }
  return "<no exception>";
}

// PyTorch's formula, written out independently of the header.
QParams expected_qparams(float mn, float mx, std::int32_t q0, std::int32_t q1) {
  mn = std::min(mn, 0.0f);
  mx = std::max(mx, 0.0f);
  QParams p;
  p.scale = std::max((mx - mn) / float(q1 - q0), std::numeric_limits<float>::epsilon());
  const float r = std::nearbyint(mn / p.scale);  // default rounding mode: half to even
  p.zero_point = std::clamp(q0 - std::int32_t(r), q0, q1);
  return p;
}

// Sample quantile at rank t (0-based, fractional) of sorted values.
double rank_value(const std::vector<float>& sorted, double t) {
  const auto i = std::size_t(std::clamp(t, 0.0, double(sorted.size() - 1)));
  return sorted[i];
}

void observe(Observer& o, const std::vector<float>& v) { o.observe(v.data(), i64(v.size())); }

}  // namespace

TEST_CASE("quant: qmin/qmax and affine_qparams follow PyTorch") {
  CHECK(qmin(QDtype::quint8) == 0);
  CHECK(qmax(QDtype::quint8) == 255);
  CHECK(qmin(QDtype::qint8) == -128);
  CHECK(qmax(QDtype::qint8) == 127);

  // Hand-checked: [-1, 3] -> scale 4/255, zero_point = 0 - round(-63.75) = 64 (quint8), -128 + 64 (qint8).
  QParams p = affine_qparams(-1.0f, 3.0f, QDtype::quint8);
  CHECK(p.scale == doctest::Approx(4.0 / 255.0).epsilon(1e-6));
  CHECK(p.zero_point == 64);
  p = affine_qparams(-1.0f, 3.0f, QDtype::qint8);
  CHECK(p.zero_point == -64);
  // Positive-only range: min is extended to 0, so zero_point is qmin.
  p = affine_qparams(0.5f, 2.55f, QDtype::quint8);
  CHECK(p.scale == doctest::Approx(0.01).epsilon(1e-6));
  CHECK(p.zero_point == 0);
  CHECK(affine_qparams(0.5f, 2.55f, QDtype::qint8).zero_point == -128);
  // Negative-only range: max is extended to 0, zero_point is qmax.
  CHECK(affine_qparams(-4.0f, -1.0f, QDtype::quint8).zero_point == 255);
  CHECK(affine_qparams(-4.0f, -1.0f, QDtype::qint8).zero_point == 127);
  // min / scale = -2.5 exactly (scale 1/64): rounds half to even, zero_point 2 (half away from zero would give 3).
  p = affine_qparams(-2.5f / 64.0f, 255.0f / 64.0f - 2.5f / 64.0f, QDtype::quint8);
  CHECK(p.scale == 1.0f / 64.0f);
  CHECK(p.zero_point == 2);
  // Empty range: scale floored at FLT_EPSILON.
  CHECK(affine_qparams(0.0f, 0.0f, QDtype::quint8).scale == std::numeric_limits<float>::epsilon());

  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f);
  for (int k = 0; k < 200; ++k) {
    float a = u(g), b = u(g);
    if (a > b) std::swap(a, b);
    for (QDtype dt : {QDtype::quint8, QDtype::qint8}) {
      const QParams got = affine_qparams(a, b, dt), want = expected_qparams(a, b, qmin(dt), qmax(dt));
      CHECK(got.scale == want.scale);
      CHECK(got.zero_point == want.zero_point);
      // 0 is exactly representable.
      CHECK(dequantize_value(quantize_value(0.0f, got, qmin(dt), qmax(dt)), got) == 0.0f);
    }
  }
}

TEST_CASE("quant: min_max observer records the exact range over batches") {
  Observer o;
  CHECK_FALSE(o.has_data());
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  i64 total = 0;
  for (int b = 0; b < 5; ++b) {
    std::vector<float> v(std::size_t(100 + 37 * b));
    for (float& x : v) x = nd(g);
    for (float x : v) mn = std::min(mn, x), mx = std::max(mx, x);
    total += i64(v.size());
    observe(o, v);
  }
  o.observe(nullptr, 0);  // an empty batch changes nothing
  CHECK(o.has_data());
  CHECK(o.count() == total);
  CHECK(o.min() == mn);
  CHECK(o.max() == mx);
  const QParams p = o.qparams(), want = expected_qparams(mn, mx, 0, 255);
  CHECK(p.scale == want.scale);
  CHECK(p.zero_point == want.zero_point);

  // Positive-only activations (after ReLU): 0 is included, zero_point is qmin.
  Observer r({.dtype = QDtype::qint8});
  const std::vector<float> pos = {0.25f, 3.0f, 1.5f};
  observe(r, pos);
  CHECK(r.min() == 0.25f);
  CHECK(r.qparams().zero_point == -128);
  CHECK(r.qparams().scale == doctest::Approx(3.0 / 255.0).epsilon(1e-6));
}

TEST_CASE("quant: moving-average observer") {
  const float c = 0.25f;
  Observer o({.kind = ObserverKind::moving_average_min_max, .averaging_constant = c});
  const std::vector<float> b1 = {-1.0f, 0.5f, 2.0f}, b2 = {-5.0f, 1.0f, 10.0f}, b3 = {0.0f, 0.1f};
  observe(o, b1);
  CHECK(o.min() == -1.0f);  // the first batch sets the range
  CHECK(o.max() == 2.0f);
  observe(o, b2);
  float mn = float(-1.0 + double(c) * (-5.0 - -1.0)), mx = float(2.0 + double(c) * (10.0 - 2.0));
  CHECK(o.min() == mn);
  CHECK(o.max() == mx);
  CHECK(mn == -2.0f);
  CHECK(mx == 4.0f);
  observe(o, b3);
  mn = float(double(mn) + double(c) * (0.0 - double(mn)));
  mx = float(double(mx) + double(c) * (0.1f - double(mx)));
  CHECK(o.min() == mn);
  CHECK(o.max() == mx);
  CHECK(o.count() == 8);
  const QParams p = o.qparams(), want = expected_qparams(mn, mx, 0, 255);
  CHECK(p.scale == want.scale);
  CHECK(p.zero_point == want.zero_point);
}

TEST_CASE("quant: histogram percentile clips rare outliers") {
  std::mt19937 g(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(100000);
  for (float& x : v) x = nd(g);
  for (int i = 0; i < 5; ++i) v[std::size_t(1000 * i + 3)] = 1e4f;
  v[77] = -1e4f;
  // An equal-width grid spans [-1e4, 1e4]: enough bins to resolve the bulk (width ~0.076).
  const int bins = 1 << 18;
  Observer o({.kind = ObserverKind::histogram, .bins = bins, .percentile = 99.9});
  observe(o, v);
  CHECK(o.count() == 100000);
  std::vector<float> s = v;
  std::sort(s.begin(), s.end());
  const double width = 2e4 / bins;
  const double tail = 100000 * 0.0005;
  INFO("min " << o.min() << " max " << o.max());
  CHECK(o.max() < 10.0f);
  CHECK(o.min() > -10.0f);
  CHECK(o.max() == doctest::Approx(3.2905).epsilon(0.05));  // the normal's 99.95% quantile
  CHECK(o.min() == doctest::Approx(-3.2905).epsilon(0.05));
  CHECK(std::fabs(o.max() - rank_value(s, 100000 - tail)) <= 2 * width);
  CHECK(std::fabs(o.min() - rank_value(s, tail)) <= 2 * width);
  CHECK(o.qparams().scale < 7.0f / 255.0f);

  // min_max keeps the outliers.
  Observer m;
  observe(m, v);
  CHECK(m.max() == 1e4f);

  // percentile 100 keeps the full range, exactly.
  Observer full({.kind = ObserverKind::histogram, .percentile = 100.0});
  observe(full, v);
  CHECK(full.min() == -1e4f);
  CHECK(full.max() == 1e4f);
}

TEST_CASE("quant: histogram grown over batches keeps counts and quantiles") {
  std::mt19937 g(3);
  const int bins = 512;
  Observer o({.kind = ObserverKind::histogram, .bins = bins, .percentile = 99.0});
  Observer med({.kind = ObserverKind::histogram, .bins = bins, .percentile = 1e-6});  // ~ the median
  Observer all({.kind = ObserverKind::histogram, .bins = bins, .percentile = 100.0});
  std::vector<float> seen;
  // Batches that drift and widen in both directions, so the grid grows and shifts several times.
  for (int b = 0; b < 12; ++b) {
    std::normal_distribution<float> nd(b % 2 ? 0.4f * float(b) : -0.3f * float(b), 0.2f + 0.25f * float(b));
    std::vector<float> v(std::size_t(3000 + 500 * b));
    for (float& x : v) x = nd(g);
    observe(o, v);
    observe(med, v);
    observe(all, v);
    seen.insert(seen.end(), v.begin(), v.end());
  }
  const double n = double(seen.size());
  CHECK(o.count() == i64(seen.size()));
  std::sort(seen.begin(), seen.end());
  CHECK(all.min() == seen.front());
  CHECK(all.max() == seen.back());
  // The grid is at most twice as wide as the span needs (plus alignment).
  const double width = 2.0 * (double(seen.back()) - double(seen.front())) / bins * 1.01;
  INFO("width bound " << width);
  CHECK(std::fabs(o.min() - rank_value(seen, n * 0.005)) <= 2 * width);
  CHECK(std::fabs(o.max() - rank_value(seen, n * 0.995)) <= 2 * width);
  CHECK(std::fabs(med.min() - rank_value(seen, n * 0.5)) <= 2 * width);
  CHECK(std::fabs(med.max() - rank_value(seen, n * 0.5)) <= 2 * width);
  CHECK(med.min() <= med.max());

  // The same data in one batch gives nearly the same range.
  Observer one({.kind = ObserverKind::histogram, .bins = bins, .percentile = 99.0});
  observe(one, seen);
  CHECK(std::fabs(o.min() - one.min()) <= 2 * width);
  CHECK(std::fabs(o.max() - one.max()) <= 2 * width);
}

TEST_CASE("quant: histogram percentile interpolates inside a bin") {
  // One bin over [0, 99] holding 0, 1, ..., 99: clipping 25 values per tail lands 25% into the bin from each end.
  Observer o({.kind = ObserverKind::histogram, .bins = 1, .percentile = 50.0});
  std::vector<float> v(100);
  for (int i = 0; i < 100; ++i) v[std::size_t(i)] = float(i);
  observe(o, v);
  CHECK(o.min() == doctest::Approx(24.75).epsilon(1e-6));
  CHECK(o.max() == doctest::Approx(74.25).epsilon(1e-6));
}

TEST_CASE("quant: histogram starting from a constant batch") {
  Observer o({.kind = ObserverKind::histogram, .bins = 64, .percentile = 100.0});
  const std::vector<float> zeros(10, 0.0f), wide = {-3.0f, 5.0f, 1.0f};
  observe(o, zeros);
  CHECK(o.min() == 0.0f);
  CHECK(o.max() == 0.0f);
  CHECK(o.qparams().scale == std::numeric_limits<float>::epsilon());
  observe(o, wide);
  CHECK(o.min() == -3.0f);
  CHECK(o.max() == 5.0f);
  CHECK(o.count() == 13);
  // 10 of the 13 values sit at 0: a percentile that clips 1.5 values per tail stays within [-3, 5] and moves in.
  Observer p({.kind = ObserverKind::histogram, .bins = 64, .percentile = 100.0 * (1.0 - 3.0 / 13.0)});
  observe(p, zeros);
  observe(p, wide);
  CHECK(p.min() > -3.0f);
  CHECK(p.max() < 5.0f);
  CHECK(p.min() <= p.max());
}

TEST_CASE("quant: quantize / dequantize round trip, clamping and half-to-even rounding") {
  const QParams p = affine_qparams(-2.0f, 6.0f, QDtype::quint8);
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-2.0f, 6.0f);
  for (int k = 0; k < 1000; ++k) {
    const float x = u(g);
    const std::int32_t q = quantize_value(x, p, 0, 255);
    CHECK(q >= 0);
    CHECK(q <= 255);
    CHECK(std::fabs(dequantize_value(q, p) - x) <= p.scale * 0.5f + 1e-6f);
  }
  CHECK(quantize_value(100.0f, p, 0, 255) == 255);
  CHECK(quantize_value(-100.0f, p, 0, 255) == 0);
  CHECK(quantize_value(1e30f, p, 0, 255) == 255);
  // Clamped to qmax: the top of the range to within the zero point's rounding (half a step).
  CHECK(std::fabs(dequantize_value(quantize_value(100.0f, p, 0, 255), p) - 6.0f) <= p.scale * 0.5f + 1e-6f);

  const QParams unit{1.0f, 0};
  CHECK(quantize_value(2.5f, unit, -128, 127) == 2);
  CHECK(quantize_value(3.5f, unit, -128, 127) == 4);
  CHECK(quantize_value(-2.5f, unit, -128, 127) == -2);
  CHECK(quantize_value(0.5f, unit, -128, 127) == 0);
  CHECK(quantize_value(2.51f, unit, -128, 127) == 3);
  CHECK(quantize_value(1.25f, QParams{0.5f, 10}, 0, 255) == 12);  // 2.5 -> 2, + 10
  CHECK(dequantize_value(12, QParams{0.5f, 10}) == 1.0f);
}

TEST_CASE("quant: symmetric per-channel weight scales") {
  const i64 channels = 4, per = 33;
  std::vector<float> w(std::size_t(channels * per));
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (i64 c = 0; c < channels; ++c)
    for (i64 i = 0; i < per; ++i) w[std::size_t(c * per + i)] = c == 2 ? 0.0f : nd(g) * float(c + 1);
  w[std::size_t(1 * per + 5)] = -9.0f;  // a negative extreme sets channel 1's scale
  const std::vector<float> s = symmetric_scales(w.data(), channels, per);
  REQUIRE(s.size() == std::size_t(channels));
  for (i64 c = 0; c < channels; ++c) {
    float m = 0.0f;
    for (i64 i = 0; i < per; ++i) m = std::max(m, std::fabs(w[std::size_t(c * per + i)]));
    const float sc = s[std::size_t(c)];
    CHECK(std::isfinite(sc));
    CHECK(sc > 0.0f);
    if (c != 2) CHECK(sc == m / 127.0f);
    const QParams qp{sc, 0};
    for (i64 i = 0; i < per; ++i) {
      const float x = w[std::size_t(c * per + i)];
      const std::int32_t q = quantize_value(x, qp, -127, 127);
      CHECK(q >= -127);
      CHECK(q <= 127);
      const float back = dequantize_value(q, qp);
      CHECK(std::isfinite(back));
      CHECK(std::fabs(back - x) <= sc * 0.5f * 1.0001f);
      if (c == 2) CHECK(q == 0);
    }
  }
  CHECK(s[1] == 9.0f / 127.0f);
  CHECK(quantize_value(-9.0f, QParams{s[1], 0}, -127, 127) == -127);
  CHECK(s[2] == 1.0f);
  CHECK(symmetric_scales(nullptr, 0, 5).empty());
}

TEST_CASE("quant: observer errors name quant::Observer") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (ObserverKind k : {ObserverKind::min_max, ObserverKind::moving_average_min_max, ObserverKind::histogram}) {
    Observer o({.kind = k});
    const std::vector<float> bad = {1.0f, nan, 2.0f}, binf = {-inf}, good = {1.0f, 2.0f};
    CHECK_THROWS_AS(observe(o, bad), ember::Error);
    std::string msg = error_of([&] { observe(o, bad); });
    CHECK(msg.find("quant::Observer") != std::string::npos);
    CHECK(msg.find("nan") != std::string::npos);
    CHECK(msg.find("index 1") != std::string::npos);
    msg = error_of([&] { observe(o, binf); });
    CHECK(msg.find("inf") != std::string::npos);
    CHECK_FALSE(o.has_data());  // a rejected batch leaves the observer unchanged

    CHECK_THROWS_AS(o.qparams(), ember::Error);
    msg = error_of([&] { (void)o.qparams(); });
    CHECK(msg.find("quant::Observer: no calibration data observed") != std::string::npos);

    observe(o, good);
    CHECK_THROWS_AS(observe(o, bad), ember::Error);
    CHECK(o.count() == 2);
    CHECK(o.min() == 1.0f);
    CHECK(o.max() == 2.0f);
  }

  struct Bad {
    ObserverOptions o;
    const char* what;
  };
  const Bad bad_options[] = {
      {{.averaging_constant = 0.0f}, "averaging_constant"}, {{.averaging_constant = 1.5f}, "averaging_constant"},
      {{.averaging_constant = nan}, "averaging_constant"},  {{.bins = 0}, "bins"},
      {{.bins = (1 << 20) + 1}, "bins"},                    {{.percentile = 0.0}, "percentile"},
      {{.percentile = 100.5}, "percentile"},                {{.percentile = double(nan)}, "percentile"},
  };
  for (const Bad& b : bad_options) {
    CHECK_THROWS_AS(Observer{b.o}, ember::Error);
    const std::string msg = error_of([&] { Observer o(b.o); });
    INFO(msg);
    CHECK(msg.find("quant::Observer") != std::string::npos);
    CHECK(msg.find(b.what) != std::string::npos);
  }
  CHECK(error_of([] { Observer o({.bins = 0}); }).find("got 0") != std::string::npos);
  CHECK_NOTHROW(Observer({.kind = ObserverKind::histogram, .averaging_constant = 1.0f, .bins = 1, .percentile = 100.0}));

  CHECK_THROWS_AS(affine_qparams(2.0f, 1.0f, QDtype::quint8), ember::Error);
  CHECK_THROWS_AS(quantize_value(nan, QParams{}, 0, 255), ember::Error);
  CHECK_THROWS_AS(quantize_value(1.0f, QParams{0.0f, 0}, 0, 255), ember::Error);
  const std::vector<float> wbad = {1.0f, inf};
  CHECK_THROWS_AS(symmetric_scales(wbad.data(), 1, 2), ember::Error);
}
