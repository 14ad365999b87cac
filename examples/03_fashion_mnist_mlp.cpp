// ember example 3: a multi-layer perceptron (784-256-128-10, ReLU) on Fashion-MNIST, trained with SGD + Nesterov
// momentum under a one-cycle learning-rate schedule; a threaded data loader normalises the images.
//
//   03_fashion_mnist_mlp [--epochs N] [--batch N] [--workers N] [--lr X] [--data DIR]
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace ember;

struct Mlp : nn::Module {
  nn::Linear fc1{784, 256}, fc2{256, 128}, fc3{128, 10};

  Mlp() : nn::Module("Mlp") {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  /// x (N, 1, 28, 28) -> logits (N, 10)
  Tensor<float> forward(const Tensor<float>& x) const {
    // Each `relu(...)` is an expression materialised into a new tensor (assigning an expression to an existing
    // tensor would write into its memory instead).
    const Tensor<float> h1 = relu(fc1(x.flatten(1)));  // (N, 256)
    const Tensor<float> h2 = relu(fc2(h1));            // (N, 128)
    return fc3(h2);
  }
};

int main(int argc, char** argv) {
  int epochs = 5, workers = 2;
  std::size_t batch = 128;
  double max_lr = 0.1;
  std::string root;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--epochs")) epochs = std::atoi(next());
    else if (!std::strcmp(argv[i], "--batch")) batch = std::size_t(std::atoi(next()));
    else if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(next());
    else if (!std::strcmp(argv[i], "--lr")) max_lr = std::atof(next());
    else if (!std::strcmp(argv[i], "--data")) root = next();
    else {
      std::fprintf(stderr, "usage: %s [--epochs N] [--batch N] [--workers N] [--lr X] [--data DIR]\n", argv[0]);
      return 2;
    }
  }
  try {
    manual_seed(0);
    data::FashionMNIST train_set(data::Split::Train, root), test_set(data::Split::Test, root);
    const data::transforms::Normalize normalize({0.2860f}, {0.3530f});  // the training set's mean and std
    data::DataLoader train(train_set, {.batch_size = batch, .shuffle = true, .num_workers = workers, .seed = 1},
                           normalize);
    data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = workers}, normalize);

    Mlp model;
    std::printf("%zu training and %zu test images, %lld parameters, %d threads\n", train_set.size(), test_set.size(),
                static_cast<long long>(model.num_parameters()), cpu::get_num_threads());
    optim::SGD opt(model.parameters(), {.lr = max_lr, .momentum = 0.9, .nesterov = true});
    optim::OneCycleLR schedule(opt, max_lr, {.total_steps = std::int64_t(epochs) * std::int64_t(train.size())});

    for (int epoch = 0; epoch < epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      model.train();
      train.set_epoch(std::uint64_t(epoch));
      double loss_sum = 0;
      std::size_t seen = 0;
      for (auto& b : train) {
        Tensor<float> loss = nn::cross_entropy(model.forward(b.data), b.target);
        opt.zero_grad();
        loss.backward();
        opt.step();
        schedule.step();
        loss_sum += double(loss.item()) * double(b.size());
        seen += b.size();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double waited = train.stats().wait_fraction();

      model.eval();
      NoGradGuard no_grad;
      std::int64_t correct = 0;
      for (auto& b : test) correct += sum(cast<std::int64_t>(argmax(model.forward(b.data), 1) == b.target)).item();
      std::printf("epoch %d  %5.1f s  %6.0f images/s  train loss %.4f  test accuracy %.2f%%  waiting for data %.1f%%\n",
                  epoch + 1, secs, double(seen) / secs, loss_sum / double(seen),
                  100.0 * double(correct) / double(test_set.size()), 100.0 * waited);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
