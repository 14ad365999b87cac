// The CNN of examples 04 (training) and 07 (quantization): (conv 3x3 → batch norm → ReLU → max-pool) twice, then a
// linear head, for 28x28 Fashion-MNIST images. The ReLUs and pools are modules, so nn::fuse_modules can move them
// into the convolutions. The precision is one type: Net<amp::fp32>, Net<amp::bf16_mixed> or Net<amp::fp16_mixed>
// (fp32 master weights, 16-bit activations, fp32 accumulation; the loss in fp32).
#pragma once

#include <ember/ember.hpp>

#include <type_traits>

template <ember::amp::PrecisionPolicy P>
struct Net : ember::nn::Module {
  using C = typename P::compute_t;
  ember::nn::Conv2dT<P> conv1{1, 32, 3, {.padding = 1, .bias = false}};
  ember::nn::BatchNormT<2, P> bn1{32};
  ember::nn::ReLU relu1;
  ember::nn::MaxPool2d pool1{2};
  ember::nn::Conv2dT<P> conv2{32, 64, 3, {.padding = 1, .bias = false}};
  ember::nn::BatchNormT<2, P> bn2{64};
  ember::nn::ReLU relu2;
  ember::nn::MaxPool2d pool2{2};
  ember::nn::LinearT<P> fc{64 * 7 * 7, 10};

  Net() : ember::nn::Module("Net") {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("relu1", relu1);
    register_module("pool1", pool1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("relu2", relu2);
    register_module("pool2", pool2);
    register_module("fc", fc);
  }
  /// x (N, 1, 28, 28) -> logits (N, 10), in fp32 for the loss
  ember::Tensor<float> forward(const ember::Tensor<float>& x) const {
    using ember::Tensor;
    const Tensor<C> h1 = pool1(relu1(bn1(conv1(to_c(x)))));  // (N, 32, 14, 14)
    const Tensor<C> h2 = pool2(relu2(bn2(conv2(h1))));       // (N, 64, 7, 7)
    return to_float(fc(h2.flatten(1)));
  }
  static ember::Tensor<C> to_c(const ember::Tensor<float>& x) {
    if constexpr (std::is_same_v<C, float>) return x;
    else return ember::Tensor<C>(ember::cast<C>(x));
  }
  static ember::Tensor<float> to_float(const ember::Tensor<C>& y) {
    if constexpr (std::is_same_v<C, float>) return y;
    else return ember::Tensor<float>(ember::cast<float>(y));
  }
};
