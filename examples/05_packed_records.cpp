// ember example 5: datasets of many small items as one packed record file. Packs Fashion-MNIST into two record
// files (one record per labelled image, an index, a CRC-32C per record), then trains an MLP (an nn::Sequential)
// from them: the DataLoader's workers read records through mmap, decode and augment them in parallel.
//
//   05_packed_records [--epochs N] [--workers N] [--out DIR] [--data DIR]
#include <ember/data.hpp>
#include <ember/ember.hpp>
#include <ember/train.hpp>

#include "flags.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

using namespace ember;

int main(int argc, char** argv) {
  int epochs = 2, workers = 2;
  std::string out = std::filesystem::temp_directory_path().string(), root;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "missing value\n"), std::exit(2), ""); };
    if (!std::strcmp(argv[i], "--epochs")) epochs = int(examples::int_flag("--epochs", next(), 1, 1000));
    else if (!std::strcmp(argv[i], "--workers")) workers = int(examples::int_flag("--workers", next(), 0, 256));
    else if (!std::strcmp(argv[i], "--out")) out = next();
    else if (!std::strcmp(argv[i], "--data")) root = next();
    else {
      std::fprintf(stderr, "usage: %s [--epochs N] [--workers N] [--out DIR] [--data DIR]\n", argv[0]);
      return 2;
    }
  }
  try {
    // 1. Pack: one record per image (8-byte label + 784 pixels).
    const std::string train_path = out + "/fashion-mnist-train.rec", test_path = out + "/fashion-mnist-test.rec";
    {
      const auto t0 = std::chrono::steady_clock::now();
      data::FashionMNIST train_idx(data::Split::Train, root), test_idx(data::Split::Test, root);
      data::pack_byte_images(train_idx.images(), train_idx.labels(), train_path);
      data::pack_byte_images(test_idx.images(), test_idx.labels(), test_path);
      std::printf("packed %zu + %zu images into %s and %s in %.2f s\n", train_idx.size(), test_idx.size(),
                  train_path.c_str(), test_path.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }

    // 2. Train from the record files.
    data::RecordDataset train_set(train_path, data::ByteImageDecoder{Shape{1, 28, 28}});
    data::RecordDataset test_set(test_path, data::ByteImageDecoder{Shape{1, 28, 28}});
    namespace T = data::transforms;
    const T::Normalize normalize({0.2860f}, {0.3530f});
    data::DataLoader train(train_set, {.batch_size = 128, .shuffle = true, .num_workers = workers, .seed = 3},
                           T::Compose(T::RandomHorizontalFlip{}, normalize));
    data::DataLoader test(test_set, {.batch_size = 1000, .num_workers = workers}, normalize);

    manual_seed(0);
    nn::Sequential model(nn::Flatten(), nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 128), nn::ReLU(),
                         nn::Linear(128, 10));
    std::cout << model << "\n";
    optim::AdamW opt(model.parameters(), {.lr = 2e-3, .weight_decay = 1e-2});
    optim::CosineWarmupLR schedule(opt, 100, std::int64_t(epochs) * std::int64_t(train.size()));
    train::Trainer({.max_epochs = epochs})
        .fit(model, opt, train, &test, [&](data::Batch& b) { return nn::cross_entropy(model(b.data), b.target); },
             [&](data::Batch& b) {
               const auto correct = sum(cast<std::int64_t>(argmax(model(b.data), 1) == b.target)).item();
               return train::Metrics{{"test_acc", double(correct) / double(b.size())}};
             },
             {.scheduler = &schedule});
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
