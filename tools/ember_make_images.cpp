// ember_make_images: writes image datasets as ImageFolders of files.
//
//   ember_make_images windows OUT --seed S [--per-class N] [--size WxH] [--quality Q] [--val-every K] NAME=PHOTO...
//       Cuts N random windows (aspect W:H, 35-100% of the largest such window, random position) out of each photo,
//       resizes them to WxH (antialiased bilinear) and writes JPEGs: every K-th window of a class to OUT/val/NAME/,
//       the others to OUT/train/NAME/ (defaults: 500 windows of 500x375, quality 90, K = 5). Deterministic from S.
//   ember_make_images fashion-png ROOT OUT
//       Writes Fashion-MNIST (the IDX files under ROOT; "" for the default place) as PNG files:
//       OUT/train/<label>_<name>/<index>.png and OUT/test/..., so that ImageFolder's sorted classes keep the labels.
#include <ember/data/fashion_mnist.hpp>
#include <ember/data/image.hpp>
#include <ember/data/image_encode.hpp>
#include <ember/data/image_resample.hpp>
#include <ember/data/rng.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace ember;
namespace fs = std::filesystem;

namespace {
[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "ember_make_images: %s\nusage: ember_make_images windows OUT --seed S [--per-class N] "
                       "[--size WxH] [--quality Q] [--val-every K] NAME=PHOTO...\n"
                       "       ember_make_images fashion-png ROOT OUT\n", why.c_str());
  std::exit(2);
}
long long number(const char* flag, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  if (!ember::detail::parse_int(text, v) || v < lo || v > hi)
    usage(std::string(flag) + ": expected a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "], got \"" + text + "\"");
  return v;
}
void write_file(const fs::path& p, const std::vector<unsigned char>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  EMBER_CHECK(f.good(), "ember_make_images: cannot write ", p.string());
}
std::string numbered(std::size_t k) {
  std::string n = std::to_string(k);
  return std::string(n.size() < 5 ? 5 - n.size() : 0, '0') + n;
}

int windows(int argc, char** argv) {
  if (argc < 3) usage("windows needs OUT");
  const fs::path out = argv[2];
  long long seed = -1, per_class = 500, W = 500, H = 375, quality = 90, val_every = 5;
  std::vector<std::pair<std::string, std::string>> sources;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--seed") seed = number("--seed", value(), 0, 1LL << 62);
    else if (a == "--per-class") per_class = number("--per-class", value(), 1, 1000000);
    else if (a == "--quality") quality = number("--quality", value(), 1, 100);
    else if (a == "--val-every") val_every = number("--val-every", value(), 2, 1000000);
    else if (a == "--size") {
      const std::string v = value();
      const std::size_t x = v.find('x');
      if (x == std::string::npos) usage("--size: expected WxH, got \"" + v + "\"");
      W = number("--size", v.substr(0, x), 8, 8192);
      H = number("--size", v.substr(x + 1), 8, 8192);
    } else if (a.find('=') != std::string::npos) {
      sources.emplace_back(a.substr(0, a.find('=')), a.substr(a.find('=') + 1));
    } else {
      usage("unknown argument " + a);
    }
  }
  if (seed < 0) usage("windows needs --seed");
  if (sources.empty()) usage("windows needs NAME=PHOTO sources");
  data::ImageDecoder dec;
  std::vector<unsigned char> file;
  std::vector<float> planar(std::size_t(3 * W * H)), tmp;
  std::vector<std::uint8_t> hwc(planar.size());
  data::ResampleAxis ax, ay;
  std::size_t written = 0;
  for (std::size_t c = 0; c < sources.size(); ++c) {
    const auto& [name, path] = sources[c];
    data::read_file_into(path, file, std::size_t(1) << 30, "ember_make_images");
    const data::ImageInfo info = dec.open(file, path);
    const data::DecodedImage img = dec.decode({.channels = 3});
    // The largest W:H window that fits, then windows of 35-100% of its side.
    const double ratio = double(W) / double(H);
    const double max_w = std::min(double(info.width), double(info.height) * ratio);
    data::Rng g(std::uint64_t(seed), c, 0xC0FFEE);
    for (long long k = 0; k < per_class; ++k) {
      const double ww = max_w * (0.35 + 0.65 * double(g.uniform())), wh = ww / ratio;
      const double x0 = double(g.uniform()) * (double(info.width) - ww);
      const double y0 = double(g.uniform()) * (double(info.height) - wh);
      data::compute_resample_axis(ay, y0, wh, H, 0, info.height);
      data::compute_resample_axis(ax, x0, ww, W, 0, info.width);
      data::resample(data::ResampleSource<std::uint8_t>{img.data, 3, img.stride, 3, 1, 0, 0}, ay, ax,
                     data::ResampleTarget{planar.data(), W * H, W, false, nullptr, nullptr}, tmp);
      for (long long ch = 0; ch < 3; ++ch)
        for (long long i = 0; i < W * H; ++i) {
          const float v = planar[std::size_t(ch * W * H + i)] + 0.5f;
          hwc[std::size_t(i * 3 + ch)] = std::uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
        }
      const bool val = (k + 1) % val_every == 0;
      write_file(out / (val ? "val" : "train") / name / (numbered(std::size_t(k)) + ".jpg"),
                 data::encode_jpeg(hwc.data(), H, W, 3, int(quality)));
      ++written;
    }
    std::printf("%s: %lld windows of %s (%lldx%lld)\n", name.c_str(), per_class, path.c_str(),
                static_cast<long long>(info.width), static_cast<long long>(info.height));
  }
  std::printf("wrote %zu images of %zu classes under %s\n", written, sources.size(), out.string().c_str());
  return 0;
}

int fashion_png(int argc, char** argv) {
  if (argc != 4) usage("fashion-png needs ROOT and OUT");
  const fs::path out = argv[3];
  for (const auto split : {data::Split::Train, data::Split::Test}) {
    const data::FashionMNIST ds(split, argv[2]);
    const std::int64_t n = ds.images().size(0);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t label = ds.labels().data()[i];
      std::string cls = std::to_string(label) + "_" + data::FashionMNIST::class_name(label);
      std::replace(cls.begin(), cls.end(), '/', '-');
      write_file(out / (split == data::Split::Train ? "train" : "test") / cls / (numbered(std::size_t(i)) + ".png"),
                 data::encode_png(ds.images().data() + i * 28 * 28, 28, 28, 1));
    }
    std::printf("wrote %lld %s images\n", static_cast<long long>(n), split == data::Split::Train ? "train" : "test");
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("a command is required");
  const std::string cmd = argv[1];
  try {
    if (cmd == "windows") return windows(argc, argv);
    if (cmd == "fashion-png") return fashion_png(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember_make_images: %s\n", e.what());
    return 1;
  }
  usage("unknown command " + cmd);
}
