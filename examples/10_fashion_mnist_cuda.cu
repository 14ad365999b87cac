// ember example 10: example 04's CNN trained on a CUDA device — the same model (examples/fashion_cnn.hpp), the same
// recipe (SGD + Nesterov momentum, one-cycle schedule, random horizontal flips in a threaded loader), and the same
// train::Trainer loop; what changes is where the tensors live:
//
//   - the model is moved once with Module::to(Device::cuda()); the optimizer is built after the move, on the
//     device's parameters;
//   - the loader's workers put each batch in pinned host memory (pin_memory), so the step's copies to the device
//     are asynchronous (non_blocking), as in PyTorch;
//   - conv2d, batch norm and max-pool run on cuDNN (benchmark mode, cudnn.benchmark in PyTorch, picks each
//     convolution's fastest algorithm once per shape), matmul on cuBLAS, and the element-wise work on ember's fused
//     kernels.
//
//   10_fashion_mnist_cuda [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16] [--data DIR]
//
// It is an nvcc translation unit (ember's fused kernels are compiled for the device here), built when CMake finds
// CUDA and cuDNN and -DEMBER_BUILD_CUDA_EXAMPLES=ON is given. It prints every epoch's wall time and the test
// accuracy; without a device it says so and exits with status 1.
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/train.hpp>

#include "fashion_cnn.hpp"
#include "flags.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

using namespace ember;

struct Args {
  int epochs = 5, workers = 2;
  std::size_t batch = 128;
  double max_lr = 0.1;
  std::string root, precision = "fp32";
};

std::string device_name() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, cuda::current_device()) == cudaSuccess ? std::string(prop.name) : "cuda";
}

// Each epoch's wall time (the training pass and the test pass after it), timed on the host after the device has
// finished the epoch's work.
struct Throughput : train::Callback {
  std::size_t train_images = 0, test_images = 0;
  std::chrono::steady_clock::time_point t0;
  void on_train_epoch_start(train::Trainer&) override {
    cuda::synchronize();
    t0 = std::chrono::steady_clock::now();
  }
  void on_train_epoch_end(train::Trainer&) override {
    cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("epoch: %zu training and %zu test images in %.2f s (%.0f images/s)\n", train_images, test_images, s,
                double(train_images + test_images) / s);
  }
};

template <amp::PrecisionPolicy P>
void train_and_evaluate(const Args& a) {
  const Device dev = Device::cuda();
  manual_seed(0);
  cuda::set_benchmark(true);
  data::FashionMNIST train_set(data::Split::Train, a.root), test_set(data::Split::Test, a.root);
  const data::transforms::Normalize normalize({0.2860f}, {0.3530f});
  data::DataLoader train(
      train_set, {.batch_size = a.batch, .shuffle = true, .num_workers = a.workers, .pin_memory = true, .seed = 1},
      data::transforms::Compose(data::transforms::RandomHorizontalFlip{}, normalize));
  data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = a.workers, .pin_memory = true}, normalize);

  Net<P> model;
  model.to(dev);
  std::printf("%zu training and %zu test images, %lld parameters on %s, precision %s\n", train_set.size(),
              test_set.size(), static_cast<long long>(model.num_parameters()), device_name().c_str(),
              a.precision.c_str());
  optim::SGD opt(model.parameters(), {.lr = a.max_lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  optim::OneCycleLR schedule(opt, a.max_lr, {.total_steps = std::int64_t(a.epochs) * std::int64_t(train.size())});

  auto throughput = std::make_shared<Throughput>();
  throughput->train_images = train_set.size();
  throughput->test_images = test_set.size();
  train::Trainer trainer({.max_epochs = a.epochs, .progress = {.plain_interval_seconds = 5}});
  trainer.add_callback(throughput);
  const train::FitResult r = trainer.fit(
      model, opt, train, &test,
      [&](data::Batch& b) {
        const Tensor<float> x = b.data.to(dev, /*non_blocking=*/true);
        const Tensor<std::int64_t> y = b.target.to(dev, /*non_blocking=*/true);
        return nn::cross_entropy(model.forward(x), y);
      },
      [&](data::Batch& b) {
        const Tensor<float> logits = model.forward(b.data.to(dev, true));
        const Tensor<std::int64_t> y = b.target.to(dev, true);
        const double correct = double(sum(cast<std::int64_t>(argmax(logits, 1) == y)).item());
        return train::Metrics{{"test_loss", nn::cross_entropy(logits, y).item()},
                              {"test_acc", correct / double(b.size())}};
      },
      {.scheduler = &schedule});
  std::printf("test accuracy %.2f%% after %lld epochs\n", 100.0 * r.metrics.get("test_acc").value_or(0),
              static_cast<long long>(r.epochs));
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
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch N] [--workers N] [--lr X] [--precision fp32|bf16] [--data DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!cuda::is_available()) {
    std::fprintf(stderr, "no CUDA device: this example trains on one (example 04 is the CPU version)\n");
    return 1;
  }
  try {
    if (a.precision == "fp32") train_and_evaluate<amp::fp32>(a);
    else if (a.precision == "bf16") train_and_evaluate<amp::bf16_mixed>(a);
    else {
      std::fprintf(stderr, "--precision: fp32 or bf16, got '%s'\n", a.precision.c_str());
      return 2;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
