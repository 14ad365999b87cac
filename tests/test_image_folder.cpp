// ImageFolder (data/image_folder.hpp) and the fused image pipeline (data/image_pipeline.hpp): torchvision's class and
// file order on a tree with odd names; errors naming the empty class or the bad file; the fused decode + crop +
// resize + flip + normalize equal to the same steps one by one; the loader's batches independent of num_workers and
// equal across runs; the per-stage times and the hint that names the slow stage.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <ember/data/dataloader.hpp>
#include <ember/data/image_folder.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "image_helpers.hpp"

using namespace ember;
using ember_test::bytes_of;
namespace fs = std::filesystem;
namespace tr = ember::data::transforms;

namespace {

const std::string kDir = std::string(EMBER_TEST_FIXTURES) + "/images/";

struct TempDir {
  fs::path p;
  // Named by the process too: ctest runs this file and the sanitizer job's copy of it side by side.
  explicit TempDir(const std::string& name)
      : p(fs::temp_directory_path() / ("ember_test_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(p, ec);
  }
  std::string str() const { return p.string(); }
};

void put(const fs::path& p, const std::vector<unsigned char>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

std::vector<data::Batch> epoch(const data::ImageFolder& f, int workers, std::uint64_t e, data::ImagePipeline p) {
  data::DataLoader loader(f, {.batch_size = 5, .shuffle = true, .num_workers = workers, .seed = 11}, p);
  loader.set_epoch(e);
  std::vector<data::Batch> out;
  for (auto& b : loader) out.push_back(b);
  return out;
}

bool same(const std::vector<data::Batch>& a, const std::vector<data::Batch>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].data.shape() != b[i].data.shape() || a[i].target.shape() != b[i].target.shape()) return false;
    if (std::memcmp(a[i].data.data(), b[i].data.data(), std::size_t(a[i].data.numel()) * sizeof(float)) != 0 ||
        std::memcmp(a[i].target.data(), b[i].target.data(), std::size_t(a[i].target.numel()) * 8) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("ImageFolder: classes, class_to_idx and samples in torchvision's order (odd names)") {
  const data::ImageFolder f(kDir + "folder");
  std::ifstream ref(kDir + "folder.txt");
  REQUIRE(ref.good());
  std::vector<std::string> classes;
  std::vector<std::pair<std::int64_t, std::string>> samples;
  std::string line;
  while (std::getline(ref, line)) {
    if (line.rfind("class ", 0) == 0) {
      const std::size_t sp = line.find(' ', 6);
      CHECK(std::stoll(line.substr(6, sp - 6)) == std::int64_t(classes.size()));
      classes.push_back(line.substr(sp + 1));
    } else if (line.rfind("sample ", 0) == 0) {
      const std::size_t sp = line.find(' ', 7);
      samples.emplace_back(std::stoll(line.substr(7, sp - 7)), line.substr(sp + 1));
    }
  }
  REQUIRE(classes.size() == 6);
  CHECK(f.classes() == classes);
  for (std::size_t c = 0; c < classes.size(); ++c) CHECK(f.class_to_idx(classes[c]) == std::int64_t(c));
  CHECK_THROWS_AS(f.class_to_idx("no such class"), Error);
  REQUIRE(f.size() == samples.size());
  for (std::size_t i = 0; i < samples.size(); ++i) {
    CAPTURE(i);
    CHECK(f.target(i) == samples[i].first);
    CHECK(f.path(i) == kDir + "folder/" + samples[i].second);
    CHECK(f.get(i).target == samples[i].first);
  }
  // Hidden files and folders left out on request.
  const data::ImageFolder visible(kDir + "folder", {.skip_hidden = true});
  CHECK(visible.classes().front() == "B");
  for (std::size_t i = 0; i < visible.size(); ++i) CHECK(visible.path(i).find("/.") == std::string::npos);
  CHECK(visible.size() == f.size() - 3);
  const data::Example e = f.load(0);
  CHECK(e.data.shape() == Shape{3, 48, 64});
  CHECK(e.target == 0);
}

TEST_CASE("ImageFolder: errors name the empty class, the missing root and the bad file") {
  TempDir d("image_folder_errors");
  put(d.p / "cat" / "a.png", bytes_of(kDir + "decode/gray8.png"));
  fs::create_directories(d.p / "dog");
  put(d.p / "dog" / "readme.txt", {'h', 'i'});
  CHECK_THROWS_WITH_AS(data::ImageFolder(d.str()), doctest::Contains("no valid file for the classes \"dog\""), Error);
  CHECK_THROWS_WITH_AS(data::ImageFolder(d.str() + "/nowhere"), doctest::Contains("not a folder"), Error);
  TempDir e("image_folder_empty");
  CHECK_THROWS_WITH_AS(data::ImageFolder(e.str()), doctest::Contains("no class folder"), Error);

  // A FIFO named like an image: an error at once, not a read that waits for a writer.
  TempDir q("image_folder_fifo");
  put(q.p / "cls" / "a.png", bytes_of(kDir + "decode/gray8.png"));
  REQUIRE(::mkfifo((q.p / "cls" / "pipe.jpg").c_str(), 0600) == 0);
  const data::ImageFolder fifo(q.str());
  REQUIRE(fifo.size() == 2);
  CHECK_THROWS_WITH_AS(data::read_image(fifo.path(1)), doctest::Contains("not a regular file"), Error);

  put(d.p / "dog" / "bad file.jpg", {'n', 'o', 't', ' ', 'j', 'p', 'e', 'g'});
  put(d.p / "dog" / "gone.png", bytes_of(kDir + "decode/gray8.png"));
  const data::ImageFolder f(d.str());
  REQUIRE(f.size() == 3);
  fs::remove(d.p / "dog" / "gone.png");
  const data::ImagePipeline p({.resize = tr::Resize(8, 8)});
  data::DataLoader bad(f, {.batch_size = 1}, p);
  auto it = bad.begin();  // batch 0: cat/a.png
  CHECK(it->data.shape() == Shape{1, 3, 8, 8});
  CHECK_THROWS_WITH_AS(++it, doctest::Contains("bad file.jpg"), Error);
  data::DataLoader gone(f, {.batch_size = 1, .num_workers = 2}, p);
  gone.skip_batches(2);
  CHECK_THROWS_WITH_AS(gone.begin(), doctest::Contains("gone.png"), Error);
}

TEST_CASE("ImagePipeline: the fused chain equals decode, crop, resize, flip and normalize one by one") {
  const std::vector<unsigned char> jpg = bytes_of(kDir + "transforms/photo.jpg");
  const Tensor<std::uint8_t> hwc = data::decode_image(jpg, "photo.jpg");
  Tensor<float> chw = empty<float>(Shape{3, 72, 96});
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t i = 0; i < 72 * 96; ++i) chw.data()[c * 72 * 96 + i] = float(hwc.data()[i * 3 + c]) / 255.0f;
  const tr::Normalize norm({0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f});
  const tr::RandomResizedCrop rrc(20, 24);
  const data::ImagePipeline exact({.random_resized_crop = rrc, .flip = 0.5f, .normalize = norm,
                                   .reduced_decode = false});
  const data::ImagePipeline fast({.random_resized_crop = rrc, .flip = 0.5f, .normalize = norm});
  double fast_diff = 0;
  int flipped = 0;
  for (std::uint64_t k = 0; k < 20; ++k) {
    CAPTURE(k);
    data::Rng g1(5, 0, k), g2(5, 0, k), g3(5, 0, k);
    const Tensor<float> got = exact.apply(jpg, "photo.jpg", g1);
    const Tensor<float> quick = fast.apply(jpg, "photo.jpg", g3);
    // The same draws by hand: the crop box, then the flip.
    const tr::RandomResizedCrop::Box b = rrc.get_params(72, 96, g2);
    const bool flip = g2.bernoulli(0.5f);
    flipped += flip;
    Tensor<float> want = tr::detail::resample_chw(chw, double(b.top), double(b.left), double(b.h), double(b.w), 20,
                                                  24, b.top, b.top + b.h, b.left, b.left + b.w, true);
    if (flip) want = tr::RandomHorizontalFlip{1.0f}(want, g2);
    want = norm(want, g2);
    REQUIRE(got.shape() == Shape{3, 20, 24});
    double worst = 0;
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      worst = std::max(worst, double(std::abs(got.data()[i] - want.data()[i])));
      fast_diff += std::abs(double(quick.data()[i] - want.data()[i])) * 0.25 * 255;  // std ~0.25: grey levels
    }
    CHECK(worst < 1e-4);
  }
  CHECK(flipped > 3);
  CHECK(flipped < 17);
  // Reduced-size and crop-first decoding (1/2 or 1/4 in the DCT for the small crops) stays close on a photograph.
  const double mean_fast = fast_diff / (20.0 * 3 * 20 * 24);
  MESSAGE("reduced decode: mean difference ", mean_fast, " grey levels");
  CHECK(mean_fast < 3.0);
  CHECK(mean_fast > 0.0);  // it did decode at a reduced scale

  // Eval chain: Resize(40) then CenterCrop(32) equals the two transforms on the decoded image.
  const data::ImagePipeline eval({.resize = tr::Resize(40), .center_crop = tr::CenterCrop(32),
                                  .reduced_decode = false});
  data::Rng g(0);
  const Tensor<float> e = eval.apply(jpg, "photo.jpg", g);
  const Tensor<float> ref = tr::CenterCrop(32)(tr::Resize(40)(chw, g), g);
  REQUIRE(e.shape() == ref.shape());
  double worst = 0;
  for (std::int64_t i = 0; i < e.numel(); ++i) worst = std::max(worst, double(std::abs(e.data()[i] - ref.data()[i])));
  CHECK(worst < 1e-5);
  // Greyscale output.
  const data::ImagePipeline gray({.resize = tr::Resize(12, 16), .channels = 1});
  CHECK(gray.apply(jpg, "photo.jpg", g).shape() == Shape{1, 12, 16});
  CHECK_THROWS_AS(data::ImagePipeline({.jitter = tr::ColorJitter(0.2f), .channels = 1}), Error);
  CHECK_THROWS_AS(data::ImagePipeline({.random_resized_crop = rrc, .resize = tr::Resize(8)}), Error);
}

TEST_CASE("ImageFolder + DataLoader: the same batches for 0, 1 and 2 workers and across runs") {
  const data::ImageFolder f(kDir + "folder");
  const data::ImagePipeline p({.random_resized_crop = tr::RandomResizedCrop(16), .flip = 0.5f,
                               .jitter = tr::ColorJitter(0.3f, 0.3f, 0.3f, 0.05f),
                               .normalize = tr::Normalize({0.5f}, {0.25f})});
  const std::vector<data::Batch> b0 = epoch(f, 0, 3, p);
  REQUIRE(b0.size() == 5);
  CHECK(b0[0].data.shape() == Shape{5, 3, 16, 16});
  CHECK(b0.back().data.shape() == Shape{2, 3, 16, 16});
  CHECK(same(b0, epoch(f, 1, 3, p)));
  CHECK(same(b0, epoch(f, 2, 3, p)));
  CHECK(same(b0, epoch(f, 2, 3, p)));
  CHECK_FALSE(same(b0, epoch(f, 0, 4, p)));  // another epoch: another order and other crops
  // Every sample once per epoch.
  std::vector<std::int64_t> targets;
  for (const auto& b : b0)
    for (std::int64_t i = 0; i < b.target.numel(); ++i) targets.push_back(b.target.data()[i]);
  std::sort(targets.begin(), targets.end());
  std::vector<std::int64_t> want;
  for (std::size_t i = 0; i < f.size(); ++i) want.push_back(f.target(i));
  std::sort(want.begin(), want.end());
  CHECK(targets == want);
}

TEST_CASE("DataLoader: per-stage times of an image epoch, and the hint names the slow stage") {
  const data::ImageFolder f(kDir + "folder");
  data::DataLoader loader(f, {.batch_size = 4, .num_workers = 2},
                          data::ImagePipeline({.random_resized_crop = tr::RandomResizedCrop(32)}));
  for (auto& b : loader) (void)b;
  const data::LoaderStats s = loader.stats();
  CHECK(s.samples == f.size());
  CHECK(s.stages[data::Stage::read] > 0);
  CHECK(s.stages[data::Stage::decode] > 0);
  CHECK(s.stages[data::Stage::augment] > 0);
  CHECK(s.stages[data::Stage::collate] >= 0);
  CHECK(s.stages.total() > 0);
  data::LoaderStats slow;
  slow.total_seconds = 10;
  slow.wait_seconds = 6;
  slow.stages[data::Stage::decode] = 3;
  slow.stages[data::Stage::read] = 1;
  const std::string h = data::input_bound_hint(slow, 2);
  CHECK(h.find("with 2 workers") != std::string::npos);
  CHECK(h.find("mostly decode (75%)") != std::string::npos);
  CHECK(h.find("reduced_decode") != std::string::npos);
  slow.stages[data::Stage::read] = 5;
  CHECK(data::input_bound_hint(slow, 2).find("mostly read") != std::string::npos);
  slow.wait_seconds = 1;
  CHECK(data::input_bound_hint(slow, 2).empty());
}
