// ember — scaled_dot_product_attention with PyTorch's semantics (torch.nn.functional.scaled_dot_product_attention):
// softmax(q k^T * scale + mask) v, with an optional boolean or additive mask, causal masking and dropout on the
// attention weights. On the CPU it runs the blocked kernel of ops/attention.hpp (no L x S matrix, forward or
// backward); on other devices, and as the reference the tests compare with, the composition of matmul, softmax
// and dropout (detail::sdpa_math).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/softmax.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/attention.hpp"

namespace ember {

/// An attention mask: boolean (true: the position takes part, as PyTorch's SDPA) or additive (added to the scores;
/// -inf masks out). Either converts implicitly, so `.attn_mask = mask` takes both. Broadcastable to (..., L, S).
template <class T>
struct AttnMask {
  Tensor<bool> keep;
  Tensor<T> add;
  AttnMask() = default;
  AttnMask(Tensor<bool> m) : keep(std::move(m)) {}  // NOLINT: implicit on purpose
  AttnMask(Tensor<T> m) : add(std::move(m)) {}      // NOLINT
  bool defined() const { return keep.defined() || add.defined(); }
};

template <class T>
struct SdpaOptions {
  AttnMask<T> attn_mask{};
  bool is_causal = false;       // key j takes part for query i when j <= i (no attn_mask with it, as PyTorch)
  double dropout_p = 0;         // on the attention weights (always applied when > 0, as the functional form)
  std::optional<double> scale{};  // default 1 / sqrt(E)
  /// Grouped-query attention: k and v may have fewer heads (dim -3) than q, each dividing q's; key/value head h
  /// serves the q/kv consecutive query heads from h * (Hq / Hkv) on, as torch's repeat_interleave of k and v.
  bool enable_gqa = false;
  Generator* generator = nullptr;  // the dropout's stream; the default generator unless given
};

namespace detail {

/// The mask as an additive bias of shape `target` (..., L, S): (L, S) when it is the same for every batch-head
/// (bias_batch_stride 0), else (BH, L, S).
template <class T>
Tensor<T> sdpa_bias(const AttnMask<T>& m, const Shape& target, std::int64_t& batch_stride, const char* op) {
  const Shape ms = m.keep.defined() ? m.keep.shape() : m.add.shape();
  bool fits = ms.n <= target.n;
  for (int i = 1; fits && i <= ms.n; ++i) fits = ms[ms.n - i] == 1 || ms[ms.n - i] == target[target.n - i];
  EMBER_CHECK(fits, op, ": attn_mask of shape ", ms.str(), " does not broadcast to the attention's (..., L, S) shape ",
              target.str());
  const std::int64_t l = target[target.n - 2], s = target[target.n - 1];
  bool per_batch = false;
  for (int k = 0; k < ms.n - 2; ++k) per_batch = per_batch || ms[k] != 1;
  const std::int64_t nb = per_batch ? target.numel() / std::max<std::int64_t>(l * s, 1) : 1;
  batch_stride = per_batch ? l * s : 0;
  Shape full = target;
  if (!per_batch) full = Shape{l, s};
  Tensor<T> bias = empty<T>(per_batch ? Shape{nb, l, s} : Shape{l, s});
  const T ninf = -std::numeric_limits<T>::infinity();
  auto fill = [&](const auto& src) {
    // src expanded to `full` (leading size-1 dims of a batch-shared mask dropped), read through its strides
    auto e = src.reshape(Shape(ms.end() - std::min(ms.n, full.n), ms.end())).expand(full).contiguous();
    const auto* p = e.data();
    for (std::int64_t i = 0; i < bias.numel(); ++i) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(*p)>, bool>) bias.data()[i] = p[i] ? T(0) : ninf;
      else bias.data()[i] = T(p[i]);
    }
  };
  if (m.keep.defined()) fill(m.keep.cpu());
  else fill(m.add.detach().cpu());
  return bias;
}

/// The positions causal masking removes, (l, s) on `device`: true where key j is after query i (j > i).
inline Tensor<bool> future_mask(std::int64_t l, std::int64_t s, Device device) {
  Tensor<bool> m = empty<bool>(Shape{l, s});
  for (std::int64_t i = 0; i < l; ++i)
    for (std::int64_t j = 0; j < s; ++j) m.data()[i * s + j] = j > i;
  return device.is_cpu() ? m : m.to(device);
}

/// x (..., H, S, E) with every head repeated `group` times in place: (..., H * group, S, E), as torch's
/// repeat_interleave(group, -3) (differentiable: a broadcast view, then a copy).
template <class T>
Tensor<T> repeat_heads(const Tensor<T>& x, std::int64_t group) {
  if (group == 1) return x;
  const int n = x.dim();
  Shape e = x.shape();
  e.insert(n - 2, group);
  Shape r = x.shape();
  r[n - 3] *= group;
  return x.unsqueeze(n - 2).expand(e).reshape(r);
}

/// The unfused reference: matmul, mask, softmax, dropout, matmul (materialises the L x S weights). With
/// enable_gqa, k and v are first repeated to q's heads.
template <class T>
Tensor<T> sdpa_math(const Tensor<T>& q, const Tensor<T>& k0, const Tensor<T>& v0, const SdpaOptions<T>& o) {
  const int nd = q.dim();
  const Tensor<T> k = o.enable_gqa ? repeat_heads(k0, q.shape()[nd - 3] / k0.shape()[nd - 3]) : k0;
  const Tensor<T> v = o.enable_gqa ? repeat_heads(v0, q.shape()[nd - 3] / v0.shape()[nd - 3]) : v0;
  const std::int64_t l = q.shape()[q.dim() - 2], s = k.shape()[k.dim() - 2], e = q.shape()[q.dim() - 1];
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(e));
  Tensor<T> sc = matmul(q, k.transpose(-2, -1));
  sc = Tensor<T>(sc * scale);
  const double ninf = -std::numeric_limits<double>::infinity();
  if (o.is_causal) sc = Tensor<T>(where(future_mask(l, s, q.device()), ninf, sc));
  if (o.attn_mask.keep.defined()) {
    Tensor<bool> keep = o.attn_mask.keep;
    sc = Tensor<T>(where(keep, sc, ninf));
  } else if (o.attn_mask.add.defined()) {
    sc = Tensor<T>(sc + o.attn_mask.add);
  }
  Tensor<T> w = softmax(sc, -1);
  if (o.dropout_p > 0) {
    Generator& g = o.generator ? *o.generator : default_generator();
    Tensor<T> keep = bernoulli<T>(w.shape(), 1.0 - o.dropout_p, g);
    if (!w.device().is_cpu()) keep = keep.to(w.device());
    w = Tensor<T>(w * keep * (1.0 / (1.0 - o.dropout_p)));
  }
  return matmul(w, v);
}

}  // namespace detail

namespace autograd {
template <class T>
struct SdpaNode final : TypedNode<T> {
  ops::AttentionGeom g;
  Saved<T> q, k, v, out;  // (BH, L, E), (BH / G, S, E), (BH / G, S, Ev), (BH, L, Ev), contiguous (G: kv_group)
  Tensor<T> lse, bias;
  Shape qs, ks, vs;
  const char* name() const override { return "ScaledDotProductAttentionBackward"; }
  void release() override {
    q = k = v = out = Saved<T>();
    lse = bias = Tensor<T>();
  }
  void backward() override {
    const char* op = "scaled_dot_product_attention backward";
    const Tensor<T>& qq = q.get(op);
    const Tensor<T>& kk = k.get(op);
    const Tensor<T>& vv = v.get(op);
    const Tensor<T>& oo = out.get(op);
    const Tensor<T> go = this->grad.contiguous().reshape(oo.shape());
    Tensor<T> dq = empty<T>(qq.shape()), dk = empty<T>(kk.shape()), dv = empty<T>(vv.shape());
    if (g.bh == 0) {  // no query heads: the kernel visits no key/value head
      dk = zeros<T>(kk.shape());
      dv = zeros<T>(vv.shape());
    }
    ops::attention_backward<T>(g, qq.data(), kk.data(), vv.data(), bias.defined() ? bias.data() : nullptr, oo.data(),
                               lse.data(), go.data(), dq.data(), dk.data(), dv.data());
    this->template deliver<T>(0, dq.view(qs));
    this->template deliver<T>(1, dk.view(ks));
    this->template deliver<T>(2, dv.view(vs));
  }
};
}  // namespace autograd

/// torch.nn.functional.scaled_dot_product_attention: q (..., L, E), k (..., S, E), v (..., S, Ev) with the same
/// batch dims (with enable_gqa, k and v may have fewer heads in dim -3); the result is (..., L, Ev). A query row
/// whose keys are all masked out gives zeros. On the CPU (float, double; half and bfloat16 compute in float) the
/// blocked kernel runs: memory O(L) per head beyond the inputs and output, in the backward too, and grouped
/// key/value heads are read in place. The mask gets no gradient.
template <class T>
Tensor<T> scaled_dot_product_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                       const SdpaOptions<std::type_identity_t<T>>& o = {}) {
  const char* op = "scaled_dot_product_attention";
  static_assert(is_floating_v<T>, "scaled_dot_product_attention: floating-point tensors");
  EMBER_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(), op, ": q, k and v need the same number (>= 2)",
              " of dims, got shapes ", q.shape().str(), ", ", k.shape().str(), ", ", v.shape().str());
  const int n = q.dim();
  EMBER_CHECK(!o.enable_gqa || n >= 3, op, ": enable_gqa needs a head dim (-3): q, k and v of 3 or more dims, got ",
              "shapes ", q.shape().str(), ", ", k.shape().str(), ", ", v.shape().str());
  const int head = o.enable_gqa ? n - 3 : -1;  // the dim where k and v may have fewer heads than q
  for (int d = 0; d < n - 2; ++d)
    EMBER_CHECK(d == head || (k.shape()[d] == q.shape()[d] && v.shape()[d] == q.shape()[d]), op,
                ": the batch dims of q ", q.shape().str(), ", k ", k.shape().str(), " and v ", v.shape().str(),
                " differ", o.enable_gqa ? " (outside the head dim -3)" : "");
  if (o.enable_gqa) {
    const std::int64_t hq = q.shape()[head], hk = k.shape()[head], hv = v.shape()[head];
    EMBER_CHECK(hk > 0 && hv > 0 && hq % hk == 0 && hq % hv == 0, op, ": with enable_gqa the number of heads in ",
                "key (", hk, ") and value (", hv, ") must divide the number of heads in query (", hq, "); shapes q ",
                q.shape().str(), ", k ", k.shape().str(), ", v ", v.shape().str());
  }
  EMBER_CHECK(k.shape()[n - 1] == q.shape()[n - 1], op, ": q's last dim (", q.shape()[n - 1], ") and k's (",
              k.shape()[n - 1], ") must match; shapes ", q.shape().str(), " and ", k.shape().str());
  EMBER_CHECK(v.shape()[n - 2] == k.shape()[n - 2], op, ": k has ", k.shape()[n - 2], " keys but v has ",
              v.shape()[n - 2], " values; shapes ", k.shape().str(), " and ", v.shape().str());
  EMBER_CHECK(q.device() == k.device() && q.device() == v.device(), op, ": q, k, v are on ", q.device().str(), ", ",
              k.device().str(), ", ", v.device().str());
  EMBER_CHECK(!(o.is_causal && o.attn_mask.defined()), op, ": give either attn_mask or is_causal, not both");
  EMBER_CHECK(o.dropout_p >= 0 && o.dropout_p < 1, op, ": dropout_p must be in [0, 1), got ", o.dropout_p);
  EMBER_CHECK(!o.scale || std::isfinite(*o.scale), op, ": scale must be finite");
  if (!q.device().is_cpu()) return detail::sdpa_math(q, k, v, o);
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    SdpaOptions<float> of;
    of.is_causal = o.is_causal;
    of.dropout_p = o.dropout_p;
    of.scale = o.scale;
    of.enable_gqa = o.enable_gqa;
    of.generator = o.generator;
    if (o.attn_mask.keep.defined()) of.attn_mask = o.attn_mask.keep;
    else if (o.attn_mask.add.defined()) of.attn_mask = Tensor<float>(cast<float>(o.attn_mask.add));
    const Tensor<float> qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v);
    return Tensor<T>(cast<T>(scaled_dot_product_attention<float>(qf, kf, vf, of)));
  } else {
    // k and v with different head counts: both repeated to q's heads (the kernel reads one group size).
    const bool mixed = o.enable_gqa && k.shape()[n - 3] != v.shape()[n - 3];
    const Tensor<T> kx = mixed ? detail::repeat_heads(k, q.shape()[n - 3] / k.shape()[n - 3]) : k;
    const Tensor<T> vx = mixed ? detail::repeat_heads(v, q.shape()[n - 3] / v.shape()[n - 3]) : v;
    ops::AttentionGeom g;
    g.l = q.shape()[n - 2];
    g.s = k.shape()[n - 2];
    g.e = q.shape()[n - 1];
    g.ev = v.shape()[n - 1];
    g.bh = 1;
    std::int64_t bkv = 1;  // key/value batch-heads
    for (int d = 0; d < n - 2; ++d) {
      g.bh *= q.shape()[d];
      bkv *= kx.shape()[d];
    }
    if (o.enable_gqa && !mixed && kx.shape()[n - 3] > 0)
      g.kv_group = std::max<std::int64_t>(1, q.shape()[n - 3] / kx.shape()[n - 3]);
    g.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(g.e));
    g.causal = o.is_causal;
    g.dropout_p = o.dropout_p;
    Shape os = q.shape();
    os[n - 1] = g.ev;
    Shape target = q.shape();
    target[n - 1] = g.s;
    Tensor<T> bias;
    if (o.attn_mask.defined()) bias = detail::sdpa_bias(o.attn_mask, target, g.bias_batch_stride, op);
    if (g.dropout_p > 0) {
      Generator& gen = o.generator ? *o.generator : default_generator();
      const std::uint64_t elems = std::uint64_t(g.bh) * std::uint64_t(g.l) * std::uint64_t(g.s);
      g.seed = gen.seed();
      g.offset = gen.reserve((elems + 3) / 4);
    }
    Tensor<T> qc, kc, vc;
    {
      NoGradGuard ng;
      qc = q.detach().contiguous().view({g.bh, g.l, g.e});
      kc = kx.detach().contiguous().view({bkv, g.s, g.e});
      vc = vx.detach().contiguous().view({bkv, g.s, g.ev});
    }
    Tensor<T> out = empty<T>(Shape{g.bh, g.l, g.ev});
    Tensor<T> lse = empty<T>(Shape{g.bh, g.l});
    if (g.bh * g.l * g.ev > 0)
      ops::attention_forward<T>(g, qc.data(), kc.data(), vc.data(), bias.defined() ? bias.data() : nullptr, out.data(),
                                lse.data());
    Tensor<T> r = out.view(os);
    if ((q.requires_grad() || kx.requires_grad() || vx.requires_grad()) && is_grad_enabled()) {
      auto node = std::make_shared<autograd::SdpaNode<T>>();
      node->g = g;
      node->q = autograd::Saved<T>(qc);
      node->k = autograd::Saved<T>(kc);
      node->v = autograd::Saved<T>(vc);
      node->out = autograd::Saved<T>(out);
      node->lse = lse;
      node->bias = bias;
      node->qs = q.shape();
      node->ks = kx.shape();
      node->vs = vx.shape();
      node->next = {autograd::gradient_edge(q), autograd::gradient_edge(kx), autograd::gradient_edge(vx)};
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
    return r;
  }
}

}  // namespace ember
