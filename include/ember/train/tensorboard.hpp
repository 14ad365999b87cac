// ember — train::TensorBoardLogger: scalars, histograms and text as TensorBoard event files
// (<save_dir>/<name>/version_<n>/events.out.tfevents.<time>.<host>), readable by `tensorboard --logdir <save_dir>`.
// Encoded here, no protobuf library: each record is TFRecord framing (little-endian uint64 length, the masked
// CRC-32C of those 8 bytes, the bytes, their masked CRC-32C) around a serialised Event message:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; HistogramProto histo = 5; TensorProto tensor = 8;
//             SummaryMetadata metadata = 9; }
// A histogram is HistogramProto { min = 1, max = 2, num = 3, sum = 4, sum_squares = 5, bucket_limit = 6 (packed),
// bucket = 7 (packed) }; text is a scalar DT_STRING TensorProto with the "text" plugin named in the metadata.
// Each event is written with one fwrite and flushed, so a reader sees whole records (TensorBoard itself stops at a
// truncated final record and picks it up when it is complete).
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/tensor.hpp"
#include "ember/data/detail/crc32c.hpp"
#include "ember/train/logger.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace tb {

/// CRC-32C, as TFRecord uses (the one packed record files use).
using data::detail::crc32c;
/// TFRecord's masked CRC: rotated right by 15 bits plus a constant.
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/// Protocol buffer wire encoding, the few forms the event messages use.
class Proto {
 public:
  /// Appends v as a base-128 varint.
  void varint(std::uint64_t v) {
    while (v >= 0x80) {
      s_ += char((v & 0x7F) | 0x80);
      v >>= 7;
    }
    s_ += char(v);
  }
  /// Appends a field's key: its number and wire type.
  void tag(int field, int wire) { varint(std::uint64_t(field) << 3 | std::uint64_t(wire)); }
  /// Appends field `field` as a varint.
  void f_varint(int field, std::uint64_t v) {
    tag(field, 0);
    varint(v);
  }
  /// Appends field `field` as a 64-bit double.
  void f_double(int field, double v) {
    tag(field, 1);
    raw(&v, 8);
  }
  /// Appends field `field` as a 32-bit float.
  void f_float(int field, float v) {
    tag(field, 5);
    raw(&v, 4);
  }
  /// Appends field `field` as length-delimited bytes (a string or a nested message).
  void f_bytes(int field, std::string_view b) {
    tag(field, 2);
    varint(b.size());
    s_.append(b.data(), b.size());
  }
  /// Appends field `field` as a packed repeated double.
  void f_packed_doubles(int field, const std::vector<double>& v) {
    tag(field, 2);
    varint(v.size() * 8);
    for (double d : v) raw(&d, 8);
  }
  /// The encoded message so far.
  const std::string& str() const { return s_; }

 private:
  void raw(const void* p, std::size_t n) { s_.append(static_cast<const char*>(p), n); }  // little-endian hosts only
  std::string s_;
};

/// One TFRecord around `data`.
inline std::string frame(const std::string& data) {
  std::string r;
  const std::uint64_t len = data.size();
  char head[8];
  std::memcpy(head, &len, 8);
  const std::uint32_t hc = masked_crc32c(head, 8), dc = masked_crc32c(data.data(), data.size());
  r.append(head, 8);
  r.append(reinterpret_cast<const char*>(&hc), 4);
  r += data;
  r.append(reinterpret_cast<const char*>(&dc), 4);
  return r;
}

}  // namespace tb

/// The options of train::TensorBoardLogger, with the names of Lightning's TensorBoardLogger(...) arguments: the
/// events go to save_dir/name/version_N/events.out.tfevents.TIME.HOST followed by file_suffix.
struct TensorBoardLoggerOptions {
  std::string save_dir = "runs";  ///< the root folder of the runs (what tensorboard --logdir reads)
  std::string name = "default";   ///< the experiment's folder under save_dir (Lightning's default: "lightning_logs")
  int version = -1;                     ///< -1: the first version_N that does not exist yet (Lightning's None)
  std::function<double()> wall_clock{};   ///< seconds since 1970; empty: the system clock (tests fix it)
  std::string file_suffix{};  ///< appended to the event file's name (torch.utils.tensorboard's filename_suffix)
};

/// Writes metrics as TensorBoard event files (torch.utils.tensorboard's SummaryWriter; Lightning's
/// TensorBoardLogger): save_dir/name/version_N/events.out.tfevents.TIME.HOST, readable by `tensorboard --logdir`.
class TensorBoardLogger : public Logger {
 public:
  /// Creates the run's version_N folder and its event file.
  explicit TensorBoardLogger(TensorBoardLoggerOptions o = {}) : o_(std::move(o)) {
    namespace fs = std::filesystem;
    if (!o_.wall_clock) o_.wall_clock = [] {
      return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    };
    version_ = detail::make_version_dir(o_.save_dir, o_.name, o_.version, "train::TensorBoardLogger", dir_);
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || !host[0]) std::strcpy(host, "localhost");
    const double t = o_.wall_clock();
    path_ = (fs::path(dir_) / ("events.out.tfevents." + std::to_string(std::int64_t(t)) + "." + host + o_.file_suffix))
                .string();
    f_ = std::fopen(path_.c_str(), "wb");
    EMBER_CHECK(f_ != nullptr, "train::TensorBoardLogger: cannot create '", path_, "': ", std::strerror(errno));
    tb::Proto e;  // the first event names the format
    e.f_double(1, t);
    e.f_bytes(3, "brain.Event:2");
    write(e.str());
  }
  ~TensorBoardLogger() override {
    if (f_) std::fclose(f_);
  }
  TensorBoardLogger(const TensorBoardLogger&) = delete;
  TensorBoardLogger& operator=(const TensorBoardLogger&) = delete;

  /// The run's folder, save_dir/name/version_N.
  const std::string& log_dir() const { return dir_; }
  /// The N of version_N (give it to a second logger of the same run: {.version = first.version()}).
  int version() const { return version_; }
  /// The event file's path.
  const std::string& path() const { return path_; }

  /// Every metric as a scalar at `step` (one event).
  void log_metrics(const Metrics& m, std::int64_t step) override {
    if (m.empty()) return;
    tb::Proto summary;
    for (const auto& [k, v] : m) {
      tb::Proto value;
      value.f_bytes(1, k);
      value.f_float(2, float(v));
      summary.f_bytes(1, value.str());
    }
    event(step, summary.str());
  }
  /// One scalar `v` under `tag` at `step` (SummaryWriter.add_scalar).
  void add_scalar(const std::string& tag, double v, std::int64_t step) { log_metrics(Metrics{{tag, v}}, step); }

  /// A histogram of a tensor's finite values (a weight, a gradient) in `buckets` equal-width buckets between the
  /// smallest and the largest.
  template <class T>
  void add_histogram(const std::string& tag, const Tensor<T>& t, std::int64_t step, int buckets = 30) {
    EMBER_CHECK(buckets >= 1 && buckets <= 100000, "train::TensorBoardLogger::add_histogram: buckets must be in "
                "[1, 100000], got ", buckets);
    EMBER_CHECK(t.defined() && t.device().is_cpu(), "train::TensorBoardLogger::add_histogram: '", tag,
                "' must be a defined CPU tensor");
    std::vector<double> v;
    v.reserve(std::size_t(t.numel()));
    Tensor<T> c = t.contiguous();
    for (std::int64_t i = 0; i < c.numel(); ++i) {
      const double x = double(c.data()[i]);
      if (std::isfinite(x)) v.push_back(x);
    }
    add_histogram_values(tag, v, step, buckets);
  }
  /// A histogram of finite values (an ember::Error names the first that is not).
  void add_histogram_values(const std::string& tag, const std::vector<double>& v, std::int64_t step, int buckets = 30) {
    EMBER_CHECK(buckets >= 1 && buckets <= 100000, "train::TensorBoardLogger::add_histogram_values: buckets must be "
                "in [1, 100000], got ", buckets);
    for (std::size_t i = 0; i < v.size(); ++i)
      EMBER_CHECK(std::isfinite(v[i]), "train::TensorBoardLogger::add_histogram_values: '", tag, "': value ", i,
                  " is ", v[i], "; a histogram takes finite values (add_histogram leaves the others out)");
    double lo = 0, hi = 0, sum = 0, sq = 0;
    if (!v.empty()) lo = hi = v[0];
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sum += x;
      sq += x * x;
    }
    std::vector<double> limits, counts(std::size_t(buckets), 0.0);
    const double w = hi > lo ? (hi - lo) / buckets : 1.0;
    for (int b = 0; b < buckets; ++b) limits.push_back(b + 1 == buckets ? hi : lo + w * (b + 1));
    for (double x : v) {  // bucket i holds (limit[i-1], limit[i]], as TensorBoard reads it
      // The bucket by division, clamped in floating point (a range wider than double's, hi - lo = inf, gives NaN
      // here), then moved to the one whose limits hold x.
      const double q = std::ceil((x - lo) / w) - 1;
      int i = q >= 0 ? int(std::min(q, double(buckets - 1))) : 0;
      while (i > 0 && x <= limits[std::size_t(i - 1)]) --i;
      while (i < buckets - 1 && x > limits[std::size_t(i)]) ++i;
      counts[std::size_t(i)] += 1;
    }
    tb::Proto h;
    h.f_double(1, lo);
    h.f_double(2, hi);
    h.f_double(3, double(v.size()));
    h.f_double(4, sum);
    h.f_double(5, sq);
    h.f_packed_doubles(6, limits);
    h.f_packed_doubles(7, counts);
    tb::Proto value, summary;
    value.f_bytes(1, tag);
    value.f_bytes(5, h.str());
    summary.f_bytes(1, value.str());
    event(step, summary.str());
  }

  /// Text (markdown) shown in TensorBoard's text tab.
  void add_text(const std::string& tag, const std::string& text, std::int64_t step) {
    tb::Proto plugin, meta, shape, tensor, value, summary;
    plugin.f_bytes(1, "text");
    meta.f_bytes(1, plugin.str());
    tensor.f_varint(1, 7);          // DT_STRING
    tensor.f_bytes(2, shape.str()); // a scalar: a shape without dims
    tensor.f_bytes(8, text);
    value.f_bytes(1, tag);
    value.f_bytes(8, tensor.str());
    value.f_bytes(9, meta.str());
    summary.f_bytes(1, value.str());
    event(step, summary.str());
  }

 private:
  void event(std::int64_t step, const std::string& summary) {
    tb::Proto e;
    e.f_double(1, o_.wall_clock());
    e.f_varint(2, std::uint64_t(step));
    e.f_bytes(5, summary);
    write(e.str());
  }
  void write(const std::string& msg) {
    const std::string rec = tb::frame(msg);
    const bool ok = std::fwrite(rec.data(), 1, rec.size(), f_) == rec.size() && std::fflush(f_) == 0;
    EMBER_CHECK(ok, "train::TensorBoardLogger: writing '", path_, "' failed: ", std::strerror(errno));
  }

  TensorBoardLoggerOptions o_;
  std::string dir_, path_;
  int version_ = 0;
  std::FILE* f_ = nullptr;
};

}  // namespace ember::train
