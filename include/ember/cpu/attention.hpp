// ember — the CPU kernel of scaled dot-product attention (ops/attention.hpp checks and prepares its operands),
// computed in blocks with an online softmax (the flash-attention scheme), so the (L x S) score matrix is never
// materialised: per query block, the scores of one key block at a time update a running row maximum, a running
// normaliser and the output accumulator. The forward saves only the output and one log-sum-exp per query row; the
// backward recomputes each score block from them. Memory beyond the inputs and outputs is O(L) per head plus a few
// blocks per thread.
//
// Layout: q (BH, L, E), k (BH / G, S, E), v (BH / G, S, Ev), contiguous, float or double, where G = kv_group is
// the number of consecutive query heads one key/value head serves (grouped-query attention; 1: one each). Within
// a batch the heads are consecutive, so batch-head b reads key/value head b / G. `bias`, when given, is an
// additive (L, S) score bias per batch-head (-inf masks a position out), with a batch stride of 0 when one bias
// serves every head. Causal masking keeps key j for query i when j <= i (PyTorch's top-left alignment). Dropout
// draws one Philox value per (head, query, key) from (seed, offset), so the backward regenerates the same mask.
// A query row whose keys are all masked out gets zeros (and zero gradients), not NaN.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/random.hpp"
#include "ember/cpu/gemm.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/expr/detail/fastmath.hpp"
#include "ember/profile/range.hpp"

namespace ember::cpu {

struct AttentionGeom {
  std::int64_t bh = 0, l = 0, s = 0, e = 0, ev = 0;
  double scale = 1;
  bool causal = false;
  double dropout_p = 0;
  std::uint64_t seed = 0, offset = 0;  // the dropout stream
  std::int64_t bias_batch_stride = 0;  // elements between two batch-heads' (L, S) biases (0: one bias for all)
  std::int64_t kv_group = 1;           // query heads per key/value head (bh is a multiple of it)
};

namespace detail {
inline constexpr std::int64_t kAttnBlockQ = 64;
inline constexpr std::int64_t kAttnBlockK = 64;

/// The dropout multipliers of positions (b, i, j0 .. j0 + n): `scale` where the position survives, 0 where it is
/// dropped; one Philox lane each, a block per four positions.
template <class T>
void attn_keep_row(const AttentionGeom& g, std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t n, T scale,
                   T* keep) {
  const std::uint64_t e0 =
      (std::uint64_t(b) * std::uint64_t(g.l) + std::uint64_t(i)) * std::uint64_t(g.s) + std::uint64_t(j0);
  constexpr std::int64_t kSpan = 64;  // positions per batch of Philox blocks
  std::uint32_t r[(kSpan / 4 + 1) * 4];
  for (std::int64_t k0 = 0; k0 < n; k0 += kSpan) {
    const std::int64_t m = std::min(kSpan, n - k0);
    const std::uint64_t first = (e0 + std::uint64_t(k0)) / 4, last = (e0 + std::uint64_t(k0 + m - 1)) / 4;
    Generator::blocks(g.seed, g.offset + first, last - first + 1, r);
    for (std::int64_t k = k0; k < k0 + m; ++k) {
      const std::uint64_t e = e0 + std::uint64_t(k);
      keep[k] = double(Generator::to_unit_float(r[(e / 4 - first) * 4 + e % 4])) >= g.dropout_p ? scale : T(0);
    }
  }
}

/// Scores of query rows [i0, i0 + bq) against keys [j0, j0 + bk) of head b into sc (bq x bk, row stride bk):
/// scale * q k^T + bias, with -inf at causally masked positions.
template <class T>
void attn_scores(const AttentionGeom& g, std::int64_t b, std::int64_t i0, std::int64_t bq, std::int64_t j0,
                 std::int64_t bk, const T* q, const T* k, const T* bias, T* sc) {
  detail::gemm_block<T, T>(bq, bk, g.e, {q + i0 * g.e, g.e, 1}, {k + j0 * g.e, 1, g.e}, sc, bk, false);
  const T scale = T(g.scale), ninf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r = 0; r < bq; ++r) {
    T* row = sc + r * bk;
    const T* br = bias ? bias + b * g.bias_batch_stride + (i0 + r) * g.s + j0 : nullptr;
    if (br)
      for (std::int64_t c = 0; c < bk; ++c) row[c] = row[c] * scale + br[c];
    else
      for (std::int64_t c = 0; c < bk; ++c) row[c] *= scale;
    if (g.causal)
      for (std::int64_t c = std::max<std::int64_t>(0, i0 + r - j0 + 1); c < bk; ++c) row[c] = ninf;
  }
}

/// exp over n values in place (fm::exp for float: vectorised in blocks of 16).
template <class T>
void attn_exp(T* x, std::int64_t n, T sub) {
  if constexpr (std::is_same_v<T, float>) {
    std::int64_t i = 0;
    for (; i + 16 <= n; i += 16)
      for (int u = 0; u < 16; ++u) x[i + u] = ember::detail::fm::exp(x[i + u] - sub);
    for (; i < n; ++i) x[i] = ember::detail::fm::exp(x[i] - sub);
  } else {
    for (std::int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - sub);
  }
}

/// Max and sum of n values in 16 independent lanes (a single running value would serialise on the add's latency;
/// the compiler may not reorder float sums itself).
template <class T>
T attn_row_max(const T* x, std::int64_t n, T init) {
  T lane[16];
  for (T& v : lane) v = init;
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int u = 0; u < 16; ++u) lane[u] = lane[u] > x[i + u] ? lane[u] : x[i + u];
  T m = init;
  for (T v : lane) m = m > v ? m : v;
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}
template <class T>
T attn_row_sum(const T* x, std::int64_t n) {
  T lane[16] = {};
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int u = 0; u < 16; ++u) lane[u] += x[i + u];
  T s = 0;
  for (T v : lane) s += v;
  for (; i < n; ++i) s += x[i];
  return s;
}
}  // namespace detail

/// Forward: out (BH, L, Ev) and lse (BH, L), the log-sum-exp of each query row's scores (+inf for a row with
/// every key masked, so the backward's exp(s - lse) gives 0 there).
template <class T>
void attention_forward(const AttentionGeom& g, const T* q, const T* k, const T* v, const T* bias, T* out, T* lse) {
  EMBER_PROFILE_RANGE("scaled_dot_product_attention");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "attention: float or double");
  using namespace detail;
  const std::int64_t nqb = (g.l + kAttnBlockQ - 1) / kAttnBlockQ;
  const T ninf = -std::numeric_limits<T>::infinity();
  const bool drop = g.dropout_p > 0;
  const T keep_scale = drop ? T(1.0 / (1.0 - g.dropout_p)) : T(1);
  parallel_for(0, g.bh * nqb, 1, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<T> sc(std::size_t(kAttnBlockQ * kAttnBlockK)), acc(std::size_t(kAttnBlockQ * g.ev));
    std::vector<T> m(static_cast<std::size_t>(kAttnBlockQ)), l(static_cast<std::size_t>(kAttnBlockQ));
    std::vector<T> keep(static_cast<std::size_t>(kAttnBlockK));
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t b = t / nqb, i0 = (t % nqb) * kAttnBlockQ, bq = std::min(kAttnBlockQ, g.l - i0);
      const T* qb = q + b * g.l * g.e;
      const T* kb = k + (b / g.kv_group) * g.s * g.e;
      const T* vb = v + (b / g.kv_group) * g.s * g.ev;
      std::fill(m.begin(), m.end(), ninf);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(acc.begin(), acc.end(), T(0));
      const std::int64_t s_end = g.causal ? std::min(g.s, i0 + bq) : g.s;  // keys past the last row's are masked
      for (std::int64_t j0 = 0; j0 < s_end; j0 += kAttnBlockK) {
        const std::int64_t bk = std::min(kAttnBlockK, g.s - j0);
        attn_scores(g, b, i0, bq, j0, bk, qb, kb, bias, sc.data());
        for (std::int64_t r = 0; r < bq; ++r) {
          T* row = sc.data() + r * bk;
          const T mx = attn_row_max(row, bk, m[std::size_t(r)]);
          if (mx == ninf) {  // nothing unmasked yet in this row
            std::fill(row, row + bk, T(0));
            continue;
          }
          const T alpha = m[std::size_t(r)] == ninf ? T(0) : T(std::exp(m[std::size_t(r)] - mx));
          attn_exp(row, bk, mx);
          l[std::size_t(r)] = l[std::size_t(r)] * alpha + attn_row_sum(row, bk);
          m[std::size_t(r)] = mx;
          if (alpha != T(1)) {
            T* a = acc.data() + r * g.ev;
            for (std::int64_t c = 0; c < g.ev; ++c) a[c] *= alpha;
          }
          if (drop) {
            attn_keep_row(g, b, i0 + r, j0, bk, keep_scale, keep.data());
            for (std::int64_t c = 0; c < bk; ++c) row[c] *= keep[std::size_t(c)];
          }
        }
        detail::gemm_block<T, T>(bq, g.ev, bk, {sc.data(), bk, 1}, {vb + j0 * g.ev, g.ev, 1}, acc.data(), g.ev,
                                      true);
      }
      for (std::int64_t r = 0; r < bq; ++r) {
        T* o = out + (b * g.l + i0 + r) * g.ev;
        const T lr = l[std::size_t(r)];
        const T inv = lr > 0 ? T(1) / lr : T(0);
        for (std::int64_t c = 0; c < g.ev; ++c) o[c] = acc[std::size_t(r * g.ev + c)] * inv;
        lse[b * g.l + i0 + r] = lr > 0 ? m[std::size_t(r)] + std::log(lr) : std::numeric_limits<T>::infinity();
      }
    }
  });
}

/// Backward: dq, dk, dv (the inputs' shapes) from dout, with out and lse from the forward. Parallel over key/value
/// heads; within one, key blocks outside, then the query heads it serves and their query blocks inside (dk and dv
/// of a key block stay in a thread's buffers, summed over the group's heads; dq accumulates in place).
template <class T>
void attention_backward(const AttentionGeom& g, const T* q, const T* k, const T* v, const T* bias, const T* out,
                        const T* lse, const T* dout, T* dq, T* dk, T* dv) {
  EMBER_PROFILE_RANGE("scaled_dot_product_attention_backward");
  using namespace detail;
  const bool drop = g.dropout_p > 0;
  const T keep_scale = drop ? T(1.0 / (1.0 - g.dropout_p)) : T(1);
  const T scale = T(g.scale);
  const std::int64_t G = g.kv_group;
  parallel_for(0, g.bh / G, 1, [&](std::int64_t h0, std::int64_t h1) {
    const std::int64_t BQ = kAttnBlockQ, BK = kAttnBlockK;
    std::vector<T> p(std::size_t(BQ * BK)), dp(std::size_t(BQ * BK)), dkb(std::size_t(BK * g.e)),
        dvb(std::size_t(BK * g.ev)), delta(std::size_t(G * g.l)), pd;
    std::vector<T> keep(static_cast<std::size_t>(BK));
    for (std::int64_t h = h0; h < h1; ++h) {
      const T* kb = k + h * g.s * g.e;
      const T* vb = v + h * g.s * g.ev;
      for (std::int64_t b = h * G; b < (h + 1) * G; ++b) {
        const T* ob = out + b * g.l * g.ev;
        const T* gb = dout + b * g.l * g.ev;
        std::fill(dq + b * g.l * g.e, dq + (b + 1) * g.l * g.e, T(0));
        for (std::int64_t i = 0; i < g.l; ++i) {  // rowsum(dout * out): the softmax backward's per-row term
          T s = 0;
          for (std::int64_t c = 0; c < g.ev; ++c) s += gb[i * g.ev + c] * ob[i * g.ev + c];
          delta[std::size_t((b - h * G) * g.l + i)] = s;
        }
      }
      for (std::int64_t j0 = 0; j0 < g.s; j0 += BK) {
        const std::int64_t bk = std::min(BK, g.s - j0);
        std::fill(dkb.begin(), dkb.end(), T(0));
        std::fill(dvb.begin(), dvb.end(), T(0));
        const std::int64_t i_begin = g.causal ? (j0 / BQ) * BQ : 0;  // query rows before j0 see none of these keys
        for (std::int64_t b = h * G; b < (h + 1) * G; ++b) {
          const T* qb = q + b * g.l * g.e;
          const T* gb = dout + b * g.l * g.ev;
          const T* lb = lse + b * g.l;
          const T* db = delta.data() + (b - h * G) * g.l;
          T* dqb = dq + b * g.l * g.e;
          for (std::int64_t i0 = i_begin; i0 < g.l; i0 += BQ) {
            const std::int64_t bq = std::min(BQ, g.l - i0);
            attn_scores(g, b, i0, bq, j0, bk, qb, kb, bias, p.data());
            for (std::int64_t r = 0; r < bq; ++r) attn_exp(p.data() + r * bk, bk, lb[i0 + r]);  // P = exp(s - lse)
            // dP = dout V^T (bq x bk)
            detail::gemm_block<T, T>(bq, bk, g.ev, {gb + i0 * g.ev, g.ev, 1}, {vb + j0 * g.ev, 1, g.ev},
                                          dp.data(), bk, false);
            if (drop) {
              // dV uses the dropped weights; dP passes back through the same mask.
              pd.assign(p.begin(), p.begin() + bq * bk);
              for (std::int64_t r = 0; r < bq; ++r) {
                attn_keep_row(g, b, i0 + r, j0, bk, keep_scale, keep.data());
                T* pr = pd.data() + r * bk;
                T* dr = dp.data() + r * bk;
                for (std::int64_t c = 0; c < bk; ++c) {
                  pr[c] *= keep[std::size_t(c)];
                  dr[c] *= keep[std::size_t(c)];
                }
              }
              detail::gemm_block<T, T>(bk, g.ev, bq, {pd.data(), 1, bk}, {gb + i0 * g.ev, g.ev, 1}, dvb.data(),
                                            g.ev, true);
            } else {
              // dV += P^T dout
              detail::gemm_block<T, T>(bk, g.ev, bq, {p.data(), 1, bk}, {gb + i0 * g.ev, g.ev, 1}, dvb.data(),
                                            g.ev, true);
            }
            // dS = P (dP - delta) * scale, in p
            for (std::int64_t r = 0; r < bq; ++r) {
              T* pr = p.data() + r * bk;
              const T* dr = dp.data() + r * bk;
              const T dl = db[i0 + r];
              for (std::int64_t c = 0; c < bk; ++c) pr[c] = pr[c] * (dr[c] - dl) * scale;
            }
            // dQ += dS K ; dK += dS^T Q
            detail::gemm_block<T, T>(bq, g.e, bk, {p.data(), bk, 1}, {kb + j0 * g.e, g.e, 1}, dqb + i0 * g.e,
                                          g.e, true);
            detail::gemm_block<T, T>(bk, g.e, bq, {p.data(), 1, bk}, {qb + i0 * g.e, g.e, 1}, dkb.data(), g.e,
                                          true);
          }
        }
        std::copy(dkb.begin(), dkb.begin() + bk * g.e, dk + (h * g.s + j0) * g.e);
        std::copy(dvb.begin(), dvb.begin() + bk * g.ev, dv + (h * g.s + j0) * g.ev);
      }
    }
  });
}

/// The additive score bias of n mask values: 0 where a boolean mask keeps the position and -inf where it does not,
/// or an additive mask's values themselves.
template <class T, class M>
void attention_bias(const M* mask, std::int64_t n, T* bias) {
  const T ninf = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<M, bool>) bias[i] = mask[i] ? T(0) : ninf;
    else bias[i] = T(mask[i]);
  }
}

}  // namespace ember::cpu
