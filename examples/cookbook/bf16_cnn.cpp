// Cookbook: a CNN in bfloat16 mixed precision, one type parameter away from its fp32 form. README, "Cookbook".
#include <ember/ember.hpp>

#include <cmath>
#include <cstdio>

using namespace ember;

// [snippet]
template <amp::PrecisionPolicy P>
struct SmallCnn : nn::Module {
  using C = typename P::compute_t;  // bfloat16 under amp::bf16_mixed; parameters stay fp32
  nn::Conv2dT<P> conv{1, 16, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2dT<P> bn{16};
  nn::LinearT<P> fc{16 * 14 * 14, 10};
  SmallCnn() { register_module("conv", conv), register_module("bn", bn), register_module("fc", fc); }
  Tensor<float> forward(const Tensor<float>& x) const {  // x (N, 1, 28, 28) -> logits (N, 10) in fp32
    const Tensor<C> h = max_pool2d(Tensor<C>(relu(bn(conv(Tensor<C>(cast<C>(x)))))), 2);
    return Tensor<float>(cast<float>(fc(h.flatten(1))));
  }
};
// [/snippet]

int main() {
  manual_seed(0);
  SmallCnn<amp::bf16_mixed> model;
  optim::SGD<float> opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  const Tensor<float> x = rand<float>({32, 1, 28, 28});
  const Tensor<std::int64_t> y = randint<std::int64_t>(0, 10, {32});
  float first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    Tensor<float> loss = nn::cross_entropy(model.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("bf16 CNN: loss %.3f -> %.3f on one batch\n", first, last);
  return std::isfinite(last) && last < first ? 0 : 1;
}
