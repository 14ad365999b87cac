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
// before writing, so that consecutive records are of mixed classes. With {.format = webdataset} it writes WebDataset
// tar shards instead (shard-NNNNN.tar and classes.txt), read by data::WebDataset (data/image_tar.hpp). A pack is
// written into a staging folder beside the destination that replaces it once complete (detail::PackFolder).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/detail/staged_file.hpp"
#include "ember/data/image.hpp"
#include "ember/data/image_encode.hpp"
#include "ember/data/image_folder.hpp"
#include "ember/data/image_pipeline.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/record_dataset.hpp"
#include "ember/data/record_file.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/sampler.hpp"
#include "ember/data/tar.hpp"

namespace ember::data {

/// The options of pack_images after (folder, dir), ember's own (FFCV's writer is the nearest: max_side is its
/// max_resolution):
///   data::pack_images(data::ImageFolder("photos/train"), "photos/train.shards", {.max_side = 256, .seed = 1});
struct PackImagesOptions {
  /// The files written: ember record files (ImageRecordDataset), or WebDataset tar shards (WebDataset).
  enum class Format { records, webdataset };
  Format format = Format::records;  ///< records: classes.rec + shard-NNNNN.rec; webdataset: shard-NNNNN.tar
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

namespace detail {

/// Test hook: whether PackFolder swaps the new pack in with one atomic exchange of the two folders (Linux's
/// renameat2(RENAME_EXCHANGE)) where the file system supports it; false takes the portable two-rename path.
inline bool pack_swap_by_exchange = true;

/// pack_images's output folder: checked when made (absent, empty or an older pack), then publish() writes the pack
/// into a staging folder beside it and swaps it in. The staging folder is named like core/atomic_file.hpp's
/// temporary files (`.<name>.tmp-<pid>-<n>`), and a writer removes those that killed writers left. Where the two
/// folders cannot be exchanged in one step, the older pack is first renamed to `.<name>.old-<pid>-<n>`; a writer
/// killed between the two renames leaves the older pack there, which the next writer puts back (when `<name>` is
/// missing) or removes (when the new pack is in place).
class PackFolder {
 public:
  explicit PackFolder(std::string dir) : dir_(std::move(dir)) {
    namespace fs = std::filesystem;
    std::error_code ec;
    EMBER_CHECK(!dir_.empty(), "pack_images: the output folder is an empty path");
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();  // "out/" and "out" are one folder
    const std::string leaf = fs::path(dir_).filename().string();
    EMBER_CHECK(!leaf.empty() && leaf != "." && leaf != "..", "pack_images: the output folder ",
                ember::detail::quote_untrusted(dir_, 4096), " must end in a folder's own name (it is replaced whole)");
    if (fs::is_symlink(dir_, ec)) {  // the folder the link names is the one replaced
      const fs::path target = fs::canonical(dir_, ec);
      EMBER_CHECK(!ec, "pack_images: the output folder ", ember::detail::quote_untrusted(dir_, 4096),
                  " is a link to nothing (", ec.message(), ")");
      dir_ = target.string();
    }
    recover();
    const std::string q = ember::detail::quote_untrusted(dir_, 4096);
    const fs::file_status st = fs::symlink_status(dir_, ec);
    if (!fs::exists(st)) return;
    EMBER_CHECK(fs::is_directory(st), "pack_images: ", q, " exists and is not a folder");
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      const bool ours = n == "classes.rec" || n == "classes.txt" ||
                        (n.rfind("shard-", 0) == 0 && (n.ends_with(".rec") || n.ends_with(".tar")));
      EMBER_CHECK(ours && it->is_regular_file(ec), "pack_images: ", q, " holds ",
                  ember::detail::quote_untrusted(n, 4096),
                  ", which is not a file of a pack; pack into a new or empty folder, or into an older pack");
    }
    EMBER_CHECK(!ec, "pack_images: cannot list ", q, ": ", ec.message());
    existed_ = true;
  }

  /// The output folder (a link's target).
  const std::string& path() const { return dir_; }

  /// Calls write(staging folder), then puts the staging folder in place of the output folder (the older one, if
  /// any, removed). If write throws, the staging folder is removed and the output folder is untouched.
  template <class Write>
  auto publish(Write&& write) const {
    namespace fs = std::filesystem;
    const fs::path parent = fs::path(dir_).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    std::string staging;
    bool made = false;
    for (int attempt = 0; !made && !ec && attempt < 64; ++attempt) {  // an earlier process's leftover is skipped
      staging = ember::detail::atomic_temp_path(dir_);
      made = fs::create_directory(staging, ec);
    }
    EMBER_CHECK(made, "pack_images: cannot make the folder ", ember::detail::quote_untrusted(staging, 4096), ": ",
                ec ? ec.message() : std::string("names in use"));
    try {
      auto result = write(staging);
      ember::detail::atomic_sync_folder(staging);
      swap_in(staging);
      return result;
    } catch (...) {
      fs::remove_all(staging, ec);
      throw;
    }
  }

 private:
  std::string aside_prefix() const { return "." + std::filesystem::path(dir_).filename().string() + ".old-"; }

  // What killed writers left beside the output folder: an older pack set aside (put back when the output folder
  // is missing, else removed), then staging folders.
  void recover() const {
    namespace fs = std::filesystem;
    const fs::path parent = fs::path(dir_).parent_path();
    const std::string prefix = aside_prefix();
    std::error_code ec;
    for (fs::directory_iterator it(parent.empty() ? fs::path(".") : parent, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::optional<pid_t> pid = ember::detail::atomic_temp_pid(it->path().filename().string(), prefix);
      if (!pid || *pid == ::getpid() || ::kill(*pid, 0) == 0 || errno != ESRCH) continue;
      std::error_code e;
      if (!fs::is_directory(fs::symlink_status(it->path(), e))) continue;
      if (!fs::exists(fs::symlink_status(dir_, e))) fs::rename(it->path(), dir_, e);
      else fs::remove_all(it->path(), e);
    }
    ember::detail::remove_stale_temp_files(dir_, /*folders=*/true);
  }

  void swap_in(const std::string& staging) const {
    namespace fs = std::filesystem;
    const std::string q = ember::detail::quote_untrusted(dir_, 4096);
    const fs::path parent = fs::path(dir_).parent_path();
    std::error_code ec;
    if (!existed_) {
      fs::remove(dir_, ec);  // an empty folder made since the check; rename(2) replaces only an empty one anyway
      fs::rename(staging, dir_, ec);
      EMBER_CHECK(!ec, "pack_images: cannot put the new pack at ", q, ": ", ec.message());
      ember::detail::atomic_sync_folder(parent);
      return;
    }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
    // One step: the new pack takes the output folder's name and the older one the staging name, then is removed.
    if (pack_swap_by_exchange) {
      if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) == 0) {
        ember::detail::atomic_sync_folder(parent);
        fs::remove_all(staging, ec);
        return;
      }
      EMBER_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "pack_images: cannot put the new pack at ",
                  q, ": ", std::strerror(errno));
    }
#endif
    std::string old;
    for (int attempt = 0;; ++attempt) {  // an unused name: the older pack must not land inside another folder
      old = (parent.empty() ? std::string() : parent.string() + "/") + aside_prefix() + std::to_string(::getpid()) +
            "-" + std::to_string(attempt);
      if (!fs::exists(fs::symlink_status(old, ec)) || attempt >= 64) break;
    }
    fs::rename(dir_, old, ec);
    EMBER_CHECK(!ec, "pack_images: cannot move the older pack ", q, " aside: ", ec.message());
    fs::rename(staging, dir_, ec);
    if (ec) {
      std::error_code back;
      fs::rename(old, dir_, back);  // the older pack back in place
      EMBER_CHECK(false, "pack_images: cannot put the new pack at ", q, ": ", ec.message());
    }
    ember::detail::atomic_sync_folder(parent);
    fs::remove_all(old, ec);
  }

  std::string dir_;
  bool existed_ = false;
};

/// pack_images's writing, into the (new, empty) folder `dir`.
inline PackImagesResult write_pack(const ImageFolder& folder, const std::string& dir, const PackImagesOptions& opt,
                                   bool tar) {
  if (tar) {
    std::string names;
    for (const std::string& c : folder.classes()) {
      EMBER_CHECK(c.find_first_of("\r\n") == std::string::npos, "pack_images: the class name ",
                  ember::detail::quote_untrusted(c, 4096), " has a line break, which classes.txt cannot hold");
      names += c + "\n";
    }
    detail::StagedFile classes(dir + "/classes.txt", "pack_images");
    classes.put(names.data(), names.size());
    classes.commit();
  } else {
    RecordWriter classes(dir + "/classes.rec");
    for (const std::string& c : folder.classes()) classes.write(c.data(), c.size());
    classes.close();
  }
  std::vector<std::size_t> order =
      opt.shuffle ? RandomSampler{opt.seed}.indices(folder.size(), 0) : SequentialSampler{}.indices(folder.size());
  PackImagesResult r;
  std::unique_ptr<RecordWriter> w;
  std::unique_ptr<TarWriter> t;
  std::size_t in_shard = 0;
  std::vector<unsigned char> file;
  auto close_shard = [&] {  // puts the open shard, if any, in place
    if (w) w->close();
    if (t) t->close();
    w.reset();
    t.reset();
  };
  auto shard_name = [&](std::size_t k) {
    std::string n = std::to_string(k);
    return dir + "/shard-" + std::string(n.size() < 5 ? 5 - n.size() : 0, '0') + n + (tar ? ".tar" : ".rec");
  };
  for (std::size_t i : order) {
    if (!w && !t) {
      if (tar) t = std::make_unique<TarWriter>(shard_name(r.shards++));
      else w = std::make_unique<RecordWriter>(shard_name(r.shards++));
    }
    folder.source()->bytes(i, file);
    bool re = false;
    const std::vector<unsigned char> payload = fit_image(file, folder.path(i), opt.max_side, opt.quality, &re);
    if (tar) {
      std::string key = std::to_string(r.images);
      key.insert(0, key.size() < 8 ? 8 - key.size() : 0, '0');
      const std::string label = std::to_string(folder.target(i));
      t->add(key + (sniff_image_format(payload) == ImageFormat::png ? ".png" : ".jpg"), payload);
      t->add(key + ".cls", label.data(), label.size());
      in_shard += payload.size() + 3 * detail::kTarBlock;
    } else {
      w->write(encode_byte_image(folder.target(i), payload));
      in_shard += payload.size() + 8;
    }
    r.reencoded += re;
    r.bytes += payload.size();
    ++r.images;
    if (in_shard >= opt.shard_bytes) {
      close_shard();
      in_shard = 0;
    }
  }
  close_shard();
  return r;
}

}  // namespace detail

/// Packs an ImageFolder into `dir` (created; see the file comment). With Format::webdataset the shards are tar files
/// (shard-NNNNN.tar) of WebDataset samples: key the image's position in the written order (8 digits), fields the
/// image ("jpg" or "png", from its bytes) and "cls" (its class index as text), for data::WebDataset and the Python
/// webdataset package; classes.txt then lists the class names, one per line (a name with a line break is refused).
///
/// The pack is written whole or not at all: its files go to a new folder beside `dir`, which takes `dir`'s place once
/// every shard is complete. A pack that fails part way (an unreadable image, a full disk) leaves `dir` as it was, and
/// packing again over an older pack replaces all of it (no shard of the older one is left to be read with the new).
/// `dir` must be absent, empty, or a pack (classes.rec or classes.txt and shard-* files only): any other file in it
/// is an error before anything is written, so that no file of the user's is replaced.
inline PackImagesResult pack_images(const ImageFolder& folder, const std::string& dir, PackImagesOptions opt = {}) {
  const bool tar = opt.format == PackImagesOptions::Format::webdataset;
  const detail::PackFolder out(dir);
  return out.publish([&](const std::string& staging) { return detail::write_pack(folder, staging, opt, tar); });
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

}  // namespace ember::data
