// A user's program, kept for scripts/compile_time.sh: the fp32 CNN of examples/04 as it stood before the example
// took --precision (which compiles the model three times, once per policy), so that the compile-time series stays
// one model in one precision. It builds and runs like the example; what it is measured for is its compile time.
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace ember;

struct Net : nn::Module {
  nn::Conv2d conv1{1, 32, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn1{32};
  nn::Conv2d conv2{32, 64, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn2{64};
  nn::Linear fc{64 * 7 * 7, 10};

  Net() : nn::Module("Net") {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc", fc);
  }
  /// x (N, 1, 28, 28) -> logits (N, 10)
  Tensor<float> forward(const Tensor<float>& x) const {
    Tensor<float> h = max_pool2d(Tensor<float>(relu(bn1(conv1(x)))), 2);  // (N, 32, 14, 14)
    h = max_pool2d(Tensor<float>(relu(bn2(conv2(h)))), 2);                // (N, 64, 7, 7)
    return fc(h.flatten(1));
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
                           data::transforms::Compose(data::transforms::RandomHorizontalFlip{}, normalize));
    data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = workers}, normalize);

    Net model;
    std::printf("%zu training and %zu test images, %lld parameters, %d threads\n", train_set.size(), test_set.size(),
                static_cast<long long>(model.num_parameters()), cpu::get_num_threads());
    optim::SGD opt(model.parameters(), {.lr = max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
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
