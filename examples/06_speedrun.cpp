// ember example 6: a Fashion-MNIST speedrun — the least wall-clock time from a cold start (reading the data
// included) to >= 91% test accuracy on a 2-core CPU, with everything else in the time too: training, evaluation.
//
//   06_speedrun [--epochs N] [--batch N] [--lr X] [--width N] [--smoothing X] [--no-tta] [--eval-each-epoch]
//               [--data DIR]
//
// The recipe, each choice for speed at a fixed accuracy:
// - the data is read once and normalised into memory, with a mirrored copy, so a batch is a gather of rows and a
//   random horizontal flip is the choice of copy (no loader threads competing with training for the two cores);
// - a small all-3x3 CNN, three (conv -> batch norm -> ReLU -> 2x2 max pool) blocks of `width`, 2·width and 4·width
//   channels (28 -> 14 -> 7 -> 3), then one linear layer: depth for accuracy, early pooling for speed; in training,
//   nn::Sequential runs each block as one fused op (nn/conv_bn.hpp: no normalised map stored, one tape node);
// - 2.4 epochs (the last one cut short) of SGD with Nesterov momentum, weight decay 5e-4, batch 128, under a
//   one-cycle schedule over the whole run (PyTorch's defaults: the lr rises from 0.2/25 to 0.2 over 30% of the
//   steps, then anneals to ~0 along a cosine, momentum moving 0.95 -> 0.85 -> 0.95 against it): a short run ends on a
//   small learning rate;
// - label smoothing 0.1, which regularises at no cost;
// - evaluation once, at the end (--eval-each-epoch for every epoch), in inference mode, with the batch norms folded
//   into the convolutions and the ReLUs and pools fused in (nn::fuse_conv_bn), on the test images and their mirror
//   images, averaging the two logits (test-time augmentation: a few tenths of a point for one more forward pass).
// It prints the time since start at each evaluation and the time at which the test accuracy first reached 91%; the
// exit status is 1 if it did not.
//
// The data comes from Debian's dataset-fashion-mnist package (or --data / $EMBER_FASHION_MNIST).
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include "flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace ember;
using Clock = std::chrono::steady_clock;

struct Args {
  double epochs = 2.4;  // may be fractional: the last epoch is cut short
  int width = 20;
  std::int64_t batch = 128;
  double max_lr = 0.2, smoothing = 0.1;
  bool tta = true, eval_each_epoch = false;
  std::string root;
};

// A split as normalised images (N, 1, 28, 28), their mirror images, and labels.
struct InMemory {
  Tensor<float> x, flipped;
  Tensor<std::int64_t> y;
};

InMemory load(data::Split split, const std::string& root) {
  const data::FashionMNIST ds(split, root);
  const std::int64_t n = std::int64_t(ds.size());
  InMemory m{empty<float>({n, 1, 28, 28}), empty<float>({n, 1, 28, 28}), empty<std::int64_t>({n})};
  const std::uint8_t* img = ds.images().data();
  float* x = m.x.data();
  float* f = m.flipped.data();
  for (std::int64_t i = 0; i < n * 28; ++i)  // rows
    for (std::int64_t c = 0; c < 28; ++c) {
      const float v = (float(img[i * 28 + c]) / 255.f - 0.2860f) / 0.3530f;  // the training set's mean and std
      x[i * 28 + c] = v;
      f[i * 28 + 27 - c] = v;
    }
  std::memcpy(m.y.data(), ds.labels().data(), std::size_t(n) * sizeof(std::int64_t));
  return m;
}

nn::Sequential make_model(int w) {
  auto block = [](std::int64_t in, std::int64_t out) {
    return nn::Sequential(nn::Conv2d(in, out, 3, {.padding = 1, .bias = false}), nn::BatchNorm2d(out), nn::ReLU(),
                          nn::MaxPool2d(2));
  };
  return nn::Sequential(block(1, w), block(w, 2 * w), block(2 * w, 4 * w), nn::Flatten(),
                        nn::Linear(4 * w * 3 * 3, 10));
}

// Test accuracy; with tta, of the mean of the logits of each image and its mirror image.
double evaluate(nn::Sequential& model, const InMemory& test, bool tta) {
  model.eval();
  InferenceMode inference;
  const std::int64_t n = test.x.size(0);
  std::int64_t correct = 0;
  for (std::int64_t b0 = 0; b0 < n; b0 += 1000) {
    const std::int64_t b = std::min<std::int64_t>(1000, n - b0);
    Tensor<float> logits = model.forward(test.x.narrow(0, b0, b));
    if (tta) logits = Tensor<float>(logits + model.forward(test.flipped.narrow(0, b0, b)));
    correct += sum(cast<std::int64_t>(argmax(logits, 1) == test.y.narrow(0, b0, b))).item();
  }
  return double(correct) / double(n);
}

int run(const Args& a) {
  const auto start = Clock::now();
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  manual_seed(0);
  const InMemory train = load(data::Split::Train, a.root), test = load(data::Split::Test, a.root);
  const std::int64_t n = train.x.size(0), steps_per_epoch = n / a.batch;  // full batches only

  nn::Sequential model = make_model(a.width);
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  const std::int64_t total_steps = std::max<std::int64_t>(1, std::llround(a.epochs * double(steps_per_epoch)));
  optim::OneCycleLR schedule(opt, a.max_lr, {.total_steps = total_steps});
  nn::CrossEntropyOptions<float> loss_options;
  loss_options.label_smoothing = a.smoothing;
  std::printf("speedrun: %lld training and %lld test images in memory after %.2f s; %lld parameters, %d threads, %s\n",
              static_cast<long long>(n), static_cast<long long>(test.x.size(0)), since_start(),
              static_cast<long long>(model.num_parameters()), cpu::get_num_threads(), cpu::describe().c_str());

  std::mt19937_64 rng(1);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), std::int64_t(0));
  Tensor<float> xb = empty<float>({a.batch, 1, 28, 28});
  Tensor<std::int64_t> yb = empty<std::int64_t>({a.batch});
  double reached = -1;
  for (std::int64_t step = 0, epoch = 0; step < total_steps; ++epoch) {
    const std::int64_t steps = std::min(steps_per_epoch, total_steps - step);
    step += steps;
    model.train();
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0;
    for (std::int64_t s = 0; s < steps; ++s) {
      // The batch: rows of the images or of their mirror images (a random horizontal flip).
      for (std::int64_t i = 0; i < a.batch; ++i) {
        const std::int64_t k = order[std::size_t(s * a.batch + i)];
        const Tensor<float>& src = (rng() & 1) ? train.flipped : train.x;
        std::memcpy(xb.data() + i * 784, src.data() + k * 784, 784 * sizeof(float));
        yb.data()[i] = train.y.data()[k];
      }
      Tensor<float> loss = nn::cross_entropy(model.forward(xb), yb, loss_options);
      opt.zero_grad();
      loss.backward();
      opt.step();
      schedule.step();
      loss_sum += double(loss.item());
    }
    const bool last = step == total_steps;
    if (last) {
      // The trained model for inference: batch norms folded into the convolutions, ReLUs and pools fused in.
      model.eval();
      nn::fuse_conv_bn(model);
    }
    if (!last && !a.eval_each_epoch) {
      std::printf("epoch %lld  %6.1f s since start  train loss %.4f\n", static_cast<long long>(epoch + 1),
                  since_start(), loss_sum / double(steps));
      continue;
    }
    const double acc = evaluate(model, test, a.tta);
    const double t = since_start();
    if (reached < 0 && acc >= 0.91) reached = t;
    std::printf("epoch %lld  %6.1f s since start  train loss %.4f  test accuracy %.2f%%%s\n",
                static_cast<long long>(epoch + 1), t, loss_sum / double(steps), 100.0 * acc,
                a.tta ? " (with mirror images)" : "");
    std::fflush(stdout);
  }
  if (reached >= 0) std::printf("reached 91%% test accuracy %.1f s after start\n", reached);
  else std::printf("did not reach 91%% test accuracy (%.1f s)\n", since_start());
  return reached >= 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--epochs")) a.epochs = examples::real_flag("--epochs", next(), 0.01, 1000);
    else if (!std::strcmp(argv[i], "--batch")) a.batch = examples::int_flag("--batch", next(), 1, 60000);
    else if (!std::strcmp(argv[i], "--lr")) a.max_lr = examples::real_flag("--lr", next(), 1e-9, 100);
    else if (!std::strcmp(argv[i], "--width")) a.width = int(examples::int_flag("--width", next(), 1, 1024));
    else if (!std::strcmp(argv[i], "--smoothing")) a.smoothing = examples::real_flag("--smoothing", next(), 0, 1);
    else if (!std::strcmp(argv[i], "--no-tta")) a.tta = false;
    else if (!std::strcmp(argv[i], "--eval-each-epoch")) a.eval_each_epoch = true;
    else if (!std::strcmp(argv[i], "--data")) a.root = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch N] [--lr X] [--width N] [--smoothing X] [--no-tta] "
                   "[--eval-each-epoch] [--data DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!(a.epochs > 0 && a.epochs <= 1000) || a.batch < 1 || a.batch > 60000 || a.width < 1 || a.max_lr <= 0) {
    std::fprintf(stderr, "speedrun: --epochs, --batch (<= 60000), --width and --lr must be positive\n");
    return 2;
  }
  try {
    return run(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
