// Helpers of the image tests (test_image*.cpp): a fixture's bytes, and the batches a loader makes of an image dataset
// (and their comparison).
#pragma once

#include <doctest/doctest.h>

#include <ember/data/dataloader.hpp>
#include <ember/data/image_pipeline.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace ember_test {

/// The bytes of the file at `path` (a test fails when it is missing).
inline std::vector<unsigned char> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE_MESSAGE(f.good(), "missing fixture " << path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// One epoch of an image dataset through a DataLoader (batches of 4, shuffled with seed 2, RandomResizedCrop(12) and
/// flips) with `workers` workers: the same dataset must give the same batches for any worker count.
template <class D>
std::vector<ember::data::Batch> image_batches(const D& d, int workers) {
  namespace data = ember::data;
  data::DataLoader loader(d, {.batch_size = 4, .shuffle = true, .num_workers = workers, .seed = 2},
                          data::ImagePipeline({.random_resized_crop = data::transforms::RandomResizedCrop(12),
                                               .flip = 0.5f}));
  std::vector<data::Batch> out;
  for (auto& b : loader) out.push_back(b);
  return out;
}

/// Checks that two epochs' batches are equal, images bit for bit and labels.
inline void check_same_batches(const std::vector<ember::data::Batch>& a, const std::vector<ember::data::Batch>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    CAPTURE(k);
    REQUIRE(a[k].data.shape() == b[k].data.shape());
    CHECK(std::memcmp(a[k].data.data(), b[k].data.data(), std::size_t(a[k].data.numel()) * sizeof(float)) == 0);
    REQUIRE(a[k].target.shape() == b[k].target.shape());
    CHECK(std::memcmp(a[k].target.data(), b[k].target.data(),
                      std::size_t(a[k].target.numel()) * sizeof(std::int64_t)) == 0);
  }
}

}  // namespace ember_test
