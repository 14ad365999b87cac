// ember example 4: a small CNN on Fashion-MNIST — (conv 3x3 → batch norm → ReLU → max-pool) twice, then a linear
// head — trained with SGD + Nesterov momentum under a one-cycle learning-rate schedule, with a threaded data loader
// doing the augmentation (random horizontal flips) while the model trains.
//
//   04_fashion_mnist_cnn [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] [--data DIR]
//                        [--save PATH]
//
// The loop is train::Trainer's: a live progress bar, the test set evaluated after every epoch (the validation step),
// the scheduler stepped per batch, loss scaling for fp16, and a line at the end saying whether the run waited for
// data (example 03 adds TensorBoard logs, checkpoints and resuming).
//
// The trained weights are saved as safetensors (default fashion_mnist_cnn.safetensors; --save '' skips it) for
// example 07, which folds and quantizes them. Saving links ember::io (CMake does it).
//
// The precision is one type: Net<amp::fp32>, Net<amp::bf16_mixed> or Net<amp::fp16_mixed> (fp32 master weights,
// 16-bit activations, fp32 accumulation; the loss in fp32).
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/train.hpp>
#if EMBER_EXAMPLE_SAVE
#include <ember/io.hpp>
#endif

#include "fashion_cnn.hpp"
#include "flags.hpp"

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
  std::printf("%zu training and %zu test images, %lld parameters, %d threads, precision %s, %s\n", train_set.size(),
              test_set.size(), static_cast<long long>(model.num_parameters()), cpu::get_num_threads(),
              a.precision.c_str(), cpu::describe().c_str());
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  optim::OneCycleLR schedule(opt, a.max_lr, {.total_steps = std::int64_t(a.epochs) * std::int64_t(train.size())});

  // fp16 needs loss scaling (the Trainer runs an amp::GradScaler); fp32 and bf16 need none.
  const bool fp16 = std::is_same_v<typename P::compute_t, half>;
  train::Trainer trainer({.max_epochs = a.epochs, .precision = fp16 ? train::Precision::fp16_mixed
                                                                   : train::Precision::fp32});
  const train::FitResult r = trainer.fit(
      model, opt, train, &test, [&](data::Batch& b) { return nn::cross_entropy(model.forward(b.data), b.target); },
      [&](data::Batch& b) {  // runs in eval mode under InferenceMode: no graph, no saved tensors
        const Tensor<float> logits = model.forward(b.data);
        const double correct = double(sum(cast<std::int64_t>(argmax(logits, 1) == b.target)).item());
        return train::Metrics{{"test_loss", nn::cross_entropy(logits, b.target).item()},
                              {"test_acc", correct / double(b.size())}};
      },
      {.scheduler = &schedule});
  std::printf("test accuracy %.2f%% after %lld epochs\n", 100.0 * r.metrics.get("test_acc").value_or(0),
              static_cast<long long>(r.epochs));
  if (fp16) std::printf("fp16: %lld steps skipped for overflow\n", static_cast<long long>(r.skipped_steps));
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
    if (!std::strcmp(argv[i], "--epochs")) a.epochs = int(examples::int_flag("--epochs", next(), 1, 1000));
    else if (!std::strcmp(argv[i], "--batch")) a.batch = std::size_t(examples::int_flag("--batch", next(), 1, 60000));
    else if (!std::strcmp(argv[i], "--workers")) a.workers = int(examples::int_flag("--workers", next(), 0, 256));
    else if (!std::strcmp(argv[i], "--lr")) a.max_lr = examples::real_flag("--lr", next(), 1e-9, 100);
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
