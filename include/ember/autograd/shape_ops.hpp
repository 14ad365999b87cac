// ember — differentiable cat, stack and index_select.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/autograd/node.hpp"
#include "ember/core/tensor.hpp"
#include "ember/ops/indexing.hpp"

namespace ember {

namespace autograd {
template <class T>
struct CatNode final : TypedNode<T> {
  int dim = 0;
  std::vector<std::int64_t> sizes;  // extent of each piece along dim
  const char* name() const override { return "CatBackward"; }
  void backward() override {
    std::int64_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (this->next[i]) this->template deliver<T>(i, this->grad.narrow(dim, at, sizes[i]));
      at += sizes[i];
    }
  }
};

template <class T>
struct IndexSelectNode final : TypedNode<T> {
  Shape in_shape;
  int dim = 0;
  Tensor<std::int64_t> index;
  const char* name() const override { return "IndexSelectBackward"; }
  void release() override { index = Tensor<std::int64_t>(); }
  void backward() override { this->template deliver<T>(0, ops::index_add(in_shape, dim, index, this->grad)); }
};
}  // namespace autograd

/// Concatenates along an existing dim.
template <class T>
Tensor<T> cat(const std::vector<Tensor<T>>& ts, std::int64_t dim = 0) {
  if (!ts.empty()) {  // the extent of the result along dim, checked before ops::cat forms it
    const int d = wrap_dim(dim, ts[0].dim(), "cat");
    std::int64_t total = 0;
    bool over = false;
    for (std::size_t i = 0; i < ts.size(); ++i) {
      EMBER_CHECK(ts[i].dim() > 0, "cat: tensor ", i, " is zero-dimensional (shape []) and cannot be concatenated");
      if (d < ts[i].dim()) over |= detail::add_overflow(total, ts[i].shape()[d], &total);
    }
    EMBER_CHECK(!over, "cat: the sizes of the ", ts.size(), " tensors along dim ", d,
                " add up to more than int64 can count (tensor 0 has shape ", ts[0].shape().str(), ")");
  }
  Tensor<T> r = ops::cat(ts, dim);
  if constexpr (is_floating_v<T>) {
    bool any = false;
    for (auto& t : ts) any = any || t.requires_grad();
    if (any && is_grad_enabled()) {
      auto node = std::make_shared<autograd::CatNode<T>>();
      node->dim = wrap_dim(dim, ts[0].dim(), "cat");
      for (auto& t : ts) {
        node->sizes.push_back(t.shape()[node->dim]);
        node->next.push_back(autograd::gradient_edge(t));
      }
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}

/// Stacks along a new dim.
template <class T>
Tensor<T> stack(const std::vector<Tensor<T>>& ts, std::int64_t dim = 0) {
  EMBER_CHECK(!ts.empty(), "stack: expected a non-empty list of tensors");
  const int d = wrap_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor<T>> u;
  u.reserve(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    EMBER_CHECK(ts[i].shape() == ts[0].shape(), "stack: tensor ", i, " has shape ", ts[i].shape().str(),
                " but tensor 0 has shape ", ts[0].shape().str(), " (all must be equal)");
    u.push_back(ts[i].unsqueeze(d));
  }
  return cat(u, d);
}

/// Picks slices along dim by a 1-D int64 index (differentiable in x).
template <class T>
Tensor<T> index_select(const Tensor<T>& x, std::int64_t dim, const Tensor<std::int64_t>& index) {
  Tensor<T> r = ops::index_select(x, dim, index);
  if constexpr (is_floating_v<T>) {
    if (x.requires_grad() && is_grad_enabled()) {
      auto node = std::make_shared<autograd::IndexSelectNode<T>>();
      node->in_shape = x.shape();
      node->dim = wrap_dim(dim, x.dim(), "index_select");
      node->index = index.clone();
      node->next.push_back(autograd::gradient_edge(x));
      node->output = r.impl_ptr();
      autograd::set_history<T>(r, node);
    }
  }
  return r;
}

}  // namespace ember
