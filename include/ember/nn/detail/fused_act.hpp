// ember — what nn::fuse_conv_bn records in the modules it changes (an extension of their state), and when a layer
// applies the activation it moved into it.
#pragma once

#include "ember/autograd/grad_mode.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/activation.hpp"
#include "ember/nn/module.hpp"

namespace ember::nn {
namespace detail {

/// What nn::fuse_conv_bn changed in a module, attached to its state (ModuleState::extensions).
struct Fused : Extension {
  /// Folded into the layer before it: the module passes its input through, as nn.Identity.
  bool folded = false;
  /// An activation moved into this layer's output: applied in the GEMM's epilogue when nothing needs a gradient,
  /// by the folded activation module after it otherwise.
  Activation activation = Activation::none;
  /// A 2x2 max pool (stride 2) after the activation moved into this Conv2d: taken in the convolution's epilogue
  /// when nothing needs a gradient, by the folded MaxPool2d module otherwise.
  bool pool = false;
};
/// s's fusion record, or a default one (nothing fused) when nn::fuse_conv_bn did not change s.
inline const Fused& fused_of(const ModuleState& s) {
  static const Fused none;
  const Fused* f = find_extension<Fused>(s);
  return f ? *f : none;
}

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

}  // namespace detail

/// Whether nn::fuse_conv_bn folded m into the layer before it (its forward is then the identity).
inline bool folded(const Module& m) { return detail::fused_of(detail::ModuleAccess::state(m)).folded; }
/// The activation nn::fuse_conv_bn moved into the layer m (Activation::none for none).
inline Activation fused_activation(const Module& m) {
  return detail::fused_of(detail::ModuleAccess::state(m)).activation;
}
/// Whether nn::fuse_conv_bn moved a 2x2 max pool into the Conv2d m.
inline bool fused_pool(const Module& m) { return detail::fused_of(detail::ModuleAccess::state(m)).pool; }

}  // namespace ember::nn
