// ember — the image loading pipeline: decode, crop/resize, flip, colour jitter, ToTensor and Normalize, one pass per
// image, written straight into the collated batch tensor. Image datasets (ImageFolder, ImageRecordDataset) hand out
// ImageItems (where the bytes are, and the label); ImagePipeline, the loader's transform, attaches itself and the
// sample's random stream; collate() then reads, decodes and transforms each image into its slot of the batch on the
// worker that builds the batch, with that worker's decoder and buffers.
//
//   data::ImagePipeline train({.random_resized_crop = transforms::RandomResizedCrop(224), .flip = 0.5f,
//                              .normalize = transforms::Normalize({0.485f, 0.456f, 0.406f},
//                                                                 {0.229f, 0.224f, 0.225f})});
//   data::ImagePipeline eval({.resize = transforms::Resize(256), .center_crop = transforms::CenterCrop(224),
//                             .normalize = ...});
//   data::DataLoader loader(data::ImageFolder("train"), {.batch_size = 256, .shuffle = true, .num_workers = 4}, train);
//
// A JPEG is decoded at the largest DCT scale (1/2, 1/4, 1/8) that keeps at least the output size over the crop, and
// only over the window the crop needs (reduced_decode, on by default); the resampler does the rest of the downscale.
// That differs from torchvision's full decode + antialiased resize by the DCT scaling's own filter (README, "Images").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/creation.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/dataset.hpp"
#include "ember/data/image.hpp"
#include "ember/data/image_resample.hpp"
#include "ember/data/image_transforms.hpp"
#include "ember/data/loader_stages.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/transforms.hpp"

namespace ember::data {

/// Where the encoded images of a dataset are: files of a folder, records of packed shards. Thread-safe (workers
/// read it concurrently).
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  /// The number of images.
  virtual std::size_t size() const = 0;
  /// The encoded bytes of image i: a view of memory the source holds (a mapped shard) or of `scratch`, which it may
  /// fill (a file read; its capacity is reused).
  virtual std::span<const unsigned char> bytes(std::size_t i, std::vector<unsigned char>& scratch) const = 0;
  /// Image i's class.
  virtual std::int64_t target(std::size_t i) const = 0;
  /// What error messages call image i (a path).
  virtual std::string name(std::size_t i) const = 0;
};

/// The steps of an ImagePipeline, in torchvision's order: a geometry (random_resized_crop; or resize and/or
/// center_crop; or none, when every image has the same size), then flip, colour jitter, ToTensor (/255) and
/// normalize. Each field is one torchvision transform (unset or 0: that step is skipped), fused into one pass:
///   data::ImagePipeline train({.random_resized_crop = data::transforms::RandomResizedCrop(224), .flip = 0.5f});
struct ImagePipelineOptions {
  /// The training geometry: a crop of random area and aspect ratio resized to its (height, width)
  /// (torchvision's RandomResizedCrop); not with resize or center_crop.
  std::optional<transforms::RandomResizedCrop> random_resized_crop = std::nullopt;
  /// The evaluation geometry's first step: the shorter side to one size, or (height, width) (torchvision's Resize),
  /// before center_crop.
  std::optional<transforms::Resize> resize = std::nullopt;
  std::optional<transforms::CenterCrop> center_crop = std::nullopt;  ///< must fit the (resized) image
  float flip = 0.0f;                                  ///< probability of a horizontal flip (RandomHorizontalFlip's p)
  transforms::ColorJitter jitter = {};                ///< off by default
  /// (x - mean[c]) / std[c] after ToTensor's /255, folded into the same pass; unset: values in [0, 1].
  std::optional<transforms::Normalize> normalize = std::nullopt;
  int channels = 3;  ///< 3: RGB (PIL's convert("RGB")); 1: greyscale
  /// JPEG: decode at a reduced DCT scale and only the crop's window (the output is then close to, not equal to,
  /// torchvision's); false: decode every pixel, as torchvision does.
  bool reduced_decode = true;
  ImageDecodeOptions limits = {};  ///< held to by every decode
};

namespace detail {
struct ImagePipelineSpec;
}

/// One sample of an image dataset: which image of which source, its label, and, once the loader's ImagePipeline has
/// seen it, the pipeline and the sample's random stream. collate() turns a batch of them into a Batch.
struct ImageItem {
  std::shared_ptr<const ImageSource> source;  ///< Where the encoded image is.
  std::size_t index = 0;                      ///< Which image of the source.
  std::int64_t target = 0;                    ///< Its class.
  /// The pipeline to run; null: decode the whole image (ToTensor only).
  std::shared_ptr<const detail::ImagePipelineSpec> pipeline;  // null: decode the whole image (ToTensor only)
  Rng rng{0};  ///< The sample's random stream (for its augmentations).
};

namespace detail {
/// A worker's reusable buffers: the file being read and the resampler's rows.
struct ImageScratch {
  std::vector<unsigned char> file;
  std::vector<float> rows;
  ResampleAxis ax, ay;
};
inline ImageScratch& image_scratch() {
  thread_local ImageScratch s;
  return s;
}

struct ImagePipelineSpec {
  ImagePipelineOptions opt;
  std::vector<float> scale, bias;  // (channels): /255 and Normalize folded, or /255 alone with jitter
  std::int64_t out_h = 0, out_w = 0;  // 0: the image's own size

  explicit ImagePipelineSpec(ImagePipelineOptions o) : opt(std::move(o)) {
    EMBER_CHECK(opt.channels == 1 || opt.channels == 3, "ImagePipeline: channels must be 1 or 3, got ", opt.channels);
    EMBER_CHECK(!(opt.random_resized_crop && (opt.resize || opt.center_crop)), "ImagePipeline: random_resized_crop "
                "replaces resize and center_crop (torchvision's train and eval chains); give one or the other");
    EMBER_CHECK(opt.flip >= 0 && opt.flip <= 1, "ImagePipeline: flip must be a probability, got ", opt.flip);
    EMBER_CHECK(!opt.jitter.active() || opt.channels == 3, "ImagePipeline: ColorJitter needs RGB (channels = 3)");
    if (opt.random_resized_crop) {
      out_h = opt.random_resized_crop->height;
      out_w = opt.random_resized_crop->width;
    } else if (opt.center_crop) {
      out_h = opt.center_crop->height;
      out_w = opt.center_crop->width;
    } else if (opt.resize && opt.resize->width > 0) {
      out_h = opt.resize->height;
      out_w = opt.resize->width;
    }
    const int C = opt.channels;
    scale.assign(std::size_t(C), 1.0f / 255.0f);
    bias.assign(std::size_t(C), 0.0f);
    if (opt.normalize) {
      const auto& m = opt.normalize->mean;
      const auto& s = opt.normalize->std;
      EMBER_CHECK(m.size() == 1 || int(m.size()) == C, "ImagePipeline: Normalize has ", m.size(), " means for ", C,
                  " channels");
      if (!opt.jitter.active())
        for (int c = 0; c < C; ++c) {
          const float mc = m[m.size() == 1 ? 0 : std::size_t(c)], sc = s[s.size() == 1 ? 0 : std::size_t(c)];
          scale[std::size_t(c)] = 1.0f / (255.0f * sc);
          bias[std::size_t(c)] = -mc / sc;
        }
    }
  }

  /// The (height, width) of the output for an image of H x W.
  std::pair<std::int64_t, std::int64_t> output_size(std::int64_t H, std::int64_t W) const {
    if (out_h > 0) return {out_h, out_w};
    if (opt.resize) return opt.resize->output_size(H, W);
    return {H, W};
  }

  /// Decodes `file` and writes the transformed image, (channels, oh, ow) for output_size(), at `out`.
  void run(std::span<const unsigned char> file, std::string_view name, Rng& g, float* out, ImageDecoder& dec,
           ImageScratch& s) const {
    std::int64_t H, W;
    {
      StageTimer t(Stage::decode);
      dec.set_options(opt.limits);
      const ImageInfo& info = dec.open(file, name);
      H = info.height;
      W = info.width;
    }
    const auto [oh, ow] = output_size(H, W);
    // The source box in full-size pixels (y, x, h, w) and the range the filter may read.
    double by = 0, bx = 0, bh = double(H), bw = double(W);
    std::int64_t cy0 = 0, cy1 = H, cx0 = 0, cx1 = W;
    if (opt.random_resized_crop) {
      const auto b = opt.random_resized_crop->get_params(H, W, g);
      by = double(b.top), bx = double(b.left), bh = double(b.h), bw = double(b.w);
      cy0 = b.top, cy1 = b.top + b.h, cx0 = b.left, cx1 = b.left + b.w;
    } else if (opt.center_crop) {
      const auto [rh, rw] = opt.resize ? opt.resize->output_size(H, W) : std::pair{H, W};
      const auto [top, left] = opt.center_crop->offset(rh, rw);
      EMBER_CHECK(top >= 0 && left >= 0, "ImagePipeline: a ", oh, "x", ow, " center crop does not fit the ", rh, "x",
                  rw, " image ", ember::detail::quote_untrusted(name, 4096), " (add a resize to at least the crop)");
      const double sy = double(H) / double(rh), sx = double(W) / double(rw);
      by = double(top) * sy, bx = double(left) * sx, bh = double(oh) * sy, bw = double(ow) * sx;
    }
    const bool flip = opt.flip > 0 && g.bernoulli(opt.flip);
    // A JPEG at 1/d: the box and clip range scale by 1/d; the filter still starts from the box's full-size extent.
    const bool jpeg = dec.info().format == ImageFormat::jpeg;
    const int d = jpeg && opt.reduced_decode ? jpeg_scale_for(bw, bh, ow, oh) : 1;
    const std::int64_t sw = (W + d - 1) / d, sh = (H + d - 1) / d;
    auto lo = [&](std::int64_t v) { return v / d; };
    auto hi = [&](std::int64_t v, std::int64_t n) { return std::min(n, (v + d - 1) / d); };
    compute_resample_axis(s.ay, by / d, bh / d, oh, lo(cy0), hi(cy1, sh), opt.resize ? opt.resize->antialias : true);
    compute_resample_axis(s.ax, bx / d, bw / d, ow, lo(cx0), hi(cx1, sw), opt.resize ? opt.resize->antialias : true);
    DecodedImage img;
    {
      StageTimer t(Stage::decode);
      DecodeWindow w{.channels = opt.channels, .scale_denom = d};
      if (opt.reduced_decode && (s.ay.hi - s.ay.lo < sh || s.ax.hi - s.ax.lo < sw)) {
        // One column more on each side: libjpeg's upsampling replicates a window's edge column.
        if (jpeg) {
          w.x0 = std::max<std::int64_t>(0, s.ax.lo - 1);
          w.width = std::min(sw, s.ax.hi + 1) - w.x0;
        }
        w.y0 = s.ay.lo;
        w.height = s.ay.hi - s.ay.lo;
      }
      img = dec.decode(w);
    }
    StageTimer t(Stage::augment);
    resample(ResampleSource<std::uint8_t>{img.data, img.channels, img.stride, img.channels, 1, img.y0, img.x0}, s.ay,
             s.ax, ResampleTarget{out, oh * ow, ow, flip, scale.data(), bias.data()}, s.rows);
    if (opt.jitter.active()) {
      opt.jitter.apply(out, oh, ow, g);
      if (opt.normalize) {
        const auto& m = opt.normalize->mean;
        const auto& sd = opt.normalize->std;
        for (std::size_t c = 0; c < 3; ++c) {
          const float mc = m[m.size() == 1 ? 0 : c], inv = 1.0f / sd[sd.size() == 1 ? 0 : c];
          float* o = out + std::int64_t(c) * oh * ow;
          for (std::int64_t i = 0; i < oh * ow; ++i) o[i] = (o[i] - mc) * inv;
        }
      }
    }
  }
};
}  // namespace detail

/// The loader's transform for image datasets: attaches itself and the sample's random stream to each ImageItem, so
/// that collate() runs the whole chain per image into the batch (options: ImagePipelineOptions).
class ImagePipeline {
 public:
  /// The pipeline of options `o` (checked: 1 or 3 channels, one geometry, a flip probability, jitter on RGB only).
  explicit ImagePipeline(ImagePipelineOptions o = {}) : spec_(std::make_shared<const detail::ImagePipelineSpec>(o)) {}
  /// `it` with the pipeline and the sample's stream g attached (the decoding itself happens in collate()).
  ImageItem operator()(ImageItem it, Rng& g) const {
    it.pipeline = spec_;
    it.rng = g;
    return it;
  }
  /// One image through the pipeline, as a (channels, H, W) tensor (for inspection or single predictions).
  Tensor<float> apply(std::span<const unsigned char> file, std::string_view name, Rng& g) const {
    ImageDecoder& dec = thread_image_decoder();
    dec.set_options(spec_->opt.limits);
    const ImageInfo& info = dec.open(file, name);
    const auto [oh, ow] = spec_->output_size(info.height, info.width);
    Tensor<float> out = empty<float>(Shape{spec_->opt.channels, oh, ow});
    spec_->run(file, name, g, out.data(), dec, detail::image_scratch());
    return out;
  }
  /// The options the pipeline was made with.
  const ImagePipelineOptions& options() const { return spec_->opt; }

 private:
  std::shared_ptr<const detail::ImagePipelineSpec> spec_;
};

/// Stacks image items into a Batch: each image read, decoded and transformed straight into its slot (items without
/// a pipeline: the whole image, /255; every image of the batch must then have the same size).
inline Batch collate(const std::vector<ImageItem>& items, const std::vector<std::size_t>& indices = {}) {
  EMBER_CHECK(!items.empty(), "collate: no samples to stack");
  detail::ImageScratch& s = detail::image_scratch();
  ImageDecoder& dec = thread_image_decoder();
  static const detail::ImagePipelineSpec plain{ImagePipelineOptions{}};
  const std::int64_t B = std::int64_t(items.size());
  Batch b;
  b.target = empty<std::int64_t>(Shape{B});
  std::int64_t C = 0, H = 0, W = 0;
  for (std::int64_t i = 0; i < B; ++i) {
    const ImageItem& it = items[std::size_t(i)];
    EMBER_CHECK(it.source != nullptr, "collate: image sample ",
                i < std::int64_t(indices.size()) ? indices[std::size_t(i)] : std::size_t(i), " has no source");
    const detail::ImagePipelineSpec& spec = it.pipeline ? *it.pipeline : plain;
    std::span<const unsigned char> file;
    {
      StageTimer t(Stage::read);
      file = it.source->bytes(it.index, s.file);
    }
    const std::string name = it.source->name(it.index);
    std::int64_t h = spec.out_h, w = spec.out_w;
    if (h == 0) {  // the size depends on the image
      StageTimer t(Stage::decode);
      dec.set_options(spec.opt.limits);
      const ImageInfo& info = dec.open(file, name);
      std::tie(h, w) = spec.output_size(info.height, info.width);
    }
    if (i == 0) {
      C = spec.opt.channels, H = h, W = w;
      b.data = empty<float>(Shape{B, C, H, W});
    }
    EMBER_CHECK(spec.opt.channels == C && h == H && w == W, "collate: image ",
                ember::detail::quote_untrusted(name, 4096), " gives a (", spec.opt.channels, ", ", h, ", ", w,
                ") sample, the first of the batch (", C, ", ", H, ", ", W,
                "); give the pipeline a crop or a fixed resize so every image has one size");
    Rng g = it.rng;
    spec.run(file, name, g, b.data.data() + i * C * H * W, dec, s);
    b.target.data()[i] = it.target;
  }
  return b;
}

}  // namespace ember::data
