// What a transformer needs beyond the tensor ops (those are in test_manip.cpp, test_index.cpp, test_sort.cpp and
// test_functional.cpp): scaled_dot_product_attention (ops/attention.hpp, autograd/attention.hpp, cpu/attention.hpp),
// MultiheadAttention and TransformerEncoderLayer (nn/attention.hpp). Values and gradients against PyTorch (fixtures
// written by tests/fixtures/gen_attention.py and gen_parity.py with the PyPI wheel), gradcheck in double, the
// blocked attention against the unfused composition, its memory, and the errors bad arguments get.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
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

using ember_test::mask_of;

constexpr auto pfx = &ember_test::parity_fixtures;

}  // namespace

// ============================================================================================= attention

namespace {

const Fixtures& afx() {
  static const Fixtures f("attention.txt");
  return f;
}

/// Copies a module's parameters from the fixture records `<prefix>.param.<name>` (PyTorch's names) through
/// load_state_dict, so a parameter PyTorch does not have fails the lookup.
void load_params(nn::Module& m, const std::string& prefix, const Fixtures& src = afx()) {
  StateDict sd;
  for (auto& [n, p] : m.named_parameters<double>()) sd.emplace(n, src[prefix + ".param." + n]);
  m.load_state_dict(sd);
}

/// The blocked kernel and the unfused composition on the same inputs: values and gradients.
void compare_with_math(const TD& q0, const TD& k0, const TD& v0, const SdpaOptions<double>& o, double tol) {
  TD q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true), v = v0.clone().requires_grad_(true);
  TD q2 = q0.clone().requires_grad_(true), k2 = k0.clone().requires_grad_(true), v2 = v0.clone().requires_grad_(true);
  TD y = scaled_dot_product_attention(q, k, v, o);
  TD y2 = ember::detail::sdpa_math(q2, k2, v2, o);
  ember_test::check_close(y, y2.detach(), tol, tol);
  TD g = ember_test::normal(y.shape(), 99);
  y.backward(g);
  y2.backward(g);
  ember_test::check_close(q.grad(), q2.grad().detach(), tol, tol);
  ember_test::check_close(k.grad(), k2.grad().detach(), tol, tol);
  ember_test::check_close(v.grad(), v2.grad().detach(), tol, tol);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention matches PyTorch: plain, causal with L != S, boolean and additive masks, scale") {
  for (const std::string c : {"plain", "causal", "bool", "float", "scale"}) {
    INFO("case " << c);
    const std::string pre = "sdpa." + c + ".";
    SdpaOptions<double> o;
    if (c == "causal") o.is_causal = true;
    if (c == "bool") o.attn_mask = mask_of(afx()[pre + "mask"]);
    if (c == "float") o.attn_mask = afx()[pre + "mask"];
    if (c == "scale") o.scale = 0.3;
    TD q = afx()[pre + "q"].requires_grad_(true), k = afx()[pre + "k"].requires_grad_(true),
       v = afx()[pre + "v"].requires_grad_(true);
    TD y = scaled_dot_product_attention(q, k, v, o);
    ember_test::check_close(y, afx()[pre + "y"], 1e-12, 1e-12);
    y.backward(afx()[pre + "g"]);
    ember_test::check_close(q.grad(), afx()[pre + "dq"], 1e-11, 1e-12);
    ember_test::check_close(k.grad(), afx()[pre + "dk"], 1e-11, 1e-12);
    ember_test::check_close(v.grad(), afx()[pre + "dv"], 1e-11, 1e-12);
    ember_test::check_grad("sdpa " + c, [o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o); },
                           {afx()[pre + "q"].requires_grad_(true), afx()[pre + "k"].requires_grad_(true),
                            afx()[pre + "v"].requires_grad_(true)});
  }
}

TEST_CASE("scaled_dot_product_attention: the blocked kernel equals the unfused composition across block edges") {
  // Sizes that straddle the 64-row and 64-column blocks, a batch of two dims, Ev != E.
  const TD q = ember_test::normal({2, 3, 130, 16}, 1), k = ember_test::normal({2, 3, 70, 16}, 2),
           v = ember_test::normal({2, 3, 70, 8}, 3);
  compare_with_math(q, k, v, {}, 1e-11);
  SdpaOptions<double> causal;
  causal.is_causal = true;
  compare_with_math(q, k, v, causal, 1e-11);
  const TD qs = ember_test::normal({1, 2, 70, 16}, 4);  // causal with L == S: whole blocks skipped
  compare_with_math(qs, k.narrow(0, 0, 1).narrow(1, 0, 2), v.narrow(0, 0, 1).narrow(1, 0, 2), causal, 1e-11);
  Tensor<bool> keep = empty<bool>({2, 1, 130, 70});
  for (std::int64_t i = 0; i < keep.numel(); ++i) keep.data()[i] = (i * 7919) % 5 != 0 || i % 70 == 0;
  SdpaOptions<double> masked;
  masked.attn_mask = keep;
  compare_with_math(q, k, v, masked, 1e-11);
  // Non-contiguous inputs (a transposed view, as attention heads are) give the same result.
  SdpaOptions<double> scaled;
  scaled.scale = 0.05;
  compare_with_math(ember_test::normal({2, 40, 3, 16}, 5).transpose(1, 2), k, v, scaled, 1e-11);
}

TEST_CASE("scaled_dot_product_attention with enable_gqa matches PyTorch; grouped heads are read in place") {
  for (const std::string c : {"plain", "causal", "bool", "mixed", "three_d"}) {
    INFO("case " << c);
    const std::string pre = "gqa." + c + ".";
    SdpaOptions<double> o;
    o.enable_gqa = true;
    if (c == "causal") o.is_causal = true;
    if (c == "bool") o.attn_mask = mask_of(pfx()[pre + "mask"]);
    TD q = pfx()[pre + "q"].requires_grad_(true), k = pfx()[pre + "k"].requires_grad_(true),
       v = pfx()[pre + "v"].requires_grad_(true);
    TD y = scaled_dot_product_attention(q, k, v, o);
    ember_test::check_close(y, pfx()[pre + "y"], 1e-12, 1e-12);
    y.backward(pfx()[pre + "g"]);
    ember_test::check_close(q.grad(), pfx()[pre + "dq"], 1e-11, 1e-12);
    ember_test::check_close(k.grad(), pfx()[pre + "dk"], 1e-11, 1e-12);
    ember_test::check_close(v.grad(), pfx()[pre + "dv"], 1e-11, 1e-12);
    ember_test::check_grad("sdpa gqa " + c,
                           [o](const Inputs& in) { return scaled_dot_product_attention(in[0], in[1], in[2], o); },
                           {pfx()[pre + "q"].requires_grad_(true), pfx()[pre + "k"].requires_grad_(true),
                            pfx()[pre + "v"].requires_grad_(true)});
  }
  // Across block edges, with dropout (one mask per query head), against the composition with repeated heads.
  const TD q = ember_test::normal({2, 6, 130, 8}, 21), k = ember_test::normal({2, 2, 70, 8}, 22),
           v = ember_test::normal({2, 2, 70, 4}, 23);
  SdpaOptions<double> g;
  g.enable_gqa = true;
  compare_with_math(q, k, v, g, 1e-11);
  g.is_causal = true;
  compare_with_math(q, k, v, g, 1e-11);
  SdpaOptions<double> d;
  d.enable_gqa = true;
  d.dropout_p = 0.3;
  Generator g1(5), g2(5);
  d.generator = &g1;
  TD qd = q.clone().requires_grad_(true), kd = k.clone().requires_grad_(true), vd = v.clone().requires_grad_(true);
  TD yd = scaled_dot_product_attention(qd, kd, vd, d);
  // The same draws on repeated heads without enable_gqa: the kernel's mask depends on (query head, query, key).
  SdpaOptions<double> r;
  r.dropout_p = 0.3;
  r.generator = &g2;
  TD kr = ember::detail::repeat_heads(k, 3).contiguous().requires_grad_(true),
     vr = ember::detail::repeat_heads(v, 3).contiguous().requires_grad_(true), qr = q.clone().requires_grad_(true);
  TD yr = scaled_dot_product_attention(qr, kr, vr, r);
  ember_test::check_close(yd, yr.detach(), 1e-12, 1e-12);
  const TD up = ember_test::normal(yd.shape(), 24);
  yd.backward(up);
  yr.backward(up);
  ember_test::check_close(qd.grad(), qr.grad().detach(), 1e-11, 1e-12);
  // A key/value head's gradient is the sum over the query heads it serves.
  ember_test::check_close(kd.grad(), TD(sum(kr.grad().reshape({2, 2, 3, 70, 8}), 2)).detach(), 1e-11, 1e-12);
  ember_test::check_close(vd.grad(), TD(sum(vr.grad().reshape({2, 2, 3, 70, 4}), 2)).detach(), 1e-11, 1e-12);
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({1, 3, 2, 4}), ones<double>({1, 2, 5, 4}),
                                                       ones<double>({1, 2, 5, 4}), {.enable_gqa = true}); },
               {"scaled_dot_product_attention", "key (2) and value (2) must divide the number of heads in query (3)"});
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({2, 4}), ones<double>({5, 4}), ones<double>({5, 4}),
                                                       {.enable_gqa = true}); },
               {"scaled_dot_product_attention", "enable_gqa needs a head dim"});
  EXPECT_ERROR([] { (void)scaled_dot_product_attention(ones<double>({1, 4, 2, 4}), ones<double>({1, 2, 5, 4}),
                                                       ones<double>({1, 2, 5, 4})); },
               {"scaled_dot_product_attention", "batch dims"});
}

TEST_CASE("MultiheadAttention with kdim/vdim and add_bias_kv matches PyTorch, masks and gradients included") {
  using MHA = nn::MultiheadAttentionT<amp::fp64>;
  auto names = [](const nn::Module& m) {
    std::set<std::string> r;
    for (const auto& [n, p] : m.named_parameters<double>()) r.insert(n);
    return r;
  };
  {
    MHA mha(8, 2, {.kdim = 5, .vdim = 6, .batch_first = true});
    CHECK(names(mha) == std::set<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                             "out_proj.weight", "out_proj.bias"});
    CHECK(double(names(mha).size()) == pfx()["mha.kv.nparams"].item());
    CHECK(!mha.in_proj_weight.defined());
    load_params(mha, "mha.kv", pfx());
    TD q = pfx()["mha.kv.q"].requires_grad_(true), k = pfx()["mha.kv.k"].requires_grad_(true),
       v = pfx()["mha.kv.v"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.key_padding_mask = mask_of(pfx()["mha.kv.kpm"]);
    auto [y, w] = mha(q, k, v, o);
    ember_test::check_close(y, pfx()["mha.kv.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.kv.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.kv.g"]);
    ember_test::check_close(q.grad(), pfx()["mha.kv.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), pfx()["mha.kv.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), pfx()["mha.kv.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.q_proj_weight.grad(), pfx()["mha.kv.d_q_proj_weight"], 1e-10, 1e-12);
    ember_test::check_close(mha.k_proj_weight.grad(), pfx()["mha.kv.d_k_proj_weight"], 1e-10, 1e-12);
    ember_test::check_close(mha.v_proj_weight.grad(), pfx()["mha.kv.d_v_proj_weight"], 1e-10, 1e-12);
    EXPECT_ERROR([&] { (void)mha(q, q, v); }, {"MultiheadAttention", "kdim = 5 (key)"});
  }
  {
    MHA mha(8, 2, {.add_bias_kv = true});
    CHECK(names(mha) == std::set<std::string>{"in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                             "out_proj.bias"});
    CHECK(mha.bias_k.shape() == Shape{1, 1, 8});
    load_params(mha, "mha.bkv", pfx());
    TD x = pfx()["mha.bkv.x"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.attn_mask = mask_of(pfx()["mha.bkv.am"]);
    o.key_padding_mask = mask_of(pfx()["mha.bkv.kpm"]);
    o.average_attn_weights = false;
    auto [y, w] = mha(x, x, x, o);
    CHECK(w.shape() == Shape{2, 2, 5, 6});  // one more key: the appended bias
    ember_test::check_close(y, pfx()["mha.bkv.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.bkv.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.bkv.g"]);
    ember_test::check_close(x.grad(), pfx()["mha.bkv.dx"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_k.grad(), pfx()["mha.bkv.d_bias_k"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_v.grad(), pfx()["mha.bkv.d_bias_v"], 1e-10, 1e-12);
    // Without weights (the blocked kernel), an additive mask.
    x.grad() = TD();
    mha.zero_grad();
    nn::MhaForwardOptions<double> f;
    f.attn_mask = pfx()["mha.bkv.fm"];
    f.need_weights = false;
    TD y2 = mha(x, x, x, f).output;
    ember_test::check_close(y2, pfx()["mha.bkv.y2"], 1e-11, 1e-12);
    y2.backward(pfx()["mha.bkv.g2"]);
    ember_test::check_close(x.grad(), pfx()["mha.bkv.dx2"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_k.grad(), pfx()["mha.bkv.d2_bias_k"], 1e-10, 1e-12);
    // is_causal equals the explicit causal mask, which keeps the appended position for every query.
    nn::MhaForwardOptions<double> c, m;
    c.is_causal = true;
    m.attn_mask = mask_of(pfx()["mha.bkv.am"]);
    ember_test::check_close(mha(x, x, x, c).output, mha(x, x, x, m).output.detach(), 1e-12, 1e-12);
  }
  {
    MHA mha(8, 4, {.bias = false, .add_bias_kv = true, .kdim = 3, .vdim = 5, .batch_first = true});
    CHECK(names(mha) == std::set<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v",
                                             "out_proj.weight"});
    load_params(mha, "mha.both", pfx());
    TD q = pfx()["mha.both.q"].requires_grad_(true), k = pfx()["mha.both.k"].requires_grad_(true),
       v = pfx()["mha.both.v"].requires_grad_(true);
    auto [y, w] = mha(q, k, v);
    ember_test::check_close(y, pfx()["mha.both.y"], 1e-11, 1e-12);
    ember_test::check_close(w, pfx()["mha.both.w"], 1e-11, 1e-12);
    y.backward(pfx()["mha.both.g"]);
    ember_test::check_close(q.grad(), pfx()["mha.both.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), pfx()["mha.both.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), pfx()["mha.both.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.bias_v.grad(), pfx()["mha.both.d_bias_v"], 1e-10, 1e-12);
  }
  EXPECT_ERROR([] { (void)nn::MultiheadAttention(8, 2, {.kdim = -1}); }, {"MultiheadAttention", "kdim (-1)"});
}

TEST_CASE("scaled_dot_product_attention: fully masked rows give zeros, dropout is reproducible and differentiable") {
  const TD q = ember_test::normal({1, 1, 4, 3}, 6), k = ember_test::normal({1, 1, 5, 3}, 7),
           v = ember_test::normal({1, 1, 5, 2}, 8);
  Tensor<bool> keep = ones<bool>({4, 5});
  for (std::int64_t j = 0; j < 5; ++j) keep.at(2, j) = false;  // query 2 sees nothing
  SdpaOptions<double> o;
  o.attn_mask = keep;
  TD ql = q.clone().requires_grad_(true);
  TD y = scaled_dot_product_attention(ql, k, v, o);
  CHECK(y.at(0, 0, 2, 0) == 0.0);
  CHECK(y.at(0, 0, 2, 1) == 0.0);
  sum(y).backward();
  CHECK(ql.grad().at(0, 0, 2, 0) == 0.0);
  for (double x : ql.grad().to_vector()) CHECK(std::isfinite(x));

  // Dropout: the mask comes from the generator's stream, the same for the same seed, and the backward
  // regenerates it (gradcheck re-seeds for every evaluation).
  SdpaOptions<double> d;
  d.dropout_p = 0.4;
  Generator g1(11), g2(11), g3(12);
  d.generator = &g1;
  const TD a = scaled_dot_product_attention(q, k, v, d);
  d.generator = &g2;
  CHECK(scaled_dot_product_attention(q, k, v, d).to_vector() == a.to_vector());
  d.generator = &g3;
  CHECK(scaled_dot_product_attention(q, k, v, d).to_vector() != a.to_vector());
  CHECK(scaled_dot_product_attention(q, k, v).to_vector() != a.to_vector());
  ember_test::check_grad("sdpa dropout", [](const Inputs& in) {
    Generator g(5);
    SdpaOptions<double> od;
    od.dropout_p = 0.3;
    od.is_causal = true;
    od.generator = &g;
    return scaled_dot_product_attention(in[0], in[1], in[2], od);
  }, {q.clone().requires_grad_(true), ember_test::normal({1, 1, 4, 3}, 9).requires_grad_(true), v.narrow(2, 0, 4).clone().requires_grad_(true)});
  // Averaged over many seeds the dropped-out output is unbiased.
  TD mean_out = zeros<double>(a.shape());
  for (int s = 0; s < 400; ++s) {
    Generator g(1000 + s);
    d.generator = &g;
    mean_out = TD(mean_out + scaled_dot_product_attention(q, k, v, d) * (1.0 / 400));
  }
  ember_test::check_close(mean_out, scaled_dot_product_attention(q, k, v), 0.15, 0.15);

  EXPECT_ERROR([&] { (void)scaled_dot_product_attention(q, k.narrow(3, 0, 2), v); }, {"scaled_dot_product_attention",
               "last dim (3) and k's (2)"});
  EXPECT_ERROR([&] { (void)scaled_dot_product_attention(q, k, v.narrow(2, 0, 4)); }, {"5 keys but v has 4"});
  EXPECT_ERROR([&] {
    SdpaOptions<double> bad;
    bad.is_causal = true;
    bad.attn_mask = keep;
    (void)scaled_dot_product_attention(q, k, v, bad);
  }, {"either attn_mask or is_causal"});
  EXPECT_ERROR([&] {
    SdpaOptions<double> bad;
    bad.attn_mask = ones<bool>({3, 5});
    (void)scaled_dot_product_attention(q, k, v, bad);
  }, {"attn_mask of shape [3, 5]", "[1, 1, 4, 5]"});
}

TEST_CASE("scaled_dot_product_attention: the CPU kernel's memory grows with L, the unfused one's with L^2") {
  // One head of 1024 queries: the L x L float scores alone are 4 MiB; the blocked kernel's forward and backward
  // allocate the inputs' size (256 KiB per tensor) plus O(L).
  auto& alloc = CpuCachingAllocator::instance();
  const std::int64_t l = 1024;
  Tensor<float> q = randn<float>({1, 1, l, 64}), k = randn<float>({1, 1, l, 64}), v = randn<float>({1, 1, l, 64});
  q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true);
  auto peak_of = [&](auto&& run) {
    const std::size_t before = alloc.stats().bytes_in_use;
    alloc.reset_peak();
    run();
    return alloc.stats().peak_in_use - before;
  };
  SdpaOptions<float> o;
  o.is_causal = true;
  const std::size_t blocked = peak_of([&] { sum(scaled_dot_product_attention(q, k, v, o)).backward(); });
  const std::size_t unfused = peak_of([&] { sum(ember::detail::sdpa_math(q, k, v, o)).backward(); });
  INFO("blocked peak " << blocked << " B, unfused " << unfused << " B");
  CHECK(blocked < std::size_t(2) << 20);
  CHECK(unfused > std::size_t(4) << 20);
}

TEST_CASE("MultiheadAttention matches PyTorch: cross-attention with key padding and weights, masked self-attention") {
  using MHA = nn::MultiheadAttentionT<amp::fp64>;
  {
    MHA mha(8, 2, 0.0, true, true);
    load_params(mha, "mha.cross");
    TD q = afx()["mha.cross.q"].requires_grad_(true), k = afx()["mha.cross.k"].requires_grad_(true),
       v = afx()["mha.cross.v"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.key_padding_mask = mask_of(afx()["mha.cross.kpm"]);
    auto [y, w] = mha(q, k, v, o);
    ember_test::check_close(y, afx()["mha.cross.y"], 1e-11, 1e-12);
    ember_test::check_close(w, afx()["mha.cross.w"], 1e-11, 1e-12);
    y.backward(afx()["mha.cross.g"]);
    ember_test::check_close(q.grad(), afx()["mha.cross.dq"], 1e-10, 1e-12);
    ember_test::check_close(k.grad(), afx()["mha.cross.dk"], 1e-10, 1e-12);
    ember_test::check_close(v.grad(), afx()["mha.cross.dv"], 1e-10, 1e-12);
    ember_test::check_close(mha.in_proj_weight.grad(), afx()["mha.cross.d_in_proj_weight"], 1e-10, 1e-12);
    // Without weights the heads go through the blocked kernel: the same output.
    o.need_weights = false;
    auto r = mha(q, k, v, o);
    CHECK(!r.weights.defined());
    ember_test::check_close(r.output, afx()["mha.cross.y"], 1e-11, 1e-12);
  }
  {
    MHA mha(8, 4);
    load_params(mha, "mha.self");
    TD x = afx()["mha.self.x"].requires_grad_(true);
    nn::MhaForwardOptions<double> o;
    o.attn_mask = Tensor<bool>(triu(ones<double>({5, 5}), 1) > 0.5);
    o.need_weights = false;
    TD y = mha(x, x, x, o).output;
    ember_test::check_close(y, afx()["mha.self.y"], 1e-11, 1e-12);
    y.backward(afx()["mha.self.g"]);
    ember_test::check_close(x.grad(), afx()["mha.self.dx"], 1e-10, 1e-12);
    ember_test::check_close(mha.out_proj.weight.grad(), afx()["mha.self.d_out_proj_weight"], 1e-10, 1e-12);
    // is_causal gives the same as the explicit causal mask.
    nn::MhaForwardOptions<double> c;
    c.is_causal = true;
    c.need_weights = false;
    ember_test::check_close(mha(x, x, x, c).output, afx()["mha.self.y"], 1e-11, 1e-12);
  }
  EXPECT_ERROR([] { (void)nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "multiple of num_heads"});
}

TEST_CASE("TransformerEncoderLayer matches PyTorch: post-norm ReLU and pre-norm GELU with key padding") {
  for (const std::string c : {"post_relu", "pre_gelu"}) {
    INFO("case " << c);
    nn::TransformerEncoderLayerOptions o;
    o.dim_feedforward = 16;
    o.dropout = 0;
    o.batch_first = true;
    o.norm_first = c == "pre_gelu";
    o.activation = c == "pre_gelu" ? nn::TransformerActivation::gelu : nn::TransformerActivation::relu;
    nn::TransformerEncoderLayerT<amp::fp64> layer(8, 2, o);
    load_params(layer, "enc." + c);
    CHECK(layer.num_parameters() == 4 * 8 * 8 + 3 * 8 + 8 + 2 * 8 * 16 + 16 + 8 + 4 * 8);
    const std::string pre = "enc." + c + ".";
    TD x = afx()[pre + "x"].requires_grad_(true);
    TD y = layer(x, {}, mask_of(afx()[pre + "kpm"]));
    ember_test::check_close(y, afx()[pre + "y"], 1e-10, 1e-12);
    y.backward(afx()[pre + "g"]);
    ember_test::check_close(x.grad(), afx()[pre + "dx"], 1e-9, 1e-11);
    ember_test::check_close(layer.linear1.weight.grad(), afx()[pre + "d_linear1_weight"], 1e-9, 1e-11);
    ember_test::check_close(layer.self_attn.in_proj_weight.grad(), afx()[pre + "d_in_proj_weight"], 1e-9, 1e-11);
  }
}

TEST_CASE("TransformerEncoderLayer without bias: no bias anywhere, LayerNorms included; PyTorch's state dict loads") {
  nn::TransformerEncoderLayerOptions o;
  o.dim_feedforward = 16;
  o.dropout = 0;
  o.batch_first = true;
  o.bias = false;
  nn::TransformerEncoderLayerT<amp::fp64> layer(8, 2, o);
  // torch.nn.TransformerEncoderLayer(bias=False)'s keys, exactly.
  std::set<std::string> keys;
  for (const auto& [k, v] : layer.state_dict()) keys.insert(k);
  CHECK(keys == std::set<std::string>{"self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                      "linear2.weight", "norm1.weight", "norm2.weight"});
  CHECK(double(keys.size()) == pfx()["enc.nobias.nstate"].item());
  CHECK(!layer.norm1.bias.defined());
  CHECK(!layer.norm2.bias.defined());
  load_params(layer, "enc.nobias", pfx());
  TD x = pfx()["enc.nobias.x"].requires_grad_(true);
  TD y = layer(x);
  ember_test::check_close(y, pfx()["enc.nobias.y"], 1e-10, 1e-12);
  y.backward(pfx()["enc.nobias.g"]);
  ember_test::check_close(x.grad(), pfx()["enc.nobias.dx"], 1e-9, 1e-11);
  ember_test::check_close(layer.norm1.weight.grad(), pfx()["enc.nobias.d_norm1_weight"], 1e-9, 1e-11);
}

TEST_CASE("attention in bf16 and fp16: the layers under the mixed policies follow fp32, dropout included") {
  manual_seed(8);
  nn::TransformerEncoderLayerOptions o;
  o.dim_feedforward = 32;
  o.dropout = 0;
  o.batch_first = true;
  o.norm_first = true;
  o.activation = nn::TransformerActivation::gelu;
  nn::TransformerEncoderLayer f32(16, 2, o);
  nn::TransformerEncoderLayerT<amp::bf16_mixed> b16(16, 2, o);
  b16.load_state_dict(f32.state_dict());
  const Tensor<float> x = randn<float>({2, 6, 16});
  Tensor<bool> kpm = zeros<bool>({2, 6});
  kpm.at(1, 5) = true;
  const Tensor<float> want = f32(x, {}, kpm, true);
  const Tensor<float> got = cast<float>(b16(Tensor<bfloat16>(cast<bfloat16>(x)), {}, kpm, true));
  ember_test::check_close(got, Tensor<double>(cast<double>(want)), 0.05, 0.05);
  // SDPA on half tensors computes in float: the float result rounded.
  const Tensor<float> q = randn<float>({1, 2, 5, 8}), k = randn<float>({1, 2, 7, 8}), v = randn<float>({1, 2, 7, 4});
  SdpaOptions<half> oh;
  oh.is_causal = true;
  SdpaOptions<float> of;
  of.is_causal = true;
  const Tensor<half> yh = scaled_dot_product_attention(Tensor<half>(cast<half>(q)), Tensor<half>(cast<half>(k)),
                                                       Tensor<half>(cast<half>(v)), oh);
  ember_test::check_close(Tensor<float>(cast<float>(yh)),
                          Tensor<double>(cast<double>(scaled_dot_product_attention(q, k, v, of))), 0.01, 0.01);
  // nn::Dropout on 16-bit tensors: zeros or the value scaled by 1 / (1 - p).
  nn::Dropout drop(0.5);
  const Tensor<bfloat16> ones16 = ones<bfloat16>({256});
  for (bfloat16 y : drop(ones16).to_vector()) CHECK((float(y) == 0.0f || float(y) == 2.0f));
}
