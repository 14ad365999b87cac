// ember — ImageFolder: a folder of images with one sub-folder per class (root/<class>/**/<name>.jpg), read with
// torchvision's rules: the classes are the sub-folders' names sorted, class_to_idx numbers them in that order, the
// samples are every file under a class folder (sub-folders included, symbolic links followed) whose name ends in one
// of the extensions (case-insensitive), in the order of Python's sorted(os.walk(...)) (folders by path, then files
// by name, comparing code points); hidden files and folders count as torchvision counts them. A class without a file
// is an error naming it; an unreadable or undecodable file is an error naming it when it is loaded.
//
//   data::ImageFolder train("photos/train");          // train.classes(), train.class_to_idx("cat")
//   data::DataLoader loader(train, {.batch_size = 128, .shuffle = true, .num_workers = 2},
//                           data::ImagePipeline({.random_resized_crop = data::transforms::RandomResizedCrop(112)}));
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/image.hpp"
#include "ember/data/image_pipeline.hpp"

namespace ember::data {

/// Options of ImageFolder.
struct ImageFolderOptions {
  /// File name endings that count as images, compared case-insensitively. torchvision's list also has .bmp, .ppm,
  /// .pgm, .tif, .tiff and .webp, which ember does not decode.
  std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"};
  /// Leave out files and folders whose name starts with "." (torchvision keeps them; so does the default).
  bool skip_hidden = false;
  std::size_t max_file_bytes = std::size_t(1) << 30;  ///< larger files are refused when read
  std::size_t max_files = std::size_t(1) << 31;       ///< a folder with more is refused (files are untrusted)
};

/// The files of an ImageFolder (thread-safe: read only).
class ImageFolderSource final : public ImageSource {
 public:
  std::vector<std::string> paths;     ///< Every image file, class by class, in os.walk order (see the file comment).
  std::vector<std::int64_t> targets;  ///< Each file's class.
  std::size_t max_file_bytes = 0;     ///< Larger files are refused when read.

  /// The number of images.
  std::size_t size() const override { return paths.size(); }
  std::span<const unsigned char> bytes(std::size_t i, std::vector<unsigned char>& scratch) const override {
    read_file_into(paths.at(i), scratch, max_file_bytes, "ImageFolder");
    return scratch;
  }
  /// Image i's class.
  std::int64_t target(std::size_t i) const override { return targets.at(i); }
  std::string name(std::size_t i) const override { return paths.at(i); }
};

/// A Dataset of images in class folders (see the file comment). A cheap handle: copies share the file list.
/// get(i) is an ImageItem that an ImagePipeline (the loader's transform) and collate() turn into a batch;
/// load(i) decodes one image on its own.
class ImageFolder {
 public:
  /// Lists the images under `root` (one sub-folder per class), as torchvision.datasets.ImageFolder(root).
  explicit ImageFolder(const std::string& root, ImageFolderOptions opt = {});

  /// The number of images.
  std::size_t size() const { return src_->size(); }
  /// Sample i, to be decoded by the loader's ImagePipeline.
  ImageItem get(std::size_t i) const {
    EMBER_CHECK(i < size(), "ImageFolder: index ", i, " is out of range for ", size(), " images");
    return ImageItem{src_, i, src_->targets[i], nullptr, Rng(0)};
  }
  /// The class names, sorted; class i is target i.
  const std::vector<std::string>& classes() const { return classes_; }
  /// The target of a class name (an error for a name that is not a class).
  std::int64_t class_to_idx(std::string_view name) const {
    const auto it = std::lower_bound(classes_.begin(), classes_.end(), name);
    EMBER_CHECK(it != classes_.end() && *it == name, "ImageFolder: no class ",
                ember::detail::quote_untrusted(name, 4096), " under ", ember::detail::quote_untrusted(root_, 4096));
    return std::int64_t(it - classes_.begin());
  }
  /// Image i's file (torchvision's samples[i][0]).
  const std::string& path(std::size_t i) const { return src_->paths.at(i); }
  /// Image i's class (torchvision's targets[i]).
  std::int64_t target(std::size_t i) const { return src_->targets.at(i); }
  /// The folder given to the constructor.
  const std::string& root() const { return root_; }
  /// The file list, as an ImageSource.
  std::shared_ptr<const ImageSource> source() const { return src_; }
  /// Image i decoded whole, (channels, H, W) in [0, 1], with its target (torchvision's dataset[i] with ToTensor).
  Example load(std::size_t i) const {
    std::vector<unsigned char> file;
    src_->bytes(i, file);
    Rng g(0);
    return {ImagePipeline().apply(file, path(i), g), target(i)};
  }

 private:
  std::string root_;
  std::vector<std::string> classes_;
  std::shared_ptr<ImageFolderSource> src_;
};

namespace detail {
inline bool has_image_extension(std::string_view name, const std::vector<std::string>& exts) {
  for (const std::string& e : exts) {
    if (name.size() < e.size()) continue;
    bool eq = true;
    for (std::size_t k = 0; k < e.size() && eq; ++k) {
      char c = name[name.size() - e.size() + k], x = e[k];
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
      if (x >= 'A' && x <= 'Z') x = char(x - 'A' + 'a');
      eq = c == x;
    }
    if (eq) return true;
  }
  return false;
}

/// Every folder under `dir` (itself included), following symbolic links, each once (a link back up is a loop that
/// os.walk would follow until the path is too long; here it is visited once), with its files sorted by name.
inline void walk_image_folder(const std::string& dir, const ImageFolderOptions& opt,
                              std::set<std::pair<std::uint64_t, std::uint64_t>>& seen,
                              std::vector<std::pair<std::string, std::vector<std::string>>>& out, int depth) {
  namespace fs = std::filesystem;
  EMBER_CHECK(depth < 256, "ImageFolder: folders nested more than 256 deep under ",
              ember::detail::quote_untrusted(dir, 4096));
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !seen.insert({std::uint64_t(st.st_dev), std::uint64_t(st.st_ino)}).second)
    return;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  EMBER_CHECK(!ec, "ImageFolder: cannot list ", ember::detail::quote_untrusted(dir, 4096), ": ", ec.message());
  std::vector<std::string> files, subdirs;
  for (; it != end; it.increment(ec)) {
    EMBER_CHECK(!ec, "ImageFolder: cannot list ", ember::detail::quote_untrusted(dir, 4096), ": ", ec.message());
    const std::string name = it->path().filename().string();
    if (opt.skip_hidden && !name.empty() && name[0] == '.') continue;
    std::error_code e2;
    if (it->is_directory(e2))  // follows links, as os.walk(followlinks=True)
      subdirs.push_back(name);
    else
      files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  out.emplace_back(dir, std::move(files));
  for (const std::string& s : subdirs) walk_image_folder(dir + "/" + s, opt, seen, out, depth + 1);
}
}  // namespace detail

inline ImageFolder::ImageFolder(const std::string& root, ImageFolderOptions opt)
    : root_(root), src_(std::make_shared<ImageFolderSource>()) {
  namespace fs = std::filesystem;
  const std::string q = ember::detail::quote_untrusted(root, 4096);
  std::error_code ec;
  EMBER_CHECK(fs::is_directory(root, ec), "ImageFolder: ", q, " is not a folder");
  fs::directory_iterator it(root, ec), end;
  EMBER_CHECK(!ec, "ImageFolder: cannot list ", q, ": ", ec.message());
  for (; it != end; it.increment(ec)) {
    EMBER_CHECK(!ec, "ImageFolder: cannot list ", q, ": ", ec.message());
    const std::string name = it->path().filename().string();
    if (opt.skip_hidden && !name.empty() && name[0] == '.') continue;
    std::error_code e2;
    if (it->is_directory(e2)) classes_.push_back(name);
  }
  std::sort(classes_.begin(), classes_.end());
  EMBER_CHECK(!classes_.empty(), "ImageFolder: no class folder in ", q, " (expected ", q, "/<class>/<image>)");
  src_->max_file_bytes = opt.max_file_bytes;
  std::vector<std::string> empty_classes;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    std::vector<std::pair<std::string, std::vector<std::string>>> dirs;
    std::set<std::pair<std::uint64_t, std::uint64_t>> seen;
    detail::walk_image_folder(root + "/" + classes_[c], opt, seen, dirs, 0);
    std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::size_t before = src_->paths.size();
    for (const auto& [dir, files] : dirs)
      for (const std::string& f : files)
        if (detail::has_image_extension(f, opt.extensions)) {
          EMBER_CHECK(src_->paths.size() < opt.max_files, "ImageFolder: more than ", opt.max_files, " images in ",
                      q, " (ImageFolderOptions::max_files)");
          src_->paths.push_back(dir + "/" + f);
          src_->targets.push_back(std::int64_t(c));
        }
    if (src_->paths.size() == before) empty_classes.push_back(classes_[c]);
  }
  if (!empty_classes.empty()) {
    std::string names, exts;
    for (const std::string& n : empty_classes) names += (names.empty() ? "" : ", ") + ember::detail::quote_untrusted(n);
    for (const std::string& e : opt.extensions) exts += (exts.empty() ? "" : ", ") + e;
    EMBER_CHECK(false, "ImageFolder: found no valid file for the classes ", names, " in ", q,
                "; supported extensions are: ", exts);
  }
}

}  // namespace ember::data
