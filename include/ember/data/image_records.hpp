// ember — packed image shards: an ImageFolder turned into a few large record files (data/record_file.hpp) of encoded
// images and labels, read memory-mapped, in an order that reads the shards mostly sequentially and still shuffles.
//
//   data::pack_images(data::ImageFolder("photos/train"), "photos/train.shards", {.max_side = 256});  // once
//   data::ImageRecordDataset train("photos/train.shards");
//   data::DataLoader loader(train, {.batch_size = 128, .num_workers = 2}, pipeline,
//                           data::ShardShuffleSampler{.seed = 1});
//
// A pack is a folder: classes.rec (record i: the name of class i) and shard-00000.rec, shard-00001.rec, ... whose
// records are ByteImageDecoder's layout (an 8-byte little-endian label, then the payload: here the encoded file).
// With max_side, images larger than that are decoded, resized (antialiased) so that their longer side is max_side, and
// re-encoded as JPEG (FFCV's max_resolution); smaller ones keep their bytes. pack_images shuffles the images (seeded)
// before writing, so that consecutive records are of mixed classes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/image.hpp"
#include "ember/data/image_encode.hpp"
#include "ember/data/image_folder.hpp"
#include "ember/data/image_pipeline.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/record_dataset.hpp"
#include "ember/data/record_file.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/sampler.hpp"

namespace ember::data {

/// The options of pack_images after (folder, dir), ember's own (FFCV's writer is the nearest: max_side is its
/// max_resolution):
///   data::pack_images(data::ImageFolder("photos/train"), "photos/train.shards", {.max_side = 256, .seed = 1});
struct PackImagesOptions {
  std::size_t shard_bytes = std::size_t(256) << 20;  ///< a shard is closed once it holds this many bytes
  std::int64_t max_side = 0;                         ///< 0: keep every file's bytes; else re-encode larger images
  int quality = 90;                                  ///< JPEG quality of re-encoded images
  bool shuffle = true;                               ///< write the images in a seeded random order
  std::uint64_t seed = 0;                            ///< the shuffle's seed: the same seed, the same order
};

/// What pack_images wrote.
struct PackImagesResult {
  ///@{
  /// The images packed, the shard files written, and the images re-encoded to fit max_side.
  std::size_t images = 0, shards = 0, reencoded = 0;
  ///@}
  std::uint64_t bytes = 0;  ///< encoded image bytes written
};

/// The bytes of an image fitted to max_side: decoded, resized with torchvision's antialiased bilinear so that the
/// longer side is max_side, and encoded as JPEG; `file` itself when it already fits.
inline std::vector<unsigned char> fit_image(std::span<const unsigned char> file, const std::string& name,
                                            std::int64_t max_side, int quality, bool* reencoded = nullptr) {
  ImageDecoder& dec = thread_image_decoder();
  const ImageInfo& info = dec.open(file, name);
  if (reencoded) *reencoded = false;
  if (max_side <= 0 || std::max(info.width, info.height) <= max_side) return {file.begin(), file.end()};
  const std::int64_t H = info.height, W = info.width, L = std::max(H, W);
  const std::int64_t nh = H == L ? max_side : std::max<std::int64_t>(1, std::int64_t(double(max_side) * H / L));
  const std::int64_t nw = W == L ? max_side : std::max<std::int64_t>(1, std::int64_t(double(max_side) * W / L));
  const DecodedImage d = dec.decode({.channels = 3});
  ResampleAxis ay, ax;
  compute_resample_axis(ay, 0, double(H), nh, 0, H);
  compute_resample_axis(ax, 0, double(W), nw, 0, W);
  std::vector<float> planar(std::size_t(3 * nh * nw)), tmp;
  resample(ResampleSource<std::uint8_t>{d.data, 3, d.stride, 3, 1, 0, 0}, ay, ax,
           ResampleTarget{planar.data(), nh * nw, nw, false, nullptr, nullptr}, tmp);
  std::vector<std::uint8_t> hwc(planar.size());
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t i = 0; i < nh * nw; ++i) {
      const float v = planar[std::size_t(c * nh * nw + i)] + 0.5f;
      hwc[std::size_t(i * 3 + c)] = std::uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  if (reencoded) *reencoded = true;
  return encode_jpeg(hwc.data(), nh, nw, 3, quality);
}

/// Packs an ImageFolder into `dir` (created; see the file comment).
inline PackImagesResult pack_images(const ImageFolder& folder, const std::string& dir, PackImagesOptions opt = {}) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  {
    RecordWriter classes(dir + "/classes.rec");
    for (const std::string& c : folder.classes()) classes.write(c.data(), c.size());
    classes.close();
  }
  std::vector<std::size_t> order =
      opt.shuffle ? RandomSampler{opt.seed}.indices(folder.size(), 0) : SequentialSampler{}.indices(folder.size());
  PackImagesResult r;
  std::unique_ptr<RecordWriter> w;
  std::size_t in_shard = 0;
  std::vector<unsigned char> file;
  auto shard_name = [&](std::size_t k) {
    std::string n = std::to_string(k);
    return dir + "/shard-" + std::string(n.size() < 5 ? 5 - n.size() : 0, '0') + n + ".rec";
  };
  for (std::size_t i : order) {
    if (!w) w = std::make_unique<RecordWriter>(shard_name(r.shards++));
    folder.source()->bytes(i, file);
    bool re = false;
    const std::vector<unsigned char> payload = fit_image(file, folder.path(i), opt.max_side, opt.quality, &re);
    w->write(encode_byte_image(folder.target(i), payload));
    r.reencoded += re;
    r.bytes += payload.size();
    ++r.images;
    in_shard += payload.size() + 8;
    if (in_shard >= opt.shard_bytes) {
      w->close();
      w.reset();
      in_shard = 0;
    }
  }
  if (w) w->close();
  return r;
}

/// The records of a pack (thread-safe: mapped read-only).
class ImageRecordSource final : public ImageSource {
 public:
  std::vector<RecordReader> shards;  ///< The shard files, in name order.
  std::vector<std::size_t> starts;   ///< (shards + 1): the global index of each shard's first record, then the total.
  bool verify = true;                ///< Check each record's CRC-32C when reading its image.

  /// The number of images.
  std::size_t size() const override { return starts.back(); }
  std::span<const unsigned char> bytes(std::size_t i, std::vector<unsigned char>&) const override {
    const auto [s, k] = locate(i);
    const std::span<const unsigned char> r = shards[s].record(k, verify);
    EMBER_CHECK(r.size() >= 8, "ImageRecordDataset: record ", k, " of ",
                ember::detail::quote_untrusted(shards[s].path(), 4096), " is ", r.size(),
                " bytes, too short for a label");
    return r.subspan(8);
  }
  /// Image i's label (the record's first 8 bytes).
  std::int64_t target(std::size_t i) const override {
    const auto [s, k] = locate(i);
    const std::span<const unsigned char> r = shards[s].record(k, false);
    EMBER_CHECK(r.size() >= 8, "ImageRecordDataset: record ", k, " of ",
                ember::detail::quote_untrusted(shards[s].path(), 4096), " is too short for a label");
    std::uint64_t v = 0;
    for (int b = 7; b >= 0; --b) v = (v << 8) | r[std::size_t(b)];
    return std::int64_t(v);
  }
  std::string name(std::size_t i) const override {
    const auto [s, k] = locate(i);
    return shards[s].path() + "#" + std::to_string(k);
  }

 private:
  std::pair<std::size_t, std::size_t> locate(std::size_t i) const {
    EMBER_CHECK(i < size(), "ImageRecordDataset: index ", i, " is out of range for ", size(), " images");
    const std::size_t s = std::size_t(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin()) - 1;
    return {s, i - starts[s]};
  }
};

/// A Dataset over a pack written by pack_images (or tools/ember_pack_images): get(i) is an ImageItem whose bytes are
/// a view of the mapped shard (no copy, no read call). Labels are checked against the class list when opened.
class ImageRecordDataset {
 public:
  /// Opens the pack in folder `dir` (classes.rec and shard-*.rec); verify_checksums: check each image's CRC-32C
  /// when it is read.
  explicit ImageRecordDataset(const std::string& dir, bool verify_checksums = true)
      : src_(std::make_shared<ImageRecordSource>()) {
    namespace fs = std::filesystem;
    const std::string q = ember::detail::quote_untrusted(dir, 4096);
    std::error_code ec;
    EMBER_CHECK(fs::is_directory(dir, ec), "ImageRecordDataset: ", q, " is not a folder");
    const RecordReader cls(dir + "/classes.rec");
    for (std::size_t c = 0; c < cls.size(); ++c) {
      const auto r = cls.record(c);
      classes_.emplace_back(reinterpret_cast<const char*>(r.data()), r.size());
    }
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.rfind("shard-", 0) == 0 && n.size() > 10 && n.substr(n.size() - 4) == ".rec") names.push_back(n);
    }
    EMBER_CHECK(!ec, "ImageRecordDataset: cannot list ", q, ": ", ec.message());
    std::sort(names.begin(), names.end());
    EMBER_CHECK(!names.empty(), "ImageRecordDataset: no shard-*.rec files in ", q);
    src_->verify = verify_checksums;
    src_->starts.push_back(0);
    for (const std::string& n : names) {
      src_->shards.emplace_back(dir + "/" + n);
      src_->starts.push_back(src_->starts.back() + src_->shards.back().size());
    }
    for (std::size_t i = 0; i < src_->size(); ++i) {
      const std::int64_t t = src_->target(i);
      EMBER_CHECK(t >= 0 && std::size_t(t) < classes_.size(), "ImageRecordDataset: ", src_->name(i), " has label ",
                  t, "; the pack has ", classes_.size(), " classes");
    }
  }
  /// The number of images.
  std::size_t size() const { return src_->size(); }
  /// Sample i, to be decoded by the loader's ImagePipeline.
  ImageItem get(std::size_t i) const { return ImageItem{src_, i, src_->target(i), nullptr, Rng(0)}; }
  /// Image i's label.
  std::int64_t target(std::size_t i) const { return src_->target(i); }
  /// The class names; class i is label i.
  const std::vector<std::string>& classes() const { return classes_; }
  /// The number of shard files.
  std::size_t num_shards() const { return src_->shards.size(); }
  /// The shards, as an ImageSource.
  std::shared_ptr<const ImageSource> source() const { return src_; }

 private:
  std::vector<std::string> classes_;
  std::shared_ptr<ImageRecordSource> src_;
};

/// A quasi-random order for packed shards (FFCV's QUASI_RANDOM, WebDataset's shard shuffle + buffer): the records
/// are cut into blocks of `block` consecutive records, the blocks are shuffled, and each group of `window`
/// consecutive blocks is pooled and shuffled. A loader then reads `window` regions of the shards at a time, each
/// sequentially, instead of one random record per read; the price is that a batch draws from window * block records
/// rather than from the whole set. On a pack written in class order (pack_images without shuffle) a batch then
/// repeats labels about 1 + classes / window times as often as a full shuffle (label_repeat_rate; 1.2 for 20 classes
/// and the defaults); on a pack shuffled when written, about as rarely as a full shuffle. Every record once per epoch;
/// (seed, epoch) decide the order.
struct ShardShuffleSampler {
  std::uint64_t seed = 0;   ///< with the epoch, it decides the order
  std::size_t block = 32;   ///< records read in a row (32 images of ~60 KB: 2 MB)
  std::size_t window = 64;  ///< blocks pooled and shuffled together

  /// The order of epoch `epoch` over n records.
  std::vector<std::size_t> indices(std::size_t n, std::uint64_t epoch) const {
    EMBER_CHECK(block >= 1 && window >= 1, "ShardShuffleSampler: block and window must be at least 1");
    const std::size_t nb = (n + block - 1) / block;
    const std::vector<std::size_t> blocks = detail::permutation(nb, seed, epoch);
    std::vector<std::size_t> out;
    out.reserve(n);
    Rng g(seed, epoch, 0x51A8D);
    for (std::size_t w0 = 0; w0 < nb; w0 += window) {
      const std::size_t first = out.size();
      for (std::size_t k = w0; k < std::min(nb, w0 + window); ++k)
        for (std::size_t i = blocks[k] * block; i < std::min(n, (blocks[k] + 1) * block); ++i) out.push_back(i);
      for (std::size_t i = out.size() - first; i > 1; --i)
        std::swap(out[first + i - 1], out[first + std::size_t(g.below(i))]);
    }
    return out;
  }
  /// The samples per epoch: all n.
  std::size_t size(std::size_t n) const { return n; }
};

/// Shuffle quality: how often two samples of one batch share a label, relative to a uniform shuffle (1: as good as
/// a full shuffle; the number of classes: every batch of one class). labels[i] is the label of dataset index i.
inline double label_repeat_rate(const std::vector<std::int64_t>& labels, const std::vector<std::size_t>& order,
                                std::size_t batch) {
  EMBER_CHECK(batch >= 2, "label_repeat_rate: batches of at least 2");
  std::vector<double> freq;
  for (std::int64_t l : labels) {
    if (std::size_t(l) >= freq.size()) freq.resize(std::size_t(l) + 1);
    freq[std::size_t(l)] += 1;
  }
  double expected = 0;
  const double n = double(labels.size());
  for (double f : freq) expected += (f / n) * ((f - 1) / (n - 1));
  double pairs = 0, same = 0;
  std::vector<double> count(freq.size());
  for (std::size_t b0 = 0; b0 + batch <= order.size(); b0 += batch) {
    std::fill(count.begin(), count.end(), 0.0);
    for (std::size_t i = b0; i < b0 + batch; ++i) count[std::size_t(labels[order[i]])] += 1;
    for (double c : count) same += c * (c - 1) / 2;
    pairs += double(batch) * double(batch - 1) / 2;
  }
  return pairs > 0 && expected > 0 ? (same / pairs) / expected : 0.0;
}

}  // namespace ember::data
