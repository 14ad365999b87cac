// ember — attention layers: nn::MultiheadAttention and nn::TransformerEncoderLayer, with torch.nn's parameter
// names, layouts, initialisation and mask conventions (so state dicts move between the two), and
// nn::functional::scaled_dot_product_attention.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ember/amp/policy.hpp"
#include "ember/autograd/attention.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/manip.hpp"
#include "ember/autograd/softmax.hpp"
#include "ember/core/creation.hpp"
#include "ember/nn/detail/policy_cast.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/normalization.hpp"

namespace ember::nn {

namespace functional {
using ember::scaled_dot_product_attention;
}  // namespace functional

/// What MultiheadAttention returns: the output and, with need_weights, the attention weights.
template <class T>
struct AttentionOutput {
  Tensor<T> output;   ///< (N, L, E) batch_first, else (L, N, E); (L, E) for an unbatched input
  Tensor<T> weights;  ///< (N, L, S) averaged over heads, or (N, H, L, S); undefined unless need_weights
};

/// The per-call options of MultiheadAttention::forward after (query, key, value): the keyword arguments of
/// torch.nn.MultiheadAttention.forward, with its names and in its order. A mask is a Tensor<bool> or an additive
/// Tensor<T> (either converts to AttnMask); the default, an undefined mask, is PyTorch's None.
template <class T>
struct MhaForwardOptions {
  /// (N, S), with N = 1 for an unbatched query: true (bool) or -inf (additive) marks a key to ignore.
  AttnMask<T> key_padding_mask{};
  /// Also return the attention weights (AttentionOutput::weights); false runs the heads through
  /// scaled_dot_product_attention without materialising the weights (faster, less memory).
  bool need_weights = true;
  /// (L, S) or (N * num_heads, L, S): true (bool) marks a position NOT allowed to attend, or additive.
  /// This is torch.nn's convention, the opposite of scaled_dot_product_attention's boolean masks.
  AttnMask<T> attn_mask{};
  /// With need_weights: the weights averaged over the heads, (N, L, S); false: per head, (N, num_heads, L, S).
  bool average_attn_weights = true;
  /// Causal masking (query i attends to key j only when j <= i), with or without attn_mask and key_padding_mask.
  /// PyTorch's is_causal is only a hint that attn_mask is the causal mask, and it requires one.
  bool is_causal = false;
};

/// The options of nn::MultiheadAttention after (embed_dim, num_heads), in torch.nn.MultiheadAttention's order
/// (its add_zero_attn is not supported):
///   nn::MultiheadAttention mha(64, 8, {.dropout = 0.1, .batch_first = true});
struct MultiheadAttentionOptions {
  double dropout = 0.0;      ///< probability of zeroing an attention weight, in training; in [0, 1)
  bool bias = true;          ///< learn in_proj_bias and out_proj.bias
  bool add_bias_kv = false;  ///< learned bias_k, bias_v (1, 1, E) appended to the keys and values as one more position
  std::int64_t kdim = 0;     ///< the key's features; 0: embed_dim (PyTorch: kdim=None)
  std::int64_t vdim = 0;     ///< the value's features; 0: embed_dim (PyTorch: vdim=None)
  bool batch_first = false;  ///< inputs and outputs (N, L, E) instead of (L, N, E)
};

/// torch.nn.MultiheadAttention (embed_dim, num_heads): in_proj_weight (3E, E) and in_proj_bias (3E) project q, k, v
/// (with kdim or vdim other than embed_dim: q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim)
/// instead of in_proj_weight, as PyTorch); out_proj is a Linear. add_bias_kv appends bias_k / bias_v to the
/// projected keys and values (the masks get a column that keeps it). Without need_weights the heads run through
/// scaled_dot_product_attention (blocked on the CPU); with it the weights are materialised, as PyTorch does.
template <amp::PrecisionPolicy P = amp::fp32>
class MultiheadAttentionT : public Module {
 public:
  using param_t = typename P::param_t;      ///< The parameters' dtype (the precision policy's master weights).
  using compute_t = typename P::compute_t;  ///< The inputs' and outputs' dtype.

  /// nn.MultiheadAttention(embed_dim, num_heads, ...): embed_dim must be a positive multiple of num_heads. The
  /// projections are Xavier-uniform initialised and the biases zero, as in PyTorch.
  MultiheadAttentionT(std::int64_t embed_dim, std::int64_t num_heads, const MultiheadAttentionOptions& o)
      : Module("MultiheadAttention"), embed_dim(embed_dim), num_heads(num_heads), dropout(o.dropout),
        batch_first(o.batch_first), kdim(o.kdim > 0 ? o.kdim : embed_dim), vdim(o.vdim > 0 ? o.vdim : embed_dim),
        out_proj(embed_dim, embed_dim, o.bias) {
    EMBER_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, "nn::MultiheadAttention: embed_dim (",
                embed_dim, ") must be a positive multiple of num_heads (", num_heads, ")");
    EMBER_CHECK(o.dropout >= 0 && o.dropout < 1, "nn::MultiheadAttention: dropout must be in [0, 1), got ", o.dropout);
    EMBER_CHECK(o.kdim >= 0 && o.vdim >= 0, "nn::MultiheadAttention: kdim (", o.kdim, ") and vdim (", o.vdim,
                ") must be positive (or 0 for embed_dim)");
    if (kdim == embed_dim && vdim == embed_dim) {
      in_proj_weight = empty<param_t>(Shape{3 * embed_dim, embed_dim});
      init::xavier_uniform_(in_proj_weight);
      register_parameter("in_proj_weight", in_proj_weight);
    } else {
      q_proj_weight = empty<param_t>(Shape{embed_dim, embed_dim});
      k_proj_weight = empty<param_t>(Shape{embed_dim, kdim});
      v_proj_weight = empty<param_t>(Shape{embed_dim, vdim});
      for (Tensor<param_t>* w : {&q_proj_weight, &k_proj_weight, &v_proj_weight}) init::xavier_uniform_(*w);
      register_parameter("q_proj_weight", q_proj_weight);
      register_parameter("k_proj_weight", k_proj_weight);
      register_parameter("v_proj_weight", v_proj_weight);
    }
    if (o.bias) {
      in_proj_bias = zeros<param_t>(Shape{3 * embed_dim});
      register_parameter("in_proj_bias", in_proj_bias);
      init::zeros_(out_proj.bias);
    }
    if (o.add_bias_kv) {
      bias_k = empty<param_t>(Shape{1, 1, embed_dim});
      bias_v = empty<param_t>(Shape{1, 1, embed_dim});
      init::xavier_normal_(bias_k);
      init::xavier_normal_(bias_v);
      register_parameter("bias_k", bias_k);
      register_parameter("bias_v", bias_v);
    }
    register_module("out_proj", out_proj);
    const std::int64_t kd = kdim, vd = vdim;
    const bool bf = o.batch_first;
    set_extra_repr([embed_dim, num_heads, bf, kd, vd]() EMBER_COLD {
      std::string r = "embed_dim=" + std::to_string(embed_dim) + ", num_heads=" + std::to_string(num_heads);
      if (kd != embed_dim || vd != embed_dim) r += ", kdim=" + std::to_string(kd) + ", vdim=" + std::to_string(vd);
      return r + ", batch_first=" + (bf ? "True" : "False");
    });
  }
  /// The positional form of the commonest options: MultiheadAttention(embed_dim, num_heads, dropout, bias,
  /// batch_first).
  MultiheadAttentionT(std::int64_t embed_dim, std::int64_t num_heads, double dropout = 0.0, bool bias = true,
                      bool batch_first = false)
      : MultiheadAttentionT(embed_dim, num_heads,
                            MultiheadAttentionOptions{.dropout = dropout, .bias = bias, .batch_first = batch_first}) {}

  /// Attention of `query` (L, N, E) over `key` (S, N, kdim) and `value` (S, N, vdim); (N, L, E) and (N, S, ...)
  /// with batch_first, or unbatched (L, E), (S, kdim), (S, vdim). Returns the output and, with o.need_weights
  /// (the default, as PyTorch's), the attention weights. As nn.MultiheadAttention.forward.
  AttentionOutput<compute_t> forward(const Tensor<compute_t>& query, const Tensor<compute_t>& key,
                                     const Tensor<compute_t>& value, const MhaForwardOptions<compute_t>& o = {}) const {
    using T = compute_t;
    const char* op = "nn::MultiheadAttention";
    EMBER_CHECK(query.dim() == 2 || query.dim() == 3, op, ": expected a 2-D (unbatched) or 3-D query, got shape ",
                query.shape().str());
    EMBER_CHECK(key.dim() == query.dim() && value.dim() == query.dim(), op, ": query ", query.shape().str(), ", key ",
                key.shape().str(), " and value ", value.shape().str(), " must have the same number of dims");
    const bool unbatched = query.dim() == 2;
    // (N, L, E) views of the inputs.
    auto nle = [&](const Tensor<T>& x) {
      if (unbatched) return x.unsqueeze(0);
      return batch_first ? x : x.transpose(0, 1);
    };
    const Tensor<T> qi = nle(query), ki = nle(key), vi = nle(value);
    const std::int64_t n = qi.shape()[0], l = qi.shape()[1], s = ki.shape()[1], e = embed_dim, h = num_heads;
    EMBER_CHECK(qi.shape()[2] == e && ki.shape()[2] == kdim && vi.shape()[2] == vdim, op, ": the inputs' feature ",
                "dims must be embed_dim = ", e, " (query), kdim = ", kdim, " (key) and vdim = ", vdim, " (value); got ",
                "query ", query.shape().str(), ", key ", key.shape().str(), ", value ", value.shape().str());
    EMBER_CHECK(ki.shape()[0] == n && vi.shape()[0] == n && vi.shape()[1] == s, op, ": query ", query.shape().str(),
                ", key ", key.shape().str(), " and value ", value.shape().str(), " disagree on batch or sequence size");
    const Tensor<T> b = in_proj_bias.defined() ? detail::to_compute<T>(in_proj_bias) : Tensor<T>();
    auto part = [&](int i) { return b.defined() ? b.narrow(0, i * e, e) : Tensor<T>(); };
    Tensor<T> q, k, v;
    if (!in_proj_weight.defined()) {  // separate projections (kdim / vdim)
      q = linear(qi, detail::to_compute<T>(q_proj_weight), part(0));
      k = linear(ki, detail::to_compute<T>(k_proj_weight), part(1));
      v = linear(vi, detail::to_compute<T>(v_proj_weight), part(2));
    } else if (query.same_impl(key) && key.same_impl(value)) {  // self-attention: one projection GEMM
      auto qkv = chunk(linear(qi, detail::to_compute<T>(in_proj_weight), b), 3, -1);
      q = qkv[0], k = qkv[1], v = qkv[2];
    } else {
      const Tensor<T> w = detail::to_compute<T>(in_proj_weight);
      q = linear(qi, w.narrow(0, 0, e), part(0));
      k = linear(ki, w.narrow(0, e, e), part(1));
      v = linear(vi, w.narrow(0, 2 * e, e), part(2));
    }
    if (bias_k.defined()) {  // one more key and value position, (N, S + 1, E)
      k = cat(std::vector<Tensor<T>>{k, detail::to_compute<T>(bias_k).expand({n, 1, e})}, 1);
      v = cat(std::vector<Tensor<T>>{v, detail::to_compute<T>(bias_v).expand({n, 1, e})}, 1);
    }
    const std::int64_t s_kv = bias_k.defined() ? s + 1 : s;
    // (N, L, E) -> (N, H, L, Dh)
    auto heads = [&](const Tensor<T>& x, std::int64_t len) { return x.reshape({n, len, h, e / h}).transpose(1, 2); };
    q = heads(q, l), k = heads(k, s_kv), v = heads(v, s_kv);
    // Every mask as one additive bias, (N, H or 1, L, S) or (L, S).
    const double ninf = -std::numeric_limits<double>::infinity();
    Tensor<T> bias;
    if (o.attn_mask.defined()) {
      const Shape ms = o.attn_mask.keep.defined() ? o.attn_mask.keep.shape() : o.attn_mask.add.shape();
      EMBER_CHECK((ms.n == 2 && ms[0] == l && ms[1] == s) || (ms.n == 3 && ms[0] == n * h && ms[1] == l && ms[2] == s),
                  op, ": attn_mask must be (L, S) = (", l, ", ", s, ") or (N * num_heads, L, S) = (", n * h, ", ", l,
                  ", ", s, "), got ", ms.str());
      bias = o.attn_mask.keep.defined() ? masked_fill(zeros<T>(ms, query.device()), o.attn_mask.keep, ninf)
                                        : o.attn_mask.add;
      if (ms.n == 3) bias = bias.reshape({n, h, l, s});
    }
    if (o.key_padding_mask.defined()) {
      const Shape ks = o.key_padding_mask.keep.defined() ? o.key_padding_mask.keep.shape()
                                                         : o.key_padding_mask.add.shape();
      EMBER_CHECK(ks.n == 2 && ks[0] == n && ks[1] == s, op, ": key_padding_mask must be (N, S) = (", n, ", ", s,
                  "), got ", ks.str());
      Tensor<T> kp = o.key_padding_mask.keep.defined()
                         ? masked_fill(zeros<T>(ks, query.device()), o.key_padding_mask.keep, ninf)
                         : o.key_padding_mask.add;
      kp = kp.reshape({n, 1, 1, s});
      bias = bias.defined() ? Tensor<T>(bias + kp) : kp;
    }
    if (o.is_causal && (bias.defined() || bias_k.defined()))  // folded into the bias with the other masks
      bias = masked_fill(bias.defined() ? Tensor<T>(bias + zeros<T>(Shape{l, s}, query.device()))
                                        : zeros<T>(Shape{l, s}, query.device()),
                         ember::detail::future_mask(l, s, query.device()), ninf);
    const bool causal_flag = o.is_causal && !bias.defined();
    if (bias_k.defined() && bias.defined()) {  // every query may attend to the appended position
      Shape one = bias.shape();
      one[one.n - 1] = 1;
      bias = cat(std::vector<Tensor<T>>{bias, zeros<T>(one, query.device())}, -1);
    }
    const double p = is_training() ? dropout : 0.0;
    AttentionOutput<T> r;
    Tensor<T> att;  // (N, H, L, Dh)
    if (o.need_weights) {
      Tensor<T> sc = Tensor<T>(matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(e / h))));
      if (bias.defined()) sc = Tensor<T>(sc + bias);
      if (causal_flag) sc = masked_fill(sc, ember::detail::future_mask(l, s, query.device()), ninf);
      Tensor<T> wts = softmax(sc, -1);
      if (p > 0) wts = functional::dropout(wts, p, true);
      att = matmul(wts, v);
      r.weights = o.average_attn_weights ? Tensor<T>(mean(wts, 1)) : wts;
      if (unbatched) r.weights = r.weights.squeeze(0);
    } else {
      SdpaOptions<T> so;
      so.is_causal = causal_flag;
      so.dropout_p = p;
      if (bias.defined()) so.attn_mask = bias;
      att = scaled_dot_product_attention(q, k, v, so);
    }
    Tensor<T> y = out_proj(att.transpose(1, 2).reshape({n, l, e}));
    if (unbatched) y = y.squeeze(0);
    else if (!batch_first) y = y.transpose(0, 1);
    r.output = y;
    return r;
  }
  /// forward(query, key, value, o).
  AttentionOutput<compute_t> operator()(const Tensor<compute_t>& query, const Tensor<compute_t>& key,
                                        const Tensor<compute_t>& value,
                                        const MhaForwardOptions<compute_t>& o = {}) const {
    return forward(query, key, value, o);
  }

  ///@{
  /// The model width E and the number of heads (E / num_heads features per head).
  std::int64_t embed_dim, num_heads;
  ///@}
  double dropout;    ///< The attention weights' dropout probability (in training).
  bool batch_first;  ///< Inputs and outputs (N, L, E) instead of (L, N, E).
  ///@{
  /// The key's and value's features (embed_dim unless the options set them).
  std::int64_t kdim, vdim;
  ///@}
  Tensor<param_t> in_proj_weight;  ///< (3E, E): q, k and v's projections stacked; undefined with kdim/vdim != E.
  ///@{
  /// (E, E), (E, kdim), (E, vdim): the separate projections, used instead of in_proj_weight when kdim/vdim != E.
  Tensor<param_t> q_proj_weight, k_proj_weight, v_proj_weight;  // (E, E), (E, kdim), (E, vdim); with kdim/vdim != E
  ///@}
  Tensor<param_t> in_proj_bias;  ///< (3E): the projections' bias; undefined without bias.
  ///@{
  /// (1, 1, E): the key and value positions appended with add_bias_kv; undefined otherwise.
  Tensor<param_t> bias_k, bias_v;                               // (1, 1, E) with add_bias_kv, else undefined
  ///@}
  LinearT<P> out_proj;  ///< The output projection (E -> E).
};
using MultiheadAttention = MultiheadAttentionT<>;

/// The feed-forward activation of a transformer layer: ember::Activation (PyTorch's choices are relu and gelu; the
/// others apply as well).
using TransformerActivation = Activation;

/// The options of nn::TransformerEncoderLayer after (d_model, nhead), in torch.nn.TransformerEncoderLayer's order
/// and with its names:
///   nn::TransformerEncoderLayer layer(256, 4, {.dim_feedforward = 1024, .batch_first = true, .norm_first = true});
struct TransformerEncoderLayerOptions {
  std::int64_t dim_feedforward = 2048;  ///< the feed-forward block's hidden width (linear1's output features)
  double dropout = 0.1;                 ///< in the attention, after the activation and on both residual branches
  TransformerActivation activation = TransformerActivation::relu;  ///< of the feed-forward block
  double layer_norm_eps = 1e-5;         ///< eps of norm1 and norm2
  bool batch_first = false;             ///< src (N, S, E) instead of (S, N, E)
  bool norm_first = false;  ///< pre-norm (x + sa(norm1(x))) instead of post-norm (norm1(x + sa(x)))
  bool bias = true;  ///< false: no bias in the linear layers, the attention's projections or the LayerNorms
};

/// torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block (linear1 -> activation -> dropout ->
/// linear2), each with dropout, a residual connection and LayerNorm, post-norm (PyTorch's default) or pre-norm.
template <amp::PrecisionPolicy P = amp::fp32>
class TransformerEncoderLayerT : public Module {
 public:
  using compute_t = typename P::compute_t;  ///< The inputs' and outputs' dtype.

  /// nn.TransformerEncoderLayer(d_model, nhead, ...): d_model must be a positive multiple of nhead.
  TransformerEncoderLayerT(std::int64_t d_model, std::int64_t nhead, const TransformerEncoderLayerOptions& o = {})
      : Module("TransformerEncoderLayer"), options(o),
        self_attn(d_model, nhead, o.dropout, o.bias, o.batch_first),
        linear1(d_model, o.dim_feedforward, o.bias), dropout(o.dropout), linear2(o.dim_feedforward, d_model, o.bias),
        norm1(Shape{d_model}, o.layer_norm_eps, true, o.bias), norm2(Shape{d_model}, o.layer_norm_eps, true, o.bias),
        dropout1(o.dropout), dropout2(o.dropout) {
    register_module("self_attn", self_attn);
    register_module("linear1", linear1);
    register_module("dropout", dropout);
    register_module("linear2", linear2);
    register_module("norm1", norm1);
    register_module("norm2", norm2);
    register_module("dropout1", dropout1);
    register_module("dropout2", dropout2);
  }

  /// src (S, N, E), (N, S, E) with batch_first, or (S, E); masks as MultiheadAttention's.
  Tensor<compute_t> forward(const Tensor<compute_t>& src, const AttnMask<compute_t>& src_mask = {},
                            const AttnMask<compute_t>& src_key_padding_mask = {}, bool is_causal = false) const {
    using T = compute_t;
    auto sa = [&](const Tensor<T>& x) {
      MhaForwardOptions<T> mo;
      mo.attn_mask = src_mask;
      mo.key_padding_mask = src_key_padding_mask;
      mo.need_weights = false;
      mo.is_causal = is_causal;
      return dropout1(self_attn(x, x, x, mo).output);
    };
    auto ff = [&](const Tensor<T>& x) {
      return dropout2(linear2(dropout(linear1.forward(x, options.activation))));
    };
    Tensor<T> x = src;
    if (options.norm_first) {
      x = Tensor<T>(x + sa(norm1(x)));
      x = Tensor<T>(x + ff(norm2(x)));
    } else {
      x = norm1(Tensor<T>(x + sa(x)));
      x = norm2(Tensor<T>(x + ff(x)));
    }
    return x;
  }
  /// forward(src, src_mask, src_key_padding_mask, is_causal).
  Tensor<compute_t> operator()(const Tensor<compute_t>& src, const AttnMask<compute_t>& src_mask = {},
                               const AttnMask<compute_t>& src_key_padding_mask = {}, bool is_causal = false) const {
    return forward(src, src_mask, src_key_padding_mask, is_causal);
  }

  TransformerEncoderLayerOptions options;  ///< The options the layer was built with.
  MultiheadAttentionT<P> self_attn;        ///< The self-attention block.
  LinearT<P> linear1;                      ///< The feed-forward block's first layer (d_model -> dim_feedforward).
  Dropout dropout;                         ///< After the feed-forward activation.
  LinearT<P> linear2;                      ///< The feed-forward block's second layer (dim_feedforward -> d_model).
  ///@{
  /// The LayerNorms of the attention block (norm1) and the feed-forward block (norm2).
  LayerNormT<P> norm1, norm2;
  ///@}
  ///@{
  /// The dropouts on the attention's (dropout1) and the feed-forward block's (dropout2) residual branches.
  Dropout dropout1, dropout2;
  ///@}
};
using TransformerEncoderLayer = TransformerEncoderLayerT<>;

}  // namespace ember::nn
