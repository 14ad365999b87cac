// bench_images: ember's image loading on the photo set of scripts/make_photo_set.sh, as ratios to measured limits and
// peers run on the same machine (bench/RESULTS.md, "Images"). A plain program:
//
//   bench_images SET [--images N] [--workers N] [--tjbench PATH] [--seconds S]
//
// 1. Decode limit: libjpeg-turbo's own tjbench (Debian libjpeg-turbo-progs) on one training image of each class
//    against ember's full-size decode of the same files on one thread (target >= 0.9x).
// 2. RandomResizedCrop(224) per image on one thread: full decode + resize against reduced-size + crop-first decoding,
//    on the 500x375 training images and on the full-size source pictures (SET/sources.txt) (targets >= 2x, >= 4x).
// 3. The loader: ImageFolder + DataLoader(num_workers) with RandomResizedCrop(224) + flip + Normalize, batches of 64,
//    from the folder, from packed shards (SET/train.shards, packed on the first run; target >= 1.2x) and from
//    WebDataset tar shards (SET/train.wds, likewise); the peer is bench/torchvision_loader_peer.py on the same images.
// The machine's CPU model and load average are printed with the figures.
#include <ember/data.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace ember;
namespace T = data::transforms;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string first_line_of(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  for (std::string l; std::getline(f, l);)
    if (key.empty() || l.rfind(key, 0) == 0) return l;
  return "?";
}

std::vector<unsigned char> bytes_of(const std::string& p) {
  std::vector<unsigned char> b;
  data::read_file_into(p, b, std::size_t(1) << 30, "bench_images");
  return b;
}

// tjbench's decompression throughput (megapixels/s) for one file, or 0 when it cannot be run.
double tjbench_mps(const std::string& tj, const std::string& file, double seconds) {
  // -nowrite: tjbench otherwise writes its decoded images next to the input.
  const std::string cmd =
      tj + " '" + file + "' -benchtime " + std::to_string(seconds) + " -warmup 0.2 -nowrite 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  char line[512];
  double mps = 0;
  while (std::fgets(line, sizeof line, p))
    if (const char* t = std::strstr(line, "Throughput:")) mps = std::atof(t + 11);
  pclose(p);
  return mps;
}

// ember's full-size decode of `file` on this thread, megapixels/s over about `seconds`.
double ember_mps(const std::vector<unsigned char>& file, double seconds) {
  data::ImageDecoder dec;
  std::size_t px = 0;
  const auto t0 = Clock::now();
  do {
    const data::ImageInfo& info = dec.open(file, "bench");
    dec.decode({.channels = 3});
    px += std::size_t(info.width * info.height);
  } while (since(t0) < seconds);
  return double(px) / 1e6 / since(t0);
}

// RandomResizedCrop(224) images per second on one thread, full or reduced decoding, the same crops both ways.
double rrc_rate(const std::vector<std::vector<unsigned char>>& files, bool reduced, double seconds) {
  const data::ImagePipeline p({.random_resized_crop = T::RandomResizedCrop(224), .flip = 0.5f,
                               .normalize = T::Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}),
                               .reduced_decode = reduced});
  std::vector<float> out(3 * 224 * 224);
  data::ImageDecoder& dec = data::thread_image_decoder();
  std::size_t n = 0;
  const auto t0 = Clock::now();
  do {
    data::Rng g(1, 0, n);
    const auto& f = files[n % files.size()];
    const Tensor<float> t = p.apply(f, "bench", g);
    (void)dec;
    ++n;
  } while (since(t0) < seconds);
  return double(n) / since(t0);
}

template <class D, class S>
double loader_rate(const D& d, int workers, std::size_t images, S sampler) {
  const data::ImagePipeline p({.random_resized_crop = T::RandomResizedCrop(224), .flip = 0.5f,
                               .normalize = T::Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})});
  data::DataLoader loader(d, {.batch_size = 64, .num_workers = workers}, p, sampler);
  std::size_t n = 0;
  auto t0 = Clock::now();
  bool warm = false;
  for (auto& b : loader) {
    n += b.size();
    if (!warm && n >= 128) {  // the first two batches start the workers and fill the page cache
      warm = true;
      n = 0;
      t0 = Clock::now();
    }
    if (warm && n >= images) break;
  }
  return double(n) / since(t0);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s SET [--images N] [--workers N] [--tjbench PATH] [--seconds S]\n", argv[0]);
    return 2;
  }
  const std::string set = argv[1];
  std::size_t images = 2000;
  int workers = 2;
  double seconds = 1.0;
  std::string tj = "tjbench";
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--images")) images = std::size_t(std::atol(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tjbench")) tj = argv[i + 1];
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
  }
  try {
    std::printf("cpu: %s\nload average at start: %s\n",
                first_line_of("/proc/cpuinfo", "model name").c_str(), first_line_of("/proc/loadavg", "").c_str());
    const data::ImageFolder train(set + "/train");
    // One image of each class (the first), for the single-thread figures.
    std::vector<std::string> sample;
    for (std::size_t i = 0, last = std::size_t(-1); i < train.size(); ++i)
      if (std::size_t(train.target(i)) != last) sample.push_back(train.path(i)), last = std::size_t(train.target(i));
    std::vector<std::vector<unsigned char>> files;
    for (const auto& p : sample) files.push_back(bytes_of(p));

    // 1. Decode limit.
    double tj_time = 0, em_time = 0, px_total = 0;
    for (std::size_t k = 0; k < sample.size(); ++k) {
      data::ImageDecoder dec;
      const data::ImageInfo& info = dec.open(files[k], sample[k]);
      const double mp = double(info.width * info.height) / 1e6;
      const double t = tjbench_mps(tj, sample[k], seconds / 2), e = ember_mps(files[k], seconds / 2);
      if (t <= 0) {
        std::printf("decode limit: %s not runnable (Debian: libjpeg-turbo-progs); skipped\n", tj.c_str());
        tj_time = 0;
        break;
      }
      tj_time += mp / t;
      em_time += mp / e;
      px_total += mp;
    }
    if (tj_time > 0)
      std::printf("decode, full size, 1 thread: tjbench %.1f MP/s, ember %.1f MP/s: %.2fx (target >= 0.9x)\n",
                  px_total / tj_time, px_total / em_time, tj_time / em_time);

    // 2. Reduced-size + crop-first against full decode + resize.
    const double full_small = rrc_rate(files, false, seconds), fast_small = rrc_rate(files, true, seconds);
    std::printf("RandomResizedCrop(224), 500x375 JPEGs, 1 thread: full decode %.0f img/s, reduced + crop-first "
                "%.0f img/s: %.2fx (target >= 2x)\n", full_small, fast_small, fast_small / full_small);
    std::vector<std::vector<unsigned char>> big;
    std::ifstream src(set + "/sources.txt");
    for (std::string l; std::getline(src, l);)
      if (l.size() > 4 && l.substr(l.size() - 4) == ".jpg") big.push_back(bytes_of(l));
    if (!big.empty()) {
      const double full_big = rrc_rate(big, false, 2 * seconds), fast_big = rrc_rate(big, true, 2 * seconds);
      std::printf("RandomResizedCrop(224), %zu full-size JPEG pictures (up to 5120x2880), 1 thread: full decode "
                  "%.1f img/s, reduced + crop-first %.1f img/s: %.2fx (target >= 4x)\n", big.size(), full_big,
                  fast_big, fast_big / full_big);
    }

    // 3. The loader, from the folder and from shards.
    const std::string shards = set + "/train.shards";
    if (!fs::exists(shards + "/classes.rec")) {
      const auto r = data::pack_images(train, shards);
      std::printf("packed %zu images into %zu shards (%s)\n", r.images, r.shards, shards.c_str());
    }
    const std::string tars = set + "/train.wds";
    if (!fs::exists(tars + "/classes.txt")) {
      const auto r = data::pack_images(train, tars, {.format = data::PackImagesOptions::Format::webdataset});
      std::printf("packed %zu images into %zu WebDataset shards (%s)\n", r.images, r.shards, tars.c_str());
    }
    const data::ImageRecordDataset pack(shards);
    const data::WebDataset wds({tars});
    const double folder_rate = loader_rate(train, workers, images, data::RandomSampler{1});
    const double shard_rate = loader_rate(pack, workers, images, data::ShardShuffleSampler{.seed = 1});
    const double tar_rate = loader_rate(wds, workers, images, data::ShardShuffleSampler{.seed = 1});
    const double folder_rate2 = loader_rate(train, workers, images, data::RandomSampler{2});
    std::printf("DataLoader(%d workers), RandomResizedCrop(224) + flip + Normalize, batches of 64: ImageFolder %.0f "
                "img/s (again: %.0f), packed shards %.0f img/s: %.2fx (target >= 1.2x), WebDataset tar shards %.0f "
                "img/s: %.2fx\n", workers, folder_rate, folder_rate2, shard_rate,
                shard_rate / std::max(folder_rate, folder_rate2), tar_rate,
                tar_rate / std::max(folder_rate, folder_rate2));
    std::printf("load average at end: %s\n", first_line_of("/proc/loadavg", "").c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
