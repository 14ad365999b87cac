// ember example 3: a multi-layer perceptron (784-256-128-10, ReLU) on Fashion-MNIST, trained with SGD + Nesterov
// momentum under a one-cycle learning-rate schedule; a threaded data loader normalises the images.
//
//   03_fashion_mnist_mlp [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] [--data DIR]
//                        [--logdir DIR] [--ckpt DIR] [--resume]
//
// train::Trainer runs the loop. --logdir writes TensorBoard event files (tensorboard --logdir DIR) and a CSV of the
// metrics; --ckpt DIR keeps the best checkpoint by test accuracy and the last one; --resume continues from the last
// one (stop the run with Ctrl-C and resume it: the parameters end bit-identical to an uninterrupted run's).
//
// The precision is one type: Mlp<amp::fp32>, Mlp<amp::bf16_mixed> or Mlp<amp::fp16_mixed> (fp32 master weights,
// 16-bit activations, fp32 accumulation; the loss in fp32). fp16 trains with the loss scaler (amp::GradScaler).
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/train.hpp>
#include <ember/train/tensorboard.hpp>
#if EMBER_EXAMPLE_SAVE
#include <ember/train/checkpoint.hpp>
#endif

#include "flags.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

using namespace ember;

template <amp::PrecisionPolicy P>
struct Mlp : nn::Module {
  using C = typename P::compute_t;
  nn::LinearT<P> fc1{784, 256}, fc2{256, 128}, fc3{128, 10};

  Mlp() : nn::Module("Mlp") {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  /// x (N, 1, 28, 28) -> logits (N, 10), in fp32 for the loss
  Tensor<float> forward(const Tensor<float>& x) const {
    // relu(fc1(x)) as one op: the bias and the ReLU applied in the GEMM's write-back, and one node on the tape
    // (nn::Sequential does this by itself for its Linear -> ReLU pairs).
    const Tensor<C> h1 = fc1.forward(to_c(x.flatten(1)), Activation::relu);  // (N, 256)
    const Tensor<C> h2 = fc2.forward(h1, Activation::relu);                  // (N, 128)
    const Tensor<C> logits = fc3(h2);
    if constexpr (std::is_same_v<C, float>) return logits;
    else return Tensor<float>(cast<float>(logits));
  }
  static Tensor<C> to_c(const Tensor<float>& x) {
    if constexpr (std::is_same_v<C, float>) return x;
    else return Tensor<C>(cast<C>(x));
  }
};

struct Args {
  int epochs = 5, workers = 2;
  std::size_t batch = 128;
  double max_lr = 0.1;
  bool resume = false;
  std::string root, precision = "fp32", logdir, ckpt;
};

template <amp::PrecisionPolicy P>
void train_and_evaluate(const Args& a) {
  manual_seed(0);
  data::FashionMNIST train_set(data::Split::Train, a.root), test_set(data::Split::Test, a.root);
  const data::transforms::Normalize normalize({0.2860f}, {0.3530f});  // the training set's mean and std
  data::DataLoader train(train_set, {.batch_size = a.batch, .shuffle = true, .num_workers = a.workers, .seed = 1},
                         normalize);
  data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = a.workers}, normalize);

  Mlp<P> model;
  std::printf("%zu training and %zu test images, %lld parameters, %d threads, precision %s, %s\n", train_set.size(),
              test_set.size(), static_cast<long long>(model.num_parameters()), cpu::get_num_threads(),
              a.precision.c_str(), cpu::describe().c_str());
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .nesterov = true});
  optim::OneCycleLR schedule(opt, a.max_lr, {.total_steps = std::int64_t(a.epochs) * std::int64_t(train.size())});
  train::Trainer trainer({.max_epochs = a.epochs, .precision = std::is_same_v<typename P::compute_t, half>
                                                                   ? train::Precision::fp16_mixed  // loss scaling
                                                                   : train::Precision::fp32});
  if (!a.logdir.empty()) {
    auto tb = std::make_shared<train::TensorBoardLogger>(train::TensorBoardLoggerOptions{.save_dir = a.logdir,
                                                                                         .name = "03_mlp"});
    trainer.add_logger(tb);  // and metrics.csv beside its event file:
    trainer.add_logger(std::make_shared<train::CSVLogger>(train::CSVLoggerOptions{
        .save_dir = a.logdir, .name = "03_mlp", .version = tb->version()}));
    trainer.add_callback(std::make_shared<train::LearningRateMonitor>());
  }
  if (!a.ckpt.empty()) {
#if EMBER_EXAMPLE_SAVE
    trainer.add_callback(std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions{
        .dirpath = a.ckpt, .filename = "{epoch}-{test_acc:.4f}", .monitor = "test_acc", .mode = train::Mode::max,
        .save_last = true}));
#else
    throw Error("--ckpt: checkpoints need the build with EMBER_EXAMPLE_SAVE=1 (CMake sets it)");
#endif
  }
  trainer.fit(
      model, opt, train, &test, [&](data::Batch& b) { return nn::cross_entropy(model.forward(b.data), b.target); },
      [&](data::Batch& b) {
        const double correct = double(sum(cast<std::int64_t>(argmax(model.forward(b.data), 1) == b.target)).item());
        return train::Metrics{{"test_acc", correct / double(b.size())}};
      },
      {.scheduler = &schedule, .ckpt_path = a.resume ? "last" : ""});
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
    else if (!std::strcmp(argv[i], "--logdir")) a.logdir = next();
    else if (!std::strcmp(argv[i], "--ckpt")) a.ckpt = next();
    else if (!std::strcmp(argv[i], "--resume")) a.resume = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] "
                   "[--data DIR] [--logdir DIR] [--ckpt DIR] [--resume]\n",
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
