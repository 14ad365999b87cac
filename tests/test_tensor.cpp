// Core tensor tests: Shape and broadcasting rules, every view (geometry, shared data, contiguity), copies,
// creation functions, random generators, element access, cat/stack/index_select, PyTorch-style printing, the CPU
// caching allocator and 16-bit tensors. Expected values are computed independently of the code under test
// (by hand, by plain loops over row-major indices, or from PyTorch's documented behaviour).
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
using namespace ember_test;

namespace {


/// 0, 1, 2, ... as a contiguous float tensor of the given shape (filled by a plain loop, not by ember).
Tensor<float> iota(const Shape& s) {
  Tensor<float> t = empty<float>(s);
  for (i64 i = 0; i < t.numel(); ++i) t.data()[i] = float(i);
  return t;
}

template <class T>
std::vector<double> values(const Tensor<T>& t) {
  std::vector<double> v;
  for (i64 i = 0; i < t.numel(); ++i) v.push_back(double(rd(t, i)));
  return v;
}

template <class T>
void check_values(const Tensor<T>& t, const std::vector<double>& expect) {
  REQUIRE(t.numel() == i64(expect.size()));
  const auto got = values(t);
  for (std::size_t i = 0; i < expect.size(); ++i) {
    INFO("element " << i);
    CHECK(got[i] == expect[i]);
  }
}

bool shares(const Tensor<float>& a, const Tensor<float>& b) { return a.storage().get() == b.storage().get(); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ember::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

// ============================================================================================ Shape, broadcast

TEST_CASE("Shape basics: numel, str, equality, insert/erase") {
  Shape s{2, 3, 4};
  CHECK(s.size() == 3);
  CHECK(s.numel() == 24);
  CHECK(Shape{}.numel() == 1);  // 0-d: one element
  CHECK(Shape{3, 0, 2}.numel() == 0);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(Shape{}.str() == "[]");
  CHECK(s == Shape{2, 3, 4});
  CHECK_FALSE(s == Shape{2, 3});
  CHECK_FALSE(s == Shape{2, 3, 5});
  s.insert(1, 7);
  CHECK(s == Shape{2, 7, 3, 4});
  s.erase(0);
  CHECK(s == Shape{7, 3, 4});
  CHECK(Shape(std::vector<i64>{5, 6}) == Shape{5, 6});
  Shape full{1, 1, 1, 1, 1, 1, 1, 1};
  CHECK_THROWS_AS(full.push_back(1), ember::Error);  // at most kMaxDims dims
}

TEST_CASE("contiguous strides and is_contiguous") {
  CHECK(contiguous_strides(Shape{2, 3, 4}) == Shape{12, 4, 1});
  CHECK(contiguous_strides(Shape{5}) == Shape{1});
  CHECK(contiguous_strides(Shape{}) == Shape{});
  // PyTorch: torch.empty(2, 0, 3).stride() == (3, 3, 1) (zero extents count as 1).
  CHECK(contiguous_strides(Shape{2, 0, 3}) == Shape{3, 3, 1});
  CHECK(is_contiguous(Shape{2, 3}, Shape{3, 1}));
  CHECK_FALSE(is_contiguous(Shape{2, 3}, Shape{1, 2}));
  CHECK(is_contiguous(Shape{2, 1, 3}, Shape{3, 99, 1}));  // size-1 dims may have any stride
  CHECK(is_contiguous(Shape{1, 1}, Shape{0, 0}));
  CHECK_FALSE(is_contiguous(Shape{2, 3}, Shape{0, 1}));
}

TEST_CASE("broadcast_shapes follows NumPy/PyTorch rules") {
  auto B = [](Shape a, Shape b) { return broadcast_shapes(a, b, "test"); };
  CHECK(B({2, 3}, {3}) == Shape{2, 3});
  CHECK(B({3}, {2, 3}) == Shape{2, 3});
  CHECK(B({2, 1}, {1, 3}) == Shape{2, 3});
  CHECK(B({5, 1, 4}, {3, 1}) == Shape{5, 3, 4});
  CHECK(B({8, 1, 6, 1}, {7, 1, 5}) == Shape{8, 7, 6, 5});  // the NumPy documentation example
  CHECK(B({}, {2, 2}) == Shape{2, 2});
  CHECK(B({}, {}) == Shape{});
  CHECK(B({1}, {}) == Shape{1});
  CHECK(B({0}, {1}) == Shape{0});
  CHECK(B({2, 0}, {0}) == Shape{2, 0});
  CHECK(B({4, 1}, {8, 4, 3}) == Shape{8, 4, 3});
  CHECK_THROWS_AS(B({2, 3}, {2}), ember::Error);
  CHECK_THROWS_AS(B({3}, {4}), ember::Error);
  CHECK_THROWS_AS(B({2, 1}, {8, 4, 3}), ember::Error);
  CHECK_THROWS_AS(B({0}, {2}), ember::Error);  // 0 does not stretch
  const std::string msg = error_of([&] { B({2, 3}, {4}); });
  CHECK(msg.find("test") != std::string::npos);
  CHECK(msg.find("[2, 3]") != std::string::npos);
  CHECK(msg.find("[4]") != std::string::npos);
}

TEST_CASE("broadcast_strides: stride 0 on stretched and new dims") {
  CHECK(broadcast_strides(Shape{3}, Shape{1}, Shape{2, 3}) == Shape{0, 1});
  CHECK(broadcast_strides(Shape{2, 1}, Shape{1, 1}, Shape{2, 5}) == Shape{1, 0});
  CHECK(broadcast_strides(Shape{}, Shape{}, Shape{4, 4}) == Shape{0, 0});
}

TEST_CASE("wrap_dim: negative dims and errors") {
  CHECK(wrap_dim(-1, 3, "t") == 2);
  CHECK(wrap_dim(-3, 3, "t") == 0);
  CHECK(wrap_dim(2, 3, "t") == 2);
  CHECK(wrap_dim(0, 0, "t") == 0);   // a 0-d tensor accepts dim 0 and -1, as PyTorch does
  CHECK(wrap_dim(-1, 0, "t") == 0);
  CHECK_THROWS_AS(wrap_dim(3, 3, "t"), ember::Error);
  CHECK_THROWS_AS(wrap_dim(-4, 3, "t"), ember::Error);
}

// ======================================================================================================= views

TEST_CASE("tensor handle: geometry of a fresh tensor") {
  Tensor<float> x = iota({2, 3, 4});
  CHECK(x.defined());
  CHECK_FALSE(Tensor<float>().defined());
  CHECK(x.dim() == 3);
  CHECK(x.numel() == 24);
  CHECK(x.shape() == Shape{2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  CHECK(x.size(-1) == 4);
  CHECK(x.stride(0) == 12);
  CHECK(x.storage_offset() == 0);
  CHECK(x.is_contiguous());
  CHECK_FALSE(x.is_view());
  CHECK(x.device() == Device::cpu());
  // Copying a handle shares data (torch::Tensor semantics).
  Tensor<float> y = x;
  y.at(0, 0, 0) = 100.f;
  CHECK(x.at(0, 0, 0) == 100.f);
  CHECK_THROWS_AS(Tensor<float>().shape(), ember::Error);
}

TEST_CASE("slice: step, negative and clamped bounds, shared data") {
  Tensor<float> x = iota({2, 3, 4});
  SUBCASE("step along the last dim") {
    Tensor<float> v = x.slice(2, 1, 4, 2);  // columns 1, 3
    CHECK(v.shape() == Shape{2, 3, 2});
    CHECK(v.strides() == Shape{12, 4, 2});
    CHECK(v.storage_offset() == 1);
    CHECK_FALSE(v.is_contiguous());
    CHECK(v.is_view());
    CHECK(shares(v, x));
    std::vector<double> e;
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 3; ++b)
        for (int c = 1; c < 4; c += 2) e.push_back(a * 12 + b * 4 + c);
    check_values(v, e);
    v.at(1, 2, 1) = -5.f;  // element (1, 2, 3) of x
    CHECK(x.at(1, 2, 3) == -5.f);
    CHECK(x.at(1, 2, 2) == 22.f);  // neighbours untouched
  }
  SUBCASE("negative bounds count from the end") {
    Tensor<float> v = x.slice(1, -2, 3);  // rows 1, 2
    CHECK(v.shape() == Shape{2, 2, 4});
    CHECK(v.storage_offset() == 4);
    CHECK(v.strides() == Shape{12, 4, 1});
    CHECK(v.at(0, 0, 0) == 4.f);
    CHECK(v.at(1, 1, 3) == 23.f);
    Tensor<float> w = x.slice(-1, -3, -1);  // columns 1, 2
    CHECK(w.shape() == Shape{2, 3, 2});
    CHECK(w.at(0, 0, 0) == 1.f);
    CHECK(w.at(0, 0, 1) == 2.f);
  }
  SUBCASE("out-of-range bounds clamp; an empty range has size 0") {
    CHECK(x.slice(0, -100, 100).shape() == Shape{2, 3, 4});
    CHECK(x.slice(2, 3, 1).shape() == Shape{2, 3, 0});
    CHECK(x.slice(2, 5, 9).shape() == Shape{2, 3, 0});
    CHECK(x.slice(2, 0, 4, 3).shape() == Shape{2, 3, 2});  // 0, 3
    CHECK(x.slice(2, 0, 4, 5).shape() == Shape{2, 3, 1});
    CHECK_THROWS_AS(x.slice(2, 0, 4, 0), ember::Error);
    CHECK_THROWS_AS(x.slice(2, 0, 4, -1), ember::Error);
    CHECK_THROWS_AS(x.slice(3, 0, 1), ember::Error);
  }
  SUBCASE("slice of a slice composes") {
    Tensor<float> v = x.slice(2, 0, 4, 2).slice(1, 1, 3);  // x[:, 1:3, ::2]
    CHECK(v.shape() == Shape{2, 2, 2});
    CHECK(v.storage_offset() == 4);
    check_values(v, {4, 6, 8, 10, 16, 18, 20, 22});
  }
}

TEST_CASE("narrow, select and operator[]") {
  Tensor<float> x = iota({2, 3, 4});
  Tensor<float> n = x.narrow(1, 1, 2);
  CHECK(n.shape() == Shape{2, 2, 4});
  CHECK(n.storage_offset() == 4);
  CHECK(n.is_view());
  CHECK_THROWS_AS(x.narrow(1, 2, 2), ember::Error);
  Tensor<float> nn = x.narrow(1, -1, 1);  // a negative start counts from the end, as torch.narrow
  CHECK(nn.shape() == Shape{2, 1, 4});
  CHECK(nn.storage_offset() == 8);
  CHECK_THROWS_AS(x.narrow(1, -4, 1), ember::Error);

  Tensor<float> s = x.select(1, -1);  // x[:, 2, :]
  CHECK(s.shape() == Shape{2, 4});
  CHECK(s.strides() == Shape{12, 1});
  CHECK(s.storage_offset() == 8);
  check_values(s, {8, 9, 10, 11, 20, 21, 22, 23});
  CHECK_THROWS_AS(x.select(1, 3), ember::Error);
  CHECK_THROWS_AS(x.select(1, -4), ember::Error);

  Tensor<float> r = x[1];
  CHECK(r.shape() == Shape{3, 4});
  CHECK(r.storage_offset() == 12);
  CHECK(x[1][2].shape() == Shape{4});
  Tensor<float> e = x[1][2][3];
  CHECK(e.dim() == 0);
  CHECK(e.item() == 23.f);
  x[0][1] = x[0][1] * 0.f + 7.f;  // write through a view of a view
  check_values(x[0], {0, 1, 2, 3, 7, 7, 7, 7, 8, 9, 10, 11});
  CHECK(x.at(1, 1, 0) == 16.f);
}

TEST_CASE("views at the edges of int64: huge steps and bounds, zero-size tensors with large sizes") {
  constexpr i64 kMax = std::numeric_limits<i64>::max();
  Tensor<float> x = iota({3, 3});
  // A step past the end leaves one element ((end - start + step - 1) / step used to overflow: shape [-1, 3]).
  Tensor<float> a = x.slice(0, 0, 3, kMax);
  CHECK(a.shape() == Shape{1, 3});
  check_values(a, {0, 1, 2});
  Tensor<float> b = x.slice(1, 1, kMax, kMax - 1);
  CHECK(b.shape() == Shape{3, 1});
  check_values(b, {1, 4, 7});
  CHECK(x.slice(1, std::numeric_limits<i64>::min(), kMax).shape() == Shape{3, 3});
  // narrow may start at the end (an empty view) and count from the end.
  CHECK(x.narrow(1, 3, 0).shape() == Shape{3, 0});
  CHECK(x.narrow(1, -3, 3).shape() == Shape{3, 3});
  // A zero size with others whose product fits in int64 (and in 2^62 bytes) is fine; its strides are exact.
  Tensor<float> z = empty<float>({0, i64(1) << 40, 3});
  CHECK(z.numel() == 0);
  CHECK(z.strides() == Shape{i64(3) << 40, 3, 1});
  CHECK(z.reshape({i64(1) << 40, 0}).shape() == Shape{i64(1) << 40, 0});
  CHECK(z.view({-1, 3}).shape() == Shape{0, 3});
  CHECK(z.flatten().shape() == Shape{0});
  CHECK(z.unsqueeze(0).shape() == Shape{1, 0, i64(1) << 40, 3});
  // A broadcast view may have up to INT64_MAX elements (no memory behind them).
  Tensor<float> e = x.select(0, 1).slice(0, 0, 1).expand({kMax});
  CHECK(e.numel() == kMax);
  CHECK(e.strides() == Shape{0});
  CHECK(e.at(kMax - 1) == 3.f);
  CHECK(e.unsqueeze(1).shape() == Shape{kMax, 1});
}

TEST_CASE("transpose, t and permute") {
  Tensor<float> x = iota({2, 3, 4});
  Tensor<float> tr = x.transpose(0, 2);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.strides() == Shape{1, 4, 12});
  CHECK_FALSE(tr.is_contiguous());
  CHECK(shares(tr, x));
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) CHECK(tr.at(c, b, a) == x.at(a, b, c));
  CHECK(x.transpose(-1, 0).shape() == Shape{4, 3, 2});
  CHECK(x.transpose(1, 1).strides() == x.strides());

  Tensor<float> m = iota({2, 3});
  Tensor<float> mt = m.t();
  CHECK(mt.shape() == Shape{3, 2});
  CHECK(mt.strides() == Shape{1, 3});
  mt.at(2, 1) = 50.f;
  CHECK(m.at(1, 2) == 50.f);
  CHECK(iota({5}).t().shape() == Shape{5});
  CHECK_THROWS_AS(x.t(), ember::Error);

  Tensor<float> p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) CHECK(p.at(c, a, b) == x.at(a, b, c));
  CHECK(x.permute({-1, -3, -2}).shape() == Shape{4, 2, 3});
  CHECK(x.permute({0, 1, 2}).is_contiguous());
  CHECK_THROWS_AS(x.permute({0, 0, 1}), ember::Error);
  CHECK_THROWS_AS(x.permute({0, 1}), ember::Error);
  // permute back gives the original geometry
  CHECK(p.permute({1, 2, 0}).strides() == x.strides());
}

TEST_CASE("view: -1 inference, shared data, stride rules") {
  Tensor<float> x = iota({2, 3, 4});
  Tensor<float> v = x.view({-1, 4});
  CHECK(v.shape() == Shape{6, 4});
  CHECK(v.strides() == Shape{4, 1});
  CHECK(shares(v, x));
  v.at(5, 3) = -1.f;
  CHECK(x.at(1, 2, 3) == -1.f);
  CHECK(x.view({24}).shape() == Shape{24});
  CHECK(x.view({2, -1}).shape() == Shape{2, 12});
  CHECK(x.view({1, 2, 1, 12, 1}).shape() == Shape{1, 2, 1, 12, 1});
  CHECK_THROWS_AS(x.view({5, -1}), ember::Error);
  CHECK_THROWS_AS(x.view({-1, -1}), ember::Error);
  CHECK_THROWS_AS(x.view({7, 4}), ember::Error);
  // A 1-element tensor views as 0-d.
  Tensor<float> one = iota({1, 1});
  CHECK(one.view(Shape{}).dim() == 0);

  // On a non-contiguous tensor: splitting a contiguous dim works, merging across the transpose does not.
  Tensor<float> t = x.transpose(0, 1);  // (3, 2, 4), strides (4, 12, 1)
  Tensor<float> split = t.view({3, 2, 2, 2});
  CHECK(split.strides() == Shape{4, 12, 2, 1});
  CHECK(shares(split, x));
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 4; ++c) CHECK(split.at(a, b, c / 2, c % 2) == t.at(a, b, c));
  CHECK_THROWS_AS(t.view({6, 4}), ember::Error);
  CHECK_THROWS_AS(t.view({3, 8}), ember::Error);
  const std::string msg = error_of([&] { t.view({6, 4}); });
  CHECK(msg.find("reshape") != std::string::npos);
}

TEST_CASE("reshape views when it can and copies when it must") {
  Tensor<float> x = iota({2, 3, 4});
  Tensor<float> r = x.reshape({4, -1});
  CHECK(r.shape() == Shape{4, 6});
  CHECK(shares(r, x));
  r.at(0, 0) = 42.f;
  CHECK(x.at(0, 0, 0) == 42.f);

  Tensor<float> t = x.transpose(0, 2);      // (4, 3, 2)
  Tensor<float> c = t.reshape({12, 2});     // needs a copy
  CHECK(c.shape() == Shape{12, 2});
  CHECK(c.is_contiguous());
  CHECK_FALSE(shares(c, x));
  std::vector<double> e = values(t);        // row-major order of t
  check_values(c, e);
  c.at(0, 0) = -3.f;
  CHECK(x.at(0, 0, 0) == 42.f);             // the copy is independent
  CHECK_THROWS_AS(x.reshape({5, 5}), ember::Error);
}

TEST_CASE("expand and expand_as: stride 0, shared data, not writable") {
  Tensor<float> row = iota({1, 4});
  Tensor<float> e = row.expand({3, 4});
  CHECK(e.shape() == Shape{3, 4});
  CHECK(e.strides() == Shape{0, 1});
  CHECK(shares(e, row));
  CHECK_FALSE(e.is_contiguous());
  check_values(e, {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
  row.at(0, 2) = 9.f;
  CHECK(e.at(2, 2) == 9.f);

  Tensor<float> v = iota({4});
  Tensor<float> e2 = v.expand({2, 3, 4});  // new leading dims
  CHECK(e2.strides() == Shape{0, 0, 1});
  CHECK(v.unsqueeze(1).expand({-1, 5}).shape() == Shape{4, 5});
  CHECK(v.unsqueeze(1).expand({-1, 5}).strides() == Shape{1, 0});
  CHECK_THROWS_AS(v.expand({3, 5}), ember::Error);
  CHECK_THROWS_AS(v.expand({-1, 4}), ember::Error);  // -1 for a new leading dim
  CHECK_THROWS_AS(iota({2, 4}).expand({4}), ember::Error);

  Tensor<float> target = zeros<float>({5, 4});
  Tensor<float> ea = v.expand_as(target);
  CHECK(ea.shape() == Shape{5, 4});
  CHECK(ea.strides() == Shape{0, 1});

  // Writing into a broadcast view would write one element many times: an error, not a race.
  CHECK_THROWS_AS(ea.fill_(1.f), ember::Error);
}

TEST_CASE("squeeze, squeeze(d), unsqueeze(d)") {
  Tensor<float> x = iota({1, 3, 1, 2});
  Tensor<float> s = x.squeeze();
  CHECK(s.shape() == Shape{3, 2});
  CHECK(s.strides() == Shape{2, 1});
  CHECK(shares(s, x));
  CHECK(x.squeeze(0).shape() == Shape{3, 1, 2});
  CHECK(x.squeeze(-2).shape() == Shape{1, 3, 2});
  CHECK(x.squeeze(1).shape() == Shape{1, 3, 1, 2});  // size 3: unchanged, as in PyTorch
  CHECK_THROWS_AS(x.squeeze(4), ember::Error);

  Tensor<float> m = iota({3, 4});
  // PyTorch: torch.empty(3, 4).unsqueeze(0).stride() == (12, 4, 1); unsqueeze(1) -> (4, 4, 1); unsqueeze(2) -> (4, 1, 1)
  CHECK(m.unsqueeze(0).shape() == Shape{1, 3, 4});
  CHECK(m.unsqueeze(0).strides() == Shape{12, 4, 1});
  CHECK(m.unsqueeze(1).shape() == Shape{3, 1, 4});
  CHECK(m.unsqueeze(1).strides() == Shape{4, 4, 1});
  CHECK(m.unsqueeze(2).strides() == Shape{4, 1, 1});
  CHECK(m.unsqueeze(-1).shape() == Shape{3, 4, 1});
  CHECK(m.unsqueeze(-3).shape() == Shape{1, 3, 4});
  CHECK(m.unsqueeze(0).is_contiguous());
  CHECK_THROWS_AS(m.unsqueeze(3), ember::Error);
  m.unsqueeze(1).at(2, 0, 3) = -8.f;
  CHECK(m.at(2, 3) == -8.f);
  Tensor<float> sc = scalar_tensor(2.5f);
  CHECK(sc.unsqueeze(0).shape() == Shape{1});
  CHECK(sc.squeeze().dim() == 0);
}

TEST_CASE("flatten views contiguous ranges and copies otherwise") {
  Tensor<float> x = iota({2, 3, 4});
  Tensor<float> f = x.flatten();
  CHECK(f.shape() == Shape{24});
  CHECK(shares(f, x));
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(x.flatten(-2, -1).shape() == Shape{2, 12});
  CHECK(x.flatten(1, 1).shape() == Shape{2, 3, 4});
  CHECK_THROWS_AS(x.flatten(2, 1), ember::Error);
  CHECK(scalar_tensor(1.f).flatten().shape() == Shape{1});

  Tensor<float> t = x.transpose(0, 1);
  Tensor<float> tf = t.flatten();
  CHECK_FALSE(shares(tf, x));
  check_values(tf, values(t));
  // merging only the last two dims of the transposed tensor is still a view (they are contiguous)
  Tensor<float> tf2 = t.flatten(1);
  CHECK(tf2.shape() == Shape{3, 8});
  CHECK_FALSE(shares(tf2, x));  // dims (2, 4) with strides (12, 1) are not mergeable
  check_values(tf2, values(t));
}

TEST_CASE("contiguous, clone and copy_") {
  Tensor<float> x = iota({3, 4});
  CHECK(x.contiguous().same_impl(x));  // already contiguous: the same tensor
  Tensor<float> t = x.t();
  Tensor<float> c = t.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Shape{3, 1});
  CHECK_FALSE(shares(c, x));
  check_values(c, values(t));

  Tensor<float> k = x.clone();
  CHECK_FALSE(shares(k, x));
  CHECK(k.strides() == x.strides());
  k.at(0, 0) = 77.f;
  CHECK(x.at(0, 0) == 0.f);
  Tensor<float> ks = x.slice(1, 0, 4, 2).clone();
  CHECK(ks.is_contiguous());
  check_values(ks, {0, 2, 4, 6, 8, 10});

  SUBCASE("copy_ same shape, from a strided source") {
    Tensor<float> y = zeros<float>({4, 3});
    y.copy_(t);
    check_values(y, values(t));
  }
  SUBCASE("copy_ broadcasts the source") {
    Tensor<float> y = zeros<float>({3, 4});
    y.copy_(tensor<float>({1.f, 2.f, 3.f, 4.f}));
    check_values(y, {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4});
    y.copy_(tensor<float>({{10.f}, {20.f}, {30.f}}));
    check_values(y, {10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30});
    y.copy_(scalar_tensor(5.f));
    check_values(y, std::vector<double>(12, 5.0));
    CHECK_THROWS_AS(y.copy_(iota({4, 3})), ember::Error);
  }
  SUBCASE("copy_ into a view writes through and leaves the rest") {
    Tensor<float> y = zeros<float>({3, 4});
    y.slice(1, 1, 3).copy_(tensor<float>({{1.f, 2.f}, {3.f, 4.f}, {5.f, 6.f}}));
    check_values(y, {0, 1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0});
  }
  SUBCASE("fill_ and zero_ through a strided view") {
    Tensor<float> y = iota({3, 4});
    y.t()[1].fill_(-1.f);  // column 1
    check_values(y, {0, -1, 2, 3, 4, -1, 6, 7, 8, -1, 10, 11});
    y.select(0, 2).zero_();
    check_values(y, {0, -1, 2, 3, 4, -1, 6, 7, 0, 0, 0, 0});
  }
}

TEST_CASE("assigning a tensor to a view copies into it (LibTorch's rvalue assignment)") {
  // In LibTorch `x.slice(0, 0, 2) = y;` copies y into the slice. Rebinding a temporary handle would silently do
  // nothing.
  Tensor<float> x = zeros<float>({4});
  Tensor<float> y = tensor<float>({1.f, 2.f});
  x.slice(0, 0, 2) = y;
  check_values(x, {1, 2, 0, 0});
  x[3] = scalar_tensor(9.f);
  check_values(x, {1, 2, 0, 9});
  // Assigning to a named handle still rebinds it (torch::Tensor semantics).
  Tensor<float> h = x;
  h = y;
  CHECK(h.same_impl(y));
  check_values(x, {1, 2, 0, 9});
}

// ==================================================================================================== creation

TEST_CASE("empty, zeros, ones, full and the _like variants") {
  Tensor<float> e = empty<float>({2, 3});
  CHECK(e.shape() == Shape{2, 3});
  CHECK(e.strides() == Shape{3, 1});
  CHECK(e.is_contiguous());
  CHECK(reinterpret_cast<std::uintptr_t>(e.data()) % 64 == 0);  // 64-byte aligned blocks
  CHECK_THROWS_AS(empty<float>({2, -1}), ember::Error);
  check_values(zeros<float>({2, 2}), {0, 0, 0, 0});
  check_values(ones<double>({3}), {1, 1, 1});
  check_values(full<float>({2}, 2.5f), {2.5, 2.5});
  check_values(full<std::int32_t>({2}, -7), {-7, -7});
  check_values(zeros<std::int64_t>({3}), {0, 0, 0});
  Tensor<bool> b = ones<bool>({2});
  CHECK(b.data()[0] == true);
  Tensor<float> z0 = zeros<float>({0, 4});
  CHECK(z0.numel() == 0);
  CHECK(z0.shape() == Shape{0, 4});
  Tensor<float> s = zeros<float>(Shape{});
  CHECK(s.dim() == 0);
  CHECK(s.item() == 0.f);
  Tensor<float> x = iota({2, 5});
  CHECK(zeros_like(x).shape() == x.shape());
  check_values(ones_like(x), std::vector<double>(10, 1.0));
  CHECK(empty_like<double>(x).shape() == x.shape());
  // zeros after a dirty block of the same size class was recycled really is zeroed
  { Tensor<float> dirty = full<float>({2, 2}, 3.f); }
  check_values(zeros<float>({2, 2}), {0, 0, 0, 0});
}

TEST_CASE("arange: integer and fractional steps, negative steps, errors") {
  check_values(arange<float>(5), {0, 1, 2, 3, 4});
  check_values(arange<float>(2, 5), {2, 3, 4});
  check_values(arange<float>(1, 2.5, 0.5), {1, 1.5, 2});
  check_values(arange<float>(5, 0, -1), {5, 4, 3, 2, 1});
  check_values(arange<std::int64_t>(-2, 3), {-2, -1, 0, 1, 2});
  // torch.arange(0, 1, 0.1) has 10 elements; element i is start + i*step (computed in double, then rounded)
  Tensor<float> f = arange<float>(0, 1, 0.1);
  REQUIRE(f.numel() == 10);
  for (int i = 0; i < 10; ++i) CHECK(f.data()[i] == float(0.1 * i));
  check_values(arange<double>(-1, 1, 0.5), {-1, -0.5, 0, 0.5});
  CHECK(arange<float>(0).numel() == 0);
  CHECK(arange<float>(3, 3).numel() == 0);
  CHECK_THROWS_AS(arange<float>(0, 5, -1), ember::Error);
  CHECK_THROWS_AS(arange<float>(0, 5, 0), ember::Error);
}

TEST_CASE("linspace: evenly spaced, both ends exact") {
  check_values(linspace<float>(0, 1, 5), {0, 0.25, 0.5, 0.75, 1});
  Tensor<float> l = linspace<float>(-1.3, 2.7, 7);
  REQUIRE(l.numel() == 7);
  CHECK(l.data()[0] == float(-1.3));
  CHECK(l.data()[6] == float(2.7));
  for (int i = 0; i < 7; ++i) CHECK(l.data()[i] == doctest::Approx(-1.3 + 4.0 * i / 6).epsilon(1e-6));
  Tensor<double> ld = linspace<double>(0.1, 0.7, 13);
  CHECK(ld.data()[0] == 0.1);
  CHECK(ld.data()[12] == 0.7);
  for (int i = 1; i < 13; ++i) CHECK(ld.data()[i] > ld.data()[i - 1]);
  Tensor<float> down = linspace<float>(3, -3, 4);
  check_values(down, {3, 1, -1, -3});
  // torch.linspace(2, 5, 1) == tensor([2.]); steps = 0 gives an empty tensor.
  check_values(linspace<float>(2, 5, 1), {2});
  CHECK(linspace<float>(2, 5, 0).numel() == 0);
  CHECK_THROWS_AS(linspace<float>(0, 1, -1), ember::Error);
}

TEST_CASE("eye") {
  check_values(eye<float>(3), {1, 0, 0, 0, 1, 0, 0, 0, 1});
  check_values(eye<float>(2, 3), {1, 0, 0, 0, 1, 0});
  check_values(eye<std::int64_t>(3, 2), {1, 0, 0, 1, 0, 0});
  CHECK(eye<float>(0).numel() == 0);
}

TEST_CASE("from_vector and nested tensor({...}) lists") {
  Tensor<float> v = from_vector<float>({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, Shape{2, 3});
  CHECK(v.shape() == Shape{2, 3});
  CHECK(v.at(1, 0) == 4.f);
  CHECK(from_vector<float>({1.f, 2.f}).shape() == Shape{2});
  CHECK(from_vector<float>({7.f}).shape() == Shape{1});  // a list of one value is 1-d, as torch.tensor([7.])
  CHECK(from_vector<float>({7.f}, Shape{}).dim() == 0);
  CHECK(from_vector<float>({}).shape() == Shape{0});
  CHECK_THROWS_AS(from_vector<float>({1.f, 2.f}, Shape{}), ember::Error);
  CHECK_THROWS_AS(from_vector<float>({1.f, 2.f, 3.f}, Shape{2, 2}), ember::Error);
  Tensor<bool> bv = from_vector<bool>({true, false, true});
  check_values(bv, {1, 0, 1});

  Tensor<float> t1 = tensor<float>({1.f, 2.f, 3.f});
  CHECK(t1.shape() == Shape{3});
  Tensor<float> t2 = tensor<float>({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  CHECK(t2.shape() == Shape{2, 3});
  CHECK(t2.strides() == Shape{3, 1});
  check_values(t2, {1, 2, 3, 4, 5, 6});
  Tensor<std::int64_t> t3 = tensor<std::int64_t>({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}, {{9, 10}, {11, 12}}});
  CHECK(t3.shape() == Shape{3, 2, 2});
  CHECK(t3.at(2, 1, 0) == 11);
  CHECK_THROWS_AS(tensor<float>({{1.f, 2.f}, {3.f}}), ember::Error);
  CHECK_THROWS_AS((tensor<float>({{{1.f}, {2.f}}, {{3.f}}})), ember::Error);
}

TEST_CASE("from_blob wraps memory without copying; the deleter runs when the last handle dies") {
  std::vector<float> buf{1, 2, 3, 4, 5, 6};
  int deleted = 0;
  void* seen = nullptr;
  {
    Tensor<float> t = from_blob(buf.data(), Shape{2, 3}, [&](void* p) {
      ++deleted;
      seen = p;
    });
    CHECK(t.data() == buf.data());
    CHECK(t.strides() == Shape{3, 1});
    buf[4] = 50.f;
    CHECK(t.at(1, 1) == 50.f);  // reads the caller's memory
    t.at(0, 2) = 30.f;
    CHECK(buf[2] == 30.f);      // writes it too
    Tensor<float> view = t.t();
    t = Tensor<float>();        // drop the first handle: the view keeps the storage alive
    CHECK(deleted == 0);
    CHECK(view.at(2, 0) == 30.f);
    {
      Tensor<float> copy = view.contiguous();  // a copy owns its own memory
      CHECK(copy.data() != buf.data());
    }
    CHECK(deleted == 0);
  }
  CHECK(deleted == 1);
  CHECK(seen == buf.data());

  // Explicit strides; no deleter is fine.
  float raw[6] = {0, 1, 2, 3, 4, 5};
  Tensor<float> col = from_blob(raw, Shape{3, 2}, Shape{1, 3});
  CHECK(col.at(2, 1) == 5.f);
  CHECK(col.at(1, 0) == 1.f);
  CHECK_FALSE(col.is_contiguous());
  CHECK_THROWS_AS(from_blob<float>(nullptr, Shape{2}), ember::Error);
}

TEST_CASE("scalar_tensor and item") {
  Tensor<float> s = scalar_tensor(3.25f);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.shape() == Shape{});
  CHECK(s.item() == 3.25f);
  CHECK(scalar_tensor<std::int64_t>(-4).item() == -4);
  CHECK(iota({1, 1, 1}).item() == 0.f);
  CHECK_THROWS_AS(iota({2}).item(), ember::Error);
}

// ====================================================================================================== random

TEST_CASE("random: Generator::blocks (eight counters per vector) writes what block() does, tails included") {
  for (const std::uint64_t n : {1ull, 7ull, 8ull, 9ull, 37ull, 64ull}) {
    std::vector<std::uint32_t> many(n * 4);
    const std::uint64_t seed = 0x9E3779B97F4A7C15ull, first = 0xFFFFFFFFull - 20;  // counters crossing 2^32
    Generator::blocks(seed, first, n, many.data());
    for (std::uint64_t i = 0; i < n; ++i) {
      std::uint32_t one[4];
      Generator::block(seed, first + i, one);
      for (int k = 0; k < 4; ++k) {
        INFO("n " << n << ", block " << i << ", value " << k);
        CHECK(many[i * 4 + std::uint64_t(k)] == one[k]);
      }
    }
  }
}

TEST_CASE("random: same seed gives the same values (Generator and manual_seed)") {
  Generator g1(1234), g2(1234), g3(999);
  Tensor<float> a = rand<float>({1000}, g1), b = rand<float>({1000}, g2), c = rand<float>({1000}, g3);
  CHECK(a.to_vector() == b.to_vector());
  CHECK(a.to_vector() != c.to_vector());
  // The stream moves on: a second draw differs from the first.
  Tensor<float> a2 = rand<float>({1000}, g1);
  CHECK(a2.to_vector() != a.to_vector());
  // manual_seed resets the stream.
  g1.manual_seed(1234);
  CHECK(rand<float>({1000}, g1).to_vector() == a.to_vector());
  // The offset is the whole state besides the seed: replay the second draw.
  Generator g4(1234);
  g4.set_offset(g2.offset());
  CHECK(rand<float>({1000}, g4).to_vector() == a2.to_vector());

  manual_seed(42);
  auto r1 = randn<float>({257}).to_vector();
  auto i1 = randint(0, 10, {100}).to_vector();
  manual_seed(42);
  auto r2 = randn<float>({257}).to_vector();
  auto i2 = randint(0, 10, {100}).to_vector();
  CHECK(r1 == r2);
  CHECK(i1 == i2);
  manual_seed(43);
  CHECK(randn<float>({257}).to_vector() != r1);

  Generator h1(5), h2(5);
  CHECK(bernoulli<float>({64}, 0.5, h1).to_vector() == bernoulli<float>({64}, 0.5, h2).to_vector());
  CHECK(rand<double>({33}, h1).to_vector() == rand<double>({33}, h2).to_vector());
}

TEST_CASE("rand: range [0, 1) and moments") {
  Generator g(7);
  Tensor<float> u = rand<float>({100000}, g);
  double s = 0, s2 = 0, lo = 1, hi = 0;
  for (float v : u.to_vector()) {
    s += v;
    s2 += double(v) * v;
    lo = std::min(lo, double(v));
    hi = std::max(hi, double(v));
  }
  const double n = 1e5, mean = s / n, var = s2 / n - mean * mean;
  CHECK(lo >= 0.0);
  CHECK(hi < 1.0);
  CHECK(lo < 1e-3);
  CHECK(hi > 1 - 1e-3);
  CHECK(std::fabs(mean - 0.5) < 0.005);           // std error 0.0009
  CHECK(std::fabs(var - 1.0 / 12) < 0.002);
  Tensor<double> ud = rand<double>({10000}, g);
  for (double v : ud.to_vector()) {
    CHECK(v >= 0.0);
    CHECK(v < 1.0);
  }
  Tensor<half> uh = rand<half>({1000}, g);
  for (half v : uh.to_vector()) {
    CHECK(float(v) >= 0.f);
    CHECK(float(v) <= 1.f);  // rounding to half may reach 1
  }
}

TEST_CASE("randn: mean and standard deviation of 100k samples") {
  Generator g(2024);
  Tensor<float> x = randn<float>({100000}, g);
  double s = 0, s2 = 0, s3 = 0, s4 = 0;
  i64 beyond3 = 0;
  for (float v : x.to_vector()) {
    s += v;
    s2 += double(v) * v;
    s3 += double(v) * v * v;
    s4 += double(v) * v * v * v;
    beyond3 += std::fabs(v) > 3;
  }
  const double n = 1e5, mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  CHECK(std::fabs(mean) < 0.02);      // std error 0.0032
  CHECK(std::fabs(sd - 1) < 0.02);    // std error 0.0022
  CHECK(std::fabs(s3 / n) < 0.06);    // skewness ~ 0 (std error ~0.008)
  CHECK(std::fabs(s4 / n - 3) < 0.2); // kurtosis 3 (std error ~0.025)
  CHECK(beyond3 > 150);                // P(|z| > 3) = 0.0027 -> ~270
  CHECK(beyond3 < 400);
  // An odd count fills the tail of the last block.
  Tensor<double> y = randn<double>({5}, g);
  for (double v : y.to_vector()) CHECK(std::isfinite(v));
}

TEST_CASE("randint: range [low, high), every value hit") {
  Generator g(11);
  Tensor<std::int64_t> r = randint(-3, 4, {10000}, g);
  std::vector<int> count(7, 0);
  for (auto v : r.to_vector()) {
    REQUIRE(v >= -3);
    REQUIRE(v < 4);
    count[std::size_t(v + 3)]++;
  }
  for (int c : count) CHECK(std::fabs(c - 10000.0 / 7) < 200);  // ~ 5 sigma
  Tensor<std::int32_t> r32 = randint<std::int32_t>(0, 2, {1000}, g);
  int ones = 0;
  for (auto v : r32.to_vector()) ones += v;
  CHECK(ones > 400);
  CHECK(ones < 600);
  CHECK_THROWS_AS(randint(3, 3, {2}, g), ember::Error);
}

TEST_CASE("randint over the whole int64 range, and arange with a huge step") {
  // high - low does not fit in int64 here (it used to be computed in int64: undefined behaviour under UBSan).
  Generator g(5);
  const i64 lo = std::numeric_limits<i64>::min(), hi = std::numeric_limits<i64>::max();
  Tensor<std::int64_t> r = randint(lo, hi, {256}, g);
  int neg = 0;
  for (auto v : r.to_vector()) {
    CHECK(v < hi);
    neg += v < 0;
  }
  CHECK(neg > 64);  // about half of 256, sd 8
  CHECK(neg < 192);
  Tensor<std::int32_t> r32 = randint<std::int32_t>(-2147483648LL, 2147483648LL, {64}, g);
  CHECK(r32.numel() == 64);
  Tensor<float> a = arange<float>(0, std::ldexp(1.0, 100), std::ldexp(1.0, 97));  // 8 elements, exactly
  CHECK(a.shape() == Shape{8});
  CHECK(a.at(7) == std::ldexp(7.f, 97));
}

TEST_CASE("bernoulli: values 0/1 with frequency p") {
  Generator g(3);
  Tensor<float> b = bernoulli<float>({20000}, 0.3, g);
  double ones = 0;
  for (float v : b.to_vector()) {
    REQUIRE((v == 0.f || v == 1.f));
    ones += v;
  }
  CHECK(std::fabs(ones / 20000 - 0.3) < 0.02);
  for (float v : bernoulli<float>({100}, 0.0, g).to_vector()) CHECK(v == 0.f);
  for (float v : bernoulli<float>({100}, 1.0, g).to_vector()) CHECK(v == 1.f);
  CHECK_THROWS_AS(bernoulli<float>({2}, 1.5, g), ember::Error);
}

// ============================================================================================== element access

TEST_CASE("at, item and to_vector") {
  Tensor<float> x = iota({2, 3});
  CHECK(x.at(1, 2) == 5.f);
  CHECK(x.at(-1, -1) == 5.f);
  CHECK(x.at(-2, 1) == 1.f);
  x.at(0, 1) = 10.f;
  CHECK(x.data()[1] == 10.f);
  CHECK_THROWS_AS(x.at(2, 0), ember::Error);
  CHECK_THROWS_AS(x.at(0, -4), ember::Error);
  CHECK_THROWS_AS(x.at(0), ember::Error);
  CHECK_THROWS_AS(x.at(0, 0, 0), ember::Error);
  CHECK(x.to_vector() == std::vector<float>{0, 10, 2, 3, 4, 5});
  CHECK(x.t().to_vector() == std::vector<float>{0, 3, 10, 4, 2, 5});  // row-major order of the view
  CHECK(x.slice(1, 0, 3, 2).to_vector() == std::vector<float>{0, 2, 3, 5});
  Tensor<std::int64_t> i = tensor<std::int64_t>({{1, 2}, {3, 4}});
  CHECK(i.at(1, 0) == 3);
  CHECK(i.t().to_vector() == std::vector<std::int64_t>{1, 3, 2, 4});
  Tensor<bool> b = from_vector<bool>({true, false, false, true}, Shape{2, 2});
  CHECK(b.at(0, 1) == false);
  CHECK(b.t().to_vector() == std::vector<bool>{true, false, false, true});
  CHECK(scalar_tensor(1.5f).to_vector() == std::vector<float>{1.5f});
}

// ============================================================================================ cat, stack, index

TEST_CASE("cat along any dim, from strided inputs") {
  Tensor<float> a = iota({2, 3});
  Tensor<float> b = iota({2, 3}) + 100.f;
  check_values(cat<float>({a, b}, 0), {0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105});
  Tensor<float> c1 = cat<float>({a, b}, 1);
  CHECK(c1.shape() == Shape{2, 6});
  check_values(c1, {0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105});
  Tensor<float> c2 = cat<float>({a, iota({2, 1}) - 1.f, b}, -1);
  check_values(c2, {0, 1, 2, -1, 100, 101, 102, 3, 4, 5, 0, 103, 104, 105});
  // Transposed and sliced inputs
  Tensor<float> c3 = cat<float>({a.t(), b.t().slice(0, 1, 3)}, 0);
  CHECK(c3.shape() == Shape{5, 2});
  check_values(c3, {0, 3, 1, 4, 2, 5, 101, 104, 102, 105});
  // An empty piece is allowed
  check_values(cat<float>({a, zeros<float>({0, 3})}, 0), values(a));
  CHECK_THROWS_AS(cat<float>({a, iota({3, 2})}, 0), ember::Error);
  CHECK_THROWS_AS(cat<float>({a, iota({6})}, 0), ember::Error);
  CHECK_THROWS_AS(cat<float>({}, 0), ember::Error);
}

TEST_CASE("stack along a new dim") {
  Tensor<float> a = tensor<float>({1.f, 2.f, 3.f}), b = tensor<float>({4.f, 5.f, 6.f});
  Tensor<float> s0 = stack<float>({a, b}, 0);
  CHECK(s0.shape() == Shape{2, 3});
  check_values(s0, {1, 2, 3, 4, 5, 6});
  Tensor<float> s1 = stack<float>({a, b}, 1);
  CHECK(s1.shape() == Shape{3, 2});
  check_values(s1, {1, 4, 2, 5, 3, 6});
  CHECK(stack<float>({a, b, a}, -1).shape() == Shape{3, 3});
  CHECK_THROWS_AS(stack<float>({a, iota({2})}, 0), ember::Error);
}

TEST_CASE("index_select: rows and columns, repeated indices; a negative index is an error, as in PyTorch") {
  Tensor<float> x = iota({4, 3});
  Tensor<std::int64_t> idx = tensor<std::int64_t>({2, 0, 3, 2});
  Tensor<float> r = index_select(x, 0, idx);
  CHECK(r.shape() == Shape{4, 3});
  check_values(r, {6, 7, 8, 0, 1, 2, 9, 10, 11, 6, 7, 8});
  Tensor<float> c = index_select(x, 1, tensor<std::int64_t>({1, 1}));
  check_values(c, {1, 1, 4, 4, 7, 7, 10, 10});
  Tensor<float> ct = index_select(x.t(), 0, tensor<std::int64_t>({2}));  // from a strided source
  check_values(ct, {2, 5, 8, 11});
  CHECK_THROWS_AS(index_select(x, 0, tensor<std::int64_t>({4})), ember::Error);
  CHECK_THROWS_AS(index_select(x, 0, tensor<std::int64_t>({-1})), ember::Error);
  CHECK_THROWS_AS(index_select(x, 0, tensor<std::int64_t>({{0}})), ember::Error);
}

// ==================================================================================================== printing

TEST_CASE("printing matches PyTorch's format") {
  // Integral floats: "0." style, rows aligned under "tensor([".
  CHECK(to_string(iota({2, 3})) == "tensor([[0., 1., 2.],\n        [3., 4., 5.]])");
  // Fixed point with 4 decimals, right-aligned to the widest element.
  CHECK(to_string(tensor<float>({1.5f, -2.25f, 10.f})) == "tensor([ 1.5000, -2.2500, 10.0000])");
  CHECK(to_string(tensor<float>({{0.1f, 0.2f}, {0.3f, 0.4f}})) == "tensor([[0.1000, 0.2000],\n        [0.3000, 0.4000]])");
  // Scientific when the dynamic range is large or values are tiny.
  CHECK(to_string(tensor<float>({0.5f, 1e-5f})) == "tensor([5.0000e-01, 1.0000e-05])");
  CHECK(to_string(tensor<float>({1.f, 10000.f})) == "tensor([1.0000e+00, 1.0000e+04])");
  CHECK(to_string(tensor<float>({1.f, 1000.f})) == "tensor([   1., 1000.])");
  CHECK(to_string(tensor<float>({-1.f, 0.f, 2.f})) == "tensor([-1.,  0.,  2.])");
  // bool and int64 are default dtypes (no suffix); bools pad to "False".
  CHECK(to_string(from_vector<bool>({true, false, true})) == "tensor([ True, False,  True])");
  CHECK(to_string(tensor<std::int64_t>({1, -2, 30})) == "tensor([ 1, -2, 30])");
  CHECK(to_string(tensor<std::int64_t>({{1, 2}, {3, 4}})) == "tensor([[1, 2],\n        [3, 4]])");
  // Other dtypes say so.
  CHECK(to_string(tensor<double>({1.5, 2.0})) == "tensor([1.5000, 2.0000], dtype=torch.float64)");
  CHECK(to_string(tensor<std::int32_t>({1, 2})) == "tensor([1, 2], dtype=torch.int32)");
  CHECK(to_string(tensor<half>({half(1.f), half(2.f)})) == "tensor([1., 2.], dtype=torch.float16)");
  // 0-d tensors
  CHECK(to_string(scalar_tensor(3.f)) == "tensor(3.)");
  CHECK(to_string(scalar_tensor(0.5f)) == "tensor(0.5000)");
  CHECK(to_string(scalar_tensor<std::int64_t>(7)) == "tensor(7)");
  // requires_grad suffix
  Tensor<float> w = tensor<float>({1.f, 2.f});
  w.requires_grad_();
  CHECK(to_string(w) == "tensor([1., 2.], requires_grad=True)");
  Tensor<double> wd = tensor<double>({0.25});
  wd.requires_grad_();
  CHECK(to_string(wd) == "tensor([0.2500], dtype=torch.float64, requires_grad=True)");
  // Non-finite values: nan/inf keep the format of the finite ones.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(to_string(tensor<float>({1.f, inf, -inf})) == "tensor([1., inf, -inf])");
  CHECK(to_string(tensor<float>({1.5f, nan})) == "tensor([1.5000,    nan])");
  // 3-d: blank line between matrices, one more indent per level.
  CHECK(to_string(iota({2, 2, 2})) ==
        "tensor([[[0., 1.],\n         [2., 3.]],\n\n        [[4., 5.],\n         [6., 7.]]])");
  // Strided views print their logical order.
  CHECK(to_string(iota({2, 3}).t()) == "tensor([[0., 3.],\n        [1., 4.],\n        [2., 5.]])");
  CHECK(to_string(Tensor<float>()) == "tensor(undefined)");
}

TEST_CASE("printing: empty tensors, long rows and summaries match PyTorch") {
  CHECK(to_string(zeros<float>({0})) == "tensor([])");
  CHECK(to_string(zeros<float>({2, 0})) == "tensor([], size=(2, 0))");
  CHECK(to_string(zeros<std::int64_t>({0})) == "tensor([], dtype=torch.int64)");
  // torch.arange(20.): rows wrap at 80 columns (14 elements of width 3 + ", " fit after the indent).
  CHECK(to_string(arange<float>(20)) ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        "        14., 15., 16., 17., 18., 19.])");
  // A suffix that would pass column 80 goes on a new line, indented under "tensor(" (PyTorch's _add_suffixes).
  CHECK(to_string(arange<double>(14)) ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.],\n"
        "       dtype=torch.float64)");
  CHECK(to_string(arange<double>(20)) ==
        "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n"
        "        14., 15., 16., 17., 18., 19.], dtype=torch.float64)");
  // More than 1000 elements: three at each end, " ..." in between; the format comes from the shown elements.
  CHECK(to_string(arange<float>(1001)) == "tensor([   0.,    1.,    2.,  ...,  998.,  999., 1000.])");
  Tensor<float> big = zeros<float>({1001});
  big.at(500) = 123456.f;  // hidden: does not widen the shown elements
  CHECK(to_string(big) == "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
  CHECK(to_string(zeros<float>({1001, 2})) ==
        "tensor([[0., 0.],\n        [0., 0.],\n        [0., 0.],\n        ...,\n        [0., 0.],\n"
        "        [0., 0.],\n        [0., 0.]])");
}

// ================================================================================================== allocator

TEST_CASE("CpuCachingAllocator::size_class properties") {
  using A = CpuCachingAllocator;
  CHECK(A::size_class(0) == 64);
  CHECK(A::size_class(1) == 64);
  CHECK(A::size_class(64) == 64);
  CHECK(A::size_class(65) == 128);
  CHECK(A::size_class(4096) == 4096);
  CHECK(A::size_class(4097) == 5120);  // four classes in (4 KiB, 8 KiB]: 5, 6, 7, 8 KiB
  CHECK(A::size_class(8192) == 8192);
  std::size_t prev = 0;
  for (std::size_t n = 0; n < (std::size_t(1) << 22); n = n < 5000 ? n + 1 : n + n / 97 + 1) {
    const std::size_t c = A::size_class(n);
    CHECK(c >= n);
    CHECK(c % 64 == 0);
    CHECK(c >= prev);                          // monotone
    CHECK(A::size_class(c) == c);              // a class is its own class
    if (n > 4096) CHECK(c - n < n / 4 + 1);    // at most 25% waste
    else if (n > 0) CHECK(c - n < 64);
    prev = c;
  }
  for (int k = 6; k < 40; ++k) CHECK(A::size_class(std::size_t(1) << k) == std::size_t(1) << k);
  // exactly four classes per power of two above 4 KiB
  for (int k = 12; k < 30; ++k) {
    const std::size_t lo = std::size_t(1) << k;
    std::vector<std::size_t> cls;
    for (std::size_t n = lo + 1; n <= 2 * lo; n += lo / 64)
      if (cls.empty() || cls.back() != A::size_class(n)) cls.push_back(A::size_class(n));
    CHECK(cls.size() == 4);
  }
}

TEST_CASE("CpuCachingAllocator: a training-like loop stops reaching the system after the first iteration") {
  auto& A = CpuCachingAllocator::instance();
  Generator g(1);
  Tensor<float> x = randn<float>({64, 128}, g), w = randn<float>({64, 128}, g), b = randn<float>({128}, g);
  std::uint64_t after_first = 0;
  const std::size_t in_use_before = A.stats().bytes_in_use;
  float acc = 0;
  for (int it = 0; it < 20; ++it) {
    Tensor<float> h = relu(x * w + b);
    Tensor<float> y = sigmoid(h) * 2.f - 1.f;
    Tensor<float> s = sum(y * y, {1});
    Tensor<float> m = mean(s);
    Tensor<float> c = y.t().contiguous();
    acc += m.item() + c.at(0, 0);
    if (it == 0) after_first = A.stats().system_allocs;
  }
  const auto st = A.stats();
  CHECK(st.system_allocs == after_first);
  CHECK(st.bytes_in_use == in_use_before);  // everything the loop allocated went back
  CHECK(st.cache_hits > 0);
  CHECK(std::isfinite(acc));
}

TEST_CASE("CpuCachingAllocator: counters, cache reuse and empty_cache") {
  auto& A = CpuCachingAllocator::instance();
  const std::size_t bytes = 3 * 1000 * 1000 + 7;  // an unusual size class
  void* p = A.allocate(bytes);
  const auto s1 = A.stats();
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(s1.bytes_in_use >= A.size_class(bytes));
  A.deallocate(p, bytes);
  const auto s2 = A.stats();
  CHECK(s2.bytes_in_use == s1.bytes_in_use - A.size_class(bytes));
  CHECK(s2.bytes_cached >= A.size_class(bytes));
  void* q = A.allocate(bytes - 5);  // same class: served from the cache
  const auto s3 = A.stats();
  CHECK(q == p);
  CHECK(s3.system_allocs == s2.system_allocs);
  CHECK(s3.cache_hits == s2.cache_hits + 1);
  A.deallocate(q, bytes - 5);
  A.empty_cache();
  const auto s4 = A.stats();
  CHECK(s4.bytes_cached == 0);
  CHECK(s4.system_frees > s3.system_frees);
  // After empty_cache, the next allocation reaches the system again.
  void* r = A.allocate(bytes);
  CHECK(A.stats().system_allocs == s4.system_allocs + 1);
  A.deallocate(r, bytes);
}

TEST_CASE("CpuCachingAllocator: thread-cache bins cover every class up to 64 KiB once") {
  using A = CpuCachingAllocator;
  std::vector<int> seen(A::kBins, 0);
  for (std::size_t n = 1; n <= A::kThreadCacheMax; ++n) {
    const std::size_t c = A::size_class(n);
    if (c != n) continue;  // each class once
    const int b = A::bin_of(c);
    REQUIRE(b >= 0);
    REQUIRE(b < A::kBins);
    seen[std::size_t(b)]++;
    CHECK(A::bin_capacity(c) >= 2);
    CHECK(A::bin_capacity(c) <= A::kMaxPerBin);
  }
  for (int b = 0; b < A::kBins; ++b) CHECK(seen[std::size_t(b)] == 1);
}

TEST_CASE("CpuCachingAllocator: a thread reuses its own blocks; spilling keeps the counters exact") {
  auto& A = CpuCachingAllocator::instance();
  const std::size_t bytes = 1000;  // class 1024: thread-cached
  void* p = A.allocate(bytes);
  A.deallocate(p, bytes);
  const auto s0 = A.stats();
  void* q = A.allocate(bytes);
  const auto s1 = A.stats();
  CHECK(q == p);
  CHECK(s1.cache_hits == s0.cache_hits + 1);
  CHECK(s1.system_allocs == s0.system_allocs);
  CHECK(s1.bytes_in_use == s0.bytes_in_use + 1024);
  CHECK(s1.bytes_cached == s0.bytes_cached - 1024);
  A.deallocate(q, bytes);
  // Free more blocks of one class than a thread cache keeps: the rest spill to the shared pool.
  const int many = 3 * CpuCachingAllocator::bin_capacity(1024);
  std::vector<void*> blocks;
  for (int i = 0; i < many; ++i) blocks.push_back(A.allocate(bytes));
  const auto s2 = A.stats();
  CHECK(s2.bytes_in_use == s0.bytes_in_use + std::size_t(many) * 1024);
  for (void* b : blocks) A.deallocate(b, bytes);
  const auto s3 = A.stats();
  CHECK(s3.bytes_in_use == s0.bytes_in_use);
  CHECK(s3.bytes_cached == s2.bytes_cached + std::size_t(many) * 1024);
  // The same blocks come back, none from the system.
  for (int i = 0; i < many; ++i) blocks[std::size_t(i)] = A.allocate(bytes);
  CHECK(A.stats().system_allocs == s3.system_allocs);
  for (void* b : blocks) A.deallocate(b, bytes);
}

TEST_CASE("CpuCachingAllocator: threads freeing each other's blocks, exiting, and empty_cache draining live threads") {
  auto& A = CpuCachingAllocator::instance();
  const std::size_t in_use0 = A.stats().bytes_in_use;
  // Producers allocate, a consumer frees (the data loader's pattern); sizes span thread-cached and shared classes.
  constexpr int kItems = 20000;
  std::vector<std::pair<void*, std::size_t>> handoff(kItems);
  std::atomic<int> produced{0};
  std::thread prod([&] {
    std::uint64_t s = 7;
    for (int i = 0; i < kItems; ++i) {
      s = s * 6364136223846793005ULL + 1442695040888963407ULL;
      const std::size_t n = 1 + (s >> 33) % 100000;
      void* p = A.allocate(n);
      std::memset(p, i & 0xff, n < 64 ? n : 64);
      handoff[std::size_t(i)] = {p, n};
      produced.store(i + 1, std::memory_order_release);
      if (i % 3 == 0) {  // and some same-thread churn
        void* t = A.allocate(n / 2 + 1);
        A.deallocate(t, n / 2 + 1);
      }
    }
  });
  std::thread cons([&] {
    for (int i = 0; i < kItems; ++i) {
      while (produced.load(std::memory_order_acquire) <= i) std::this_thread::yield();
      auto [p, n] = handoff[std::size_t(i)];
      CHECK(static_cast<unsigned char*>(p)[0] == static_cast<unsigned char>(i & 0xff));
      A.deallocate(p, n);
    }
  });
  prod.join();
  cons.join();
  // Both threads exited: their caches went back to the shared pool, their counters with them.
  CHECK(A.stats().bytes_in_use == in_use0);

  // A live thread's cache is drained by empty_cache too.
  std::atomic<int> stage{0};
  std::thread holder([&] {
    void* p = A.allocate(2000);
    A.deallocate(p, 2000);  // now cached in this thread's cache
    stage.store(1);
    while (stage.load() != 2) std::this_thread::yield();
    void* q = A.allocate(2000);  // the cache was emptied: this reaches the system or the shared pool
    A.deallocate(q, 2000);
  });
  while (stage.load() != 1) std::this_thread::yield();
  CHECK(A.stats().bytes_cached > 0);
  A.empty_cache();
  CHECK(A.stats().bytes_cached == 0);
  stage.store(2);
  holder.join();
  CHECK(A.stats().bytes_in_use == in_use0);
}

// ============================================================================================= 16-bit tensors

TEST_CASE("half and bfloat16 tensors: from float values, arithmetic through expressions") {
  const std::vector<float> src{0.1f, -2.5f, 1000.3f, 3.14159f, 65504.f, 1e-6f};
  Tensor<float> f = from_vector(src);
  Tensor<half> h = cast<half>(f);
  Tensor<bfloat16> bf = cast<bfloat16>(f);
  CHECK(h.shape() == Shape{6});
  for (std::size_t i = 0; i < src.size(); ++i) {
    CHECK(h.data()[i].bits == half(src[i]).bits);
    CHECK(bf.data()[i].bits == bfloat16(src[i]).bits);
  }
  // The 16-bit values round as expected (independent check on a few exact cases).
  CHECK(float(h.data()[1]) == -2.5f);
  CHECK(float(h.data()[4]) == 65504.f);
  CHECK(float(bf.data()[1]) == -2.5f);
  CHECK(float(h.data()[2]) == 1000.5f);  // half spacing in [512, 1024) is 0.5: 1000.3 rounds to 1000.5
  CHECK(float(bf.data()[2]) == 1000.f);  // bfloat16 spacing in [512, 1024) is 4
  Tensor<half> hs = tensor<half>({half(1.f), half(2.f), half(3.f)});
  Tensor<half> r = hs * hs + 1.f;
  check_values(r, {2, 5, 10});
  Tensor<bfloat16> rb = cast<bfloat16>(cast<float>(hs)) * 2.f;
  check_values(rb, {2, 4, 6});
  Tensor<float> back = cast<float>(h);
  for (std::size_t i = 0; i < src.size(); ++i) CHECK(back.data()[i] == float(half(src[i])));
  Tensor<half> z = zeros<half>({3});
  check_values(z, {0, 0, 0});
  check_values(full<bfloat16>({2}, bfloat16(0.5f)), {0.5, 0.5});
  check_values(arange<half>(4), {0, 1, 2, 3});
  // Views work the same for 16-bit element types.
  Tensor<half> m = cast<half>(iota({2, 3}));
  CHECK(float(m.t().at(2, 1)) == 5.f);
  CHECK(m.t().contiguous().strides() == Shape{2, 1});
}

// ---- copies between devices, with a stand-in for the CUDA backend ----------------------------------------------
// Host memory labelled cuda:0 and memcpy behind core's hooks (core/storage.hpp): what core does for to(), cuda(),
// cpu(), copy_ across devices, item(), to_vector(), printing, pin_memory(), Module::to and gradients through to()
// runs, and is checked, without a GPU. (The real backend is tested in test_tensor_cuda.cu.)
#if !EMBER_WITH_CUDA
namespace {
struct FakeMemory final : Allocator {
  Device dev;
  int allocs = 0, frees = 0;
  explicit FakeMemory(Device d) : dev(d) {}
  void* allocate(std::size_t n) override {
    ++allocs;
    return n ? std::aligned_alloc(64, (n + 63) / 64 * 64) : nullptr;
  }
  void deallocate(void* p, std::size_t) override {
    ++frees;
    std::free(p);
  }
  Device device() const override { return dev; }
};

// Installs the hooks for its lifetime; declare it before the tensors it serves.
struct FakeCudaBackend {
  FakeMemory gpu{Device::cuda(0)}, pinned{Device::cpu()};
  int copies = 0, non_blocking_copies = 0;
  static inline FakeCudaBackend* self = nullptr;
  FakeCudaBackend() {
    self = this;
    ember::detail::provide<ember::detail::CudaAllocatorPart>([](int i) -> Allocator* {
      EMBER_CHECK(i == 0, "fake backend: cuda:", i, " does not exist");
      return &self->gpu;
    });
    ember::detail::provide<ember::detail::PinnedAllocatorPart>([]() -> Allocator* { return &self->pinned; });
    ember::detail::provide<ember::detail::CudaCopyPart>([](const Storage& dst, std::size_t doff, const Storage& src,
                                                           std::size_t soff, std::size_t n, bool nb) {
      REQUIRE((dst->device.is_cuda() || src->device.is_cuda()));
      self->copies++;
      self->non_blocking_copies += nb;
      std::memcpy(static_cast<char*>(dst->data) + doff, static_cast<const char*>(src->data) + soff, n);
    });
  }
  ~FakeCudaBackend() {
    ember::detail::provide<ember::detail::CudaAllocatorPart>(nullptr);
    ember::detail::provide<ember::detail::PinnedAllocatorPart>(nullptr);
    ember::detail::provide<ember::detail::CudaCopyPart>(nullptr);
    self = nullptr;
  }
};

template <class T>
bool same_elements(const Tensor<T>& a, const Tensor<T>& b) {
  if (!(a.shape() == b.shape()) || !a.device().is_cpu() || !b.device().is_cpu()) return false;
  for (i64 i = 0; i < a.numel(); ++i) {
    const T x = rd(a, i), y = rd(b, i);
    if (std::memcmp(&x, &y, sizeof(T)) != 0) return false;
  }
  return true;
}
}  // namespace

TEST_CASE_TEMPLATE("device copies (stand-in backend): round trips, strided sources, element access", T, float,
                   half, std::int64_t, bool) {
  FakeCudaBackend be;
  Tensor<T> x = empty<T>({4, 6});
  for (i64 i = 0; i < x.numel(); ++i) x.data()[i] = convert<T>(double(i % 5) - 2.0);
  const Tensor<T> g = x.cuda();
  CHECK(g.device() == Device::cuda(0));
  CHECK(g.storage()->allocator == &be.gpu);
  CHECK(g.is_contiguous());
  CHECK(g.to(Device::cuda()).same_impl(g));
  CHECK(same_elements(g.cpu(), x));
  CHECK(be.copies == 2);
  // Strided host sources are gathered on the host, strided device views staged through the host.
  CHECK(same_elements(x.t().cuda().cpu(), x.t().contiguous()));
  CHECK(same_elements(g.t().cpu(), x.t().contiguous()));
  CHECK(same_elements(g.slice(1, 1, 6, 2).cpu(), x.slice(1, 1, 6, 2).contiguous()));
  CHECK(same_elements(g.select(1, 4).cpu(), x.select(1, 4).contiguous()));
  CHECK(same_elements(g[2].unsqueeze(0).expand({3, 6}).cpu(), x[2].unsqueeze(0).expand({3, 6}).contiguous()));
  CHECK(g.to_vector() == x.to_vector());
  const T a = g[3][5].item(), b = x.at(3, 5);
  CHECK(std::memcmp(&a, &b, sizeof(T)) == 0);
  CHECK(empty<T>({0, 2}).cuda().cpu().shape() == Shape{0, 2});
  // copy_ across devices: straight into contiguous memory, through a host copy into strided memory.
  Tensor<T> h = empty<T>({4, 6});
  h.copy_(g);
  CHECK(same_elements(h, x));
  Tensor<T> ht = empty<T>({6, 4}).t();
  ht.copy_(g);
  CHECK(same_elements(ht.contiguous(), x));
  Tensor<T> g2 = empty<T>({4, 6}, Device::cuda());
  g2.copy_(x.t().contiguous().t().contiguous());
  CHECK(same_elements(g2.cpu(), x));
  EXPECT_ERROR([&] { (void)x.to(Device::cuda(1)); }, {"cuda:1", "does not exist"});
  EXPECT_ERROR([&] { (void)g.pin_memory(); }, {"pin_memory", "cuda:0"});
}

TEST_CASE("device copies (stand-in backend): pinned memory and non_blocking") {
  FakeCudaBackend be;
  const Tensor<float> x = iota({3, 5});
  CHECK_FALSE(x.is_pinned());
  const Tensor<float> p = x.t().pin_memory();
  CHECK(p.is_pinned());
  CHECK(p.storage()->allocator == &be.pinned);
  CHECK(same_elements(p, x.t().contiguous()));
  CHECK(p.pin_memory().same_impl(p));
  const Tensor<float> g = p.to(Device::cuda(), /*non_blocking*/ true);
  CHECK(be.non_blocking_copies == 1);
  const Tensor<float> back = g.to(Device::cpu(), /*non_blocking*/ true);  // lands in pinned memory, as PyTorch
  CHECK(back.is_pinned());
  CHECK(be.non_blocking_copies == 2);
  CHECK(same_elements(back, p));
  CHECK_FALSE(g.cpu().is_pinned());  // a blocking copy to the host: ordinary memory
  Tensor<float> h = empty<float>({5, 3});
  h.copy_(g, /*non_blocking*/ true);
  CHECK(be.non_blocking_copies == 3);
  CHECK(same_elements(h, p));
}

TEST_CASE("device copies (stand-in backend): printing shows the device") {
  FakeCudaBackend be;
  const Tensor<float> x = tensor<float>({{1.5f, -2.f}, {3.f, 4.25f}});
  CHECK(to_string(x.cuda()) == "tensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.2500]], device='cuda:0')");
  CHECK(to_string(tensor<double>({1, 2}).cuda()) == "tensor([1., 2.], device='cuda:0', dtype=torch.float64)");
  Tensor<float> r = x.clone();
  r.requires_grad_();
  CHECK(to_string(r.cuda()) ==
        "tensor([[ 1.5000, -2.0000],\n        [ 3.0000,  4.2500]], device='cuda:0', grad_fn=<Backward>)");
}

TEST_CASE("device copies (stand-in backend): gradients flow back through to(), cpu() and pin_memory()") {
  FakeCudaBackend be;
  Tensor<double> x = from_vector<double>({1, -2, 3, 0.5, 7, -1}, {2, 3});
  x.requires_grad_();
  const Tensor<double> y = x.t().cuda();  // a strided source
  CHECK(y.requires_grad());
  CHECK_FALSE(y.is_leaf());
  CHECK(std::string(y.grad_fn()->name()) == "ToCopyBackward");
  const Tensor<double> z = y.cpu().pin_memory();
  const Tensor<double> w = from_vector<double>({2, 3, 5, 7, 11, 13}, {3, 2});
  Tensor<double> loss = sum(z * w);
  loss.backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device().is_cpu());
  CHECK(same_elements(x.grad(), w.t().contiguous()));
  {
    NoGradGuard ng;
    CHECK_FALSE(x.cuda().requires_grad());
  }
}

TEST_CASE("device copies (stand-in backend): Module::to keeps parameter identity and moves gradients") {
  FakeCudaBackend be;
  nn::Linear lin(3, 2);
  nn::BatchNorm1d bn(2);
  struct Net : nn::Module {
    nn::Linear l;
    nn::BatchNorm1d b;
    Net(nn::Linear l_, nn::BatchNorm1d b_) : l(l_), b(b_) {
      register_module("l", l);
      register_module("b", b);
    }
  } net(lin, bn);
  const Tensor<float> w0 = lin.weight.detach().clone();
  const Tensor<float> other = lin.weight;  // another handle to the parameter
  lin.weight.grad() = iota({2, 3});
  net.to(Device::cuda());
  CHECK(lin.weight.device() == Device::cuda());
  CHECK(other.same_impl(lin.weight));
  CHECK(other.device() == Device::cuda());
  CHECK(lin.weight.is_leaf());
  CHECK(lin.weight.requires_grad());
  CHECK(lin.weight.grad().device() == Device::cuda());
  CHECK(bn.running_mean.device() == Device::cuda());
  CHECK(std::get<Tensor<std::int64_t>>(net.state_dict().at("b.num_batches_tracked")).device() == Device::cuda());
  CHECK(same_elements(lin.weight.detach().cpu(), w0));
  CHECK(same_elements(lin.weight.grad().cpu(), iota({2, 3})));
  // zero_grad(set_to_none = false) and load_state_dict write device memory through host copies.
  lin.zero_grad(false);
  CHECK(same_elements(lin.weight.grad().cpu(), zeros<float>({2, 3})));
  auto sd = net.state_dict();
  sd.at("l.weight") = Tensor<float>(iota({2, 3}) * 2.f);
  net.load_state_dict(sd);
  CHECK(lin.weight.device() == Device::cuda());
  CHECK(same_elements(lin.weight.detach().cpu(), Tensor<float>(iota({2, 3}) * 2.f)));
  net.to(Device::cpu());
  CHECK(lin.weight.device().is_cpu());
  CHECK(other.device().is_cpu());
  CHECK(same_elements(lin.weight.detach(), Tensor<float>(iota({2, 3}) * 2.f)));
  CHECK(lin.weight.grad().device().is_cpu());
}
#endif
