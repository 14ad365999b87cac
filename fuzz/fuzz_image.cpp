// libFuzzer target: the JPEG and PNG decoders (data/image.hpp) and the image pipeline (data/image_pipeline.hpp) on
// arbitrary bytes: the header, a whole decode, a DCT-scaled window, and a RandomResizedCrop with reduced-size
// decoding into a batch slot. Every input must decode or throw ember::Error; the decoder must stay usable after an
// error (one decoder serves every input, as one serves every image of a loader's worker).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ember/data/image.hpp"
#include "ember/data/image_pipeline.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // 4 M pixels: large enough for every seed, small enough to stay fast.
  static ember::data::ImageDecoder dec({.max_pixels = std::uint64_t(4) << 20});
  static const ember::data::ImagePipeline pipe({.random_resized_crop = ember::data::transforms::RandomResizedCrop(16),
                                                .flip = 0.5f,
                                                .limits = {.max_pixels = std::uint64_t(4) << 20}});
  const std::span<const unsigned char> file(data, size);
  try {
    const ember::data::ImageInfo& info = dec.open(file, "fuzz");
    if (info.width <= 0 || info.height <= 0) __builtin_trap();
    const ember::data::DecodedImage d = dec.decode({.channels = size % 2 ? 3 : 1});
    if (d.width != info.width || d.height != info.height) __builtin_trap();
    volatile std::uint8_t sink = d.data[std::size_t(d.height - 1) * std::size_t(d.stride)];
    (void)sink;
  } catch (const ember::Error&) {
  }
  try {
    const ember::data::ImageInfo& info = dec.open(file, "fuzz");
    const int denom = 1 << (size % 4);
    const std::int64_t sw = (info.width + denom - 1) / denom, sh = (info.height + denom - 1) / denom;
    if (info.format == ember::data::ImageFormat::jpeg && sw > 2 && sh > 2)
      dec.decode({.channels = 3, .scale_denom = denom, .x0 = sw / 3, .y0 = sh / 3, .width = sw / 3,
                  .height = sh / 3});
  } catch (const ember::Error&) {
  }
  try {
    ember::data::Rng g(size);
    const ember::Tensor<float> t = pipe.apply(file, "fuzz", g);
    if (t.numel() != 3 * 16 * 16) __builtin_trap();
  } catch (const ember::Error&) {
  }
  return 0;
}
