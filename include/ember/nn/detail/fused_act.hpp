// ember — when a layer applies the activation nn::fuse_conv_bn moved into it.
#pragma once

#include "ember/autograd/grad_mode.hpp"
#include "ember/core/tensor.hpp"

namespace ember::nn::detail {

/// Whether an op on these tensors records autograd (an undefined tensor needs nothing). A layer with a fused
/// activation applies it in its epilogue only when it does not: otherwise the folded activation module after it
/// applies it as its own differentiable op (it sees an output that requires grad), so the pair always computes
/// act(layer(x)), and training through a fused model is exact.
template <class T>
bool records_grad(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& b) {
  return is_grad_enabled() && (x.requires_grad() || w.requires_grad() || (b.defined() && b.requires_grad()));
}

/// Whether a layer can apply a fused activation to tensors on t's device: always on the CPU; on CUDA only in a
/// translation unit compiled by nvcc (the activation is a kernel there).
template <class T>
bool epilogue_on_device(const Tensor<T>& t) {
#if defined(__CUDACC__)
  (void)t;
  return true;
#else
  return t.device().is_cpu();
#endif
}

/// For a folded activation module: whether the layer before it already applied the activation to its output x (it
/// does whenever its output records no autograd and its device allows).
template <class T>
bool applied_by_layer(const Tensor<T>& x) {
  return epilogue_on_device(x) && !(is_grad_enabled() && x.requires_grad());
}

}  // namespace ember::nn::detail
