// ember — datasets stored in packed record files: RecordDataset decodes record i into a sample; labelled byte
// images (MNIST-like: an int64 label and the pixels) have an encoder, a decoder and a packing function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/record_file.hpp"

namespace ember::data {

/// A Dataset whose sample i is decode(record i). Decode: a callable span<const unsigned char> -> sample, safe to
/// call from several threads.
template <class Decode>
class RecordDataset {
 public:
  /// The records of `reader`, decoded by `decode`.
  RecordDataset(RecordReader reader, Decode decode) : reader_(std::move(reader)), decode_(std::move(decode)) {}
  /// The records of the file at `path`, decoded by `decode`.
  RecordDataset(const std::string& path, Decode decode) : RecordDataset(RecordReader(path), std::move(decode)) {}
  /// The number of records.
  std::size_t size() const { return reader_.size(); }
  /// Sample i: decode(record i), its checksum verified.
  auto get(std::size_t i) const { return decode_(reader_.record(i)); }
  /// The file's reader.
  const RecordReader& reader() const { return reader_; }

 private:
  RecordReader reader_;
  Decode decode_;
};

/// Decodes a labelled byte image (8-byte little-endian label, then C*H*W pixels) into an Example with data
/// (C, H, W) in [0, 1] (pixel / 255).
struct ByteImageDecoder {
  Shape shape;  ///< (C, H, W) of every image.

  /// The Example of record r (an error when r is not 8 + C*H*W bytes).
  Example operator()(std::span<const unsigned char> r) const {
    const std::size_t n = std::size_t(shape.numel());
    EMBER_CHECK(r.size() == 8 + n, "ByteImageDecoder: a record of ", r.size(), " bytes; an image ", shape.str(),
                " with its label takes ", 8 + n);
    std::int64_t label = 0;
    for (int i = 7; i >= 0; --i) label = std::int64_t((std::uint64_t(label) << 8) | r[std::size_t(i)]);
    Tensor<float> x = empty<float>(shape);
    float* o = x.data();
    const unsigned char* px = r.data() + 8;
    for (std::size_t k = 0; k < n; ++k) o[k] = float(px[k]) / 255.0f;
    return {x, label};
  }
};

/// The record of one labelled byte image, as ByteImageDecoder reads it.
inline std::vector<unsigned char> encode_byte_image(std::int64_t label, std::span<const std::uint8_t> pixels) {
  std::vector<unsigned char> r(8 + pixels.size());
  for (int i = 0; i < 8; ++i) r[std::size_t(i)] = static_cast<unsigned char>(std::uint64_t(label) >> (8 * i));
  if (!pixels.empty()) std::memcpy(r.data() + 8, pixels.data(), pixels.size());
  return r;
}

/// Packs images (N, ...) of bytes and their labels (N) into a record file, one record per image.
inline void pack_byte_images(const Tensor<std::uint8_t>& images, const Tensor<std::int64_t>& labels,
                             const std::string& path) {
  EMBER_CHECK(images.dim() >= 1 && labels.dim() == 1 && labels.size(0) == images.size(0),
              "pack_byte_images: images ", images.shape().str(), " and labels ", labels.shape().str(),
              " must have the same first dim");
  EMBER_CHECK(images.is_contiguous() && labels.is_contiguous(), "pack_byte_images: expected contiguous tensors");
  const std::int64_t n = images.size(0), per = n ? images.numel() / n : 0;
  RecordWriter w(path);
  for (std::int64_t i = 0; i < n; ++i)
    w.write(encode_byte_image(labels.data()[i], {images.data() + i * per, std::size_t(per)}));
  w.close();
}

}  // namespace ember::data
