// ember example 3: a multi-layer perceptron (784-256-128-10, ReLU) on Fashion-MNIST, trained with SGD + Nesterov
// momentum under a one-cycle learning-rate schedule; a threaded data loader normalises the images.
//
//   03_fashion_mnist_mlp [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] [--data DIR]
//
// The precision is one type: Mlp<amp::fp32>, Mlp<amp::bf16_mixed> or Mlp<amp::fp16_mixed> (fp32 master weights,
// 16-bit activations, fp32 accumulation; the loss in fp32). fp16 trains with the loss scaler (amp::GradScaler).
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    const Tensor<C> h1 = fc1.forward(to_c(x.flatten(1)), ops::LinearAct::relu);  // (N, 256)
    const Tensor<C> h2 = fc2.forward(h1, ops::LinearAct::relu);                  // (N, 128)
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
  std::string root, precision = "fp32";
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
  std::printf("%zu training and %zu test images, %lld parameters, %d threads, precision %s\n", train_set.size(),
              test_set.size(), static_cast<long long>(model.num_parameters()), cpu::get_num_threads(),
              a.precision.c_str());
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .nesterov = true});
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
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16|fp16] "
                   "[--data DIR]\n",
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
