// A user's program, kept for scripts/compile_time.sh: a small ResNet (two residual stages, batch norm, global
// average pooling) trained on Fashion-MNIST with the threaded DataLoader doing augmentation (random crop with
// padding, horizontal flip, random erasing). It builds and runs; what it is measured for is its compile time.
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <cstdio>
#include <string>

using namespace ember;

struct Block : nn::Module {
  nn::Conv2d c1, c2;
  nn::BatchNorm2d b1, b2;
  std::optional<nn::Conv2d> down;
  std::optional<nn::BatchNorm2d> down_bn;

  Block(std::int64_t in, std::int64_t out, std::int64_t stride)
      : nn::Module("Block"),
        c1(in, out, 3, {.stride = stride, .padding = 1, .bias = false}),
        c2(out, out, 3, {.padding = 1, .bias = false}),
        b1(out),
        b2(out) {
    register_module("conv1", c1);
    register_module("bn1", b1);
    register_module("conv2", c2);
    register_module("bn2", b2);
    if (stride != 1 || in != out) {
      down.emplace(in, out, 1, nn::Conv2dOptions{.stride = stride, .bias = false});
      down_bn.emplace(out);
      register_module("downsample_conv", *down);
      register_module("downsample_bn", *down_bn);
    }
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    Tensor<float> h = relu(b1(c1(x)));
    h = b2(c2(h));
    const Tensor<float> skip = down ? (*down_bn)((*down)(x)) : x;
    return relu(h + skip);
  }
};

struct ResNet : nn::Module {
  nn::Conv2d stem{1, 16, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d stem_bn{16};
  Block l1{16, 16, 1}, l2{16, 32, 2}, l3{32, 64, 2};
  nn::Linear fc{64, 10};

  ResNet() : nn::Module("ResNet") {
    register_module("conv1", stem);
    register_module("bn1", stem_bn);
    register_module("layer1", l1);
    register_module("layer2", l2);
    register_module("layer3", l3);
    register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    Tensor<float> h = relu(stem_bn(stem(x)));
    h = l3.forward(l2.forward(l1.forward(h)));                          // (N, 64, 7, 7)
    return fc(adaptive_avg_pool2d(h, 1).flatten(1));                    // (N, 10)
  }
};

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "";
  const std::int64_t max_steps = argc > 2 ? std::stoll(argv[2]) : 50;
  try {
    manual_seed(0);
    namespace T = data::transforms;
    data::FashionMNIST train_set(data::Split::Train, root), test_set(data::Split::Test, root);
    const T::Normalize normalize({0.2860f}, {0.3530f});
    data::DataLoader train(train_set, {.batch_size = 128, .shuffle = true, .num_workers = 2, .pin_memory = true},
                           T::Compose(T::RandomCrop(28, {.padding = 2}), T::RandomHorizontalFlip{}, normalize,
                                      T::RandomErasing{}));
    data::DataLoader test(test_set, {.batch_size = 500, .num_workers = 1}, normalize);

    ResNet model;
    optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
    optim::OneCycleLR schedule(opt, 0.1, {.total_steps = max_steps});
    nn::CrossEntropyOptions<float> smooth;
    smooth.label_smoothing = 0.1;
    model.train();
    std::int64_t step = 0;
    for (auto& b : train) {
      if (step++ == max_steps) break;
      Tensor<float> loss = nn::cross_entropy(model.forward(b.data), b.target, smooth);
      opt.zero_grad();
      loss.backward();
      optim::clip_grad_norm_(model.parameters(), 5.0);
      opt.step();
      schedule.step();
      if (step % 10 == 0) std::printf("step %lld  loss %.4f\n", static_cast<long long>(step), double(loss.item()));
    }
    model.eval();
    NoGradGuard no_grad;
    std::int64_t correct = 0;
    for (auto& b : test) correct += sum(cast<std::int64_t>(argmax(model.forward(b.data), 1) == b.target)).item();
    std::printf("test accuracy %.2f%%\n", 100.0 * double(correct) / double(test_set.size()));
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
