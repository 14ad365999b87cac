// ember — scaled dot-product attention without autograd: the options, the argument checks, the choice between the
// blocked kernel of cpu/attention.hpp and the composition of differentiable ops (autograd/attention.hpp), and the
// kernel's operands: the (BH, L, E) views of q, k and v, the mask as an additive score bias, the dropout stream.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/cpu/attention.hpp"

namespace ember {

/// An attention mask: boolean (true: the position takes part, as PyTorch's SDPA) or additive (added to the scores;
/// -inf masks out). Either converts implicitly, so `.attn_mask = mask` takes both. Broadcastable to (..., L, S).
template <class T>
struct AttnMask {
  Tensor<bool> keep;  ///< A boolean mask (true: attend), or undefined.
  Tensor<T> add;      ///< An additive mask, or undefined.
  AttnMask() = default;  ///< No mask (PyTorch's None).
  /// A boolean mask.
  AttnMask(Tensor<bool> m) : keep(std::move(m)) {}  // NOLINT: implicit on purpose
  /// An additive mask.
  AttnMask(Tensor<T> m) : add(std::move(m)) {}      // NOLINT
  /// Whether there is a mask.
  bool defined() const { return keep.defined() || add.defined(); }
};

/// The options of scaled_dot_product_attention after (q, k, v), torch.nn.functional.scaled_dot_product_attention's
/// keyword arguments (is_causal comes before dropout_p here; generator is ember's):
///   auto out = scaled_dot_product_attention(q, k, v, {.is_causal = true, .dropout_p = 0.1});
template <class T>
struct SdpaOptions {
  /// Broadcastable to (..., L, S): boolean (true: the key takes part) or additive (added to the scores, -inf masks
  /// out); undefined: no mask. It gets no gradient.
  AttnMask<T> attn_mask{};
  bool is_causal = false;  ///< key j takes part for query i when j <= i (no attn_mask with it, as PyTorch)
  /// The probability of zeroing an attention weight, in [0, 1); always applied when > 0, as the functional form
  /// (no training flag).
  double dropout_p = 0;
  std::optional<double> scale{};  ///< the scores' factor, finite; unset: 1 / sqrt(E) (PyTorch: scale=None)
  /// Grouped-query attention: k and v may have fewer heads (dim -3) than q, each dividing q's; key/value head h
  /// serves the q/kv consecutive query heads from h * (Hq / Hkv) on, as torch's repeat_interleave of k and v.
  bool enable_gqa = false;
  Generator* generator = nullptr;  ///< the dropout's stream; nullptr: the default generator (not in PyTorch)
};

namespace ops {

using AttentionGeom = cpu::AttentionGeom;

/// Checks scaled_dot_product_attention's arguments (shapes, devices, options).
template <class T>
void check_sdpa(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const SdpaOptions<T>& o) {
  const char* op = "scaled_dot_product_attention";
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
}

/// Whether attention on tensors of this device runs the blocked kernel (the CPU; half and bfloat16 through float);
/// elsewhere it is the composition of matmul, softmax and dropout.
inline bool sdpa_blocked(Device d) { return d.is_cpu(); }

/// With enable_gqa, k and v with different head counts: the kernel reads one group size, so both are repeated to
/// q's heads first.
template <class T>
bool sdpa_mixed_heads(const Tensor<T>& k, const Tensor<T>& v, const SdpaOptions<T>& o) {
  const int n = k.dim();
  return o.enable_gqa && k.shape()[n - 3] != v.shape()[n - 3];
}

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
  auto fill = [&](const auto& src) {
    // src expanded to `full` (leading size-1 dims of a batch-shared mask dropped), read through its strides
    auto e = src.reshape(Shape(ms.end() - std::min(ms.n, full.n), ms.end())).expand(full).contiguous();
    cpu::attention_bias(e.data(), bias.numel(), bias.data());
  };
  if (m.keep.defined()) fill(m.keep.cpu());
  else fill(m.add.detach().cpu());
  return bias;
}
}  // namespace detail

/// What the blocked forward computed and its backward needs: the geometry, the kernel's (BH, L, E) operands, the
/// output (BH, L, Ev), the log-sum-exp of each query row (BH, L) and the mask's bias (or undefined).
template <class T>
struct SdpaForward {
  AttentionGeom g;  ///< The geometry.
  ///@{
  /// The (BH, L, E) operands, the output, the row log-sum-exps and the mask's bias (see above).
  Tensor<T> q, k, v, out, lse, bias;
  ///@}
};

/// The blocked forward (CPU; float or double): q (..., L, E), k (..., S, E) and v (..., S, Ev) checked by check_sdpa,
/// k and v with q's heads or, with enable_gqa and !sdpa_mixed_heads, fewer. The output is out viewed as (..., L, Ev).
template <class T>
SdpaForward<T> sdpa_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const SdpaOptions<T>& o) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "sdpa_forward: float or double");
  const char* op = "scaled_dot_product_attention";
  const int n = q.dim();
  SdpaForward<T> f;
  AttentionGeom& g = f.g;
  g.l = q.shape()[n - 2];
  g.s = k.shape()[n - 2];
  g.e = q.shape()[n - 1];
  g.ev = v.shape()[n - 1];
  g.bh = 1;
  std::int64_t bkv = 1;  // key/value batch-heads
  for (int d = 0; d < n - 2; ++d) {
    g.bh *= q.shape()[d];
    bkv *= k.shape()[d];
  }
  if (o.enable_gqa && !sdpa_mixed_heads(k, v, o) && k.shape()[n - 3] > 0)
    g.kv_group = std::max<std::int64_t>(1, q.shape()[n - 3] / k.shape()[n - 3]);
  g.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(g.e));
  g.causal = o.is_causal;
  g.dropout_p = o.dropout_p;
  Shape target = q.shape();
  target[n - 1] = g.s;
  if (o.attn_mask.defined()) f.bias = detail::sdpa_bias(o.attn_mask, target, g.bias_batch_stride, op);
  if (g.dropout_p > 0) {
    Generator& gen = o.generator ? *o.generator : default_generator();
    const std::uint64_t elems = std::uint64_t(g.bh) * std::uint64_t(g.l) * std::uint64_t(g.s);
    g.seed = gen.seed();
    g.offset = gen.reserve((elems + 3) / 4);
  }
  f.q = q.detach().contiguous().view({g.bh, g.l, g.e});
  f.k = k.detach().contiguous().view({bkv, g.s, g.e});
  f.v = v.detach().contiguous().view({bkv, g.s, g.ev});
  f.out = empty<T>(Shape{g.bh, g.l, g.ev});
  f.lse = empty<T>(Shape{g.bh, g.l});
  if (g.bh * g.l * g.ev > 0)
    cpu::attention_forward<T>(g, f.q.data(), f.k.data(), f.v.data(), f.bias.defined() ? f.bias.data() : nullptr,
                              f.out.data(), f.lse.data());
  return f;
}

/// The gradients of the blocked attention's q, k and v.
template <class T>
struct SdpaGrads {
  ///@{
  /// The gradients of q, k and v, in the shapes of the forward's kernel operands.
  Tensor<T> q, k, v;  // the shapes of the forward's kernel operands
  ///@}
};

/// The blocked backward from the forward's operands (q, k, v, out: (BH, L, E), (BH / G, S, E), (BH / G, S, Ev),
/// (BH, L, Ev), contiguous), its lse and bias, and the output's gradient go (BH, L, Ev).
template <class T>
SdpaGrads<T> sdpa_backward(const AttentionGeom& g, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                           const Tensor<T>& out, const Tensor<T>& lse, const Tensor<T>& bias, const Tensor<T>& go) {
  SdpaGrads<T> r;
  r.q = empty<T>(q.shape());
  r.k = empty<T>(k.shape());
  r.v = empty<T>(v.shape());
  if (g.bh == 0) {  // no query heads: the kernel visits no key/value head
    r.k = zeros<T>(k.shape());
    r.v = zeros<T>(v.shape());
  }
  cpu::attention_backward<T>(g, q.data(), k.data(), v.data(), bias.defined() ? bias.data() : nullptr, out.data(),
                             lse.data(), go.data(), r.q.data(), r.k.data(), r.v.data());
  return r;
}

}  // namespace ops

}  // namespace ember
