// ember — CPU sort, scan and sampling loops along a dim of a contiguous host tensor: the stable sort (and its first k
// positions, for topk), cumsum and cumprod with their backward, and multinomial sampling from Philox draws.
// ops/indexing.hpp checks the arguments and dispatches.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/random.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"

namespace ember::cpu {

/// The split of a shape at dim d into outer x n x inner (a contiguous tensor's rows along d are at
/// o * n * inner + j * inner + i).
struct DimSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline DimSplit dim_split(const Shape& s, int d) {
  DimSplit r;
  for (int k = 0; k < d; ++k) r.outer *= s[k];
  r.n = s[d];
  for (int k = d + 1; k < s.n; ++k) r.inner *= s[k];
  return r;
}

namespace detail {
/// NaN sorts above every number, as in PyTorch.
template <class T>
bool sort_less(T a, T b) {
  if constexpr (is_floating_v<T>) {
    const double x = double(a), y = double(b);
    if (std::isnan(x)) return false;
    if (std::isnan(y)) return true;
    return x < y;
  } else {
    return a < b;
  }
}
}  // namespace detail

/// The first k positions (along d) of each row of the contiguous tensor c in sorted order, stable (ties keep their
/// order); NaN sorts above every number.
template <class T>
Tensor<std::int64_t> sort_indices(const Tensor<T>& c, int d, std::int64_t k, bool descending) {
  const auto s = dim_split(c.shape(), d);
  Shape os = c.shape();
  os[d] = k;
  Tensor<std::int64_t> r = empty<std::int64_t>(os);
  std::vector<std::int64_t> order(std::size_t(s.n));
  const T* p = c.data();
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const T* row = p + o * s.n * s.inner + i;
      std::iota(order.begin(), order.end(), std::int64_t(0));
      auto cmp = [&](std::int64_t a, std::int64_t b) {
        return descending ? detail::sort_less(row[b * s.inner], row[a * s.inner]) : detail::sort_less(row[a * s.inner], row[b * s.inner]);
      };
      if (k < s.n) {
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int64_t a, std::int64_t b) {
          return cmp(a, b) || (!cmp(b, a) && a < b);  // ties by position: the same as the stable sort
        });
      } else {
        std::stable_sort(order.begin(), order.end(), cmp);
      }
      std::int64_t* out = r.data() + o * k * s.inner + i;
      for (std::int64_t j = 0; j < k; ++j) out[j * s.inner] = order[std::size_t(j)];
    }
  return r;
}

/// Running sums (prod: products) along d of the contiguous tensor c, accumulated in double for floating types and
/// int64 for integers (PyTorch's CPU accumulation types).
template <class T>
Tensor<T> cumulative(const Tensor<T>& c, int d, bool prod) {
  const auto s = dim_split(c.shape(), d);
  Tensor<T> r = empty<T>(c.shape());
  using Acc = std::conditional_t<is_floating_v<T>, double, std::int64_t>;  // PyTorch's CPU accumulation types
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const std::int64_t base = o * s.n * s.inner + i;
      Acc acc = prod ? Acc(1) : Acc(0);
      for (std::int64_t j = 0; j < s.n; ++j) {
        const Acc v = Acc(c.data()[base + j * s.inner]);
        acc = prod ? Acc(acc * v) : Acc(acc + v);
        r.data()[base + j * s.inner] = T(acc);
      }
    }
  return r;
}

/// The gradient of cumsum (prod: cumprod, from its contiguous input x and output y) along dim for the contiguous
/// gradient g.
template <class T>
Tensor<T> cumulative_backward(const Tensor<T>& g, const Tensor<T>& x, const Tensor<T>& y, int dim, bool prod) {
  const auto s = dim_split(g.shape(), dim);
  Tensor<T> gx = empty<T>(g.shape());
  const T* gp = g.data();
  T* op = gx.data();
  for (std::int64_t o = 0; o < s.outer; ++o)
    for (std::int64_t i = 0; i < s.inner; ++i) {
      const std::int64_t base = o * s.n * s.inner + i;
      auto at = [&](std::int64_t j) { return base + j * s.inner; };
      if (!prod) {  // a reversed cumulative sum
        double acc = 0;
        for (std::int64_t j = s.n - 1; j >= 0; --j) op[at(j)] = T(acc += double(gp[at(j)]));
        continue;
      }
      // d y_j / d x_k = prod_{m <= j, m != k} x_m for k <= j. Before the first zero z: sum_{j=k}^{z-1} g_j y_j / x_k;
      // at z: sum_{j>=z} g_j prod_{m<=j, m!=z} x_m; after z: 0.
      const T* xp = x.data();
      const T* yp = y.data();
      std::int64_t z = s.n;
      for (std::int64_t j = 0; j < s.n; ++j)
        if (double(xp[at(j)]) == 0) {
          z = j;
          break;
        }
      double acc = 0;
      for (std::int64_t k = s.n - 1; k >= 0; --k) {
        if (k > z) {
          op[at(k)] = T(0);
        } else if (k == z) {
          double q = z > 0 ? double(yp[at(z - 1)]) : 1.0, sum = 0;
          for (std::int64_t j = z; j < s.n; ++j) {
            if (j > z) q *= double(xp[at(j)]);
            sum += double(gp[at(j)]) * q;
          }
          op[at(k)] = T(sum);
        } else {
          acc += double(gp[at(k)]) * double(yp[at(k)]);
          op[at(k)] = T(acc / double(xp[at(k)]));
        }
      }
    }
  return gx;
}

/// Row `row` of multinomial's weights (k values at x) into w as doubles, checked: every weight finite and
/// non-negative, a positive sum, and without replacement at least num_samples categories with non-zero weight.
/// Otherwise an error naming the row, the weight and `probs` (the caller's shape). The CUDA kernel runs the same
/// checks; a row it refuses is reported through this function, with the same message.
template <class T>
void multinomial_row_weights(const T* x, std::int64_t row, std::int64_t k, std::int64_t num_samples, bool replacement,
                             const Shape& probs, std::vector<double>& w) {
  std::int64_t nonzero = 0;
  for (std::int64_t j = 0; j < k; ++j) {
    const double v = double(x[j]);
    EMBER_CHECK(std::isfinite(v) && v >= 0, "multinomial: row ", row, " of probs (shape ", probs.str(),
                ") has weight ", v, " at category ", j, "; weights must be finite and non-negative");
    w[std::size_t(j)] = v;
    nonzero += v > 0;
  }
  EMBER_CHECK(nonzero > 0, "multinomial: row ", row, " of probs (shape ", probs.str(), ") sums to zero");
  EMBER_CHECK(replacement || num_samples <= nonzero, "multinomial: row ", row, " has ", nonzero,
              " categories with non-zero weight, fewer than the ", num_samples, " samples to draw without replacement");
}

/// Every row of the contiguous (rows, k) weights x checked as multinomial_row_weights does: an error naming the first
/// bad row. The CUDA path reports a row its kernel refused through this.
template <class T>
void check_multinomial_weights(const T* x, std::int64_t rows, std::int64_t k, std::int64_t num_samples,
                               bool replacement, const Shape& probs) {
  std::vector<double> w(static_cast<std::size_t>(k));
  for (std::int64_t row = 0; row < rows; ++row)
    multinomial_row_weights(x + row * k, row, k, num_samples, replacement, probs, w);
}

/// num_samples category indices per row of the contiguous (rows, k) weights p, drawn from gen: with replacement
/// through the running sum of the weights, without by removing each pick. Bad weights are an error naming the row
/// (`probs`: the caller's shape, for the message). The result is (rows, num_samples), or (num_samples) for 1-D p.
/// Draw i = row * num_samples + s is the uniform double of half i % 2 of Philox block (reserved base) + i / 2.
template <class T>
Tensor<std::int64_t> multinomial(const Tensor<T>& p, std::int64_t rows, std::int64_t k, std::int64_t num_samples,
                                 bool replacement, Generator& gen, const Shape& probs) {
  Tensor<std::int64_t> r = empty<std::int64_t>(p.dim() == 2 ? Shape{rows, num_samples} : Shape{num_samples});
  // One 53-bit uniform per draw, two per Philox block.
  const std::uint64_t draws = std::uint64_t(rows) * std::uint64_t(num_samples);
  const std::uint64_t base = gen.reserve((draws + 1) / 2);
  std::uint64_t used = 0;
  auto uniform = [&]() {
    std::uint32_t b[4];
    Generator::block(gen.seed(), base + used / 2, b);
    const double u = (used % 2) ? Generator::to_unit_double(b[2], b[3]) : Generator::to_unit_double(b[0], b[1]);
    ++used;
    return u;
  };
  std::vector<double> w(static_cast<std::size_t>(k)), cdf(static_cast<std::size_t>(k));
  for (std::int64_t row = 0; row < rows; ++row) {
    multinomial_row_weights(p.data() + row * k, row, k, num_samples, replacement, probs, w);
    std::int64_t* out = r.data() + row * num_samples;
    if (replacement) {
      double acc = 0;
      for (std::int64_t j = 0; j < k; ++j) cdf[std::size_t(j)] = acc += w[std::size_t(j)];
      for (std::int64_t s = 0; s < num_samples; ++s) {
        const double u = uniform() * acc;
        auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
        std::int64_t j = std::min<std::int64_t>(it - cdf.begin(), k - 1);
        while (w[std::size_t(j)] == 0) --j;  // rounding at the top end: the last category with weight
        out[s] = j;
      }
    } else {
      for (std::int64_t s = 0; s < num_samples; ++s) {
        double total = 0;
        for (double v : w) total += v;
        const double u = uniform() * total;
        double acc = 0;
        std::int64_t pick = -1;
        for (std::int64_t j = 0; j < k; ++j) {
          if (w[std::size_t(j)] == 0) continue;
          pick = j;
          acc += w[std::size_t(j)];
          if (u < acc) break;
        }
        out[s] = pick;
        w[std::size_t(pick)] = 0;
      }
    }
  }
  return r;
}

}  // namespace ember::cpu
