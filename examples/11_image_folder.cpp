// ember example 11: training on real image files — a small ResNet on an ImageFolder of JPEG photos (torchvision's
// train/<class>/<image>.jpg layout), fed by data::ImagePipeline: RandomResizedCrop + horizontal flip + Normalize,
// decoded at reduced size and cropped before decoding, written by the loader's workers straight into the batch.
// Each epoch prints the images per second, the share of the time the model waited for data, the loader's time per
// stage (read, decode, augment, collate) and the validation accuracy.
//
//   11_image_folder --data ROOT [--shards] [--size 64] [--epochs N] [--batch N] [--workers N] [--lr X]
//                   [--max-steps N] [--full-decode]
//   11_image_folder --fashion-png ROOT [--epochs N] [--batch N] [--workers N] [--lr X]
//
// --data ROOT: ROOT/train and ROOT/val, as scripts/make_photo_set.sh writes them (20 classes, 500x375 JPEGs).
//   Validation: Resize(size * 8 / 7) + CenterCrop(size), torchvision's eval chain.
// --shards: the same images from packed record shards (ROOT/train.shards and ROOT/val.shards, packed on the first
//   run, as tools/ember_pack_images does), read memory-mapped in ShardShuffleSampler's quasi-random order.
// --fashion-png ROOT: Fashion-MNIST written as PNG files (ember_make_images fashion-png: ROOT/train, ROOT/test),
//   trained with example 04's CNN and recipe; it reaches example 04's accuracy (from the IDX files).
#include <ember/data.hpp>
#include <ember/ember.hpp>

#include "fashion_cnn.hpp"
#include "flags.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>

using namespace ember;
namespace T = data::transforms;

struct Args {
  std::string data, fashion;
  bool shards = false, full_decode = false;
  std::int64_t size = 64, max_steps = 0;
  int epochs = 4, workers = 2;
  std::size_t batch = 64;
  double lr = 0.2;
};

// A basic residual block: conv-bn-relu-conv-bn, plus the input (projected when the shape changes), relu.
struct Block : nn::Module {
  nn::Conv2d c1, c2;
  nn::BatchNorm2d b1, b2;
  std::optional<nn::Conv2d> down;
  std::optional<nn::BatchNorm2d> down_bn;

  Block(std::int64_t in, std::int64_t out, std::int64_t stride)
      : nn::Module("Block"), c1(in, out, 3, {.stride = stride, .padding = 1, .bias = false}),
        c2(out, out, 3, {.padding = 1, .bias = false}), b1(out), b2(out) {
    register_module("conv1", c1);
    register_module("bn1", b1);
    register_module("conv2", c2);
    register_module("bn2", b2);
    if (stride != 1 || in != out) {
      down.emplace(in, out, 1, nn::Conv2dOptions{.stride = stride, .bias = false});
      down_bn.emplace(out);
      register_module("downsample_conv", *down);
      register_module("downsample_bn", *down_bn);
    }
  }
  Tensor<float> forward(const Tensor<float>& x) const {
    const Tensor<float> h = b2(c2(relu(b1(c1(x)))));
    return relu(h + (down ? (*down_bn)((*down)(x)) : x));
  }
};

// A ResNet for small images: a stride-2 stem (stride 4 with max pooling from 112 pixels on), three stages of one
// block each (32, 64, 128 channels), global average pooling, a linear head.
struct SmallResNet : nn::Module {
  nn::Conv2d stem;
  nn::BatchNorm2d stem_bn{32};
  Block l1{32, 32, 1}, l2{32, 64, 2}, l3{64, 128, 2};
  nn::Linear fc;
  bool pool;

  SmallResNet(std::int64_t classes, std::int64_t size)
      : nn::Module("SmallResNet"), stem(3, 32, 3, {.stride = 2, .padding = 1, .bias = false}), fc(128, classes),
        pool(size >= 112) {
    register_module("conv1", stem);
    register_module("bn1", stem_bn);
    register_module("layer1", l1);
    register_module("layer2", l2);
    register_module("layer3", l3);
    register_module("fc", fc);
  }
  Tensor<float> forward(const Tensor<float>& x) const {  // x (N, 3, S, S) -> logits (N, classes)
    Tensor<float> h = relu(stem_bn(stem(x)));
    if (pool) h = max_pool2d(h, 2);
    h = l3.forward(l2.forward(l1.forward(h)));
    return fc(adaptive_avg_pool2d(h, 1).flatten(1));
  }
};

// "decode 61%, augment 30%, ...": where the loader's workers spent their time.
std::string stage_split(const data::LoaderStats& s) {
  std::string out;
  const double total = s.stages.total();
  for (int k = 0; k < data::kNumStages; ++k) {
    const auto st = data::Stage(k);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.0f%%", k ? ", " : "", data::stage_name(st),
                  total > 0 ? 100 * s.stages[st] / total : 0.0);
    out += buf;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, " of %.1f worker-s", total);
  return out + buf;
}

template <class Model, class TrainLoader, class ValLoader>
void fit(Model& model, TrainLoader& train, ValLoader& val, const Args& a) {
  optim::SGD opt(model.parameters(), {.lr = a.lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  std::int64_t steps = std::int64_t(a.epochs) * std::int64_t(train.size());
  if (a.max_steps > 0) steps = std::min(steps, a.max_steps);
  optim::OneCycleLR schedule(opt, a.lr, {.total_steps = steps});
  std::int64_t step = 0;
  for (int epoch = 0; epoch < a.epochs && step < steps; ++epoch) {
    model.train();
    train.set_epoch(std::uint64_t(epoch));
    double loss_sum = 0;
    std::int64_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& b : train) {
      Tensor<float> loss = nn::cross_entropy(model.forward(b.data), b.target);
      opt.zero_grad();
      loss.backward();
      opt.step();
      schedule.step();
      loss_sum += double(loss.item()) * double(b.size());
      n += std::int64_t(b.size());
      if (++step >= steps) break;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const data::LoaderStats s = train.stats();
    model.eval();
    NoGradGuard no_grad;
    std::int64_t correct = 0, seen = 0;
    for (auto& b : val) {
      correct += sum(cast<std::int64_t>(argmax(model.forward(b.data), 1) == b.target)).item();
      seen += std::int64_t(b.size());
    }
    std::printf("epoch %d: loss %.4f, %.0f images/s, waited for data %.1f%% (%s), val accuracy %.2f%%\n", epoch + 1,
                loss_sum / double(std::max<std::int64_t>(n, 1)), double(n) / secs, 100 * s.wait_fraction(),
                stage_split(s).c_str(), 100.0 * double(correct) / double(std::max<std::int64_t>(seen, 1)));
    std::fflush(stdout);
  }
}

void photos(const Args& a) {
  const T::Normalize imagenet({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  const data::ImagePipeline train_tf({.random_resized_crop = T::RandomResizedCrop(a.size), .flip = 0.5f,
                                      .normalize = imagenet, .reduced_decode = !a.full_decode});
  const data::ImagePipeline val_tf({.resize = T::Resize(a.size * 8 / 7), .center_crop = T::CenterCrop(a.size),
                                    .normalize = imagenet, .reduced_decode = !a.full_decode});
  const data::ImageFolder train_folder(a.data + "/train"), val_folder(a.data + "/val");
  const std::int64_t classes = std::int64_t(train_folder.classes().size());
  manual_seed(0);
  SmallResNet model(classes, a.size);
  std::printf("%zu training and %zu validation images of %lld classes at %lldx%lld, %s, %d workers\n",
              train_folder.size(), val_folder.size(), static_cast<long long>(classes),
              static_cast<long long>(a.size), static_cast<long long>(a.size),
              a.shards ? "from packed shards" : "from the ImageFolder", a.workers);
  const data::DataLoaderOptions vo{.batch_size = 200, .num_workers = a.workers};
  if (!a.shards) {
    data::DataLoader train(train_folder, {.batch_size = a.batch, .shuffle = true, .drop_last = true,
                                          .num_workers = a.workers, .seed = 1}, train_tf);
    data::DataLoader val(val_folder, vo, val_tf);
    fit(model, train, val, a);
    return;
  }
  for (const char* split : {"train", "val"}) {
    const std::string dir = a.data + "/" + split + ".shards";
    if (!std::filesystem::exists(dir + "/classes.rec")) {
      const auto r = data::pack_images(data::ImageFolder(a.data + "/" + split), dir);
      std::printf("packed %zu images into %zu shards in %s\n", r.images, r.shards, dir.c_str());
    }
  }
  data::DataLoader train(data::ImageRecordDataset(a.data + "/train.shards"),
                         {.batch_size = a.batch, .drop_last = true, .num_workers = a.workers}, train_tf,
                         data::ShardShuffleSampler{.seed = 1});
  data::DataLoader val(data::ImageRecordDataset(a.data + "/val.shards"), vo, val_tf);
  fit(model, train, val, a);
}

void fashion_png(const Args& a) {
  // Example 04's recipe on the same images as PNG files: 28x28 grey, flips, the training set's mean and std.
  const T::Normalize normalize({0.2860f}, {0.3530f});
  const data::ImageFolder train_folder(a.fashion + "/train"), test_folder(a.fashion + "/test");
  data::DataLoader train(train_folder, {.batch_size = a.batch, .shuffle = true, .num_workers = a.workers, .seed = 1},
                         data::ImagePipeline({.flip = 0.5f, .normalize = normalize, .channels = 1}));
  data::DataLoader test(test_folder, {.batch_size = 1000, .num_workers = a.workers},
                        data::ImagePipeline({.normalize = normalize, .channels = 1}));
  manual_seed(0);
  Net<amp::fp32> model;
  std::printf("%zu training and %zu test PNG images, %zu classes\n", train_folder.size(), test_folder.size(),
              train_folder.classes().size());
  fit(model, train, test, a);
}

int main(int argc, char** argv) {
  Args a;
  bool lr_given = false, batch_given = false, epochs_given = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--data")) a.data = next();
    else if (!std::strcmp(argv[i], "--fashion-png")) a.fashion = next();
    else if (!std::strcmp(argv[i], "--shards")) a.shards = true;
    else if (!std::strcmp(argv[i], "--full-decode")) a.full_decode = true;
    else if (!std::strcmp(argv[i], "--size")) a.size = examples::int_flag("--size", next(), 16, 512);
    else if (!std::strcmp(argv[i], "--epochs")) {
      a.epochs = int(examples::int_flag("--epochs", next(), 1, 1000));
      epochs_given = true;
    } else if (!std::strcmp(argv[i], "--batch")) {
      a.batch = std::size_t(examples::int_flag("--batch", next(), 1, 60000));
      batch_given = true;
    } else if (!std::strcmp(argv[i], "--lr")) {
      a.lr = examples::real_flag("--lr", next(), 1e-9, 100);
      lr_given = true;
    } else if (!std::strcmp(argv[i], "--workers")) a.workers = int(examples::int_flag("--workers", next(), 0, 256));
    else if (!std::strcmp(argv[i], "--max-steps")) a.max_steps = examples::int_flag("--max-steps", next(), 1, 1 << 30);
    else {
      std::fprintf(stderr, "usage: %s --data ROOT [--shards] [--size N] [--full-decode] | --fashion-png ROOT; "
                           "[--epochs N] [--batch N] [--workers N] [--lr X] [--max-steps N]\n", argv[0]);
      return 2;
    }
  }
  if (a.data.empty() == a.fashion.empty()) {
    std::fprintf(stderr, "%s: give --data ROOT (a photo set) or --fashion-png ROOT\n", argv[0]);
    return 2;
  }
  if (!a.fashion.empty()) {  // example 04's defaults
    if (!lr_given) a.lr = 0.1;
    if (!batch_given) a.batch = 128;
    if (!epochs_given) a.epochs = 5;
  }
  try {
    if (a.fashion.empty()) photos(a);
    else fashion_png(a);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
