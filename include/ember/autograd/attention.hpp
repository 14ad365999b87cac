// ember — scaled_dot_product_attention with PyTorch's semantics (torch.nn.functional.scaled_dot_product_attention):
// softmax(q k^T * scale + mask) v, with an optional boolean or additive mask, causal masking and dropout on the
// attention weights. Where ops::sdpa_blocked says so (the CPU) it runs the blocked kernel of cpu/attention.hpp through
// ops/attention.hpp (no L x S matrix, forward or backward); on other devices, and as the reference the tests compare
// with, the composition of matmul, softmax and dropout (detail::sdpa_math).
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
#include "ember/ops/indexing.hpp"

namespace ember {

namespace detail {

/// The positions causal masking removes, (l, s) on `device`: true where key j is after query i (j > i).
inline Tensor<bool> future_mask(std::int64_t l, std::int64_t s, Device device) {
  return ops::triangle_mask(l, s, 1, false, device);  // j - i >= 1
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
    ops::SdpaGrads<T> d = ops::sdpa_backward(g, qq, kk, vv, oo, lse, bias, go);
    this->template deliver<T>(0, d.q.view(qs));
    this->template deliver<T>(1, d.k.view(ks));
    this->template deliver<T>(2, d.v.view(vs));
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
  static_assert(is_floating_v<T>, "scaled_dot_product_attention: floating-point tensors");
  ops::check_sdpa(q, k, v, o);
  if (!ops::sdpa_blocked(q.device())) return detail::sdpa_math(q, k, v, o);
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
    const int n = q.dim();
    const bool mixed = ops::sdpa_mixed_heads(k, v, o);
    const Tensor<T> kx = mixed ? detail::repeat_heads(k, q.shape()[n - 3] / k.shape()[n - 3]) : k;
    const Tensor<T> vx = mixed ? detail::repeat_heads(v, q.shape()[n - 3] / v.shape()[n - 3]) : v;
    ops::SdpaForward<T> f = ops::sdpa_forward(q, kx, vx, o);
    Shape os = q.shape();
    os[n - 1] = f.g.ev;
    Tensor<T> r = f.out.view(os);
    if ((q.requires_grad() || kx.requires_grad() || vx.requires_grad()) && is_grad_enabled()) {
      auto node = std::make_shared<autograd::SdpaNode<T>>();
      node->g = f.g;
      node->q = autograd::Saved<T>(f.q);
      node->k = autograd::Saved<T>(f.k);
      node->v = autograd::Saved<T>(f.v);
      node->out = autograd::Saved<T>(f.out);
      node->lse = f.lse;
      node->bias = f.bias;
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
