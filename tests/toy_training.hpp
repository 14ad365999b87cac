// The small model and dataset that the Trainer's and the profiler's tests train on (test_train.cpp,
// test_profile.cpp), and reading a file back whole.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "ember/data.hpp"
#include "ember/ember.hpp"

namespace ember_test {

using namespace ember;

/// A two-layer MLP: Linear(4, 8), ReLU, Linear(8, 3).
struct Net : nn::Module {
  nn::Linear fc1{4, 8}, fc2{8, 3};
  Net() : nn::Module("Net") {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor<float> forward(const Tensor<float>& x) const { return fc2(Tensor<float>(relu(fc1(x)))); }
  Tensor<float> operator()(const Tensor<float>& x) const { return forward(x); }
};

/// n samples of shape (1, 2, 2) with values from their index; target i % 3.
struct Toy {
  std::size_t n = 40;
  std::size_t size() const { return n; }
  data::Example get(std::size_t i) const {
    Tensor<float> x = empty<float>(Shape{1, 2, 2});
    for (int k = 0; k < 4; ++k)
      x.data()[k] = std::sin(float(i) * 0.7f + float(k)) + (i % 3 == std::size_t(k % 3) ? 1.f : 0.f);
    return {x, std::int64_t(i % 3)};
  }
};

/// Toy's (N, 1, 2, 2) batches as (N, 4) rows for Net.
inline Tensor<float> flat(const Tensor<float>& x) { return x.reshape({x.size(0), 4}); }

/// The whole content of the file at p.
inline std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ember_test
