// Cookbook: an op with a backward of your own (as torch.autograd.Function), checked by gradcheck in double
// precision. README, "Cookbook".
#include <ember/ember.hpp>

#include <cstdio>

using namespace ember;

// [snippet]
/// softsign(x) = x / (1 + |x|), derivative 1 / (1 + |x|)^2: forward and backward by hand.
template <class T>
Tensor<T> softsign(const Tensor<T>& x) {
  return autograd::apply_function<T>(
      "Softsign", {x}, [](const std::vector<Tensor<T>>& in) { return Tensor<T>(in[0] / (T(1) + abs(in[0]))); },
      [](const Tensor<T>& grad, const std::vector<Tensor<T>>& in, const Tensor<T>& /*output*/) {
        return std::vector<Tensor<T>>{Tensor<T>(grad / square(T(1) + abs(in[0])))};
      });
}

int main() {
  const auto check = gradcheck([](const std::vector<Tensor<double>>& in) { return softsign(in[0]); },
                               {randn<double>({4, 5})});
  std::printf("gradcheck softsign: %s (max error %.2g)\n", check ? "ok" : check.message.c_str(), check.max_error);
  // [/snippet]
  Tensor<float> x = randn<float>({8}).requires_grad_();
  sum(softsign(x)).backward();  // float, on the tape like any op
  return check && x.grad().defined() ? 0 : 1;
}
