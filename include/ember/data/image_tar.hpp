// ember — WebDataset shards: tar files whose members are grouped into samples by name (train-000000.tar holding
// n01440764_10026.jpg, n01440764_10026.cls, ...), the way many public datasets ship. Each shard is mapped read-only
// and listed once (data/tar.hpp); an image's bytes are a view of the mapping, decoded by the loader's ImagePipeline
// like an ImageFolder's files or an ImageRecordDataset's records.
//
//   data::WebDataset train({"imagenet/train-{000000..000146}.tar"});   // braces as WebDataset's URLs use them
//   data::DataLoader loader(train, {.batch_size = 256, .num_workers = 4}, pipeline,
//                           data::ShardShuffleSampler{.seed = 1});       // reads each shard mostly in order
//
// Samples follow the Python webdataset package's rules: a member's key is its name up to the first "." of its last
// path component and its field the rest, lower-cased ("a/b.seg.png": key "a/b", field "seg.png"); consecutive
// members with one key form a sample; a field twice in one sample is an error; members without a "." and names
// starting with a "__...__" component are passed over. The image is the first of image_keys the sample has
// (to_tuple("jpg;jpeg;png", "cls")), the label the decimal text of label_key (surrounding white space allowed, as
// Python's int()). A sample without an image or a label is an error naming the shard and key (skip_incomplete
// counts and drops such samples instead). Shards are not reordered: sample i is in shard order, then archive order.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/detail/mapped_file.hpp"
#include "ember/data/image.hpp"
#include "ember/data/image_pipeline.hpp"
#include "ember/data/rng.hpp"
#include "ember/data/tar.hpp"

namespace ember::data {

/// Expands the brace groups of a shard name as the shell (and WebDataset's URLs) do: "{000..011}" counts with the
/// zero padding of its ends, "{a,b}" lists alternatives; several groups give every combination, in order. A group
/// with neither ".." nor "," is kept as written; groups do not nest. More than max_names names is an error.
inline std::vector<std::string> expand_braces(std::string_view pattern, std::size_t max_names = std::size_t(1) << 20) {
  const std::size_t open = pattern.find('{');
  const std::size_t close = open == std::string_view::npos ? open : pattern.find('}', open);
  if (close == std::string_view::npos) return {std::string(pattern)};
  const std::string_view head = pattern.substr(0, open), inner = pattern.substr(open + 1, close - open - 1);
  std::vector<std::string> alts;
  const std::size_t dots = inner.find("..");
  long long lo = 0, hi = 0;
  const auto number = [](std::string_view s, long long& v) { return !s.empty() && ember::detail::parse_int(s, v); };
  if (dots != std::string_view::npos && number(inner.substr(0, dots), lo) && number(inner.substr(dots + 2), hi)) {
    const std::string_view a = inner.substr(0, dots), b = inner.substr(dots + 2);
    const auto padded = [](std::string_view s) {
      if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
      return s.size() > 1 && s[0] == '0';
    };
    const std::size_t width = padded(a) || padded(b) ? std::max(a.size(), b.size()) : 0;
    const unsigned long long count = (lo <= hi ? (unsigned long long)hi - (unsigned long long)lo
                                               : (unsigned long long)lo - (unsigned long long)hi) + 1;
    EMBER_CHECK(count != 0 && count <= max_names, "expand_braces: ", ember::detail::quote_untrusted(pattern, 4096),
                " names more than ", max_names, " shards");
    for (unsigned long long k = 0; k < count; ++k) {
      const long long v = lo <= hi ? lo + (long long)k : lo - (long long)k;
      std::string digits = std::to_string(v < 0 ? -(v + 1) + 1ull : (unsigned long long)v);
      if (digits.size() + (v < 0) < width) digits.insert(0, width - digits.size() - (v < 0), '0');
      alts.push_back(v < 0 ? "-" + digits : digits);
    }
  } else if (inner.find(',') != std::string_view::npos) {
    for (std::size_t at = 0;;) {
      const std::size_t comma = inner.find(',', at);
      alts.emplace_back(inner.substr(at, comma == std::string_view::npos ? comma : comma - at));
      if (comma == std::string_view::npos) break;
      at = comma + 1;
    }
  } else {
    alts.push_back("{" + std::string(inner) + "}");
  }
  const std::vector<std::string> rest = expand_braces(pattern.substr(close + 1), max_names);
  EMBER_CHECK(alts.size() <= max_names / rest.size(), "expand_braces: ",
              ember::detail::quote_untrusted(pattern, 4096), " names more than ", max_names, " shards");
  std::vector<std::string> out;
  out.reserve(alts.size() * rest.size());
  for (const std::string& a : alts)
    for (const std::string& r : rest) out.push_back(std::string(head) + a + r);
  return out;
}

/// Options of WebDataset.
struct WebDatasetOptions {
  std::vector<std::string> image_keys = {"jpg", "jpeg", "png"};  ///< the image is the first of these a sample has
  std::string label_key = "cls";                                  ///< the field holding the label as decimal text
  std::int64_t num_classes = 0;  ///< labels must be below it; 0: one more than the largest label
  bool skip_incomplete = false;  ///< drop (and count) samples without an image or a label instead of an error
  TarLimits limits = {};         ///< bounds on each shard (files are untrusted)
};

/// The images of WebDataset shards (thread-safe: mapped read-only).
class WebDatasetSource final : public ImageSource {
 public:
  /// One sample: where its image lies and its label.
  struct Sample {
    std::uint32_t shard = 0;             ///< which shard (an index of maps and paths)
    ///@{
    /// Where the image member's bytes are in the shard.
    std::uint64_t offset = 0, size = 0;
    ///@}
    std::int64_t label = 0;              ///< the cls field's value
    std::string key;  ///< the sample's key and its image's field ("n014_100.jpg")
  };
  std::vector<std::shared_ptr<const detail::MappedFile>> maps;  ///< the shards' mappings
  std::vector<std::string> paths;                              ///< the shards' paths
  std::vector<Sample> samples;                                 ///< every sample, in shard order

  /// The number of samples.
  std::size_t size() const override { return samples.size(); }
  std::span<const unsigned char> bytes(std::size_t i, std::vector<unsigned char>&) const override {
    const Sample& s = at(i);
    return maps[s.shard]->bytes().subspan(std::size_t(s.offset), std::size_t(s.size));
  }
  /// Sample i's label.
  std::int64_t target(std::size_t i) const override { return at(i).label; }
  std::string name(std::size_t i) const override {
    const Sample& s = at(i);
    return paths[s.shard] + "#" + s.key;
  }

 private:
  const Sample& at(std::size_t i) const {
    EMBER_CHECK(i < samples.size(), "WebDataset: index ", i, " is out of range for ", samples.size(), " samples");
    return samples[i];
  }
};

/// A Dataset over WebDataset tar shards (see the file comment). A cheap handle: copies share the mappings.
class WebDataset {
 public:
  /// Opens the shards: each entry is a tar file, a folder (every *.tar in it, sorted by name; its classes.txt, when
  /// there, gives the class names, one per line, as pack_images writes it) or a brace pattern (expand_braces).
  explicit WebDataset(const std::vector<std::string>& shards, WebDatasetOptions opt = {})
      : src_(std::make_shared<WebDatasetSource>()) {
    namespace fs = std::filesystem;
    EMBER_CHECK(!opt.image_keys.empty() && !opt.label_key.empty(), "WebDataset: image_keys and label_key are needed");
    EMBER_CHECK(opt.num_classes >= 0, "WebDataset: num_classes is ", opt.num_classes, "; expected 0 (inferred) or more");
    std::vector<std::string> files;
    for (const std::string& s : shards) {
      std::error_code ec;
      if (fs::is_directory(s, ec)) {
        std::vector<std::string> in;
        for (fs::directory_iterator it(s, ec), end; !ec && it != end; it.increment(ec)) {
          const std::string n = it->path().filename().string();
          if (n.size() > 4 && n.substr(n.size() - 4) == ".tar") in.push_back(it->path().string());
        }
        EMBER_CHECK(!ec, "WebDataset: cannot list ", ember::detail::quote_untrusted(s, 4096), ": ", ec.message());
        EMBER_CHECK(!in.empty(), "WebDataset: no *.tar files in ", ember::detail::quote_untrusted(s, 4096));
        std::sort(in.begin(), in.end());
        if (classes_.empty() && fs::is_regular_file(s + "/classes.txt", ec)) read_classes(s + "/classes.txt");
        files.insert(files.end(), in.begin(), in.end());
      } else {
        for (std::string& f : expand_braces(s)) files.push_back(std::move(f));
      }
    }
    EMBER_CHECK(!files.empty(), "WebDataset: no shards given");
    EMBER_CHECK(files.size() < (std::size_t(1) << 32), "WebDataset: more than 2^32 shards");
    std::int64_t max_label = -1;
    for (const std::string& f : files) {
      src_->maps.push_back(std::make_shared<const detail::MappedFile>(f, "WebDataset"));
      src_->paths.push_back(f);
      add_shard(std::uint32_t(src_->paths.size() - 1), opt, max_label);
    }
    EMBER_CHECK(!src_->samples.empty(), "WebDataset: the ", files.size(), " shard(s) starting with ",
                ember::detail::quote_untrusted(files.front(), 4096), " hold no samples");
    num_classes_ = opt.num_classes > 0 ? opt.num_classes
                   : !classes_.empty() ? std::int64_t(classes_.size())
                                       : max_label + 1;
    EMBER_CHECK(max_label < num_classes_, "WebDataset: a sample has label ", max_label, " but the shards' classes.txt ",
                "names ", classes_.size(), " classes");
  }

  /// The number of samples.
  std::size_t size() const { return src_->size(); }
  /// Sample i, to be decoded by the loader's ImagePipeline.
  ImageItem get(std::size_t i) const { return ImageItem{src_, i, src_->target(i), nullptr, Rng(0)}; }
  /// Sample i's label.
  std::int64_t target(std::size_t i) const { return src_->target(i); }
  /// Sample i's key and image field ("n01440764_10026.jpg").
  const std::string& key(std::size_t i) const {
    EMBER_CHECK(i < size(), "WebDataset: index ", i, " is out of range for ", size(), " samples");
    return src_->samples[i].key;
  }
  /// The class names (class i is label i), from a shard folder's classes.txt; empty without one.
  const std::vector<std::string>& classes() const { return classes_; }
  /// The number of classes: WebDatasetOptions::num_classes, else the names in classes.txt, else one more than the
  /// largest label.
  std::int64_t num_classes() const { return num_classes_; }
  /// The number of shard files.
  std::size_t num_shards() const { return src_->paths.size(); }
  /// Samples dropped for want of an image or a label (with skip_incomplete).
  std::size_t skipped() const { return skipped_; }
  /// The shards, as an ImageSource.
  std::shared_ptr<const ImageSource> source() const { return src_; }

 private:
  void add_shard(std::uint32_t shard, const WebDatasetOptions& opt, std::int64_t& max_label) {
    const std::string& path = src_->paths[shard];
    const TarView tar(src_->maps[shard]->bytes(), path, opt.limits);
    const auto q = [&](std::string_view key) {
      return ember::detail::quote_untrusted(path + "#" + std::string(key), 8192);
    };
    // One sample's fields as they are met: (field, member index).
    std::vector<std::pair<std::string_view, std::size_t>> fields;
    std::string_view key;
    const auto finish = [&] {
      if (fields.empty()) return;
      const TarMember* image = nullptr;
      std::string_view image_field;
      for (const std::string& want : opt.image_keys) {
        for (const auto& [f, m] : fields)
          if (f == want) image = &tar.members()[m], image_field = f;
        if (image) break;
      }
      const TarMember* label = nullptr;
      for (const auto& [f, m] : fields)
        if (f == opt.label_key) label = &tar.members()[m];
      if (!image || !label) {
        std::string have;
        for (const auto& [f, m] : fields) have += (have.empty() ? "" : ", ") + std::string(f);
        if (opt.skip_incomplete) {
          ++skipped_;
          fields.clear();
          return;
        }
        std::string wanted;
        for (const std::string& w : opt.image_keys) wanted += (wanted.empty() ? "" : "/") + w;
        EMBER_CHECK(false, "WebDataset: sample ", q(key), " has no ", !image ? wanted : opt.label_key,
                    " field (it has ", have, "); set WebDatasetOptions::skip_incomplete to drop such samples");
      }
      const std::span<const unsigned char> text = tar.data(*label);
      std::string_view t(reinterpret_cast<const char*>(text.data()), text.size());
      const auto space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
      while (!t.empty() && space(t.front())) t.remove_prefix(1);
      while (!t.empty() && space(t.back())) t.remove_suffix(1);
      long long v = 0;
      EMBER_CHECK(t.size() <= 32 && ember::detail::parse_int(t, v) && v >= 0, "WebDataset: sample ", q(key),
                  " has the label ", ember::detail::quote_untrusted(t), " in its ", opt.label_key,
                  " field; expected a whole number >= 0");
      EMBER_CHECK(opt.num_classes == 0 || v < opt.num_classes, "WebDataset: sample ", q(key), " has label ", v,
                  "; num_classes is ", opt.num_classes);
      max_label = std::max<std::int64_t>(max_label, v);
      src_->samples.push_back(WebDatasetSource::Sample{shard, image->offset, image->size, std::int64_t(v),
                                                       std::string(key) + "." + std::string(image_field)});
      fields.clear();
    };
    std::vector<std::string> lower(tar.size());  // the fields, lower-cased; `fields` views them
    for (std::size_t m = 0; m < tar.size(); ++m) {
      const std::string& name = tar.members()[m].name;
      std::string_view k, f;
      if (detail::webdataset_meta(name) || !detail::webdataset_split(name, k, f)) continue;
      if (k != key) {
        finish();
        key = k;
      }
      lower[m] = f;
      for (char& c : lower[m]) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
      for (const auto& fm : fields)
        EMBER_CHECK(fm.first != lower[m], "WebDataset: sample ", q(key), " has the field ",
                    ember::detail::quote_untrusted(lower[m]), " twice");
      fields.emplace_back(lower[m], m);
    }
    finish();
  }

  static constexpr std::size_t kMaxClasses = std::size_t(1) << 20;  // classes.txt is untrusted: a bound on its lines

  void read_classes(const std::string& path) {
    std::vector<unsigned char> text;
    read_file_into(path, text, std::size_t(64) << 20, "WebDataset");
    std::string_view t(reinterpret_cast<const char*>(text.data()), text.size());
    while (!t.empty()) {
      const std::size_t nl = t.find('\n');
      EMBER_CHECK(classes_.size() < kMaxClasses, "WebDataset: ", ember::detail::quote_untrusted(path, 4096),
                  " names more than ", kMaxClasses, " classes");
      classes_.emplace_back(t.substr(0, nl));
      t.remove_prefix(nl == std::string_view::npos ? t.size() : nl + 1);
    }
  }

  std::shared_ptr<WebDatasetSource> src_;
  std::vector<std::string> classes_;
  std::int64_t num_classes_ = 0;
  std::size_t skipped_ = 0;
};

}  // namespace ember::data
