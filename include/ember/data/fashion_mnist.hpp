// ember — Fashion-MNIST (Zalando's 28x28 grey-scale clothing images, 10 classes; 60000 train, 10000 test), read
// from the IDX files of Debian's dataset-fashion-mnist package or from any folder holding the same files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/idx.hpp"

namespace ember::data {

/// Which part of a dataset to load.
enum class Split { Train, Test };

/// Fashion-MNIST as a Dataset of Examples: data (1, 28, 28) float in [0, 1], target the class (0..9).
///
/// Where the files are looked for, first match wins: the `root` argument; the EMBER_FASHION_MNIST environment
/// variable; /usr/share/datasets/fashion-mnist (`apt-get install dataset-fashion-mnist`). The folder holds
/// train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz
/// (the files may also be uncompressed, without .gz). The images stay as bytes (47 MB for train); get()
/// converts one image.
class FashionMNIST {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";  ///< The last folder tried.
  static constexpr std::int64_t kNumClasses = 10;  ///< T-shirt/top, trouser, ..., ankle boot.

  /// Loads the train (60000 images) or test (10000) split from `root` (empty: the folders above, in order), as
  /// torchvision.datasets.FashionMNIST(root, train=...).
  EMBER_HEADER_INLINE explicit FashionMNIST(Split split, std::string root = "");

  /// The number of images.
  std::size_t size() const { return std::size_t(images_.size(0)); }

  /// Sample i: the image as float (1, 28, 28) in [0, 1] and its class.
  EMBER_HEADER_INLINE Example get(std::size_t i) const;

  /// Every image as bytes, (N, 28, 28).
  const Tensor<std::uint8_t>& images() const { return images_; }  // (N, 28, 28)
  /// Every label, (N).
  const Tensor<std::int64_t>& labels() const { return labels_; }  // (N)
  /// The split loaded.
  Split split() const { return split_; }
  /// The folder the files were read from.
  const std::string& root() const { return root_; }

  /// The class names, in label order.
  static constexpr const char* class_name(std::int64_t label) {
    constexpr const char* names[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                     "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    return label >= 0 && label < kNumClasses ? names[label] : "?";
  }

 private:
  EMBER_HEADER_INLINE static std::string resolve_root(std::string root);
  EMBER_HEADER_INLINE std::string find_file(const std::string& base) const;

  Split split_;
  std::string root_;
  Tensor<std::uint8_t> images_;  // (N, 28, 28)
  Tensor<std::int64_t> labels_;  // (N)
};

#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE FashionMNIST::FashionMNIST(Split split, std::string root)
    : split_(split) {
  root_ = resolve_root(std::move(root));
  const std::string stem = split == Split::Train ? "train" : "t10k";
  images_ = read_idx(find_file(stem + "-images-idx3-ubyte"));
  const Tensor<std::uint8_t> raw_labels = read_idx(find_file(stem + "-labels-idx1-ubyte"));
  EMBER_CHECK(images_.dim() == 3 && images_.size(1) == 28 && images_.size(2) == 28, "FashionMNIST: images in ",
              ember::detail::quote_untrusted(root_, 4096), " have shape ", images_.shape().str(),
              ", expected (N, 28, 28)");
  EMBER_CHECK(raw_labels.dim() == 1 && raw_labels.size(0) == images_.size(0), "FashionMNIST: labels in ",
              ember::detail::quote_untrusted(root_, 4096), " have shape ", raw_labels.shape().str(), ", expected (",
              images_.size(0), ") to match the images ", images_.shape().str());
  labels_ = empty<std::int64_t>(raw_labels.shape());
  for (std::int64_t i = 0; i < raw_labels.numel(); ++i) {
    const std::uint8_t l = raw_labels.data()[i];
    EMBER_CHECK(l < kNumClasses, "FashionMNIST: label ", int(l), " of sample ", i, " in ",
                ember::detail::quote_untrusted(root_, 4096), " is not a class index 0..9");
    labels_.data()[i] = l;
  }
}

EMBER_HEADER_INLINE Example FashionMNIST::get(std::size_t i) const {
  EMBER_CHECK(i < size(), "FashionMNIST::get: index ", i, " is out of range for a dataset of ", size(),
              " samples");
  Tensor<float> x = empty<float>(Shape{1, 28, 28});
  const std::uint8_t* src = images_.data() + std::int64_t(i) * 784;
  float* dst = x.data();
  for (int k = 0; k < 784; ++k) dst[k] = float(src[k]) / 255.0f;  // as torchvision ToTensor: x.float() / 255
  return {x, labels_.data()[i]};
}

EMBER_HEADER_INLINE std::string FashionMNIST::resolve_root(std::string root) {
  if (!root.empty()) return root;
  if (const char* env = std::getenv("EMBER_FASHION_MNIST"); env && *env) return env;
  return kDefaultRoot;
}

EMBER_COLD EMBER_HEADER_INLINE std::string FashionMNIST::find_file(const std::string& base) const {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(root_) / (base + ".gz"), plain = fs::path(root_) / base;
  std::error_code ec;
  if (fs::is_regular_file(gz, ec)) return gz.string();
  if (fs::is_regular_file(plain, ec)) return plain.string();
  EMBER_CHECK(false, "FashionMNIST: ", ember::detail::quote_untrusted(gz.string(), 4096), " not found (nor ",
              ember::detail::quote_untrusted(plain.filename().string(), 4096),
              "). Install the dataset with `apt-get install dataset-fashion-mnist` (it goes to ", kDefaultRoot,
              "), or point the root argument or the EMBER_FASHION_MNIST environment variable at a folder holding ",
              "the four IDX files");
  return {};
}
#endif

}  // namespace ember::data
