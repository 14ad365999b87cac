// ember — parameter initialisation, as torch.nn.init: each function fills a tensor in place (without recording
// autograd) from a seedable generator and returns it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"

namespace ember::nn::init {

enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, Conv, Sigmoid, Tanh, ReLU, LeakyReLU, SELU };

/// The recommended gain for a nonlinearity (torch.nn.init.calculate_gain).
inline double calculate_gain(Nonlinearity nl, double param = 0.01) {
  switch (nl) {
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::SELU: return 3.0 / 4.0;
    default: return 1.0;
  }
}

/// (fan_in, fan_out) of a weight: dims 1 and 0 times the receptive field (the product of the dims after 1).
template <class T>
std::pair<std::int64_t, std::int64_t> fans(const Tensor<T>& w) {
  EMBER_CHECK(w.dim() >= 2, "init: fan in and fan out cannot be computed for a tensor with fewer than 2 dims (shape ",
              w.shape().str(), ")");
  std::int64_t rf = 1;
  for (int i = 2; i < w.dim(); ++i) rf *= w.size(i);
  return {w.size(1) * rf, w.size(0) * rf};
}

/// Fills t with U(a, b).
template <class T>
Tensor<T>& uniform_(Tensor<T>& t, double a = 0.0, double b = 1.0, Generator& g = default_generator()) {
  EMBER_CHECK(a <= b, "init::uniform_: expected a <= b, got [", a, ", ", b, "]");
  NoGradGuard ng;
  Tensor<T> r = rand<T>(t.shape(), g);
  if (t.device().is_cpu()) t = r * T(b - a) + T(a);
  else t.copy_(Tensor<T>(r * T(b - a) + T(a)));  // drawn on the host, as on the CPU, then copied to the device
  return t;
}
/// Fills t with N(mean, std²).
template <class T>
Tensor<T>& normal_(Tensor<T>& t, double mean = 0.0, double std = 1.0, Generator& g = default_generator()) {
  EMBER_CHECK(std >= 0, "init::normal_: std must be non-negative, got ", std);
  NoGradGuard ng;
  Tensor<T> r = randn<T>(t.shape(), g);
  if (t.device().is_cpu()) t = r * T(std) + T(mean);
  else t.copy_(Tensor<T>(r * T(std) + T(mean)));  // drawn on the host, as on the CPU, then copied to the device
  return t;
}
template <class T>
Tensor<T>& constant_(Tensor<T>& t, double v) {
  NoGradGuard ng;
  t.fill_(T(v));
  return t;
}
template <class T>
Tensor<T>& zeros_(Tensor<T>& t) {
  return constant_(t, 0.0);
}
template <class T>
Tensor<T>& ones_(Tensor<T>& t) {
  return constant_(t, 1.0);
}

/// Glorot: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
template <class T>
Tensor<T>& xavier_uniform_(Tensor<T>& t, double gain = 1.0, Generator& g = default_generator()) {
  auto [fi, fo] = fans(t);
  const double a = gain * std::sqrt(6.0 / double(fi + fo));
  return uniform_(t, -a, a, g);
}
/// Glorot: N(0, std²) with std = gain * sqrt(2 / (fan_in + fan_out)).
template <class T>
Tensor<T>& xavier_normal_(Tensor<T>& t, double gain = 1.0, Generator& g = default_generator()) {
  auto [fi, fo] = fans(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / double(fi + fo)), g);
}
/// He: U(-b, b) with b = gain * sqrt(3 / fan); gain from the nonlinearity (a = negative slope of a leaky ReLU).
template <class T>
Tensor<T>& kaiming_uniform_(Tensor<T>& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                            Nonlinearity nl = Nonlinearity::LeakyReLU, Generator& g = default_generator()) {
  auto [fi, fo] = fans(t);
  const double fan = double(mode == FanMode::FanIn ? fi : fo);
  EMBER_CHECK(fan > 0, "init::kaiming_uniform_: zero fan for a tensor of shape ", t.shape().str());
  const double bound = calculate_gain(nl, a) * std::sqrt(3.0 / fan);
  return uniform_(t, -bound, bound, g);
}
/// He: N(0, std²) with std = gain / sqrt(fan).
template <class T>
Tensor<T>& kaiming_normal_(Tensor<T>& t, double a = 0.0, FanMode mode = FanMode::FanIn,
                           Nonlinearity nl = Nonlinearity::LeakyReLU, Generator& g = default_generator()) {
  auto [fi, fo] = fans(t);
  const double fan = double(mode == FanMode::FanIn ? fi : fo);
  EMBER_CHECK(fan > 0, "init::kaiming_normal_: zero fan for a tensor of shape ", t.shape().str());
  return normal_(t, 0.0, calculate_gain(nl, a) / std::sqrt(fan), g);
}

/// PyTorch's default for Linear and Conv layers: kaiming_uniform_(w, a = sqrt(5)), i.e. U(±1/sqrt(fan_in)), and the
/// bias U(±1/sqrt(fan_in)).
template <class T>
void default_weight_and_bias_(Tensor<T>& w, Tensor<T>* b, Generator& g = default_generator()) {
  kaiming_uniform_(w, std::sqrt(5.0), FanMode::FanIn, Nonlinearity::LeakyReLU, g);
  if (b && b->defined()) {
    const double fi = double(fans(w).first);
    const double bound = fi > 0 ? 1.0 / std::sqrt(fi) : 0.0;
    uniform_(*b, -bound, bound, g);
  }
}

}  // namespace ember::nn::init
