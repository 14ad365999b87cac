// ember example 4: a small CNN on Fashion-MNIST — (conv 3x3 → batch norm → ReLU → max-pool) twice, then a linear
// head — trained with SGD + Nesterov momentum under a one-cycle learning-rate schedule, with a threaded data loader
// doing the augmentation (random horizontal flips) while the model trains.
//
//   04_fashion_mnist_cnn [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] [--data DIR]
//                        [--save PATH]
//
// The trained weights are saved as safetensors (default fashion_mnist_cnn.safetensors; --save '' skips it) for
// example 07, which folds and quantizes them. Saving needs ember::io (nlohmann/json), which scripts/deps.sh installs.
//
// The precision is one type: Net<amp::fp32>, Net<amp::bf16_mixed> or Net<amp::fp16_mixed> (fp32 master weights,
// 16-bit activations, fp32 accumulation; the loss in fp32). fp16 trains with the loss scaler (amp::GradScaler).
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>
#if EMBER_EXAMPLE_SAVE
#include <ember/io.hpp>
#endif

#include "fashion_cnn.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

using namespace ember;

struct Args {
  int epochs = 5, workers = 2;
  std::size_t batch = 128;
  double max_lr = 0.1;
  std::string root, precision = "fp32", save = "fashion_mnist_cnn.safetensors";
};

template <amp::PrecisionPolicy P>
void train_and_evaluate(const Args& a) {
  manual_seed(0);
  data::FashionMNIST train_set(data::Split::Train, a.root), test_set(data::Split::Test, a.root);
  const data::transforms::Normalize normalize({0.2860f}, {0.3530f});  // the training set's mean and std
  data::DataLoader train(train_set, {.batch_size = a.batch, .shuffle = true, .num_workers = a.workers, .seed = 1},
                         data::transforms::Compose(data::transforms::RandomHorizontalFlip{}, normalize));
  data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = a.workers}, normalize);

  Net<P> model;
  std::printf("%zu training and %zu test images, %lld parameters, %d threads, precision %s\n", train_set.size(),
              test_set.size(), static_cast<long long>(model.num_parameters()), cpu::get_num_threads(),
              a.precision.c_str());
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  optim::OneCycleLR schedule(opt, a.max_lr, {.total_steps = std::int64_t(a.epochs) * std::int64_t(train.size())});
  // fp16 needs loss scaling; for fp32 and bf16 the disabled scaler passes everything through.
  amp::GradScaler scaler({.enabled = std::is_same_v<typename P::compute_t, half>});

  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    const auto t0 = std::chrono::steady_clock::now();
    model.train();
    train.set_epoch(std::uint64_t(epoch));
    double loss_sum = 0;
    std::size_t seen = 0, skipped = 0;
    for (auto& b : train) {
      Tensor<float> loss = nn::cross_entropy(model.forward(b.data), b.target);
      opt.zero_grad();
      scaler.scale(loss).backward();
      if (!scaler.step(opt)) ++skipped;  // an overflow in fp16: the step is skipped and the scale halved
      scaler.update();
      schedule.step();
      loss_sum += double(loss.item()) * double(b.size());
      seen += b.size();
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double waited = train.stats().wait_fraction();

    model.eval();
    InferenceMode inference;  // no graph, no saved tensors, no version counters
    std::int64_t correct = 0;
    for (auto& b : test) correct += sum(cast<std::int64_t>(argmax(model.forward(b.data), 1) == b.target)).item();
    std::printf("epoch %d  %5.1f s  %6.0f images/s  train loss %.4f  test accuracy %.2f%%  waiting for data %.1f%%",
                epoch + 1, secs, double(seen) / secs, loss_sum / double(seen),
                100.0 * double(correct) / double(test_set.size()), 100.0 * waited);
    if (scaler.is_enabled()) std::printf("  loss scale %g, %zu steps skipped", scaler.get_scale(), skipped);
    std::printf("\n");
  }
#if EMBER_EXAMPLE_SAVE
  if (!a.save.empty()) {
    io::TensorMap weights;
    for (const auto& entry : model.state_dict())  // (lambdas capture structured bindings only from clang 16 on)
      std::visit([&](const auto& x) { weights.emplace(entry.first, x); }, entry.second);
    io::save_safetensors(a.save, weights, {{"model", "examples/fashion_cnn.hpp Net"}, {"precision", a.precision}});
    std::printf("saved the weights to %s\n", a.save.c_str());
  }
#endif
}

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--epochs")) a.epochs = std::atoi(next());
    else if (!std::strcmp(argv[i], "--batch")) a.batch = std::size_t(std::atoi(next()));
    else if (!std::strcmp(argv[i], "--workers")) a.workers = std::atoi(next());
    else if (!std::strcmp(argv[i], "--lr")) a.max_lr = std::atof(next());
    else if (!std::strcmp(argv[i], "--precision")) a.precision = next();
    else if (!std::strcmp(argv[i], "--data")) a.root = next();
    else if (!std::strcmp(argv[i], "--save")) a.save = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] "
                   "[--data DIR] [--save PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    if (a.precision == "fp32") train_and_evaluate<amp::fp32>(a);
    else if (a.precision == "bf16") train_and_evaluate<amp::bf16_mixed>(a);
    else if (a.precision == "fp16") train_and_evaluate<amp::fp16_mixed>(a);
    else {
      std::fprintf(stderr, "--precision: fp32, bf16 or fp16, got '%s'\n", a.precision.c_str());
      return 2;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
