// DataLoader throughput (samples/s) on Fashion-MNIST with augmentation heavy enough to matter (random crop with
// 4-pixel padding, horizontal flip, random erasing, normalisation), for 0, 1 and 2 workers: what the loader can
// deliver to a consumer that does nothing else. items_per_second is samples/s; compare the workers:2 line with
// workers:0 (the target is >= 1.8x on two cores). BM_LoaderOverlap gives the consumer a fixed amount of work per
// batch (a stand-in for a training step) and reports wait_fraction, the share of the epoch it waited for data.
// BM_LoaderRecords reads the same images from a packed record file (mmap + CRC-32C per record).
// Wall-clock time (UseRealTime): the work runs on the loader's threads. Needs dataset-fashion-mnist.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <ember/data.hpp>

using namespace ember;  // as ember's users write it
namespace T = ember::data::transforms;

namespace {

const data::FashionMNIST* train_set() {
  static std::unique_ptr<data::FashionMNIST> ds = [] {
    try {
      return std::make_unique<data::FashionMNIST>(data::Split::Train);
    } catch (const ember::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return std::unique_ptr<data::FashionMNIST>();
    }
  }();
  return ds.get();
}

auto augmentation() {
  return T::Compose(T::RandomCrop(28, {.padding = 4}), T::RandomHorizontalFlip{}, T::RandomErasing{},
                    T::Normalize({0.2860f}, {0.3530f}));
}

template <class Loader>
void run_epochs(benchmark::State& state, Loader& loader) {
  std::size_t samples = 0;
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    loader.set_epoch(epoch++);
    for (auto& b : loader) {
      benchmark::DoNotOptimize(b.data.data());
      samples += b.size();
    }
  }
  state.SetItemsProcessed(std::int64_t(samples));
  state.counters["wait_fraction"] = loader.stats().wait_fraction();
}

void BM_Loader(benchmark::State& state) {
  const auto* ds = train_set();
  if (!ds) return state.SkipWithError("Fashion-MNIST not found (apt-get install dataset-fashion-mnist)");
  data::DataLoader loader(*ds, {.batch_size = 128, .shuffle = true, .num_workers = int(state.range(0))},
                          augmentation());
  run_epochs(state, loader);
}
BENCHMARK(BM_Loader)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The consumer spins for state.range(1) microseconds per batch of 128, as a training step would keep it busy.
void BM_LoaderOverlap(benchmark::State& state) {
  const auto* ds = train_set();
  if (!ds) return state.SkipWithError("Fashion-MNIST not found (apt-get install dataset-fashion-mnist)");
  data::DataLoader loader(*ds, {.batch_size = 128, .shuffle = true, .num_workers = int(state.range(0))},
                          augmentation());
  const auto step = std::chrono::microseconds(state.range(1));
  double wait = 0, total = 0;
  std::size_t samples = 0;
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    loader.set_epoch(epoch++);
    for (auto& b : loader) {
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < step) benchmark::DoNotOptimize(b.data.data());
      samples += b.size();
    }
    wait += loader.stats().wait_seconds;
    total += loader.stats().total_seconds;
  }
  state.SetItemsProcessed(std::int64_t(samples));
  state.counters["wait_fraction"] = total > 0 ? wait / total : 0;
}
BENCHMARK(BM_LoaderOverlap)
    ->ArgNames({"workers", "step_us"})
    ->Args({1, 2000})
    ->Args({2, 2000})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

void BM_LoaderRecords(benchmark::State& state) {
  const auto* ds = train_set();
  if (!ds) return state.SkipWithError("Fashion-MNIST not found (apt-get install dataset-fashion-mnist)");
  const std::string path = (std::filesystem::temp_directory_path() / "ember_bench_fashion_train.rec").string();
  data::pack_byte_images(ds->images(), ds->labels(), path);
  data::RecordDataset packed(path, data::ByteImageDecoder{Shape{1, 28, 28}});
  data::DataLoader loader(packed, {.batch_size = 128, .shuffle = true, .num_workers = int(state.range(0))},
                          augmentation());
  run_epochs(state, loader);
  std::filesystem::remove(path);
}
BENCHMARK(BM_LoaderRecords)->ArgName("workers")->Arg(0)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
