// ember_pack_images: packs an ImageFolder (ROOT/<class>/**/<image>) into ember record shards for
// data::ImageRecordDataset: OUT/classes.rec and OUT/shard-NNNNN.rec, the encoded files with their labels, in a seeded
// random order; with --max-side, images larger than that are resized (antialiased) and re-encoded as JPEG. With
// --webdataset: WebDataset tar shards instead (OUT/shard-NNNNN.tar and OUT/classes.txt) for data::WebDataset and the
// Python webdataset package. OUT is replaced whole when the pack is complete; a failure leaves it as it was, and an
// OUT holding files that are not a pack's is refused.
//
//   ember_pack_images ROOT OUT [--webdataset] [--shard-mb N] [--max-side N] [--quality Q] [--seed S] [--no-shuffle]
#include <ember/data/image_records.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

namespace {
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "ember_pack_images: %s\nusage: ember_pack_images ROOT OUT [--webdataset] [--shard-mb N] "
                       "[--max-side N] [--quality Q] [--seed S] [--no-shuffle]\n", why);
  std::exit(2);
}
long long number(const char* flag, const char* text, long long lo, long long hi) {
  long long v = 0;
  if (!ember::detail::parse_int(text, v) || v < lo || v > hi) {
    std::fprintf(stderr, "ember_pack_images: %s: expected a whole number in [%lld, %lld], got \"%s\"\n", flag, lo, hi,
                 text);
    std::exit(2);
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  std::string root, out;
  ember::data::PackImagesOptions opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--shard-mb") opt.shard_bytes = std::size_t(number("--shard-mb", value(), 1, 1 << 20)) << 20;
    else if (a == "--max-side") opt.max_side = number("--max-side", value(), 1, 65500);
    else if (a == "--quality") opt.quality = int(number("--quality", value(), 1, 100));
    else if (a == "--seed") opt.seed = std::uint64_t(number("--seed", value(), 0, 1LL << 62));
    else if (a == "--no-shuffle") opt.shuffle = false;
    else if (a == "--webdataset") opt.format = ember::data::PackImagesOptions::Format::webdataset;
    else if (!a.empty() && a[0] == '-') usage(("unknown flag " + a).c_str());
    else if (root.empty()) root = a;
    else if (out.empty()) out = a;
    else usage("too many arguments");
  }
  if (out.empty()) usage("ROOT and OUT are required");
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const ember::data::ImageFolder folder(root);
    const ember::data::PackImagesResult r = ember::data::pack_images(folder, out, opt);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("packed %zu images of %zu classes into %zu shards in %s (%.1f MB of images, %zu re-encoded), %.1f s\n",
                r.images, folder.classes().size(), r.shards, out.c_str(), double(r.bytes) / 1e6, r.reencoded, s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember_pack_images: %s\n", e.what());
    return 1;
  }
  return 0;
}
