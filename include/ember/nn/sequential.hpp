// ember — nn::Sequential: runs its modules in order, each one's output the next one's input.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ember/core/tensor.hpp"
#include "ember/nn/activation.hpp"
#include "ember/nn/conv_bn.hpp"
#include "ember/nn/linear.hpp"
#include "ember/nn/module.hpp"
#include "ember/nn/pooling.hpp"

namespace ember::nn {

/// Holds a handle (a copy sharing parameters) of each module; a module can be run by Sequential on every dtype its
/// forward accepts. In training mode, each Conv2d -> BatchNorm2d [-> ReLU] [-> MaxPool2d(2)] group of float32
/// modules runs as one fused operation on the CPU (nn::conv_bn_forward): the same values and gradients, fewer passes
/// over memory.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  /// The modules in order (nn.Sequential(a, b, c)), named "0", "1", ...
  template <class... M>
    requires(sizeof...(M) > 0 && (std::is_base_of_v<Module, std::remove_cvref_t<M>> && ...))
  explicit Sequential(M&&... modules) : Module("Sequential") {
    (push_back(std::forward<M>(modules)), ...);
  }

  /// Appends a module, named by its position ("0", "1", ...) as in PyTorch.
  template <class M>
  Sequential& push_back(M&& module) {
    using D = std::remove_cvref_t<M>;
    static_assert(std::is_base_of_v<Module, D>, "Sequential::push_back: expected an nn::Module");
    auto m = std::make_shared<D>(std::forward<M>(module));
    register_module(std::to_string(stages_.size()), *m);
    Stage s;
    s.keep = m;
    bind<float>(s.f32, m);
    bind<double>(s.f64, m);
    bind<half>(s.f16, m);
    bind<bfloat16>(s.bf16, m);
    stages_.push_back(std::move(s));
    return *this;
  }

  /// Runs x through every module in order (an error when a module has no forward for T).
  template <class T>
  Tensor<T> forward(const Tensor<T>& x) const {
    Tensor<T> h = x;
    for (std::size_t i = 0; i < stages_.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        if (const std::size_t used = run_conv_bn(i, h)) {
          i += used - 1;
          continue;
        }
        if (run_linear_relu(i, h)) {
          ++i;
          continue;
        }
      }
      const auto& f = slot<T>(stages_[i]);
      EMBER_CHECK(bool(f), "Sequential: module ", i, " has no forward for a ", dtype_name<T>(), " tensor");
      h = f(h);
    }
    return h;
  }
  /// forward(x).
  template <class T>
  Tensor<T> operator()(const Tensor<T>& x) const {
    return forward(x);
  }
  /// The number of modules (len(seq)).
  std::size_t size() const { return stages_.size(); }

 private:
  // A Linear -> ReLU pair starting at stage i, run as one op (Linear::forward_relu): whether it ran. (Templates, as
  // run_conv_bn, only so that the layers' code is compiled where a Sequential runs, not wherever it is included.)
  template <class T>
  bool run_linear_relu(std::size_t i, Tensor<T>& h) const {
    if (i + 1 >= stages_.size()) return false;
    const auto* fc = dynamic_cast<const Linear*>(stages_[i].keep.get());
    const auto* r = fc ? dynamic_cast<const ReLU*>(stages_[i + 1].keep.get()) : nullptr;
    if (!r || nn::folded(*r)) return false;
    h = fc->forward_relu(h);
    return true;
  }
  // A Conv2d -> BatchNorm2d [-> ReLU] [-> MaxPool2d(2)] group starting at stage i, run fused on h when it can be:
  // returns the number of stages it ran (0: none).
  template <class T>
  std::size_t run_conv_bn(std::size_t i, Tensor<T>& h) const {
    if (i + 1 >= stages_.size()) return 0;
    const auto* conv = dynamic_cast<const Conv2d*>(stages_[i].keep.get());
    const auto* bn = conv ? dynamic_cast<const BatchNorm2d*>(stages_[i + 1].keep.get()) : nullptr;
    if (!bn) return 0;
    std::size_t used = 2;
    ConvBnTail tail;
    if (used + i < stages_.size()) {
      const auto* r = dynamic_cast<const ReLU*>(stages_[i + used].keep.get());
      if (r && !nn::folded(*r)) tail.relu = true, ++used;
    }
    if (used + i < stages_.size()) {
      const auto* p = dynamic_cast<const MaxPool2d*>(stages_[i + used].keep.get());
      const Size2 st = p ? (p->options.stride.h == 0 && p->options.stride.w == 0 ? p->kernel_size : p->options.stride)
                         : Size2(0);
      if (p && !nn::folded(*p) && p->kernel_size.h == 2 && p->kernel_size.w == 2 && st.h == 2 && st.w == 2 &&
          p->options.padding.h == 0 && p->options.padding.w == 0 && p->options.dilation.h == 1 &&
          p->options.dilation.w == 1 && !p->options.ceil_mode)
        tail.pool2 = true, ++used;
    }
    if (!conv_bn_fusable(*conv, *bn, h, tail.pool2)) return 0;
    h = conv_bn_forward(*conv, *bn, h, tail);
    return used;
  }

  template <class T>
  using Fn = std::function<Tensor<T>(const Tensor<T>&)>;
  struct Stage {
    std::shared_ptr<Module> keep;
    Fn<float> f32;
    Fn<double> f64;
    Fn<half> f16;
    Fn<bfloat16> bf16;
  };
  template <class T, class D>
  static void bind(Fn<T>& f, const std::shared_ptr<D>& m) {
    if constexpr (requires(D& d, const Tensor<T>& x) {
                    { d.forward(x) } -> std::convertible_to<Tensor<T>>;
                  })
      f = [m](const Tensor<T>& x) { return Tensor<T>(m->forward(x)); };
  }
  template <class T>
  static const Fn<T>& slot(const Stage& s) {
    if constexpr (std::is_same_v<T, float>) return s.f32;
    else if constexpr (std::is_same_v<T, double>) return s.f64;
    else if constexpr (std::is_same_v<T, half>) return s.f16;
    else return s.bf16;
  }

  std::vector<Stage> stages_;
};

}  // namespace ember::nn
