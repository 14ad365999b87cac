// The data pipeline: IDX files, Fashion-MNIST, samplers, transforms, the DataLoader (order, determinism across
// worker counts, early exit, worker exceptions, bounded prefetch, statistics) and packed record files.
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ember/data.hpp"
#include "ember/ember.hpp"
#include "helpers.hpp"

using namespace ember;
namespace fs = std::filesystem;

namespace {

using ember_test::error_of;
using ember_test::EnvGuard;
using ember_test::TempDir;

using Bytes = std::vector<std::uint8_t>;



void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, b.data(), unsigned(b.size())) == int(b.size()));
  gzclose(f);
}

/// A gzip stream (in memory) of `head` followed by `zeros` zero bytes, deflated in pieces so the zeros are never
/// held in memory at once: 64 MiB of zeros become about 64 KB.
Bytes gzip_with_zeros(const Bytes& head, std::size_t zeros) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) == Z_OK);
  const Bytes block(std::size_t(1) << 20, 0);
  Bytes out;
  std::uint8_t buf[1 << 16];
  auto feed = [&](const std::uint8_t* p, std::size_t n, int flush) {
    zs.next_in = const_cast<Bytef*>(p);
    zs.avail_in = uInt(n);
    int rc;
    do {
      zs.next_out = buf;
      zs.avail_out = sizeof(buf);
      rc = deflate(&zs, flush);
      REQUIRE(rc != Z_STREAM_ERROR);
      out.insert(out.end(), buf, buf + (sizeof(buf) - zs.avail_out));
    } while (zs.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  };
  feed(head.data(), head.size(), Z_NO_FLUSH);
  for (std::size_t left = zeros; left > 0;) {
    const std::size_t n = std::min(left, block.size());
    feed(block.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  feed(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

/// The names of the entries of a folder, sorted.
std::vector<std::string> folder_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

/// An IDX image: header (type, dims) followed by `data`.
Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& data) {
  Bytes b{0, 0, type, std::uint8_t(dims.size())};
  for (auto d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(std::uint8_t(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

Bytes iota_bytes(std::size_t n, std::uint8_t start = 0) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = std::uint8_t(start + i);
  return b;
}

/// Writes a small Fashion-MNIST-like folder: n images whose pixels are (i * 7 + k) % 256, labels i % 10.
void write_fake_fashion(const TempDir& d, const std::string& stem, std::uint32_t n, bool gz = true) {
  Bytes px(std::size_t(n) * 784), lb(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    for (int k = 0; k < 784; ++k) px[i * 784 + k] = std::uint8_t((i * 7 + std::uint32_t(k)) % 256);
    lb[i] = std::uint8_t(i % 10);
  }
  const Bytes images = idx_bytes(0x08, {n, 28, 28}, px), labels = idx_bytes(0x08, {n}, lb);
  if (gz) {
    write_gz(d / (stem + "-images-idx3-ubyte.gz"), images);
    write_gz(d / (stem + "-labels-idx1-ubyte.gz"), labels);
  } else {
    write_bytes(d / (stem + "-images-idx3-ubyte"), images);
    write_bytes(d / (stem + "-labels-idx1-ubyte"), labels);
  }
}

/// Sample i is a (2, 3) tensor filled with i (plus k/100 at element k) and target i; optionally slow or failing.
struct CountingDataset {
  std::size_t n = 50;
  int sleep_us = 0;
  std::int64_t fail_at = -1;
  std::shared_ptr<std::atomic<std::size_t>> calls = std::make_shared<std::atomic<std::size_t>>(0);

  std::size_t size() const { return n; }
  data::Example get(std::size_t i) const {
    calls->fetch_add(1);
    if (sleep_us) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    if (std::int64_t(i) == fail_at) throw std::runtime_error("bad record");
    Tensor<float> x = empty<float>(Shape{2, 3});
    for (int k = 0; k < 6; ++k) x.data()[k] = float(i) + float(k) / 100.0f;
    return {x, std::int64_t(i)};
  }
};

/// Threads of this process (Linux).
std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

/// Whether the thread count falls to at most `n` within two seconds. A joined thread can stay listed in
/// /proc/self/task for a moment after pthread_join returns (the kernel wakes the joiner before it reaps the task),
/// so an exact count straight after a join is flaky; threads that were never told to stop never leave.
bool threads_settle_to(std::size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (thread_count() > n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

template <class T>
std::vector<T> vec(const Tensor<T>& t) {
  return std::vector<T>(t.data(), t.data() + t.numel());
}

}  // namespace

// ---- IDX ------------------------------------------------------------------------------------------------------

TEST_CASE("read_idx: plain and gzip files give the shape of the header and the bytes that follow it") {
  TempDir d;
  const Bytes data = iota_bytes(2 * 3 * 4, 5);
  write_bytes(d / "a.idx", idx_bytes(0x08, {2, 3, 4}, data));
  write_gz(d / "a.idx.gz", idx_bytes(0x08, {2, 3, 4}, data));
  for (const char* name : {"a.idx", "a.idx.gz"}) {
    const Tensor<std::uint8_t> t = data::read_idx(d / name);
    CHECK(t.shape() == Shape{2, 3, 4});
    CHECK(vec(t) == data);
  }
  // Concatenated gzip members decode as one stream, as gunzip does.
  const Bytes whole = idx_bytes(0x08, {6}, iota_bytes(6));
  write_gz(d / "p1.gz", Bytes(whole.begin(), whole.begin() + 7));
  write_gz(d / "p2.gz", Bytes(whole.begin() + 7, whole.end()));
  Bytes cat = data::detail::read_file_bytes(d / "p1.gz", "t"), p2 = data::detail::read_file_bytes(d / "p2.gz", "t");
  cat.insert(cat.end(), p2.begin(), p2.end());
  CHECK(vec(data::decode_idx(cat)) == iota_bytes(6));
  // Zero-size dims are valid.
  CHECK(data::parse_idx(idx_bytes(0x08, {0, 28}, {})).shape() == Shape{0, 28});
}

TEST_CASE("read_idx: a missing file") {
  EXPECT_ERROR([] { data::read_idx("/nonexistent/dir/x-idx1-ubyte.gz"); }, {"read_idx", "cannot open",
                                                                              "/nonexistent/dir/x-idx1-ubyte.gz"});
}

TEST_CASE("read_idx: a file shorter than the magic number") {
  EXPECT_ERROR([] { data::parse_idx(Bytes{0, 0, 8}, "f"); }, {"read_idx", "\"f\"", "too short", "3 bytes"});
}

TEST_CASE("read_idx: a magic number that does not start with two zero bytes") {
  EXPECT_ERROR([] { data::parse_idx(Bytes{0x50, 0x4b, 8, 1, 0, 0, 0, 0}, "f"); }, {"not an IDX file", "0x50"});
}

TEST_CASE("read_idx: an element type other than unsigned byte") {
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x0D, {1}, {0, 0, 0, 0}), "f"); },
               {"element type 0xd", "float32", "unsigned bytes (type 0x08)"});
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x42, {1}, {0}), "f"); }, {"element type 0x42", "unknown"});
}

TEST_CASE("read_idx: zero or too many dims") {
  EXPECT_ERROR([] { data::parse_idx(Bytes{0, 0, 8, 0}, "f"); }, {"declares 0 dimensions", "1 to 8"});
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x08, std::vector<std::uint32_t>(9, 1), {0}), "f"); },
               {"declares 9 dimensions"});
}

TEST_CASE("read_idx: a header cut inside its extents") {
  Bytes b = idx_bytes(0x08, {2, 3}, {});
  b.resize(9);
  EXPECT_ERROR([&] { data::parse_idx(b, "f"); }, {"truncated inside its header", "9 bytes", "needs 12"});
}

TEST_CASE("read_idx: truncated data") {
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x08, {2, 3}, iota_bytes(5)), "f"); },
               {"truncated", "[2, 3]", "needs 6 bytes", "has 5"});
}

TEST_CASE("read_idx: bytes after the data") {
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x08, {2}, iota_bytes(3)), "f"); }, {"1 bytes after the 2 bytes"});
}

TEST_CASE("read_idx: extents whose product is absurdly large") {
  EXPECT_ERROR([] { data::parse_idx(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), "f"); },
               {"more than", "elements"});
}

TEST_CASE("read_idx: a zero-size dim beside huge ones (found by fuzz/fuzz_idx.cpp)") {
  // The byte count is 0, but the strides of [33554432, 0, 84281092, 4203011, ...] overflow int64.
  const Bytes crash{0x0, 0x0, 0x8, 0x5, 0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x5, 0x6, 0x7, 0x4,
                    0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7};
  EXPECT_ERROR([&] { data::parse_idx(crash, "f"); }, {"read_idx", "declares shape", "more than"});
  CHECK(data::parse_idx(idx_bytes(0x08, {0, 1u << 30, 3}, {})).shape() == Shape{0, 1 << 30, 3});
}

TEST_CASE("read_idx: a corrupt gzip stream") {
  TempDir d;
  write_gz(d / "c.gz", idx_bytes(0x08, {64}, iota_bytes(64)));
  Bytes b = data::detail::read_file_bytes(d / "c.gz", "t");
  for (std::size_t i = 10; i < b.size() - 8; ++i) b[i] ^= 0x5A;
  EXPECT_ERROR([&] { data::decode_idx(b, "c.gz"); }, {"read_idx", "\"c.gz\"", "gzip"});
}

TEST_CASE("read_idx: a truncated gzip stream") {
  TempDir d;
  write_gz(d / "t.gz", idx_bytes(0x08, {4096}, Bytes(4096, 7)));
  Bytes b = data::detail::read_file_bytes(d / "t.gz", "t");
  b.resize(b.size() / 2);
  EXPECT_ERROR([&] { data::decode_idx(b, "t.gz"); }, {"truncated gzip stream"});
}

TEST_CASE("read_idx: a gzip bomb stops inflating one byte past the size its header declares") {
  // Shape [16] (8 header bytes + 16 data bytes = 24), followed by 64 MiB of zeros: a ~64 KB file.
  const Bytes bomb = gzip_with_zeros(idx_bytes(0x08, {16}, Bytes(16, 1)), std::size_t(64) << 20);
  CHECK(bomb.size() < 128 * 1024);
  data::detail::gunzip_bytes_inflated = 0;
  EXPECT_ERROR([&] { data::decode_idx(bomb, "bomb.gz"); },
               {"read_idx", "bomb.gz", "more than the 24 bytes", "shape [16]"});
  // Inflation stopped at the declared size + 1 byte: nothing near the 64 MiB was produced.
  CHECK(data::detail::gunzip_bytes_inflated == 25);
  // A single byte too many is reported the same way; the exact size still decodes.
  const Bytes one_more = gzip_with_zeros(idx_bytes(0x08, {16}, Bytes(16, 1)), 1);
  EXPECT_ERROR([&] { data::decode_idx(one_more, "one.gz"); }, {"one.gz", "more than the 24 bytes", "shape [16]"});
  const Tensor<std::uint8_t> ok = data::decode_idx(gzip_with_zeros(idx_bytes(0x08, {4, 4}, {}), 16), "ok.gz");
  CHECK(ok.shape() == Shape{4, 4});
  CHECK(vec(ok) == Bytes(16, 0));
  // A header declaring a huge shape with little data behind it: an error about the missing data, after inflating
  // only what the stream holds.
  const Bytes liar = gzip_with_zeros(idx_bytes(0x08, {1u << 31}, {}), 1000);
  EXPECT_ERROR([&] { data::decode_idx(liar, "liar.gz"); }, {"liar.gz", "truncated", "2147483648"});
  CHECK(data::detail::gunzip_bytes_inflated == 8 + 1000);
  // A stream that ends inside the header, and a bad magic number seen after the first 4 inflated bytes.
  EXPECT_ERROR([&] { data::decode_idx(gzip_with_zeros({0, 0, 8}, 0), "h.gz"); }, {"h.gz", "too short"});
  EXPECT_ERROR([&] { data::decode_idx(gzip_with_zeros({1, 2, 8, 1}, std::size_t(8) << 20), "m.gz"); },
               {"m.gz", "not an IDX file"});
  CHECK(data::detail::gunzip_bytes_inflated <= 4 + 1024);
}

TEST_CASE("read_idx, FashionMNIST: file names with terminal escape sequences are escaped in messages") {
  TempDir d;
  const std::string evil = "evil\x1b]0;owned\x07\x1b[2J.idx";
  write_bytes(d / evil, Bytes{1, 2, 3, 4, 5, 6, 7, 8});
  const std::string msg = error_of([&] { data::read_idx(d / evil); });
  CHECK(msg.find("not an IDX file") != std::string::npos);
  CHECK(msg.find("evil\\x1b]0;owned\\x07\\x1b[2J.idx") != std::string::npos);
  CHECK(msg.find('\x1b') == std::string::npos);
  CHECK(msg.find('\x07') == std::string::npos);
  EnvGuard env("EMBER_FASHION_MNIST", (d / "no\x1b[2Jpe").c_str());
  const std::string m2 = error_of([] { (void)data::FashionMNIST(data::Split::Train); });
  CHECK(m2.find("no\\x1b[2Jpe") != std::string::npos);
  CHECK(m2.find('\x1b') == std::string::npos);
}

// ---- Fashion-MNIST -------------------------------------------------------------------------------------------

TEST_CASE("FashionMNIST: reads a folder given as root, gzip'd or plain; pixels become [0, 1] floats") {
  TempDir gz, plain;
  write_fake_fashion(gz, "train", 12);
  write_fake_fashion(gz, "t10k", 5);
  write_fake_fashion(plain, "t10k", 5, false);
  data::FashionMNIST train(data::Split::Train, gz.path.string());
  CHECK(train.size() == 12);
  CHECK(train.images().shape() == Shape{12, 28, 28});
  CHECK(train.labels().shape() == Shape{12});
  CHECK(train.labels().data()[11] == 1);
  const data::Example e = train.get(3);
  CHECK(e.data.shape() == Shape{1, 28, 28});
  CHECK(e.target == 3);
  for (int k : {0, 100, 783}) CHECK(e.data.data()[k] == float((3 * 7 + k) % 256) / 255.0f);
  for (const TempDir* d : {&gz, &plain}) {
    data::FashionMNIST test(data::Split::Test, d->path.string());
    CHECK(test.size() == 5);
    CHECK(test.root() == d->path.string());
  }
  EXPECT_ERROR([&] { train.get(12); }, {"FashionMNIST::get", "index 12", "12 samples"});
}

TEST_CASE("FashionMNIST: the EMBER_FASHION_MNIST environment variable is used when no root is given") {
  TempDir d;
  write_fake_fashion(d, "t10k", 4);
  EnvGuard env("EMBER_FASHION_MNIST", d.path.string().c_str());
  data::FashionMNIST test(data::Split::Test);
  CHECK(test.size() == 4);
  CHECK(test.root() == d.path.string());
}

TEST_CASE("FashionMNIST: missing files name the path tried and how to install the dataset") {
  TempDir d;
  EXPECT_ERROR([&] { (void)data::FashionMNIST(data::Split::Train, d.path.string()); },
               {"FashionMNIST", (d / "train-images-idx3-ubyte.gz").c_str(), "apt-get install dataset-fashion-mnist",
                "EMBER_FASHION_MNIST"});
  EnvGuard env("EMBER_FASHION_MNIST", (d / "nowhere").c_str());
  EXPECT_ERROR([&] { (void)data::FashionMNIST(data::Split::Test); }, {(d / "nowhere").c_str(), "apt-get install"});
}

TEST_CASE("FashionMNIST: image and label counts that differ") {
  TempDir d;
  write_fake_fashion(d, "train", 6);
  write_gz(d / "train-labels-idx1-ubyte.gz", idx_bytes(0x08, {5}, Bytes(5, 1)));
  EXPECT_ERROR([&] { (void)data::FashionMNIST(data::Split::Train, d.path.string()); },
               {"labels", "[5]", "expected (6)"});
}

TEST_CASE("FashionMNIST: images that are not 28x28") {
  TempDir d;
  write_gz(d / "train-images-idx3-ubyte.gz", idx_bytes(0x08, {2, 27, 28}, Bytes(2 * 27 * 28, 0)));
  write_gz(d / "train-labels-idx1-ubyte.gz", idx_bytes(0x08, {2}, Bytes(2, 1)));
  EXPECT_ERROR([&] { (void)data::FashionMNIST(data::Split::Train, d.path.string()); }, {"[2, 27, 28]", "(N, 28, 28)"});
}

TEST_CASE("FashionMNIST: a label outside 0..9") {
  TempDir d;
  write_gz(d / "train-images-idx3-ubyte.gz", idx_bytes(0x08, {2, 28, 28}, Bytes(2 * 784, 0)));
  write_gz(d / "train-labels-idx1-ubyte.gz", idx_bytes(0x08, {2}, Bytes{3, 10}));
  EXPECT_ERROR([&] { (void)data::FashionMNIST(data::Split::Train, d.path.string()); }, {"label 10", "sample 1"});
}

TEST_CASE("FashionMNIST: Debian's dataset-fashion-mnist (skipped when not installed)") {
  if (!fs::exists(std::string(data::FashionMNIST::kDefaultRoot) + "/t10k-images-idx3-ubyte.gz")) {
    MESSAGE("dataset-fashion-mnist is not installed; skipped");
    return;
  }
  EnvGuard env("EMBER_FASHION_MNIST", nullptr);
  for (auto [split, n] : {std::pair{data::Split::Train, 60000}, std::pair{data::Split::Test, 10000}}) {
    data::FashionMNIST ds(split);
    REQUIRE(ds.size() == std::size_t(n));
    std::vector<int> hist(10, 0);
    for (std::int64_t i = 0; i < n; ++i) hist[std::size_t(ds.labels().data()[i])]++;
    for (int c = 0; c < 10; ++c) CHECK(hist[std::size_t(c)] == n / 10);  // balanced classes
    const auto px = ds.images();
    CHECK(*std::max_element(px.data(), px.data() + px.numel()) == 255);
  }
  // The first test image is an ankle boot (class 9), as in every Fashion-MNIST loader.
  CHECK(data::FashionMNIST(data::Split::Test).get(0).target == 9);
}

// ---- samplers -------------------------------------------------------------------------------------------------

TEST_CASE("RandomSampler: a permutation, the same for the same epoch, different for another") {
  data::RandomSampler s{42};
  const auto a = s.indices(1000, 0), b = s.indices(1000, 0), c = s.indices(1000, 1);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::size_t> iota(1000);
  std::iota(iota.begin(), iota.end(), std::size_t(0));
  CHECK(sorted == iota);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a != iota);
  CHECK(data::RandomSampler{43}.indices(1000, 0) != a);
}

TEST_CASE("DistributedSampler: disjoint shards of equal size that cover the dataset, reshuffled per epoch") {
  for (std::size_t n : {12u, 10u, 1u, 7u}) {
    for (int world : {1, 3, 4}) {
      for (bool drop_last : {false, true}) {
        INFO("n " << n << " world " << world << " drop_last " << drop_last);
        std::vector<std::size_t> all;
        std::size_t per = 0;
        for (int r = 0; r < world; ++r) {
          data::DistributedSampler s(r, world, {.shuffle = true, .seed = 7, .drop_last = drop_last});
          s.set_epoch(3);
          const auto mine = s.indices(n);
          CHECK(mine == s.indices(n, 3));
          CHECK(mine.size() == s.size(n));
          if (r == 0) per = mine.size();
          CHECK(mine.size() == per);  // equal shards
          all.insert(all.end(), mine.begin(), mine.end());
        }
        const std::set<std::size_t> uniq(all.begin(), all.end());
        if (drop_last) {
          CHECK(per == n / std::size_t(world));
          CHECK(uniq.size() == all.size());  // disjoint
        } else {
          CHECK(per == (n + std::size_t(world) - 1) / std::size_t(world));
          CHECK(uniq.size() == n);                          // every sample seen
          CHECK(all.size() - n < std::size_t(world));       // padding below one sample per rank
        }
      }
    }
  }
  data::DistributedSampler s(1, 2, {.seed = 1});
  CHECK(s.indices(100, 0) != s.indices(100, 1));
  data::DistributedSampler seq(1, 2, {.shuffle = false});
  CHECK(seq.indices(6, 5) == std::vector<std::size_t>{1, 3, 5});
}

TEST_CASE("DistributedSampler: a rank outside the world") {
  EXPECT_ERROR([] { data::DistributedSampler(2, 2); }, {"DistributedSampler", "rank 2", "world_size 2"});
  EXPECT_ERROR([] { data::DistributedSampler(0, 0); }, {"world_size must be at least 1"});
}

// ---- transforms ----------------------------------------------------------------------------------------------

namespace {
Tensor<float> img(std::int64_t c, std::int64_t h, std::int64_t w) {
  Tensor<float> t = empty<float>(Shape{c, h, w});
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = float(i + 1);
  return t;
}
}  // namespace

TEST_CASE("transforms: Normalize per channel, and a single value for every channel") {
  data::Rng g(0);
  const Tensor<float> x = img(2, 2, 2);
  const auto y = data::transforms::Normalize({1.0f, 2.0f}, {2.0f, 4.0f})(x, g);
  CHECK(vec(y) == std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 0.75f, 1.0f, 1.25f, 1.5f});
  CHECK(vec(x)[0] == 1.0f);  // input untouched
  const auto z = data::transforms::Normalize({1.0f}, {0.5f})(x, g);
  CHECK(vec(z)[7] == 14.0f);
  // A strided view (the transpose of H and W) is read through its strides.
  const auto t = data::transforms::Normalize({0.0f}, {1.0f})(x.transpose(1, 2), g);
  CHECK(vec(t) == std::vector<float>{1, 3, 2, 4, 5, 7, 6, 8});
}

TEST_CASE("transforms: Normalize with the wrong channel count, or std 0") {
  data::Rng g(0);
  EXPECT_ERROR([&] { data::transforms::Normalize({0, 0, 0}, {1, 1, 1})(img(2, 2, 2), g); },
               {"Normalize", "3 means", "2 channels", "[2, 2, 2]"});
  EXPECT_ERROR([] { data::transforms::Normalize({0}, {0}); }, {"Normalize", "non-zero"});
  EXPECT_ERROR([] { data::transforms::Normalize({0, 1}, {1}); }, {"Normalize", "2 values", "1"});
}

TEST_CASE("transforms: inputs that are not (C, H, W)") {
  data::Rng g(0);
  EXPECT_ERROR([&] { data::transforms::RandomHorizontalFlip{}(empty<float>(Shape{28, 28}), g); },
               {"RandomHorizontalFlip", "(C, H, W)", "[28, 28]"});
}

TEST_CASE("transforms: RandomCrop with padding cuts a window of the zero-padded image") {
  const Tensor<float> x = img(2, 5, 6);
  std::set<std::pair<int, int>> offsets;
  for (std::uint64_t s = 0; s < 200; ++s) {
    data::Rng g(s);
    const auto y = data::transforms::RandomCrop(4, 5, {.padding = 2})(x, g);
    REQUIRE(y.shape() == Shape{2, 4, 5});
    // Find the offset (top, left) in [-2, 3] x [-2, 3] that explains every pixel.
    int found = 0;
    for (int top = -2; top <= 3; ++top)
      for (int left = -2; left <= 3; ++left) {
        bool ok = true;
        for (int c = 0; c < 2 && ok; ++c)
          for (int i = 0; i < 4 && ok; ++i)
            for (int j = 0; j < 5 && ok; ++j) {
              const int yy = top + i, xx = left + j;
              const float want = yy >= 0 && yy < 5 && xx >= 0 && xx < 6 ? x.data()[(c * 5 + yy) * 6 + xx] : 0.0f;
              ok = y.data()[(c * 4 + i) * 5 + j] == want;
            }
        if (ok) {
          ++found;
          offsets.insert({top, left});
        }
      }
    CHECK(found == 1);
  }
  CHECK(offsets.size() == 36);  // every position is reachable
  // Padding wider than the crop: windows lying partly or wholly in the padding get the fill value there.
  for (std::uint64_t s = 0; s < 300; ++s) {
    data::Rng g(s), h(s);
    const auto y = data::transforms::RandomCrop(3, 2, {.padding = 4, .fill = -1.0f})(x, g);
    const int top = int(h.below(5 + 8 - 3 + 1)) - 4, left = int(h.below(6 + 8 - 2 + 1)) - 4;  // the same draws
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 2; ++j) {
          const int yy = top + i, xx = left + j;
          const float want = yy >= 0 && yy < 5 && xx >= 0 && xx < 6 ? x.data()[(c * 5 + yy) * 6 + xx] : -1.0f;
          REQUIRE(y.data()[(c * 3 + i) * 2 + j] == want);
        }
  }
  data::Rng g(1);
  CHECK(vec(data::transforms::RandomCrop(5, 6)(x, g)) == vec(x));  // no padding, full size: identity
  EXPECT_ERROR([&] { data::transforms::RandomCrop(8, {.padding = 1})(x, g); }, {"RandomCrop", "does not fit",
                                                                                 "[2, 5, 6]"});
}

TEST_CASE("transforms: RandomHorizontalFlip mirrors rows with probability p") {
  const Tensor<float> x = img(1, 2, 3);
  data::Rng g(3);
  CHECK(vec(data::transforms::RandomHorizontalFlip{1.0f}(x, g)) == std::vector<float>{3, 2, 1, 6, 5, 4});
  CHECK(vec(data::transforms::RandomHorizontalFlip{0.0f}(x, g)) == vec(x));
  int flipped = 0;
  for (std::uint64_t s = 0; s < 2000; ++s) {
    data::Rng r(s);
    flipped += data::transforms::RandomHorizontalFlip{}(x, r).data()[0] == 3.0f;
  }
  CHECK(flipped > 900);
  CHECK(flipped < 1100);
}

TEST_CASE("transforms: RandomErasing with aspect ratios whose sizes are beyond any integer erases nothing") {
  data::Rng g(3);
  const Tensor<float> x = rand<float>({1, 8, 8});
  // area * ratio (or area / ratio) overflows float: the sizes are inf, which no rectangle fits.
  for (const auto& o : {data::transforms::RandomErasingOptions{.p = 1.0f, .ratio_min = 1e37f, .ratio_max = 3e38f},
                        data::transforms::RandomErasingOptions{.p = 1.0f, .ratio_min = 1e-45f, .ratio_max = 1e-44f}})
    CHECK(vec(data::transforms::RandomErasing(o)(x, g)) == vec(x));
}

TEST_CASE("transforms: RandomErasing fills one rectangle and leaves the rest") {
  const Tensor<float> x = img(2, 16, 16);
  for (std::uint64_t s = 0; s < 50; ++s) {
    data::Rng g(s);
    const auto y = data::transforms::RandomErasing({.p = 1.0f, .value = -1.0f})(x, g);
    // The erased pixels of channel 0 form a rectangle, the same in channel 1; the others are unchanged.
    int r0 = 16, r1 = -1, c0 = 16, c1 = -1, erased = 0;
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 16; ++j) {
          const float v = y.data()[(c * 16 + i) * 16 + j];
          if (v == -1.0f) {
            ++erased;
            r0 = std::min(r0, i), r1 = std::max(r1, i), c0 = std::min(c0, j), c1 = std::max(c1, j);
          } else {
            CHECK(v == x.data()[(c * 16 + i) * 16 + j]);
          }
        }
    REQUIRE(erased > 0);
    CHECK(erased == 2 * (r1 - r0 + 1) * (c1 - c0 + 1));
    const double area = double(erased / 2) / 256.0;
    CHECK(area >= 0.01);  // 0.02..0.33 of the image, up to rounding of the sides
    CHECK(area <= 0.45);
  }
  data::Rng g(0);
  CHECK(vec(data::transforms::RandomErasing({.p = 0.0f})(x, g)) == vec(x));
  EXPECT_ERROR([] { data::transforms::RandomErasing({.p = 1.5f}); }, {"RandomErasing", "p must be in [0, 1]"});
  EXPECT_ERROR([] { data::transforms::RandomErasing({.scale_min = 0.5f, .scale_max = 0.2f}); },
               {"RandomErasing", "scale range"});
}

TEST_CASE("transforms: Compose applies in order") {
  const Tensor<float> x = img(1, 1, 3);
  data::Rng g(0);
  const auto c = data::transforms::Compose(data::transforms::RandomHorizontalFlip{1.0f},
                                           data::transforms::Normalize({1.0f}, {2.0f}));
  CHECK(vec(c(x, g)) == std::vector<float>{1.0f, 0.5f, 0.0f});
}

TEST_CASE("transforms: Compose transforms its own intermediates in place, with the same results, and never the caller's") {
  namespace T = data::transforms;
  const auto c = T::Compose(T::RandomHorizontalFlip{}, T::RandomErasing{}, T::Normalize({0.5f, 0.2f}, {2.0f, 0.5f}));
  const auto with_crop = T::Compose(T::RandomCrop(5, 6, {.padding = 1}), T::RandomHorizontalFlip{},
                                    T::RandomErasing(T::RandomErasingOptions{.p = 0.9f, .value = -7.0f}),
                                    T::Normalize({0.1f}, {0.3f}));
  const Tensor<float> x = img(2, 5, 6);
  const std::vector<float> x0 = vec(x);
  int erased = 0;
  for (std::uint64_t s = 0; s < 200; ++s) {
    // Reference: each transform by itself (always copying), with the same stream of random numbers.
    data::Rng r(s);
    Tensor<float> ref = T::RandomHorizontalFlip{}(x, r);
    ref = T::RandomErasing{}(ref, r);
    ref = T::Normalize({0.5f, 0.2f}, {2.0f, 0.5f})(ref, r);
    data::Rng g1(s), g2(s);
    const Tensor<float> shared = c(x, g1);           // x is shared with the caller: never written
    const Tensor<float> own = c(x.clone(), g2);      // a clone nobody else holds: transformed in place
    CHECK(vec(shared) == vec(ref));
    CHECK(vec(own) == vec(ref));
    CHECK(vec(x) == x0);
    data::Rng r2(s), g3(s);
    Tensor<float> ref2 = T::RandomCrop(5, 6, {.padding = 1})(x, r2);
    ref2 = T::RandomHorizontalFlip{}(ref2, r2);
    const Tensor<float> before_erase = ref2;
    ref2 = T::RandomErasing(T::RandomErasingOptions{.p = 0.9f, .value = -7.0f})(ref2, r2);
    erased += !before_erase.same_impl(ref2);
    ref2 = T::Normalize({0.1f}, {0.3f})(ref2, r2);
    CHECK(vec(with_crop(x, g3)) == vec(ref2));
    CHECK(vec(x) == x0);
  }
  CHECK(erased > 100);  // the in-place erase path really ran
}

// ---- DataLoader ------------------------------------------------------------------------------------------------

TEST_CASE("DataLoader: sequential batches in order, the last one smaller unless drop_last") {
  CountingDataset ds{.n = 10};
  for (int w : {0, 1, 3}) {
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = w});
    CHECK(loader.size() == 3);
    std::vector<std::int64_t> targets;
    std::vector<std::size_t> sizes;
    for (auto& b : loader) {
      CHECK(b.data.is_contiguous());
      CHECK(b.data.shape() == Shape{std::int64_t(b.size()), 2, 3});
      for (std::size_t i = 0; i < b.size(); ++i) {
        targets.push_back(b.target.data()[i]);
        CHECK(b.data.data()[i * 6 + 5] == float(b.target.data()[i]) + 0.05f);
      }
      sizes.push_back(b.size());
    }
    CHECK(sizes == std::vector<std::size_t>{4, 4, 2});
    CHECK(targets == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    data::DataLoader dl(ds, {.batch_size = 4, .drop_last = true, .num_workers = w});
    CHECK(dl.size() == 2);
    std::size_t seen = 0;
    for (auto& b : dl) seen += b.size();
    CHECK(seen == 8);
  }
}

namespace {
// A sampler whose size() promises more samples than indices() returns.
struct ShortSampler {
  std::vector<std::size_t> indices(std::size_t, std::uint64_t) const { return {0, 1, 2}; }
  std::size_t size(std::size_t) const { return 9; }
};
}  // namespace

TEST_CASE("DataLoader: a sampler whose size() exceeds its indices() is an error, not batches past its end") {
  CountingDataset ds{.n = 10};
  for (int w : {0, 2}) {
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = w}, data::NoTransform{}, ShortSampler{});
    CHECK(loader.size() == 3);
    EXPECT_ERROR([&] { loader.begin(); }, {"DataLoader", "sampler's size()", "indices() returned 3 indices"});
  }
}

TEST_CASE("DataLoader: batches do not depend on the worker count; epochs reshuffle deterministically") {
  namespace T = data::transforms;
  TempDir d;
  write_fake_fashion(d, "train", 64);
  data::FashionMNIST ds(data::Split::Train, d.path.string());
  const auto transform = T::Compose(T::RandomCrop(28, {.padding = 4}), T::RandomHorizontalFlip{},
                                    T::RandomErasing{}, T::Normalize({0.5f}, {0.25f}));
  auto run = [&](int workers, std::uint64_t epoch, std::uint64_t seed = 5) {
    data::DataLoader loader(ds, {.batch_size = 10, .shuffle = true, .num_workers = workers, .prefetch_factor = 1,
                                 .seed = seed},
                            transform);
    loader.set_epoch(epoch);
    std::vector<float> out;
    std::vector<std::int64_t> targets;
    for (auto& b : loader) {
      const auto v = vec(b.data);
      out.insert(out.end(), v.begin(), v.end());
      const auto t = vec(b.target);
      targets.insert(targets.end(), t.begin(), t.end());
    }
    return std::pair{out, targets};
  };
  const auto ref = run(0, 1);
  CHECK(ref.first.size() == 64 * 784);
  for (int w : {1, 2, 3, 5}) {
    INFO("workers " << w);
    CHECK(run(w, 1) == ref);  // bit-identical data and order
  }
  const auto other = run(2, 2);
  CHECK(other.second != ref.second);  // another epoch, another order
  auto a = other.second, b = ref.second;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  CHECK(a == b);                                 // the same samples
  CHECK(run(2, 1, 6).first != ref.first);        // another seed, other augmentations
}

TEST_CASE("DataLoader: leaving the loop early stops and joins the workers without hanging") {
  CountingDataset ds{.n = 400, .sleep_us = 200};
  const std::size_t before = thread_count();
  const auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 3; ++rep) {
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 3, .prefetch_factor = 2});
    int n = 0;
    for (auto& b : loader) {
      CHECK(b.size() == 4);
      if (++n == 2) break;
    }
    CHECK(threads_settle_to(before));  // stopped at the end of the loop, not at the loader's destruction
    // An iteration left by an exception from the loop body cleans up too.
    CHECK_THROWS_AS(
        [&] {
          for (auto& b : loader) {
            (void)b;
            throw std::runtime_error("consumer failed");
          }
        }(),
        std::runtime_error);
    CHECK(threads_settle_to(before));
  }
  // A full epoch would take 400 samples * 200 us / 3 workers > 25 ms per loader; six early exits stay far below.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(ds.calls->load() < 6 * (2 + 3 * 2 + 3) * 4);  // only what the prefetch window allowed was loaded
}

TEST_CASE("DataLoader: an exception while loading reaches the caller with the sample index") {
  for (int w : {0, 1, 2}) {
    INFO("workers " << w);
    CountingDataset ds{.n = 40, .fail_at = 37};
    data::DataLoader loader(ds, {.batch_size = 4, .num_workers = w});
    std::size_t batches = 0;
    const std::string msg = error_of([&] {
      for (auto& b : loader) {
        (void)b;
        ++batches;
      }
    });
    CHECK(msg.find("sample 37") != std::string::npos);
    CHECK(msg.find("batch 9") != std::string::npos);
    CHECK(msg.find("bad record") != std::string::npos);
    CHECK(batches == 9);  // every batch before the failing one was delivered, in order
  }
  // A transform that throws is reported the same way.
  CountingDataset ds{.n = 8};
  auto bad = [](Tensor<float> x, data::Rng&) -> Tensor<float> {
    if (x.data()[0] == 5.0f) throw ember::Error("transform rejects 5");
    return x;
  };
  data::DataLoader loader(ds, {.batch_size = 2, .num_workers = 2}, bad);
  EXPECT_ERROR([&] {
    for (auto& b : loader) (void)b;
  }, {"sample 5", "transform rejects 5"});
}

TEST_CASE("DataLoader: at most num_workers * prefetch_factor batches are loaded ahead of the consumer") {
  CountingDataset ds{.n = 200};
  data::DataLoader loader(ds, {.batch_size = 5, .num_workers = 2, .prefetch_factor = 3});
  std::size_t consumed = 0, max_ahead = 0;
  for (auto& b : loader) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow consumer lets the workers run ahead
    consumed += b.size();
    max_ahead = std::max(max_ahead, ds.calls->load() - consumed);
  }
  CHECK(max_ahead <= 2 * 3 * 5);
  CHECK(max_ahead >= 2 * 5);  // and they do run ahead
}

TEST_CASE("DataLoader: statistics separate waiting for data from the consumer's own work") {
  {
    CountingDataset slow{.n = 40, .sleep_us = 1000};
    data::DataLoader loader(slow, {.batch_size = 4});  // loading happens in the consumer's thread: all wait
    for (auto& b : loader) (void)b;
    const auto s = loader.stats();
    CHECK(s.batches == 10);
    CHECK(s.samples == 40);
    CHECK(s.wait_seconds <= s.total_seconds);
    CHECK(s.wait_fraction() > 0.8);
    CHECK(s.samples_per_second() > 0);
  }
  {
    CountingDataset fast{.n = 40, .sleep_us = 100};
    data::DataLoader loader(fast, {.batch_size = 4, .num_workers = 2});
    for (auto& b : loader) {
      (void)b;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the "training step"
    }
    const auto s = loader.stats();
    CHECK(s.batches == 10);
    CHECK(s.total_seconds >= 0.09);
    CHECK(s.wait_fraction() < 0.5);  // workers keep up with a consumer that is slower than loading
  }
}

TEST_CASE("DataLoader: a distributed sampler gives each rank its shard, reshuffled by set_epoch") {
  CountingDataset ds{.n = 30};
  std::vector<std::vector<std::int64_t>> per_epoch(2);
  for (std::uint64_t epoch = 0; epoch < 2; ++epoch)
    for (int r = 0; r < 3; ++r) {
      data::DataLoader loader(ds, {.batch_size = 4, .num_workers = 1}, data::NoTransform{},
                              data::DistributedSampler(r, 3, {.seed = 9}));
      CHECK(loader.size() == 3);  // 10 samples per rank
      loader.set_epoch(epoch);
      for (auto& b : loader)
        for (auto t : vec(b.target)) per_epoch[epoch].push_back(t);
    }
  for (auto& v : per_epoch) {
    CHECK(std::set<std::int64_t>(v.begin(), v.end()).size() == 30);
    CHECK(v.size() == 30);
  }
  CHECK(per_epoch[0] != per_epoch[1]);
}

TEST_CASE("DataLoader: an iterator that outlives its loader keeps what its epoch uses alive and finishes the epoch") {
  using Loader = data::DataLoader<CountingDataset>;
  for (int w : {0, 1, 3}) {
    INFO("workers " << w);
    CountingDataset ds{.n = 40, .sleep_us = 100};
    std::optional<Loader::Iterator> it;
    {
      Loader loader(ds, {.batch_size = 4, .num_workers = w, .prefetch_factor = 2});
      it.emplace(loader.begin());
    }  // the loader (and its copy of the dataset) is gone; its workers are still loading
    CHECK(ds.calls.use_count() >= 2);  // the running epoch holds the dataset
    std::vector<std::int64_t> targets;
    for (; !(*it == Loader::Sentinel{}); ++*it)
      for (std::size_t i = 0; i < (*it)->size(); ++i) targets.push_back((*it)->target.data()[i]);
    std::vector<std::int64_t> expect(40);
    std::iota(expect.begin(), expect.end(), 0);
    CHECK(targets == expect);
    it.reset();
    CHECK(ds.calls.use_count() == 1);  // released with the epoch
  }
}

TEST_CASE("DataLoader: an epoch that kept the model waiting gives a hint naming what to change") {
  data::LoaderStats s;
  s.total_seconds = 10;
  s.wait_seconds = 1;  // 10%: not input-bound
  CHECK(data::input_bound_hint(s, 0).empty());
  s.wait_seconds = 6;
  CHECK(data::input_bound_hint(s, 0).find("waited for data 60% of the epoch") != std::string::npos);
  CHECK(data::input_bound_hint(s, 0).find("set num_workers") != std::string::npos);
  CHECK(data::input_bound_hint(s, 2).find("with 2 workers; more workers, packed record files") != std::string::npos);
  s.total_seconds = 1, s.wait_seconds = 0.9;  // a short epoch says nothing
  CHECK(data::input_bound_hint(s, 0).empty());
}

TEST_CASE("DataLoader: invalid options") {
  CountingDataset ds;
  EXPECT_ERROR([&] { data::DataLoader l(ds, {.batch_size = 0}); }, {"DataLoader", "batch_size", "got 0"});
  EXPECT_ERROR([&] { data::DataLoader l(ds, {.num_workers = -1}); }, {"DataLoader", "num_workers", "-1"});
  EXPECT_ERROR([&] { data::DataLoader l(ds, {.prefetch_factor = 0}); }, {"DataLoader", "prefetch_factor"});
  EXPECT_ERROR([&] { data::DataLoader l(ds, {.shuffle = true}, data::NoTransform{}, data::RandomSampler{1}); },
               {"DataLoader", "shuffle", "sampler"});
}

TEST_CASE("DataLoader: samples of different shapes in one batch") {
  struct Ragged {
    std::size_t size() const { return 4; }
    data::Example get(std::size_t i) const { return {empty<float>(Shape{std::int64_t(i < 2 ? 3 : 4)}), 0}; }
  };
  data::DataLoader loader(Ragged{}, {.batch_size = 4, .num_workers = 1});
  EXPECT_ERROR([&] {
    for (auto& b : loader) (void)b;
  }, {"collate", "sample 2", "[4]", "[3]"});
}

TEST_CASE("DataLoader: pin_memory is accepted and batches are usable host memory") {
  CountingDataset ds{.n = 6};
  data::DataLoader loader(ds, {.batch_size = 3, .num_workers = 1, .pin_memory = true});
  std::size_t n = 0;
  for (auto& b : loader) {
    CHECK(b.data.device().is_cpu());
    n += b.size();
  }
  CHECK(n == 6);
}

// ---- packed record files -------------------------------------------------------------------------------------

namespace {
Bytes record_payload(std::size_t i) {
  Bytes r(i % 7 == 3 ? 0 : 1 + (i * 37) % 300);  // some empty records
  for (std::size_t k = 0; k < r.size(); ++k) r[k] = std::uint8_t(i * 31 + k * 7);
  return r;
}
std::string write_records(const TempDir& d, std::size_t n, const std::string& name = "r.rec") {
  data::RecordWriter w(d / name);
  for (std::size_t i = 0; i < n; ++i) CHECK(w.write(record_payload(i)) == i);
  CHECK(w.size() == n);
  w.close();
  return d / name;
}
std::vector<std::uint8_t> span_vec(std::span<const unsigned char> s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("crc32c: the check value of the Castagnoli polynomial") {
  CHECK(data::detail::crc32c("123456789", 9) == 0xE3069283u);
  CHECK(data::detail::crc32c("", 0) == 0u);
  // Incremental use equals one pass.
  const std::string s = "the quick brown fox jumps over the lazy dog, twice over";
  CHECK(data::detail::crc32c(s.data() + 20, s.size() - 20, data::detail::crc32c(s.data(), 20)) ==
        data::detail::crc32c(s.data(), s.size()));
}

TEST_CASE("record files: records come back as written, in any order") {
  TempDir d;
  const std::string path = write_records(d, 200);
  data::RecordReader r(path);
  REQUIRE(r.size() == 200);
  for (std::size_t i : {199u, 0u, 3u, 57u, 100u})
    CHECK(span_vec(r[i]) == record_payload(i));
  for (std::size_t i = 0; i < 200; ++i) CHECK(span_vec(r.record(i)) == record_payload(i));
  data::RecordReader copy = r;  // shares the mapping
  CHECK(span_vec(copy[10]) == record_payload(10));
  // An empty file of records is valid too.
  data::RecordReader empty_file(write_records(d, 0, "e.rec"));
  CHECK(empty_file.size() == 0);
  EXPECT_ERROR([&] { r.record(200); }, {"record 200 is out of range", "200 records"});
}

TEST_CASE("record files: every truncation is an error, never a crash or a wrong record") {
  TempDir d;
  const Bytes full = data::detail::read_file_bytes(write_records(d, 20), "t");
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    const std::string msg = error_of([&] { data::RecordView(std::span(full.data(), cut), "cut.rec"); });
    INFO("cut at " << cut << ": " << msg);
    CHECK(msg.rfind("RecordReader: ", 0) == 0);
  }
  write_bytes(d / "half.rec", Bytes(full.begin(), full.begin() + std::ptrdiff_t(full.size() / 2)));
  EXPECT_ERROR([&] { data::RecordReader(d / "half.rec"); }, {"RecordReader", "half.rec", "truncated"});
}

TEST_CASE("record files: a corrupt record fails its checksum when read") {
  TempDir d;
  const std::string path = write_records(d, 20);
  Bytes b = data::detail::read_file_bytes(path, "t");
  // Record 5 starts after the header and records 0..4.
  std::size_t off = 16;
  for (std::size_t i = 0; i < 5; ++i) off += record_payload(i).size();
  b[off + 2] ^= 0x01;
  const data::RecordView v(b, "flip.rec");
  EXPECT_ERROR([&] { v.record(5); }, {"record 5", "flip.rec", "corrupt", "CRC-32C"});
  CHECK(span_vec(v.record(4)) == record_payload(4));  // the others are fine
  CHECK(span_vec(v.record(5, /*verify=*/false)).size() == record_payload(5).size());
}

TEST_CASE("record files: a corrupt index") {
  TempDir d;
  Bytes b = data::detail::read_file_bytes(write_records(d, 20), "t");
  b[b.size() - 32 - 24 * 20 + 9] ^= 0x40;  // the size of record 0
  EXPECT_ERROR([&] { data::RecordView(b, "idx.rec"); }, {"idx.rec", "index checksum", "corrupt"});
}

TEST_CASE("record files: a footer whose index does not fit the file") {
  TempDir d;
  Bytes b = data::detail::read_file_bytes(write_records(d, 3), "t");
  b[b.size() - 32 + 8] = 200;  // record count
  EXPECT_ERROR([&] { data::RecordView(b, "f.rec"); }, {"f.rec", "does not fit the file", "200 records"});
}

TEST_CASE("record files: a file that is not a record file, or of another version") {
  Bytes b(64, 0);
  EXPECT_ERROR([&] { data::RecordView(b, "z.rec"); }, {"z.rec", "not a record file"});
  std::memcpy(b.data(), "EMBERREC", 8);
  b[8] = 2;
  EXPECT_ERROR([&] { data::RecordView(b, "v.rec"); }, {"format version 2", "version 1"});
  EXPECT_ERROR([] { data::RecordReader("/nonexistent/x.rec"); }, {"RecordReader", "cannot open", "/nonexistent/x.rec"});
}

TEST_CASE("record files: unknown header flags and a footer version that differs are errors") {
  TempDir d;
  const Bytes good = data::detail::read_file_bytes(write_records(d, 3), "t");
  Bytes b = good;
  b[12] = 1;  // header flags
  EXPECT_ERROR([&] { data::RecordView(b, "flags.rec"); }, {"flags.rec", "header flags 1", "expected 0"});
  b = good;
  b[b.size() - 32 + 23] = 0x80;  // the footer's version
  EXPECT_ERROR([&] { data::RecordView(b, "fv.rec"); }, {"fv.rec", "footer gives format version", "the header 1"});
}

TEST_CASE("record files: every single-byte flip is refused when opened or when its record is read") {
  TempDir d;
  const Bytes good = data::detail::read_file_bytes(write_records(d, 4), "t");
  for (std::size_t at = 0; at < good.size(); ++at) {
    for (const std::uint8_t mask : {std::uint8_t(0x01), std::uint8_t(0x80), std::uint8_t(0xff)}) {
      Bytes b = good;
      b[at] ^= mask;
      const std::string msg = error_of([&] {
        const data::RecordView v(b, "flip.rec");
        for (std::size_t i = 0; i < v.size(); ++i) v.record(i);
      });
      INFO("byte " << at << " ^ " << int(mask));
      CHECK(msg.rfind("RecordReader: ", 0) == 0);
    }
  }
}

TEST_CASE("record files: writing after close") {
  TempDir d;
  data::RecordWriter w(d / "w.rec");
  w.close();
  const Bytes one{1};
  EXPECT_ERROR([&] { w.write(one); }, {"RecordWriter", "write after close"});
  EXPECT_ERROR([] { data::RecordWriter("/nonexistent/dir/w.rec"); }, {"RecordWriter", "cannot create"});
}

TEST_CASE("record files: packed Fashion-MNIST images decode to the same Examples, through a DataLoader too") {
  TempDir d;
  write_fake_fashion(d, "train", 30);
  data::FashionMNIST ds(data::Split::Train, d.path.string());
  data::pack_byte_images(ds.images(), ds.labels(), d / "train.rec");
  data::RecordDataset packed(d / "train.rec", data::ByteImageDecoder{Shape{1, 28, 28}});
  REQUIRE(packed.size() == 30);
  for (std::size_t i : {0u, 17u, 29u}) {
    const data::Example a = ds.get(i), b = packed.get(i);
    CHECK(a.target == b.target);
    CHECK(vec(a.data) == vec(b.data));
    CHECK(b.data.shape() == Shape{1, 28, 28});
  }
  data::DataLoader l1(ds, {.batch_size = 8, .shuffle = true, .num_workers = 2, .seed = 3});
  data::DataLoader l2(packed, {.batch_size = 8, .shuffle = true, .num_workers = 2, .seed = 3});
  std::vector<float> a, b;
  for (auto& x : l1) a.insert(a.end(), x.data.data(), x.data.data() + x.data.numel());
  for (auto& x : l2) b.insert(b.end(), x.data.data(), x.data.data() + x.data.numel());
  CHECK(a.size() == 30 * 784);
  CHECK(a == b);
  EXPECT_ERROR([] { data::ByteImageDecoder{Shape{1, 2, 2}}(Bytes(5)); }, {"ByteImageDecoder", "5 bytes", "takes 12"});
}

TEST_CASE("record files: rewriting a file that a reader has mapped leaves the reader on the old contents") {
  TempDir d;
  const std::string path = write_records(d, 50);
  data::RecordReader old(path);
  {
    data::RecordWriter w(path);
    for (std::size_t i = 0; i < 50; ++i) CHECK(span_vec(old[i]) == record_payload(i));  // SIGBUS if truncated
    for (std::size_t i = 0; i < 10; ++i) w.write(record_payload(100 + i));
    CHECK(data::RecordReader(path).size() == 50);  // the destination changes only when the writer finishes
    w.close();
  }
  for (std::size_t i = 0; i < 50; ++i) CHECK(span_vec(old[i]) == record_payload(i));
  data::RecordReader fresh(path);
  REQUIRE(fresh.size() == 10);
  for (std::size_t i = 0; i < 10; ++i) CHECK(span_vec(fresh[i]) == record_payload(100 + i));
  CHECK(folder_entries(d.path) == std::vector<std::string>{"r.rec"});  // no temporary file left
}

TEST_CASE("record files: a writer that does not finish leaves the old file intact and no temporary file") {
  TempDir d;
  const std::string path = write_records(d, 5);
  const Bytes before = data::detail::read_file_bytes(path, "t");
  {  // destroyed without close(): abandoned
    data::RecordWriter w(path);
    w.write(record_payload(1));
  }
  CHECK(data::detail::read_file_bytes(path, "t") == before);
  CHECK(folder_entries(d.path) == std::vector<std::string>{"r.rec"});
  // An exception between writes abandons the file too.
  CHECK_THROWS_AS(
      [&] {
        data::RecordWriter w(path);
        w.write(record_payload(2));
        throw std::runtime_error("producer failed");
      }(),
      std::runtime_error);
  CHECK(data::detail::read_file_bytes(path, "t") == before);
  CHECK(folder_entries(d.path) == std::vector<std::string>{"r.rec"});
  // A new file that is never finished does not appear at all.
  { data::RecordWriter w(d / "new.rec"); }
  CHECK(!fs::exists(d / "new.rec"));
  CHECK(folder_entries(d.path) == std::vector<std::string>{"r.rec"});
  // pack_byte_images finishes its file.
  data::pack_byte_images(zeros<std::uint8_t>(Shape{3, 2}), from_vector<std::int64_t>({1, 2, 3}), d / "p.rec");
  CHECK(data::RecordReader(d / "p.rec").size() == 3);
}

TEST_CASE("record files: names and magic with terminal escape sequences are escaped in messages") {
  TempDir d;
  Bytes b(64, 0);
  std::memcpy(b.data(), "\x1b[2J\x1b]0;", 8);
  const std::string evil = d / "a\x1b[31m.rec";
  write_bytes(evil, b);
  const std::string msg = error_of([&] { data::RecordReader r(evil); });
  CHECK(msg.find("not a record file") != std::string::npos);
  CHECK(msg.find("a\\x1b[31m.rec") != std::string::npos);
  CHECK(msg.find("starts with \"\\x1b[2J\\x1b]0;\"") != std::string::npos);  // the magic it found, escaped
  CHECK(msg.find('\x1b') == std::string::npos);
  const std::string m2 = error_of([&] { data::RecordView(std::span(b.data(), 10), "v\x1b[0m"); });
  CHECK(m2.find("v\\x1b[0m") != std::string::npos);
  CHECK(m2.find('\x1b') == std::string::npos);
}
