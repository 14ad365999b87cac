// ember example 7: fast inference for the CNN example 04 trained. It loads the saved weights, then evaluates the
// model three ways on the Fashion-MNIST test set, each at batch 64 and batch 1:
//   fp32          the trained model in eval mode under InferenceMode;
//   folded fp32   BatchNorm folded into the convolutions, ReLU and max pool moved into their epilogues
//                 (nn::fuse_modules);
//   int8          the folded model quantized after calibration on training batches (quant::prepare / convert):
//                 int8 weights per output channel, each layer's input per tensor, int8 GEMMs with int32 sums.
// and saves the int8 model (then loads it back into a fresh model and checks the logits are identical).
//
//   07_quantize_cnn [--weights PATH] [--calibration N] [--observer minmax|average|histogram] [--keep-last]
//                   [--batch1 N] [--data DIR] [--save PATH]
//
// Run 04_fashion_mnist_cnn first: it writes fashion_mnist_cnn.safetensors.
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/io.hpp>
#include <ember/nn/fuse.hpp>
#include <ember/quant.hpp>

#include "fashion_cnn.hpp"
#include "flags.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace ember;
using Model = Net<amp::fp32>;

namespace {

struct Args {
  std::string weights = "fashion_mnist_cnn.safetensors", root, observer = "histogram",
              save = "fashion_mnist_cnn_int8.safetensors";
  int calibration = 100;
  std::int64_t batch1 = 1000;  // images timed one at a time
  bool keep_last = false;
};

struct Batch {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};

/// The test set in memory, normalised, in batches of `size` (so timing measures the model, not the loader).
std::vector<Batch> load_batches(const data::FashionMNIST& set, std::size_t size, std::size_t limit) {
  const data::transforms::Normalize normalize({0.2860f}, {0.3530f});
  data::DataLoader loader(set, {.batch_size = size, .num_workers = 0}, normalize);
  std::vector<Batch> out;
  std::size_t n = 0;
  for (auto& b : loader) {
    if (n >= limit) break;
    out.push_back({b.data.clone(), b.target.clone()});
    n += b.size();
  }
  return out;
}

struct Result {
  double accuracy = 0, images_per_s = 0;
};

/// Accuracy and throughput over the batches (the best of `reps` timed passes after one warm-up pass).
Result evaluate(const Model& m, const std::vector<Batch>& batches, int reps) {
  InferenceMode inference;
  Result r;
  std::int64_t correct = 0, seen = 0;
  for (const auto& b : batches) {
    correct += sum(cast<std::int64_t>(argmax(m.forward(b.x), 1) == b.y)).item();
    seen += b.x.size(0);
  }
  r.accuracy = 100.0 * double(correct) / double(seen);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& b : batches) (void)m.forward(b.x);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.images_per_s = std::max(r.images_per_s, double(seen) / s);
  }
  return r;
}

void load_weights(Model& m, const std::string& path) {
  if (!std::filesystem::exists(path))
    throw Error("no weights at '" + path + "': run 04_fashion_mnist_cnn first (it saves them there), or pass --weights");
  StateDict sd;
  for (auto& [name, t] : io::load_safetensors(path).tensors) {
    const auto* f = std::get_if<Tensor<float>>(&t);
    const auto* i = std::get_if<Tensor<std::int64_t>>(&t);
    EMBER_CHECK(f || i, "'", path, "': tensor '", name, "' is ", dtype_name(io::scalar_type(t)),
                "; example 04's weights are float32 (and int64 batch counters)");
    if (f) sd.emplace(name, *f);
    else sd.emplace(name, *i);
  }
  m.load_state_dict(sd);
}

void fold(Model& m) { nn::fuse_modules(m, {{"conv1", "bn1", "relu1", "pool1"}, {"conv2", "bn2", "relu2", "pool2"}}); }

void run(const Args& a) {
  data::FashionMNIST train_set(data::Split::Train, a.root), test_set(data::Split::Test, a.root);
  const auto test64 = load_batches(test_set, 64, test_set.size());
  const auto test1 = load_batches(test_set, 1, std::size_t(a.batch1));
  std::printf("%zu test images (batch 1: the first %zu), %d threads, int8 GEMM kernel: %s, %s\n", test_set.size(),
              test1.size(), cpu::get_num_threads(), cpu::q::path_name(cpu::q::best_path()), cpu::describe().c_str());

  Model model;
  load_weights(model, a.weights);
  model.eval();
  std::printf("%-12s %10s %16s %16s\n", "model", "accuracy", "batch 64 img/s", "batch 1 img/s");
  auto report = [&](const char* name) {
    const Result r64 = evaluate(model, test64, 3), r1 = evaluate(model, test1, 3);
    std::printf("%-12s %9.2f%% %16.0f %16.0f\n", name, r64.accuracy, r64.images_per_s, r1.images_per_s);
  };
  report("fp32");
  fold(model);
  report("folded fp32");

  quant::ObserverKind kind = quant::ObserverKind::histogram;
  if (a.observer == "minmax") kind = quant::ObserverKind::min_max;
  else if (a.observer == "average") kind = quant::ObserverKind::moving_average_min_max;
  else if (a.observer != "histogram") throw Error("--observer: minmax, average or histogram, got '" + a.observer + "'");
  quant::prepare(model, {.activation = {.kind = kind}, .keep_last = a.keep_last});
  {
    // Calibration: training images, normalised as in training, without augmentation.
    const data::transforms::Normalize normalize({0.2860f}, {0.3530f});
    data::DataLoader calib(train_set, {.batch_size = 64, .shuffle = true, .num_workers = 0, .seed = 7}, normalize);
    InferenceMode inference;
    int n = 0;
    for (auto& b : calib) {
      if (n++ >= a.calibration) break;
      (void)model.forward(b.data);
    }
  }
  const int converted = quant::convert(model);
  std::printf("(calibrated on %d batches of 64 with the %s observer; %d layers in int8)\n", a.calibration,
              a.observer.c_str(), converted);
  report("int8");

  if (!a.save.empty()) {
    quant::save(model, a.save);
    Model reloaded;
    reloaded.eval();
    fold(reloaded);
    quant::load(reloaded, a.save);
    InferenceMode inference;
    const bool same =
        sum(cast<std::int64_t>(reloaded.forward(test64[0].x) != model.forward(test64[0].x))).item() == 0;
    std::printf("saved the int8 model to %s (%ju bytes); reloaded: logits %s\n", a.save.c_str(),
                std::uintmax_t(std::filesystem::file_size(a.save)), same ? "identical" : "DIFFER");
    if (!same) throw Error("the reloaded int8 model differs from the saved one");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--weights")) a.weights = next();
    else if (!std::strcmp(argv[i], "--calibration"))
      a.calibration = int(examples::int_flag("--calibration", next(), 1, 1000));
    else if (!std::strcmp(argv[i], "--observer")) a.observer = next();
    else if (!std::strcmp(argv[i], "--keep-last")) a.keep_last = true;
    else if (!std::strcmp(argv[i], "--batch1")) a.batch1 = examples::int_flag("--batch1", next(), 0, 10000);
    else if (!std::strcmp(argv[i], "--data")) a.root = next();
    else if (!std::strcmp(argv[i], "--save")) a.save = next();
    else {
      std::fprintf(stderr,
                   "usage: %s [--weights PATH] [--calibration N] [--observer minmax|average|histogram] [--keep-last] "
                   "[--batch1 N] [--data DIR] [--save PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    run(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
