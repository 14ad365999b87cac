// ember — gradcheck: compares the gradients autograd computes with central finite differences, in double
// precision. The output is projected on a fixed random vector v, so one backward pass gives vᵀJ, and each input
// element is perturbed by ±eps to get the same quantity numerically.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/tensor_ops.hpp"
#include "ember/autograd/reduce.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/random.hpp"
#include "ember/core/tensor.hpp"

namespace ember {

/// What gradcheck returns: whether the analytic gradients match the numerical ones (torch.autograd.gradcheck's
/// result, with the details PyTorch puts in its exception).
struct GradcheckResult {
  bool ok = true;        ///< Every gradient within the tolerances.
  double max_error = 0;  ///< The largest |numeric - analytic|.
  std::string message;   ///< The first mismatch, if any.
  /// ok.
  explicit operator bool() const { return ok; }
};

/// f maps a list of double tensors to a double tensor of any shape. The inputs given are copied into fresh
/// leaves (views of them may be taken inside f). Passes when |numeric - analytic| <= atol + rtol * |numeric|.
/// (T is double; a template parameter only so that the body's tensor expressions are compiled in the TUs that call
/// gradcheck and not in every TU that includes this header.)
template <class F, class T = double>
GradcheckResult gradcheck(F&& f, const std::vector<Tensor<T>>& inputs, double eps = 1e-6, double atol = 1e-5,
                          double rtol = 1e-4) {
  static_assert(std::is_same_v<T, double>, "gradcheck: the inputs are double tensors");
  std::vector<Tensor<T>> xs;
  for (const auto& x : inputs) {
    x.check_cpu("gradcheck");  // it perturbs the inputs element by element on the host
    Tensor<T> c = x.detach().clone();
    c.requires_grad_(true);
    xs.push_back(c);
  }
  GradcheckResult res;
  Tensor<T> y = f(xs);
  EMBER_CHECK(y.requires_grad(), "gradcheck: the output does not depend on any input through differentiable ops");
  Generator gen(0x9e3779b97f4a7c15ULL);
  Tensor<T> v = randn<T>(y.shape(), gen);
  y.backward(v);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    Tensor<T>& x = xs[i];
    const Tensor<T> ana = x.grad().defined() ? x.grad().contiguous() : zeros<T>(x.shape());
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      T* p = x.data() + j;
      const double orig = *p;
      auto project = [&] {
        NoGradGuard ng;
        Tensor<T> out = f(xs);
        return sum(out * v).item();
      };
      *p = orig + eps;
      const double lp = project();
      *p = orig - eps;
      const double lm = project();
      *p = orig;
      const double num = (lp - lm) / (2 * eps), a = ana.data()[j];
      const double err = std::fabs(num - a);
      res.max_error = std::max(res.max_error, err);
      if (!(err <= atol + rtol * std::fabs(num)) && res.ok) {
        res.ok = false;
        res.message = "gradcheck: input " + std::to_string(i) + " (shape " + x.shape().str() + "), element " +
                      std::to_string(j) + ": numeric " + std::to_string(num) + " vs analytic " + std::to_string(a);
      }
    }
  }
  return res;
}

}  // namespace ember
