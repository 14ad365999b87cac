// A user's program grown one feature at a time, for scripts/compile_time.sh --ladder: compiled with -DEMBER_LADDER=k
// it uses the features of levels 1..k, so the difference between two levels is what one feature costs a header-only
// translation unit. The top level is the CNN of cnn_fmnist.cpp (smaller, and with the two small steps of levels 1
// and 2 kept in its training step). It builds and runs; what it is measured for is its compile time.
//
//   0  the headers, random input, printf
//   1  autograd on float tensors: a fused element-wise expression, a sum, backward
//   2  matmul (with its autograd node and backward)
//   3  nn::Linear in a Module, cross_entropy
//   4  SGD (momentum, Nesterov, weight decay) and OneCycleLR
//   5  Conv2d, ReLU and max_pool2d
//   6  BatchNorm2d
//   7  the Fashion-MNIST DataLoader with two workers and augmentation (instead of random batches)
//   8  evaluation: argmax, comparison with the labels, a count
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

#ifndef EMBER_LADDER
#define EMBER_LADDER 8
#endif

using namespace ember;

#if EMBER_LADDER >= 3
struct Net : nn::Module {
#if EMBER_LADDER >= 5
  nn::Conv2d conv{1, 16, 3, {.padding = 1, .bias = EMBER_LADDER < 6}};
#endif
#if EMBER_LADDER >= 6
  nn::BatchNorm2d bn{16};
#endif
  nn::Linear fc{EMBER_LADDER >= 5 ? 16 * 14 * 14 : 28 * 28, 10};

  Net() : nn::Module("Net") {
#if EMBER_LADDER >= 5
    register_module("conv", conv);
#endif
#if EMBER_LADDER >= 6
    register_module("bn", bn);
#endif
    register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    Tensor<float> h = x;
#if EMBER_LADDER >= 6
    h = max_pool2d(Tensor<float>(relu(bn(conv(h)))), 2);
#elif EMBER_LADDER >= 5
    h = max_pool2d(Tensor<float>(relu(conv(h))), 2);
#endif
    return fc(h.flatten(1));
  }
};
#endif

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "";
  try {
    manual_seed(0);
    const Tensor<float> x = randn<float>(Shape{64, 1, 28, 28});
    const Tensor<std::int64_t> y = zeros<std::int64_t>(Shape{64});
    double total = double(x.data()[0]);
#if EMBER_LADDER >= 1
    const Tensor<float> w1 = randn<float>(Shape{28 * 28}).requires_grad_(true);
#endif
#if EMBER_LADDER >= 2
    const Tensor<float> w2 = randn<float>(Shape{10, 28 * 28}).requires_grad_(true);
#endif
#if EMBER_LADDER >= 3
    Net model;
#endif
#if EMBER_LADDER >= 4
    optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
    optim::OneCycleLR schedule(opt, 0.05, {.total_steps = 1000});
#endif
    // One training step on a batch.
    auto step = [&](const Tensor<float>& xb, const Tensor<std::int64_t>& yb) {
      (void)xb;
      (void)yb;
#if EMBER_LADDER >= 1
      Tensor<float> l1 = sum(relu(xb.flatten(1) * w1 + 0.5f));
      l1.backward();
      total += double(l1.item());
#endif
#if EMBER_LADDER >= 2
      Tensor<float> l2 = sum(matmul(xb.flatten(1), w2.transpose(0, 1)));
      l2.backward();
      total += double(l2.item());
#endif
#if EMBER_LADDER >= 3
      Tensor<float> loss = nn::cross_entropy(model.forward(xb), yb);
#if EMBER_LADDER >= 4
      opt.zero_grad();
#endif
      loss.backward();
#if EMBER_LADDER >= 4
      opt.step();
      schedule.step();
#endif
      total += double(loss.item());
#endif
    };
#if EMBER_LADDER >= 7
    data::FashionMNIST train_set(data::Split::Train, root);
    const data::transforms::Normalize normalize({0.2860f}, {0.3530f});
    data::DataLoader train(train_set, {.batch_size = 64, .shuffle = true, .num_workers = 2, .seed = 1},
                           data::transforms::Compose(data::transforms::RandomHorizontalFlip{}, normalize));
    int batches = 0;
    for (auto& b : train) {
      step(b.data, b.target);
      if (++batches == 20) break;
    }
#else
    for (int i = 0; i < 3; ++i) step(x, y);
#endif
#if EMBER_LADDER >= 8
    {
      NoGradGuard no_grad;
      model.eval();
      total += double(sum(cast<std::int64_t>(argmax(model.forward(x), 1) == y)).item());
    }
#endif
    std::printf("level %d: %.4f\n", EMBER_LADDER, total);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
