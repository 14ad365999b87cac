// Cookbook: fold BatchNorm into the convolutions, quantize to int8 after calibration, save and load the int8 model.
// README, "Cookbook".
#include <ember/ember.hpp>
#include <ember/io.hpp>
#include <ember/nn/fuse.hpp>
#include <ember/quant.hpp>

#include <cstdio>
#include <filesystem>

using namespace ember;

struct Net : nn::Module {
  nn::Conv2d conv{3, 16, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn{16};
  nn::ReLU relu;
  nn::MaxPool2d pool{2};
  nn::Linear fc{16 * 8 * 8, 10};
  Net() {
    register_module("conv", conv), register_module("bn", bn), register_module("relu", relu);
    register_module("pool", pool), register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const { return fc(pool(relu(bn(conv(x)))).flatten(1)); }
};

int main() {
  manual_seed(0);
  Net model;  // (a trained model, in practice)
  const Tensor<float> calib = randn<float>({64, 3, 16, 16}), test = randn<float>({8, 3, 16, 16});
  // [snippet]
  model.eval();
  nn::fuse_modules(model, {{"conv", "bn", "relu", "pool"}});  // BatchNorm folded, ReLU and pool in the epilogue
  quant::prepare(model);                                        // observers on every Linear and Conv2d
  {
    InferenceMode g;
    for (int b = 0; b < 4; ++b) (void)model.forward(calib.narrow(0, b * 16, 16));  // calibration batches
  }
  quant::convert(model);                             // int8 weights per channel, int8 GEMMs with int32 sums
  quant::save(model, "cookbook_int8.safetensors");
  Net fresh;  // the same architecture, folded the same way, then the int8 file
  fresh.eval();
  nn::fuse_modules(fresh, {{"conv", "bn", "relu", "pool"}});
  quant::load(fresh, "cookbook_int8.safetensors");
  // [/snippet]
  InferenceMode g;
  const auto a = model.forward(test).to_vector(), b = fresh.forward(test).to_vector();
  std::printf("int8 model saved and loaded: %s logits\n", a == b ? "identical" : "DIFFERENT");
  std::filesystem::remove("cookbook_int8.safetensors");
  return a == b ? 0 : 1;
}
