// ember — differentiable reductions over tensors or expressions: sum, mean, max, min, prod, var, std, norm,
// argmax, argmin; over everything or the given dims, keepdim as in PyTorch. The element-wise part of the
// argument runs inside the reduction pass; the backward is again one fused expression per leaf.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "ember/autograd/expr_backward.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/reducer.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/reduce.hpp"
#include "ember/expr/nodes.hpp"

namespace ember {

/// The dims a reduction runs over: one dim, a braced list, or none (= all dims).
struct Dims {
  std::vector<std::int64_t> v;  ///< The dims (negative ones count from the end); empty: every dim.
  Dims() = default;  ///< Every dim (PyTorch's dim=None).
  /// One dim: `sum(x, 1)`.
  Dims(int d) : v{d} {}                                   // NOLINT: implicit on purpose
  /// One dim: `sum(x, d)`.
  Dims(std::int64_t d) : v{d} {}                          // NOLINT
  /// Several dims: `sum(x, {0, 2})` (PyTorch's dim=(0, 2)).
  Dims(std::initializer_list<std::int64_t> l) : v(l) {}   // NOLINT
  /// Several dims, from a vector.
  Dims(std::vector<std::int64_t> l) : v(std::move(l)) {}  // NOLINT
};

namespace autograd {

struct ReducePlan {
  Shape space;  // the argument's shape
  Shape keep;   // space with reduced dims set to 1
  Shape out;    // keep, or without the reduced dims
  std::int64_t count = 1;  // elements per output
  bool reduced[kMaxDims] = {};
  bool all = false;  // no dims given: a reduction over everything (torch.prod(x) and torch.prod(x, dim) differ)
};

EMBER_HEADER_INLINE ReducePlan plan_reduce(const Shape& space, const Dims& dims, bool keepdim, const char* op);
#if EMBER_HEADER_BODIES
EMBER_HEADER_INLINE ReducePlan plan_reduce(const Shape& space, const Dims& dims, bool keepdim, const char* op) {
  ReducePlan p;
  p.space = space;
  p.all = dims.v.empty();
  if (dims.v.empty()) {
    for (int d = 0; d < space.n; ++d) p.reduced[d] = true;
  } else {
    for (auto d : dims.v) {
      const int lim = space.n > 0 ? space.n : 1;
      EMBER_CHECK(d >= -lim && d < lim, op, ": dim ", d, " is out of range for a tensor of shape ", space.str(),
                  " (expected a dim in [", -lim, ", ", lim - 1, "])");
      const int w = wrap_dim(d, space.n, op);
      if (space.n == 0) continue;
      EMBER_CHECK(!p.reduced[w], op, ": dim ", w, " appears more than once");
      p.reduced[w] = true;
    }
  }
  p.keep = space;
  for (int d = 0; d < space.n; ++d)
    if (p.reduced[d]) {
      p.count *= space[d];
      p.keep[d] = 1;
    }
  for (int d = 0; d < space.n; ++d)
    if (!p.reduced[d] || keepdim) p.out.push_back(p.keep[d]);
  return p;
}
#endif

enum class RKind { Sum, Mean, Max, Min, Prod, Var, Std, Norm };

template <class A, class B>
auto mul_(A a, B b) {
  return expr::make_binary(ops_table::Mul{}, std::move(a), std::move(b));
}
template <class A, class B>
auto div_(A a, B b) {
  return expr::make_binary(ops_table::Div{}, std::move(a), std::move(b));
}
template <class A, class B>
auto sub_(A a, B b) {
  return expr::make_binary(ops_table::Sub{}, std::move(a), std::move(b));
}

/// Backward of a reduction r = R(e). `result` is the keepdim-shaped forward result; `aux` the mean for var/std.
template <class T, class E, RKind K>
struct ReduceNode final : TypedNode<T> {
  SavedExpr<E> s;
  ReducePlan plan;
  double scale = 1, p = 2;
  Tensor<T> result, aux;
  std::uint64_t result_version = 0;  // the result is the user's output tensor: it can be written in place

  const char* name() const override { return "ReduceBackward"; }
  void release() override {
    s.e.reset();
    result = aux = Tensor<T>();
  }
  void backward() override {
    EMBER_CHECK(!result.defined() || result.version() == result_version, name(),
                ": a tensor needed for gradient computation (the result, shape ", result.shape().str(),
                ") was modified by an in-place operation after it was used (version ", result_version, ", now ",
                result.version(), "); clone() it before modifying it");
    using L = expr::TensorLeaf<T, false>;
    using S = expr::ScalarLeaf<T>;
    const Tensor<T> gk = this->grad.reshape(plan.keep);
    const auto& e = *s.e;
    const L g{&gk}, r{&result}, m{&aux};
    auto run = [&](const auto& G) { backward_through(*this, e, G, plan.space, s.versions.data(), name()); };
    if constexpr (K == RKind::Sum) {
      run(g);
    } else if constexpr (K == RKind::Mean) {
      run(mul_(g, S{compute_t<T>(scale)}));
    } else if constexpr (K == RKind::Max || K == RKind::Min) {
      // The elements equal to the result share the gradient evenly (ties). Over everything, as torch.max(x), a NaN
      // result gives it to the NaN elements (SameValue: NaN matches NaN). Over dims, as torch.amax(x, dims), NaN
      // equals nothing: a group whose result is NaN divides by a count of 0, and its whole gradient is NaN.
      auto shared = [&](auto same) {
        auto hit = expr::CastExpr<T, decltype(expr::make_binary(same, e, r))>{expr::make_binary(same, e, r)};
        Tensor<T> cnt = empty<T>(plan.keep, gk.device());
        ops::reduce<expr::SumR<double>>(cnt, hit, name());
        const L c{&cnt};
        run(div_(mul_(g, hit), c));
      };
      if (plan.all) shared(ops_table::SameValue{});
      else shared(ops_table::Eq{});
    } else if constexpr (K == RKind::Prod) {
      Tensor<T> others = prod_of_others();
      const L o{&others};
      run(mul_(g, o));
    } else if constexpr (K == RKind::Var) {
      run(mul_(mul_(g, sub_(e, m)), S{compute_t<T>(2 * scale)}));
    } else if constexpr (K == RKind::Std) {
      // d std = d var / (2 std), taken as 0 where std == 0 (a constant group), as PyTorch's std_backward.
      auto zero_std = expr::make_binary(ops_table::Eq{}, r, S{0});
      auto gs = div_(g, r);
      auto gz = expr::WhereExpr<decltype(zero_std), S, decltype(gs)>{zero_std, S{0}, gs};
      run(mul_(mul_(gz, sub_(e, m)), S{compute_t<T>(scale)}));
    } else if constexpr (K == RKind::Norm) {
      // d||e||_p / de = sign(e) |e|^(p-1) / ||e||^(p-1); zero where the norm is zero.
      auto zero_norm = expr::make_binary(ops_table::Eq{}, r, S{0});
      if (p == 2) {
        auto q = div_(e, r);
        run(mul_(g, expr::WhereExpr<decltype(zero_norm), S, decltype(q)>{zero_norm, S{0}, q}));
      } else if (p == 1) {
        run(mul_(g, expr::make_unary(ops_table::Sign{}, e)));
      } else if (std::isinf(p)) {
        auto a = expr::make_unary(ops_table::Abs{}, e);
        auto hit = expr::CastExpr<T, decltype(expr::make_binary(ops_table::Eq{}, a, r))>{
            expr::make_binary(ops_table::Eq{}, a, r)};
        Tensor<T> cnt = empty<T>(plan.keep, gk.device());
        ops::reduce<expr::SumR<double>>(cnt, hit, name());
        const L c{&cnt};
        run(div_(mul_(mul_(g, expr::make_unary(ops_table::Sign{}, e)), hit), c));
      } else {
        // Also 0 at a zero element: for p < 1 its |e|^(p-1) is inf (PyTorch masks it); for p > 1 it is 0 anyway.
        auto a = expr::make_unary(ops_table::Abs{}, e);
        auto num = mul_(expr::make_unary(ops_table::Sign{}, e),
                        expr::make_binary(ops_table::Pow{}, a, S{compute_t<T>(p - 1)}));
        auto q = div_(num, expr::make_binary(ops_table::Pow{}, r, S{compute_t<T>(p - 1)}));
        auto zero = expr::make_binary(ops_table::Or{}, zero_norm, expr::make_binary(ops_table::Eq{}, e, S{0}));
        run(mul_(g, expr::WhereExpr<decltype(zero), S, decltype(q)>{zero, S{0}, q}));
      }
    }
  }

 private:
  // For prod: d prod / d x_j, as PyTorch computes it. Over all elements (torch.prod(x)): a group without zeros
  // takes prod / x_j (so a NaN or inf element makes the group's gradient NaN, the NaN element's included), a
  // group with one zero the product of the others (exact: prefix × suffix), a group with two or more zeros 0.
  // Over dims (torch.prod(x, dim)): prod / x_j when the whole argument has no zero, else the product of the
  // others in every group. A 0-d argument passes the gradient (1).
  Tensor<T> prod_of_others() const {
    const Shape& sp = plan.space;
    EMBER_CHECK(this->grad.device().is_cpu(), "prod: the backward runs on CPU tensors only for now (got ",
                this->grad.device().str(), ")");
    Tensor<T> x = empty<T>(sp);
    ops::assign(x, *s.e, name());
    std::vector<std::int64_t> perm;
    for (int d = 0; d < sp.n; ++d)
      if (!plan.reduced[d]) perm.push_back(d);
    for (int d = 0; d < sp.n; ++d)
      if (plan.reduced[d]) perm.push_back(d);
    const std::int64_t R = plan.count, Kn = sp.numel() / std::max<std::int64_t>(R, 1);
    Tensor<T> xp = x.permute(perm).contiguous();
    Tensor<T> rp = result.permute(perm).contiguous();  // (Kn) in the same group order: reduced dims are 1 here
    const Tensor<T> op = ops::prod_of_others(xp, rp, Kn, R, plan.all, sp.n > 0);
    std::vector<std::int64_t> inv(perm.size());
    for (std::size_t i = 0; i < perm.size(); ++i) inv[std::size_t(perm[i])] = std::int64_t(i);
    return op.permute(inv);
  }
};

template <class T, RKind K, class E>
void record_reduce(Tensor<T>& res, const E& e, const ReducePlan& plan, double scale, double p, Tensor<T> result,
                   Tensor<T> aux) {
  if constexpr (is_floating_v<T>) {
    if (!needs_grad(e)) return;
    auto node = std::make_shared<ReduceNode<T, E, K>>();
    node->s.save(*node, e);
    node->plan = plan;
    node->scale = scale;
    node->p = p;
    node->result = std::move(result);
    node->result_version = node->result.defined() ? node->result.version() : 0;
    node->aux = std::move(aux);
    node->output = res.impl_ptr();
    set_history<T>(res, node);
  }
}

/// The argument as an expression node (a tensor becomes a leaf held by pointer).
template <class X>
auto arg_node(const X& x) {
  if constexpr (expr::is_tensor_v<X>) return expr::TensorLeaf<typename X::value_type, false>{&x};
  else return x;
}

template <class R, class OutT, class E>
Tensor<OutT> reduce_into(const E& e, const ReducePlan& plan, const char* op) {
  Tensor<OutT> out = empty<OutT>(plan.keep, expr::device_of(e));
  ops::reduce<R>(out, e, op);
  return out;
}

template <class T>
Tensor<T> view_out(const Tensor<T>& keep, const ReducePlan& plan) {
  Tensor<T> r = keep.as_strided_raw(plan.out, contiguous_strides(plan.out), keep.storage_offset());
  r.unsafe_impl()->is_view = false;  // a fresh result (keep is internal), so `s = s * 2.f` may write into it
  return r;
}

}  // namespace autograd

// ---- the public reductions -----------------------------------------------------------------------------------

/// Sum over all elements (0-d result) or over dims. Integer and bool arguments sum to int64.
template <expr::TensorOrExpr X>
auto sum(const X& x, const Dims& dims = {}, bool keepdim = false) {
  using V = typename expr::value_of<X>::type;
  using R = std::conditional_t<is_floating_v<V>, V, std::int64_t>;
  const auto e = autograd::arg_node(x);
  const auto plan = autograd::plan_reduce(e.shape(), dims, keepdim, "sum");
  Tensor<R> keep = autograd::reduce_into<expr::SumR<expr::sum_acc_t<compute_t<V>>>, R>(e, plan, "sum");
  Tensor<R> res = autograd::view_out(keep, plan);
  if constexpr (std::is_same_v<R, V>) autograd::record_reduce<R, autograd::RKind::Sum>(res, e, plan, 1, 0, {}, {});
  return res;
}

/// Mean over all elements or over dims (floating types).
template <expr::TensorOrExpr X>
auto mean(const X& x, const Dims& dims = {}, bool keepdim = false) {
  using V = typename expr::value_of<X>::type;
  static_assert(is_floating_v<V>, "mean: needs a floating-point argument; use cast<float>(x)");
  const auto e = autograd::arg_node(x);
  const auto plan = autograd::plan_reduce(e.shape(), dims, keepdim, "mean");
  Tensor<V> keep = autograd::reduce_into<expr::SumR<double>, V>(e, plan, "mean");
  const double scale = 1.0 / double(plan.count);
  {
    NoGradGuard ng;
    keep /= compute_t<V>(double(plan.count));
  }
  Tensor<V> res = autograd::view_out(keep, plan);
  autograd::record_reduce<V, autograd::RKind::Mean>(res, e, plan, scale, 0, {}, {});
  return res;
}

namespace autograd {
template <bool Less, expr::TensorOrExpr X>
auto extremum(const X& x, const Dims& dims, bool keepdim, const char* op) {
  using V = typename expr::value_of<X>::type;
  const auto e = arg_node(x);
  const auto plan = plan_reduce(e.shape(), dims, keepdim, op);
  EMBER_CHECK(plan.count > 0 && e.shape().numel() > 0, op, ": cannot reduce an empty tensor (shape ",
              e.shape().str(), ")");
  Tensor<V> keep = reduce_into<expr::ExtremumR<compute_t<V>, Less>, V>(e, plan, op);
  Tensor<V> res = view_out(keep, plan);
  record_reduce<V, Less ? RKind::Min : RKind::Max>(res, e, plan, 1, 0, keep, {});
  return res;
}
template <bool Less, expr::TensorOrExpr X>
Tensor<std::int64_t> arg_extremum(const X& x, std::int64_t dim, bool has_dim, bool keepdim, const char* op) {
  const auto e = arg_node(x);
  const Shape sp = e.shape();
  EMBER_CHECK(sp.numel() > 0, op, ": cannot reduce an empty tensor (shape ", sp.str(), ")");
  using V = typename expr::value_of<X>::type;
  using R = expr::ArgR<compute_t<V>, Less>;
  if (!has_dim) {
    const auto plan = plan_reduce(sp, {}, false, op);
    return view_out(reduce_into<R, std::int64_t>(e, plan, op), plan);
  }
  const auto plan = plan_reduce(sp, Dims{dim}, keepdim, op);
  return view_out(reduce_into<R, std::int64_t>(e, plan, op), plan);
}
}  // namespace autograd

/// Largest element (NaN propagates), over all elements (torch.max(x)) or dims (torch.amax(x, dims)): ties share the
/// gradient evenly. Where the result is NaN, over all elements the NaN elements share the gradient (as torch.max);
/// over dims the whole group's gradient is NaN (as torch.amax, whose NaN result equals no element).
template <expr::TensorOrExpr X>
auto max(const X& x, const Dims& dims = {}, bool keepdim = false) {
  return autograd::extremum<false>(x, dims, keepdim, "max");
}
/// Smallest element, over all elements or dims (torch.min(x), torch.amin(x, dims); gradients as max's).
template <expr::TensorOrExpr X>
auto min(const X& x, const Dims& dims = {}, bool keepdim = false) {
  return autograd::extremum<true>(x, dims, keepdim, "min");
}
/// Index of the first largest element of the flattened argument.
template <expr::TensorOrExpr X>
Tensor<std::int64_t> argmax(const X& x) {
  return autograd::arg_extremum<false>(x, 0, false, false, "argmax");
}
/// Indices of the largest elements along dim.
template <expr::TensorOrExpr X>
Tensor<std::int64_t> argmax(const X& x, std::int64_t dim, bool keepdim = false) {
  return autograd::arg_extremum<false>(x, dim, true, keepdim, "argmax");
}
template <expr::TensorOrExpr X>
Tensor<std::int64_t> argmin(const X& x) {
  return autograd::arg_extremum<true>(x, 0, false, false, "argmin");
}
template <expr::TensorOrExpr X>
Tensor<std::int64_t> argmin(const X& x, std::int64_t dim, bool keepdim = false) {
  return autograd::arg_extremum<true>(x, dim, true, keepdim, "argmin");
}

/// Product over all elements or dims; the gradient as PyTorch's (prod / x, or the exact product of the others
/// where there are zeros; see ReduceNode::prod_of_others).
template <expr::TensorOrExpr X>
auto prod(const X& x, const Dims& dims = {}, bool keepdim = false) {
  using V = typename expr::value_of<X>::type;
  using R = std::conditional_t<is_floating_v<V>, V, std::int64_t>;
  const auto e = autograd::arg_node(x);
  const auto plan = autograd::plan_reduce(e.shape(), dims, keepdim, "prod");
  using A = std::conditional_t<is_floating_v<V>, double, std::int64_t>;
  Tensor<R> keep = autograd::reduce_into<expr::ProdR<A>, R>(e, plan, "prod");
  Tensor<R> res = autograd::view_out(keep, plan);
  if constexpr (std::is_same_v<R, V>) autograd::record_reduce<R, autograd::RKind::Prod>(res, e, plan, 1, 0, keep, {});
  return res;
}

namespace autograd {
template <bool Sqrt, expr::TensorOrExpr X>
auto var_std(const X& x, const Dims& dims, std::int64_t correction, bool keepdim, const char* op) {
  using V = typename expr::value_of<X>::type;
  static_assert(is_floating_v<V>, "var/std: needs a floating-point argument");
  const auto e = arg_node(x);
  const auto plan = plan_reduce(e.shape(), dims, keepdim, op);
  Tensor<V> m = reduce_into<expr::SumR<double>, V>(e, plan, op);
  const double dof = double(plan.count - correction);
  Tensor<V> keep;
  {
    NoGradGuard ng;
    m *= compute_t<V>(1.0 / double(plan.count));
    const expr::TensorLeaf<V, false> ml{&m};
    keep = reduce_into<expr::SumR<double>, V>(expr::make_unary(ops_table::Square{}, sub_(e, ml)), plan, op);
    keep *= compute_t<V>(1.0 / dof);  // dof <= 0 gives inf or nan, as in PyTorch
    if constexpr (Sqrt) keep = Tensor<V>(ember::sqrt(keep));
  }
  Tensor<V> res = view_out(keep, plan);
  record_reduce<V, Sqrt ? RKind::Std : RKind::Var>(res, e, plan, 1.0 / dof, 0, keep, m);
  return res;
}
}  // namespace autograd

/// Variance with Bessel's correction by default (correction = 1), as torch.var.
template <expr::TensorOrExpr X>
auto var(const X& x, const Dims& dims = {}, std::int64_t correction = 1, bool keepdim = false) {
  return autograd::var_std<false>(x, dims, correction, keepdim, "var");
}
/// Standard deviation, as torch.std (named std_dev so that `using namespace ember` keeps `std` unambiguous).
template <expr::TensorOrExpr X>
auto std_dev(const X& x, const Dims& dims = {}, std::int64_t correction = 1, bool keepdim = false) {
  return autograd::var_std<true>(x, dims, correction, keepdim, "std");
}

/// p-norm (p = 2 by default; 1, inf and any p > 0 work) over all elements or dims.
template <expr::TensorOrExpr X>
auto norm(const X& x, double p = 2, const Dims& dims = {}, bool keepdim = false) {
  using V = typename expr::value_of<X>::type;
  static_assert(is_floating_v<V>, "norm: needs a floating-point argument");
  EMBER_CHECK(p > 0, "norm: p must be positive, got ", p);
  const auto e = autograd::arg_node(x);
  const auto plan = autograd::plan_reduce(e.shape(), dims, keepdim, "norm");
  using S = expr::ScalarLeaf<V>;
  Tensor<V> keep;
  {
    NoGradGuard ng;
    auto a = expr::make_unary(ops_table::Abs{}, e);
    if (std::isinf(p)) {
      keep = autograd::reduce_into<expr::ExtremumR<compute_t<V>, false>, V>(a, plan, "norm");
    } else if (p == 1) {
      keep = autograd::reduce_into<expr::SumR<double>, V>(a, plan, "norm");
    } else if (p == 2) {
      keep = autograd::reduce_into<expr::SumR<double>, V>(expr::make_unary(ops_table::Square{}, e), plan, "norm");
      keep = Tensor<V>(ember::sqrt(keep));
    } else {
      keep = autograd::reduce_into<expr::SumR<double>, V>(expr::make_binary(ops_table::Pow{}, a, S{compute_t<V>(p)}),
                                                         plan, "norm");
      keep = Tensor<V>(ember::pow(keep, compute_t<V>(1.0 / p)));
    }
  }
  Tensor<V> res = autograd::view_out(keep, plan);
  autograd::record_reduce<V, autograd::RKind::Norm>(res, e, plan, 1, p, keep, {});
  return res;
}

}  // namespace ember
