// Packed image shards (data/image_records.hpp): an ImageFolder packed and read back gives the same images, labels and
// loader batches; a pack is written whole or not at all and replaces an older one whole; max_side re-encodes large
// images; the quasi-random shard order visits every record once and shuffles labels far better than reading in order;
// corrupt shards are errors naming the shard; what a killed packer leaves is cleaned up by the next.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <ember/data/dataloader.hpp>
#include <ember/data/image_records.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "image_helpers.hpp"
#include "process_helpers.hpp"

using namespace ember;
using ember_test::bytes_of;
using ember_test::image_batches;
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
  }
  ~TempDir() {  // with what a packer left beside it (".<name>.tmp-*", ".<name>.old-*") if a check failed
    std::error_code ec;
    fs::remove_all(p, ec);
    const std::string pre = "." + p.filename().string() + ".";
    for (fs::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename().string().rfind(pre, 0) == 0) fs::remove_all(it->path(), ec);
  }
  std::string str() const { return p.string(); }
};

/// The entries beside `dir` whose names start with "." + dir's name (staging and set-aside folders).
std::vector<std::string> beside(const fs::path& dir) {
  std::vector<std::string> v;
  const std::string pre = "." + dir.filename().string() + ".";
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    if (e.path().filename().string().rfind(pre, 0) == 0) v.push_back(e.path().filename().string());
  return v;
}

}  // namespace

TEST_CASE("pack_images: the pack holds the folder's images and labels; its batches equal the folder's") {
  const data::ImageFolder folder(kDir + "folder");
  TempDir d("image_pack");
  const data::PackImagesResult r = data::pack_images(folder, d.str(), {.shard_bytes = 1500, .shuffle = false});
  CHECK(r.images == folder.size());
  CHECK(r.shards >= 3);
  CHECK(r.reencoded == 0);
  const data::ImageRecordDataset pack(d.str());
  CHECK(pack.num_shards() == r.shards);
  CHECK(pack.classes() == folder.classes());
  REQUIRE(pack.size() == folder.size());
  std::vector<unsigned char> scratch;
  for (std::size_t i = 0; i < pack.size(); ++i) {
    CAPTURE(i);
    CHECK(pack.target(i) == folder.target(i));
    const auto b = pack.source()->bytes(i, scratch);
    const std::vector<unsigned char> file = bytes_of(folder.path(i));
    CHECK(std::vector<unsigned char>(b.begin(), b.end()) == file);
  }
  ember_test::check_same_batches(image_batches(folder, 0), image_batches(pack, 2));
  // Shuffled at packing: the same labels in another order.
  TempDir e("image_pack_shuffled");
  data::pack_images(folder, e.str(), {.seed = 3});
  const data::ImageRecordDataset mixed(e.str());
  std::vector<std::int64_t> x, y;
  for (std::size_t i = 0; i < mixed.size(); ++i) x.push_back(mixed.target(i)), y.push_back(folder.target(i));
  CHECK(x != y);
  std::sort(x.begin(), x.end());
  std::sort(y.begin(), y.end());
  CHECK(x == y);
}

TEST_CASE("pack_images: a pack is written whole or not at all, and replaces an older pack whole") {
  TempDir src("image_pack_src");
  fs::copy(kDir + "folder", src.p, fs::copy_options::recursive);
  const data::ImageFolder folder(src.str());
  TempDir d("image_pack_whole");
  const data::PackImagesResult many = data::pack_images(folder, d.str(), {.shard_bytes = 1500});
  REQUIRE(many.shards >= 3);
  // Packed again in one shard: the older pack's other shards are gone, not read as part of the new one.
  const data::PackImagesResult one = data::pack_images(folder, d.str() + "/");
  CHECK(one.shards == 1);
  {
    const data::ImageRecordDataset pack(d.str());
    CHECK(pack.num_shards() == 1);
    CHECK(pack.size() == folder.size());
  }
  // An image that cannot be read part way: an error, and the pack in place is the one before.
  const data::ImageFolder listed(src.str());
  fs::remove(listed.path(listed.size() - 1));
  CHECK_THROWS_AS(data::pack_images(listed, d.str(), {.shard_bytes = 1500, .shuffle = false}), Error);
  {
    const data::ImageRecordDataset pack(d.str());
    CHECK(pack.num_shards() == 1);
    CHECK(pack.size() == folder.size());
  }
  // A failure into a new folder leaves no folder.
  TempDir fresh("image_pack_fresh");
  CHECK_THROWS_AS(data::pack_images(listed, fresh.str(), {.shard_bytes = 1500, .shuffle = false}), Error);
  CHECK_FALSE(fs::exists(fresh.p));
  // No staging or set-aside folder is left beside either.
  CHECK(beside(d.p).empty());
  CHECK(beside(fresh.p).empty());
  // A folder holding a file that is not a pack's: refused before anything is written, the file kept.
  TempDir mine("image_pack_mine");
  fs::create_directories(mine.p);
  std::ofstream(mine.p / "notes.txt") << "mine";
  CHECK_THROWS_WITH_AS(data::pack_images(folder, mine.str()), doctest::Contains("notes.txt"), Error);
  CHECK(fs::exists(mine.p / "notes.txt"));
  CHECK_FALSE(fs::exists(mine.p / "classes.rec"));
  // A link to a pack: the pack it names is replaced, the link stays; a link to nothing is an error.
  TempDir link("image_pack_link");
  fs::create_directory_symlink(d.p, link.p);
  const data::ImageFolder left(src.str());  // (without the image removed above)
  const data::PackImagesResult linked = data::pack_images(left, link.str(), {.shard_bytes = 1500});
  CHECK(linked.shards > 1);
  CHECK(fs::is_symlink(link.p));
  CHECK(data::ImageRecordDataset(d.str()).num_shards() == linked.shards);
  CHECK(data::ImageRecordDataset(d.str()).size() == left.size());
  TempDir dangling("image_pack_dangling");
  fs::create_directory_symlink(d.p / "none", dangling.p);
  CHECK_THROWS_WITH_AS(data::pack_images(folder, dangling.str()), doctest::Contains("link to nothing"), Error);
}

TEST_CASE("pack_images: what a killed packer leaves is cleaned up, and a set-aside older pack is put back") {
  TempDir src("image_pack_kill_src");
  fs::copy(kDir + "folder", src.p, fs::copy_options::recursive);
  const data::ImageFolder folder(src.str());
  TempDir d("image_pack_kill");
  const std::size_t first = data::pack_images(folder, d.str()).shards;
  REQUIRE(first == 1);
  // A packer killed part way (here it exits as its second shard is committed) leaves its staging folder.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int commits = 0;
    ember::detail::atomic_write_before_rename = [&](const std::string&) {
      if (++commits == 3) ::_exit(0);  // classes.rec, shard-00000.rec, then this one
    };
    data::pack_images(folder, d.str(), {.shard_bytes = 1500});
    ::_exit(3);  // not reached when the hook runs
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string staging_pre = "." + d.p.filename().string() + ".tmp-" + std::to_string(pid) + "-";
  const std::vector<std::string> left = beside(d.p);
  REQUIRE(left.size() == 1);
  CHECK(left[0].rfind(staging_pre, 0) == 0);
  CHECK(data::ImageRecordDataset(d.str()).num_shards() == first);  // the pack in place is the one before
  // The next pack removes the dead packer's staging folder, and leaves none of its own.
  const std::size_t next = data::pack_images(folder, d.str(), {.shard_bytes = 1500}).shards;
  CHECK(next > 1);
  CHECK(data::ImageRecordDataset(d.str()).num_shards() == next);
  CHECK(beside(d.p).empty());

  // The two-rename path (file systems without an atomic exchange) replaces the pack the same way.
  data::detail::pack_swap_by_exchange = false;
  struct Restore {
    ~Restore() { data::detail::pack_swap_by_exchange = true; }
  } restore;
  CHECK(data::pack_images(folder, d.str()).shards == 1);
  CHECK(data::ImageRecordDataset(d.str()).num_shards() == 1);
  CHECK(beside(d.p).empty());
  // Killed between its two renames, a packer leaves the older pack set aside and no pack in place: the next
  // packer puts it back before anything else, so even a pack that then fails leaves the older one in place.
  const fs::path aside = d.p.parent_path() / ("." + d.p.filename().string() + ".old-" +
                                              std::to_string(ember_test::dead_pid()) + "-0");
  fs::rename(d.p, aside);
  const data::ImageFolder listed(src.str());
  fs::remove(listed.path(listed.size() - 1));
  CHECK_THROWS_AS(data::pack_images(listed, d.str()), Error);
  CHECK(data::ImageRecordDataset(d.str()).num_shards() == 1);
  CHECK(data::ImageRecordDataset(d.str()).size() == folder.size());
  CHECK(beside(d.p).empty());
  // Killed after them, it leaves the older pack set aside beside the new one: removed.
  fs::copy(d.p, aside, fs::copy_options::recursive);
  const fs::path live_aside = d.p.parent_path() / ("." + d.p.filename().string() + ".old-1-0");  // pid 1 runs
  fs::copy(d.p, live_aside, fs::copy_options::recursive);
  const data::ImageFolder fewer(src.str());
  data::pack_images(fewer, d.str());
  CHECK(data::ImageRecordDataset(d.str()).size() == fewer.size());
  CHECK(beside(d.p) == std::vector<std::string>{live_aside.filename().string()});  // a live packer's is kept
  fs::remove_all(live_aside);
}

TEST_CASE("pack_images: max_side re-encodes larger images at that size") {
  const data::ImageFolder folder(kDir + "folder");
  TempDir d("image_pack_small");
  const data::PackImagesResult r = data::pack_images(folder, d.str(), {.max_side = 32});
  CHECK(r.reencoded == folder.size());  // every fixture is 64x48
  const data::ImageRecordDataset pack(d.str());
  std::vector<unsigned char> scratch;
  data::ImageDecoder dec;
  for (std::size_t i = 0; i < pack.size(); ++i) {
    const data::ImageInfo& info = dec.open(pack.source()->bytes(i, scratch), "x");
    CHECK(info.format == data::ImageFormat::jpeg);
    CHECK(info.width == 32);
    CHECK(info.height == 24);
  }
}

TEST_CASE("ShardShuffleSampler: every record once, reproducible, and labels well mixed") {
  const data::ShardShuffleSampler s{.seed = 4, .block = 32, .window = 64};
  const std::size_t n = 10000;
  std::vector<std::size_t> o = s.indices(n, 0);
  CHECK(o == s.indices(n, 0));
  CHECK(o != s.indices(n, 1));
  std::vector<std::size_t> sorted = o;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < n; ++i) REQUIRE(sorted[i] == i);
  // Labels in class order (a pack written without shuffling: 20 classes of 500): reading in order puts one class in
  // every batch; the quasi-random order comes close to a full shuffle.
  std::vector<std::int64_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) labels[i] = std::int64_t(i / 500);
  const double seq = data::label_repeat_rate(labels, data::SequentialSampler{}.indices(n), 64);
  const double quasi = data::label_repeat_rate(labels, o, 64);
  const double full = data::label_repeat_rate(labels, data::RandomSampler{4}.indices(n, 0), 64);
  MESSAGE("label repeat rate in batches of 64: sequential ", seq, ", quasi-random ", quasi, ", random ", full);
  CHECK(seq > 15);
  CHECK(quasi < 1.5);  // a batch draws from 64 blocks: about 1 + 20 classes / 64 blocks
  const double narrow = data::label_repeat_rate(labels, data::ShardShuffleSampler{4, 32, 8}.indices(n, 0), 64);
  CHECK(narrow > quasi);  // fewer blocks pooled: reads more sequential, batches less mixed
  CHECK(full < 1.2);
  CHECK(s.size(n) == n);
  CHECK(data::ShardShuffleSampler{}.indices(5, 0).size() == 5);
}

TEST_CASE("ImageRecordDataset: corrupt and foreign packs are errors naming the file") {
  const data::ImageFolder folder(kDir + "folder");
  TempDir d("image_pack_corrupt");
  data::pack_images(folder, d.str(), {.shuffle = false});
  CHECK_THROWS_WITH_AS(data::ImageRecordDataset(d.str() + "/none"), doctest::Contains("not a folder"), Error);
  {
    std::fstream f(d.str() + "/shard-00000.rec", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  const data::ImageRecordDataset pack(d.str());
  data::DataLoader loader(pack, {.batch_size = 32}, data::ImagePipeline({.resize = tr::Resize(8, 8)}));
  CHECK_THROWS_WITH_AS(loader.begin(), doctest::Contains("shard-00000.rec"), Error);
  fs::remove(d.str() + "/classes.rec");
  CHECK_THROWS_WITH_AS(data::ImageRecordDataset(d.str()), doctest::Contains("classes.rec"), Error);
  TempDir e("image_pack_labels");
  fs::create_directories(e.p);
  {
    data::RecordWriter c(e.str() + "/classes.rec");
    c.write("only", 4);
    c.close();
    data::RecordWriter w(e.str() + "/shard-00000.rec");
    const std::vector<unsigned char> img = bytes_of(kDir + "decode/gray8.png");
    w.write(data::encode_byte_image(7, img));
    w.close();
  }
  CHECK_THROWS_WITH_AS(data::ImageRecordDataset(e.str()), doctest::Contains("has label 7"), Error);
}

TEST_CASE("encode_jpeg and encode_png round trips") {
  const std::vector<unsigned char> src = bytes_of(kDir + "decode/rgb8.png");
  const Tensor<std::uint8_t> img = data::decode_image(src, "rgb8.png");
  const std::vector<unsigned char> png = data::encode_png(img.data(), 48, 64, 3);
  const Tensor<std::uint8_t> back = data::decode_image(png, "png");
  CHECK(std::memcmp(back.data(), img.data(), std::size_t(img.numel())) == 0);
  const std::vector<unsigned char> jpg = data::encode_jpeg(img.data(), 48, 64, 3, 95);
  const Tensor<std::uint8_t> j = data::decode_image(jpg, "jpg");
  double diff = 0;
  for (std::int64_t i = 0; i < img.numel(); ++i) diff += std::abs(int(j.data()[i]) - int(img.data()[i]));
  CHECK(diff / double(img.numel()) < 4.0);
  CHECK_THROWS_AS(data::encode_jpeg(img.data(), 48, 64, 2), Error);
  CHECK_THROWS_AS(data::encode_jpeg(img.data(), 48, 64, 3, 0), Error);
}
