// ember — einsum with torch.einsum's semantics: any number of operands, ellipsis, broadcasting of size-1 dims,
// implicit output, and subscripts repeated within an operand (its diagonal: "ii->i", the trace "ii->"). Built from
// differentiable pieces: a diagonal view copied out (its backward writes the diagonal of a zero tensor), sums over
// the labels only one operand has, and one bmm per pair of operands, contracted left to right.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/node.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/ops/elementwise.hpp"

namespace ember {

namespace autograd {
/// The gradient of a diagonal taken by einsum: g written into the same strided positions of a zero base tensor.
template <class T>
struct EinsumDiagonalNode final : TypedNode<T> {
  Shape base_shape, diag_shape, diag_strides;  // diag_strides: in the contiguous base's layout
  const char* name() const override { return "DiagonalBackward"; }
  void backward() override {
    Tensor<T> gx = zeros<T>(base_shape, this->grad.device());
    const Tensor<T> dst = gx.as_strided_raw(diag_shape, diag_strides, 0);
    ops::assign(dst, expr::TensorLeaf<T, false>{&this->grad}, name());
    this->template deliver<T>(0, std::move(gx));
  }
};
}  // namespace autograd

namespace detail {
/// One einsum term: a label per dim (A-Z -> 0..25, a-z -> 26..51, ellipsis dims -> 52 + k).
struct EinsumTerm {
  std::vector<int> labels;
  bool ellipsis = false;
};
inline int einsum_label(char ch, const std::string& eq) {
  if (ch >= 'A' && ch <= 'Z') return ch - 'A';
  if (ch >= 'a' && ch <= 'z') return 26 + (ch - 'a');
  throw Error("einsum: invalid subscript '" + std::string(1, ch) + "' in \"" + eq + "\" (letters only)");
}
/// The letter of a label (below 52).
inline char einsum_letter(int l) { return char(l < 26 ? 'A' + l : 'a' + (l - 26)); }
/// Parses a term's letters and "..." (-1 stands for the ellipsis).
inline EinsumTerm einsum_parse(const std::string& s, const std::string& eq) {
  EinsumTerm t;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.') {
      EMBER_CHECK(!t.ellipsis && s.compare(i, 3, "...") == 0, "einsum: malformed ellipsis in \"", eq,
                  "\"");
      t.ellipsis = true;
      t.labels.push_back(-1);
      i += 2;
    } else {
      t.labels.push_back(einsum_label(s[i], eq));
    }
  }
  return t;
}
/// The labels of an operand with ndim dims: the ellipsis expanded to ndim - letters dims, right-aligned to `ell`
/// ellipsis dims in all.
inline std::vector<int> einsum_expand(const EinsumTerm& t, int ndim, int ell, const std::string& eq,
                                      std::size_t which) {
  const int letters = int(t.labels.size()) - (t.ellipsis ? 1 : 0);
  EMBER_CHECK(t.ellipsis ? ndim >= letters : ndim == letters, "einsum: operand ", which, " has ", ndim,
              " dims but its subscripts in \"", eq, "\" name ", letters);
  std::vector<int> r;
  for (int l : t.labels) {
    if (l >= 0) {
      r.push_back(l);
      continue;
    }
    const int e = ndim - letters;
    for (int k = 0; k < e; ++k) r.push_back(52 + ell - e + k);
  }
  return r;
}

/// The diagonal of x over every label repeated in `labels` (which become unique, in order of first appearance):
/// a strided view of x copied out, differentiable.
template <class T>
Tensor<T> einsum_diagonal(const Tensor<T>& x, std::vector<int>& labels, const std::string& eq, std::size_t which) {
  std::vector<int> uniq;
  Shape ds, dst, base_st;  // the diagonal's shape, its strides in x, its strides in a contiguous x
  const Shape cs = contiguous_strides(x.shape());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const auto at = std::find(uniq.begin(), uniq.end(), labels[i]);
    if (at != uniq.end()) {
      const int k = int(at - uniq.begin());
      EMBER_CHECK(ds[k] == x.shape()[int(i)], "einsum: subscript ", einsum_letter(labels[i]),
                  " is repeated in operand ", which, " of \"", eq, "\" but its sizes differ (", ds[k], " and ",
                  x.shape()[int(i)], ", shape ", x.shape().str(), ")");
      dst[k] += x.strides()[int(i)];
      base_st[k] += cs[int(i)];
      continue;
    }
    uniq.push_back(labels[i]);
    ds.push_back(x.shape()[int(i)]);
    dst.push_back(x.strides()[int(i)]);
    base_st.push_back(cs[int(i)]);
  }
  if (uniq.size() == labels.size()) return x;
  labels = uniq;
  const Tensor<T> view = x.as_strided_raw(ds, dst, x.storage_offset());
  Tensor<T> r = empty<T>(ds, x.device());
  ops::assign(r, expr::TensorLeaf<T, false>{&view}, "einsum");
  if constexpr (is_floating_v<T>) {
    if (is_grad_enabled() && x.requires_grad()) {
      auto node = std::make_shared<autograd::EinsumDiagonalNode<T>>();
      node->base_shape = x.shape();
      node->diag_shape = ds;
      node->diag_strides = base_st;
      node->next = {autograd::gradient_edge(x)};
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}

/// Sums over the dims whose label is not in `keep`; returns the remaining labels.
template <class T>
Tensor<T> einsum_sum_out(const Tensor<T>& x, std::vector<int>& labels, const std::vector<bool>& keep) {
  std::vector<std::int64_t> dims;
  std::vector<int> rest;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (keep[std::size_t(labels[i])]) rest.push_back(labels[i]);
    else dims.push_back(std::int64_t(i));
  }
  labels = rest;
  if (dims.empty()) return x;
  return Tensor<T>(sum(x, Dims(dims)));
}

/// x's dims reordered to `order` (labels of x, each once).
template <class T>
Tensor<T> einsum_permuted(const Tensor<T>& x, const std::vector<int>& labels, const std::vector<int>& order) {
  std::vector<std::int64_t> perm;
  for (int l : order)
    for (std::size_t k = 0; k < labels.size(); ++k)
      if (labels[k] == l) perm.push_back(std::int64_t(k));
  return x.permute(perm);
}

/// The product of a (labels la) and b (labels lb), each label once per operand, summed over the labels not in
/// `keep`, as one bmm: the result's labels are `out` (the kept labels of a, then those of b). `size` holds each
/// label's size (a size-1 dim broadcasts against it).
template <class T>
Tensor<T> einsum_pair(const Tensor<T>& a0, std::vector<int> la, const Tensor<T>& b0, std::vector<int> lb,
                      const std::vector<bool>& keep, const std::vector<std::int64_t>& size, std::vector<int>& out) {
  auto has = [](const std::vector<int>& v, int l) { return std::find(v.begin(), v.end(), l) != v.end(); };
  // Labels only one operand has and nothing keeps are summed out first.
  std::vector<bool> keep_a = keep, keep_b = keep;
  for (int x : lb) keep_a[std::size_t(x)] = true;
  for (int x : la) keep_b[std::size_t(x)] = true;
  Tensor<T> a = einsum_sum_out(a0, la, keep_a);
  Tensor<T> b = einsum_sum_out(b0, lb, keep_b);
  out.clear();
  for (int l : la)
    if (keep[std::size_t(l)]) out.push_back(l);
  for (int l : lb)
    if (keep[std::size_t(l)] && !has(la, l)) out.push_back(l);
  std::vector<int> batch, contract, fa, fb;
  for (int l : out) {
    if (has(la, l) && has(lb, l)) batch.push_back(l);
    else if (has(la, l)) fa.push_back(l);
    else fb.push_back(l);
  }
  for (int l : la)
    if (has(lb, l) && !keep[std::size_t(l)]) contract.push_back(l);
  auto extent = [&](const std::vector<int>& ls) {
    std::int64_t p = 1;
    Shape s;
    for (int l : ls) {
      p *= size[std::size_t(l)];
      s.push_back(size[std::size_t(l)]);
    }
    return std::pair{p, s};
  };
  // (plain variables: clang before 16 cannot capture structured bindings in the lambda below)
  const auto eb = extent(batch), em = extent(fa), en = extent(fb), ek = extent(contract);
  const std::int64_t nb = eb.first, nm = em.first, nn = en.first, nk = ek.first;
  const Shape sb = eb.second, sm = em.second, sn = en.second;
  auto as_matrix = [&](const Tensor<T>& x, const std::vector<int>& labels, const std::vector<int>& rows,
                       const std::vector<int>& cols, std::int64_t r, std::int64_t c) {
    std::vector<int> order = batch;
    order.insert(order.end(), rows.begin(), rows.end());
    order.insert(order.end(), cols.begin(), cols.end());
    Tensor<T> p = einsum_permuted(x, labels, order);
    Shape full;
    for (int l : order) full.push_back(size[std::size_t(l)]);
    if (!(p.shape() == full)) p = p.expand(full);  // a size-1 dim against a larger one
    return p.reshape({nb, r, c});
  };
  Tensor<T> am = as_matrix(a, la, fa, contract, nm, nk);
  Tensor<T> bm = as_matrix(b, lb, contract, fb, nk, nn);
  Tensor<T> c = bmm(am, bm);
  Shape cs = sb;
  for (std::int64_t s : sm) cs.push_back(s);
  for (std::int64_t s : sn) cs.push_back(s);
  std::vector<int> have = batch;
  have.insert(have.end(), fa.begin(), fa.end());
  have.insert(have.end(), fb.begin(), fb.end());
  return einsum_permuted(c.reshape(cs), have, out);
}
}  // namespace detail

/// Einstein summation: torch.einsum for permutations, sums, diagonals and traces (a subscript repeated within an
/// operand: "ii->i", "ii->", "bii->bi"), batched and broadcast products and contractions of any number of operands
/// ("bij,bjk->bik", "bhqd,bhkd->bhqk", "i,j->ij", "...ij,...jk", "ij,jk,kl->il"), implicit output (the labels used
/// once, in alphabetical order, upper case first). Operands are contracted left to right, each pair as one bmm,
/// keeping only the labels the output or a later operand needs.
template <class T>
Tensor<T> einsum(const std::string& equation, const std::vector<Tensor<T>>& operands) {
  std::string eq;
  for (char ch : equation)
    if (ch != ' ') eq.push_back(ch);
  const std::size_t n = operands.size();
  EMBER_CHECK(n >= 1, "einsum: expected at least one operand for \"", equation, "\"");
  const std::size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> parts;
  for (std::size_t at = 0;;) {
    const std::size_t comma = lhs.find(',', at);
    parts.push_back(lhs.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  EMBER_CHECK(parts.size() == n, "einsum: \"", equation, "\" names ", parts.size(), " operands, ", n,
              " given");
  int ell = 0;
  std::vector<detail::EinsumTerm> terms;
  for (std::size_t i = 0; i < n; ++i) {
    terms.push_back(detail::einsum_parse(parts[i], equation));
    const int letters = int(terms[i].labels.size()) - (terms[i].ellipsis ? 1 : 0);
    if (terms[i].ellipsis) ell = std::max(ell, operands[i].dim() - letters);
  }
  std::vector<std::vector<int>> lab;
  for (std::size_t i = 0; i < n; ++i)
    lab.push_back(detail::einsum_expand(terms[i], operands[i].dim(), ell, equation, i));
  const int nl = 52 + ell;
  std::vector<int> count(std::size_t(nl), 0);
  for (auto& l : lab)
    for (int x : l) ++count[std::size_t(x)];
  std::vector<int> out;
  if (arrow != std::string::npos) {
    const detail::EinsumTerm t = detail::einsum_parse(eq.substr(arrow + 2), equation);
    for (int l : t.labels) {
      if (l < 0) {
        for (int k = 0; k < ell; ++k) out.push_back(52 + k);
        continue;
      }
      EMBER_CHECK(count[std::size_t(l)] > 0, "einsum: output subscript of \"", equation,
                  "\" does not appear in any operand");
      out.push_back(l);
    }
    for (std::size_t i = 0; i < out.size(); ++i)
      for (std::size_t j = i + 1; j < out.size(); ++j)
        EMBER_CHECK(out[i] != out[j], "einsum: an output subscript repeats in \"", equation, "\"");
  } else {  // implicit: the ellipsis dims, then the labels used once, in order (upper case before lower case)
    for (int k = 0; k < ell; ++k) out.push_back(52 + k);
    for (int l = 0; l < 52; ++l)
      if (count[std::size_t(l)] == 1) out.push_back(l);
  }
  // Sizes: a label repeated within an operand (a diagonal) must have one size there; across operands sizes must
  // agree or be 1 (which broadcasts).
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < lab[i].size(); ++k)
      for (std::size_t j = 0; j < k; ++j)
        EMBER_CHECK(lab[i][j] != lab[i][k] || operands[i].shape()[int(j)] == operands[i].shape()[int(k)],
                    "einsum: subscript ", detail::einsum_letter(lab[i][k]), " is repeated in operand ", i, " of \"",
                    equation, "\" but its sizes differ (", operands[i].shape()[int(j)], " and ",
                    operands[i].shape()[int(k)], ", shape ", operands[i].shape().str(), ")");
  std::vector<std::int64_t> size(std::size_t(nl), 1);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < lab[i].size(); ++k) {
      const std::int64_t s = operands[i].shape()[int(k)];
      std::int64_t& have = size[std::size_t(lab[i][k])];
      EMBER_CHECK(have == 1 || s == 1 || have == s, "einsum: subscript ", k, " of operand ", i, " in \"",
                  equation, "\" has size ", s, " where another operand has ", have,
                  " (shapes must agree or be 1)");
      if (s != 1) have = s;
    }
  // Diagonals first, so every operand names each label once.
  std::vector<Tensor<T>> xs;
  for (std::size_t i = 0; i < n; ++i) xs.push_back(detail::einsum_diagonal(operands[i], lab[i], equation, i));
  std::vector<bool> in_out(std::size_t(nl), false);
  for (int l : out) in_out[std::size_t(l)] = true;
  if (n == 1) {
    std::vector<int> l = lab[0];
    Tensor<T> x = detail::einsum_sum_out(xs[0], l, in_out);
    if (x.dim() == 0) return x.same_impl(operands[0]) ? x.clone() : x;
    Tensor<T> r = detail::einsum_permuted(x, l, out);
    return r.same_impl(operands[0]) ? r.clone() : r;
  }
  // Left to right: the running product keeps the labels the output or a later operand needs.
  Tensor<T> cur = xs[0];
  std::vector<int> lcur = lab[0];
  for (std::size_t i = 1; i < n; ++i) {
    std::vector<bool> keep = in_out;
    for (std::size_t j = i + 1; j < n; ++j)
      for (int x : lab[j]) keep[std::size_t(x)] = true;
    std::vector<int> lnext;
    cur = detail::einsum_pair(cur, lcur, xs[i], lab[i], keep, size, lnext);
    lcur = std::move(lnext);
  }
  return detail::einsum_permuted(cur, lcur, out);
}
template <class T>
Tensor<T> einsum(const std::string& equation, const Tensor<T>& a) {
  return einsum<T>(equation, std::vector<Tensor<T>>{a});
}
template <class T>
Tensor<T> einsum(const std::string& equation, const Tensor<T>& a, const Tensor<T>& b) {
  return einsum<T>(equation, std::vector<Tensor<T>>{a, b});
}
template <class T>
Tensor<T> einsum(const std::string& equation, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c) {
  return einsum<T>(equation, std::vector<Tensor<T>>{a, b, c});
}

}  // namespace ember
