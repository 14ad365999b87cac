// ember — the umbrella header: tensors, fused element-wise expressions, reductions, autograd, CPU execution.
// The data pipeline and file I/O have umbrellas of their own, so code that does not use them does not compile them:
//   #include <ember/data.hpp>  datasets (IDX, Fashion-MNIST, record files), samplers, transforms, DataLoader
//   #include <ember/io.hpp>    safetensors, atomic files, checkpoints (CMake target ember::io)
#pragma once

#include "ember/config.hpp"
#include "ember/core/allocator.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/device_copy.hpp"
#include "ember/core/dtype.hpp"
#include "ember/core/print.hpp"
#include "ember/core/random.hpp"
#include "ember/core/shape.hpp"
#include "ember/core/tensor.hpp"
#include "ember/expr/aliasing.hpp"
#include "ember/expr/derivative.hpp"
#include "ember/expr/evaluator.hpp"
#include "ember/expr/nodes.hpp"
#include "ember/expr/reducer.hpp"
#include "ember/cpu/executor.hpp"
#include "ember/cpu/reduce.hpp"
#include "ember/cpu/thread_pool.hpp"
#include "ember/cpu/conv.hpp"
#include "ember/cpu/pool.hpp"
#include "ember/cpu/isa.hpp"
// CUDA (empty unless EMBER_WITH_CUDA): devices, streams, the caching allocators, copies between devices.
#include "ember/cuda/check.hpp"
#include "ember/cuda/device.hpp"
#include "ember/cuda/stream.hpp"
#include "ember/cuda/allocator.hpp"
#include "ember/cuda/pinned.hpp"
#include "ember/cuda/copy.hpp"
#include "ember/cuda/algo_cache.hpp"
#include "ember/cuda/blas.hpp"
#include "ember/cuda/cudnn.hpp"
#include "ember/autograd/engine.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/autograd/linalg.hpp"
#include "ember/autograd/shape_ops.hpp"
#include "ember/autograd/manip.hpp"
#include "ember/autograd/einsum.hpp"
#include "ember/autograd/interpolate.hpp"
#include "ember/autograd/attention.hpp"
#include "ember/autograd/function.hpp"
#include "ember/autograd/gradcheck.hpp"
#include "ember/autograd/conv.hpp"
#include "ember/autograd/pool.hpp"
#include "ember/autograd/normalization.hpp"
#include "ember/autograd/conv_bn.hpp"
#include "ember/autograd/softmax.hpp"
#include "ember/ops/elementwise.hpp"
#include "ember/ops/indexing.hpp"
#include "ember/ops/matmul.hpp"
#include "ember/ops/window.hpp"
#include "ember/ops/conv.hpp"
#include "ember/ops/pool.hpp"
#include "ember/ops/normalization.hpp"
#include "ember/ops/conv_bn.hpp"
#include "ember/ops/softmax.hpp"
#include "ember/ops/attention.hpp"
#include "ember/ops/interpolate.hpp"
#include "ember/amp/policy.hpp"
#include "ember/amp/grad_scaler.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/init.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/activation.hpp"
#include "ember/nn/dropout.hpp"
#include "ember/nn/embedding.hpp"
#include "ember/nn/sequential.hpp"
#include "ember/nn/container.hpp"
#include "ember/nn/loss.hpp"
#include "ember/nn/functional.hpp"
#include "ember/optim/optimizer.hpp"
#include "ember/optim/sgd.hpp"
#include "ember/optim/adam.hpp"
#include "ember/optim/lr_scheduler.hpp"
#include "ember/optim/clip_grad.hpp"
#include "ember/nn/conv.hpp"
#include "ember/nn/pooling.hpp"
#include "ember/nn/normalization.hpp"
#include "ember/nn/conv_bn.hpp"
#include "ember/nn/fuse.hpp"
#include "ember/nn/attention.hpp"

// ---- opt-in precompilation ------------------------------------------------------------------------------------
// ember stays header-only. A user who links the CMake target ember::precompiled gets EMBER_PRECOMPILED defined, and
// the heavy, dtype-only instantiations below are declared `extern`: the TU calls the copies compiled once into the
// ember_precompiled library instead of compiling its own. The library is several TUs (src/precompiled*.cpp, which
// define EMBER_PRECOMPILED_BUILD) compiled side by side, each the lists of its EMBER_PRECOMPILED_PART (config.hpp):
// X below is EMBER_PRECOMPILED_EXTERN_<part>. Fused expressions, which differ per call site, are compiled where they
// are written (the commonest one-operation ones excepted, below). The library is built for the CPU only: with CUDA
// the precompiled copies would lack the GPU paths, so the two do not combine.
#ifdef EMBER_PRECOMPILED_EXTERN  // (config.hpp)
// float, bfloat16 and half: the layers' compute dtypes under the fp32, bf16 and fp16 precision policies.
#define EMBER_PRECOMPILED_OPS(T, X)                                                                                   \
  X template Tensor<T> linear<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&);                               \
  X template Tensor<T> linear<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                                \
      Activation);                                                                                                    \
  X template Tensor<T> mm<T>(const Tensor<T>&, const Tensor<T>&);                                                     \
  X template Tensor<T> bmm<T>(const Tensor<T>&, const Tensor<T>&);                                                    \
  X template Tensor<T> matmul<T>(const Tensor<T>&, const Tensor<T>&);                                                 \
  X template Tensor<T> conv2d<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                                \
      const Conv2dOptions&);                                                                                          \
  X template Tensor<T> max_pool2d<T>(const Tensor<T>&, Size2, const Pool2dOptions&);                                  \
  X template Tensor<T> avg_pool2d<T>(const Tensor<T>&, Size2, const Pool2dOptions&);                                  \
  X template Tensor<T> adaptive_avg_pool2d<T>(const Tensor<T>&, Size2);                                               \
  X template Tensor<T> batch_norm<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                            \
      const Tensor<T>&, const Tensor<T>&, bool, double, double);                                                      \
  X template Tensor<T> layer_norm<T>(const Tensor<T>&, const Shape&, const Tensor<T>&,                                \
      const Tensor<T>&, double);                                                                                      \
  X template Tensor<T> softmax<T>(const Tensor<T>&, std::int64_t);                                                    \
  X template Tensor<T> log_softmax<T>(const Tensor<T>&, std::int64_t);                                                \
  X template Tensor<T> nn::cross_entropy<T>(const Tensor<T>&, const Tensor<std::int64_t>&,                            \
      const nn::CrossEntropyOptions<T>&);                                                                             \
  X template Tensor<T> nn::mse_loss<T>(const Tensor<T>&, const Tensor<T>&, nn::Reduction);
// The element-wise kernels every program runs whatever it computes: copies (copy_, clone, contiguous) and fills.
#define EMBER_PRECOMPILED_KERNELS(T)                                                                                  \
  EMBER_PRECOMPILED_EXTERN template void cpu::assign<T, expr::TensorLeaf<T, false>>(                                  \
      const Tensor<T>&, const expr::TensorLeaf<T, false>&, const char*);                                              \
  EMBER_PRECOMPILED_EXTERN template void cpu::assign<T, expr::ScalarLeaf<T>>(const Tensor<T>&,                        \
                                                                             const expr::ScalarLeaf<T>&, const char*);
namespace ember {
EMBER_PRECOMPILED_OPS(float, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_OPS(bfloat16, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_OPS(half, EMBER_PRECOMPILED_EXTERN_0)
EMBER_PRECOMPILED_KERNELS(float)
EMBER_PRECOMPILED_KERNELS(double)
EMBER_PRECOMPILED_KERNELS(bfloat16)
EMBER_PRECOMPILED_KERNELS(half)
EMBER_PRECOMPILED_KERNELS(std::int64_t)
// sum() and argmax() of a float tensor.
EMBER_PRECOMPILED_EXTERN template void cpu::reduce<expr::SumR<double>, float, expr::TensorLeaf<float, false>>(
    const Tensor<float>&, const expr::TensorLeaf<float, false>&, const char*);
EMBER_PRECOMPILED_EXTERN template void
cpu::reduce<expr::ArgR<float, false>, std::int64_t, expr::TensorLeaf<float, false>>(
    const Tensor<std::int64_t>&, const expr::TensorLeaf<float, false>&, const char*);
// The commonest one-operation expressions of float tensors, materialised: `a + b` (residuals), `a - b`, `a * b`,
// `relu(x)`, `gelu(x)`, `silu(x)`, `tanh(x)`, `sigmoid(x)`. Each is its kernel, its autograd node and the node's
// fused backward: a TU with `Tensor<float> y = a + b;` then compiles none of them (the character transformer's
// object code 117 -> 75 KB). Longer expressions are compiled where they are written, as header-only.
#define EMBER_PRECOMPILED_EXPR(E, X)                                                                                  \
  X template void cpu::assign<float, E>(const Tensor<float>&, const E&, const char*);                                 \
  X template void autograd::record_expr<float, E>(Tensor<float>&, const E&);                                          \
  X template struct autograd::ExprNode<float, E>;
namespace detail::precompiled {
using Leaf = expr::TensorLeaf<float, true>;
template <class Op>
using Binary = expr::BinaryExpr<Op, Leaf, Leaf>;
template <class Op>
using Unary = expr::UnaryExpr<Op, Leaf>;
}  // namespace detail::precompiled
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Binary<::ember::ops_table::Add>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Binary<::ember::ops_table::Sub>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Binary<::ember::ops_table::Mul>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Unary<::ember::ops_table::Relu>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Unary<::ember::ops_table::Gelu>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Unary<::ember::ops_table::Silu>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Unary<::ember::ops_table::Tanh>, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_EXPR(::ember::detail::precompiled::Unary<::ember::ops_table::Sigmoid>, EMBER_PRECOMPILED_EXTERN_1)
// Batching and concatenation of float data and int64 indices (token windows, labels), ranges of positions, and
// the reduction that sums a broadcast float operand's gradient down to its shape.
#define EMBER_PRECOMPILED_SHAPE_OPS(T)                                                                                \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> cat<T>(const std::vector<Tensor<T>>&, std::int64_t);                   \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> stack<T>(const std::vector<Tensor<T>>&, std::int64_t);                 \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> arange<T>(double, double, double);
EMBER_PRECOMPILED_SHAPE_OPS(float)
EMBER_PRECOMPILED_SHAPE_OPS(std::int64_t)
EMBER_PRECOMPILED_EXTERN template Tensor<float> autograd::sum_to<float, expr::TensorLeaf<float, false>>(
    const expr::TensorLeaf<float, false>&, const Shape&, const Shape&);
EMBER_PRECOMPILED_EXTERN template double optim::clip_grad_norm_<float>(const std::vector<Tensor<float>>&, double,
                                                                       double, bool);
// Tensor's own members (views, shape checks, item, backward) and the dtype-only autograd nodes, for the state
// dict's dtypes and the data's uint8. Explicit instantiation covers in-class (inline) members too; the larger ones
// are defined after the class, not inline, so that a TU does not compile them even to inline them.
#define EMBER_PRECOMPILED_TENSOR(T)                                                                                   \
  EMBER_PRECOMPILED_EXTERN template class Tensor<T>;                                                                  \
  EMBER_PRECOMPILED_EXTERN template struct detail::TensorOps<T>;                                                      \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> detail::copy_to_device<T>(const Tensor<T>&, Device, bool);              \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> detail::stage_to_host<T>(const Tensor<T>&);                             \
  EMBER_PRECOMPILED_EXTERN template Tensor<T> detail::empty<T>(const Shape&, Device, const char*);
#define EMBER_PRECOMPILED_NODES(T)                                                                                    \
  EMBER_PRECOMPILED_EXTERN template struct AutogradMeta<T>;                                                           \
  EMBER_PRECOMPILED_EXTERN template struct autograd::TypedNode<T>;                                                    \
  EMBER_PRECOMPILED_EXTERN template void autograd::TypedNode<T>::deliver<T>(std::size_t, Tensor<T>);                  \
  EMBER_PRECOMPILED_EXTERN template void autograd::set_history<T>(Tensor<T>&,                                        \
                                                                   const std::shared_ptr<autograd::TypedNode<T>>&);   \
  EMBER_PRECOMPILED_EXTERN template struct autograd::AccumulateGrad<T>;                                               \
  EMBER_PRECOMPILED_EXTERN template struct autograd::ViewNode<T>;                                                     \
  EMBER_PRECOMPILED_EXTERN template struct autograd::DeviceCopyNode<T>;
EMBER_PRECOMPILED_TENSOR(float)
EMBER_PRECOMPILED_TENSOR(double)
EMBER_PRECOMPILED_TENSOR(bfloat16)
EMBER_PRECOMPILED_TENSOR(half)
EMBER_PRECOMPILED_TENSOR(std::int64_t)
EMBER_PRECOMPILED_TENSOR(std::uint8_t)
EMBER_PRECOMPILED_NODES(float)
EMBER_PRECOMPILED_NODES(double)
EMBER_PRECOMPILED_NODES(bfloat16)
EMBER_PRECOMPILED_NODES(half)
// Module's members that visit every dtype of the state (member templates so that header-only TUs that do not call
// them do not compile them).
EMBER_PRECOMPILED_EXTERN template void nn::Module::zero_grad<void>(bool);
EMBER_PRECOMPILED_EXTERN template void nn::Module::to<void>(Device);
EMBER_PRECOMPILED_EXTERN template void nn::Module::load_state_dict<void>(const nn::StateDict&, bool);
EMBER_PRECOMPILED_EXTERN template nn::Module& nn::Module::requires_grad_<void>(bool);
EMBER_PRECOMPILED_EXTERN template std::vector<Tensor<float>> nn::Module::parameters<float>(bool) const;
EMBER_PRECOMPILED_EXTERN template std::vector<std::pair<std::string, Tensor<float>>>
nn::Module::named_parameters<float>(bool) const;
EMBER_PRECOMPILED_EXTERN template Tensor<float> nn::functional::dropout<float>(const Tensor<float>&, double, bool,
                                                                              Generator&);
EMBER_PRECOMPILED_EXTERN template class optim::SGD<float>;
EMBER_PRECOMPILED_EXTERN template class optim::BasicAdam<float, false>;
EMBER_PRECOMPILED_EXTERN template class optim::BasicAdam<float, true>;
// The layers' and optimizers' constructors, forwards and steps are defined outside their classes (not inline): an
// `extern` class instantiation then keeps a TU from compiling them at all, where in-class (inline) members would
// still be instantiated and optimised in every TU, to be inlined.
#define EMBER_PRECOMPILED_LAYERS(P, X)                                                                                \
  X template class nn::LinearT<P>;                                                                                    \
  X template class nn::Conv2dT<P>;                                                                                    \
  X template class nn::BatchNormT<2, P>;                                                                              \
  X template class nn::LayerNormT<P>;                                                                                 \
  X template class nn::EmbeddingT<P>;
EMBER_PRECOMPILED_LAYERS(amp::fp32, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_LAYERS(amp::bf16_mixed, EMBER_PRECOMPILED_EXTERN_1)
EMBER_PRECOMPILED_LAYERS(amp::fp16_mixed, EMBER_PRECOMPILED_EXTERN_1)
}  // namespace ember
#undef EMBER_PRECOMPILED_OPS
#undef EMBER_PRECOMPILED_KERNELS
#undef EMBER_PRECOMPILED_SHAPE_OPS
#undef EMBER_PRECOMPILED_TENSOR
#undef EMBER_PRECOMPILED_NODES
#undef EMBER_PRECOMPILED_LAYERS
#undef EMBER_PRECOMPILED_EXPR
#endif
