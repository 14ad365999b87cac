// ember — differentiable ops of your own, as torch.autograd.Function: a forward computed from the inputs and a
// backward that maps the output's gradient to the inputs' gradients, recorded on the tape as one node.
//
//   // y = x * sigmoid(x), with its derivative written by hand
//   Tensor<float> y = autograd::apply_function<float>(
//       "Swish", {x},
//       [](const std::vector<Tensor<float>>& in) { return Tensor<float>(in[0] * sigmoid(in[0])); },
//       [](const Tensor<float>& grad, const std::vector<Tensor<float>>& in, const Tensor<float>&) {
//         Tensor<float> s = sigmoid(in[0]);
//         return std::vector<Tensor<float>>{Tensor<float>(grad * s * (1.f + in[0] * (1.f - s)))};
//       });
//
// The forward runs without recording (what it does is not differentiated); the backward gets the output's gradient,
// the inputs and the output as they were (an in-place change to either before backward is an error, as for ember's
// own ops), and returns one gradient per input, each of its input's shape, or an undefined tensor for "none".
// Check the pair with gradcheck in double precision (autograd/gradcheck.hpp).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/autograd/grad_mode.hpp"
#include "ember/autograd/node.hpp"

namespace ember::autograd {

template <class T>
using FunctionBackward =
    std::function<std::vector<Tensor<T>>(const Tensor<T>& grad, const std::vector<Tensor<T>>& inputs,
                                         const Tensor<T>& output)>;

/// The tape entry of apply_function: the user's backward, with what it reads saved.
template <class T>
struct FunctionNode final : TypedNode<T> {
  std::string op;
  FunctionBackward<T> fn;
  std::vector<Saved<T>> inputs;
  std::vector<Shape> shapes;
  Saved<T> result;  // the output, as a handle without autograd state (no cycle through its grad_fn)
  const char* name() const override { return op.c_str(); }
  void release() override {
    inputs.clear();
    result = Saved<T>();
  }
  void backward() override {
    EMBER_CHECK(bool(fn), op, ": backward ran twice (call backward(retain_graph) to keep the graph)");
    std::vector<Tensor<T>> in;
    in.reserve(inputs.size());
    for (const Saved<T>& s : inputs) in.push_back(s.get(op.c_str()));
    std::vector<Tensor<T>> g;
    {
      NoGradGuard ng;
      g = fn(this->grad, in, result.get(op.c_str()));
    }
    EMBER_CHECK(g.size() == shapes.size(), op, ": backward returned ", g.size(), " gradients for ", shapes.size(),
                " inputs");
    for (std::size_t k = 0; k < g.size(); ++k) {
      if (!g[k].defined()) continue;
      EMBER_CHECK(g[k].shape() == shapes[k], op, ": backward returned a gradient of shape ", g[k].shape().str(),
                  " for input ", k, " of shape ", shapes[k].str());
      EMBER_CHECK(g[k].device() == in[k].device(), op, ": backward returned input ", k, "'s gradient on ",
                  g[k].device().str(), ", the input is on ", in[k].device().str());
      this->template deliver<T>(k, std::move(g[k]));
    }
  }
};

/// Runs `forward(inputs)` without recording and, when an input requires a gradient (and grad mode is on), records
/// one node whose backward is `backward(grad, inputs, output)`. `name` names the node in errors and profiles.
template <class T, class Forward, class Backward>
Tensor<T> apply_function(const std::string& name, const std::vector<Tensor<T>>& inputs, Forward&& forward,
                         Backward&& backward) {
  for (std::size_t k = 0; k < inputs.size(); ++k)
    EMBER_CHECK(inputs[k].defined(), name, ": input ", k, " is an undefined tensor");
  Tensor<T> y;
  {
    NoGradGuard ng;
    y = forward(inputs);
  }
  EMBER_CHECK(y.defined(), name, ": forward returned an undefined tensor");
  bool needs = false;
  for (const auto& x : inputs) needs = needs || x.requires_grad();
  if (!needs || !is_grad_enabled()) return y;
  y = y.detach();  // a handle of its own (forward may have returned an input, or a view of one)
  auto node = std::make_shared<FunctionNode<T>>();
  node->op = name;
  node->fn = FunctionBackward<T>(std::forward<Backward>(backward));
  for (const auto& x : inputs) {
    node->inputs.emplace_back(x.detach());
    node->shapes.push_back(x.shape());
    node->next.push_back(gradient_edge(x));
  }
  node->result = Saved<T>(y.detach());
  node->output = y.impl_ptr();
  set_history<T>(y, node);
  return y;
}

}  // namespace ember::autograd
