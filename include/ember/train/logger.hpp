// ember — train::CSVLogger: every logged metric as a row of <save_dir>/<name>/version_<n>/metrics.csv (step, then
// one column per metric name in the order first seen; a metric not logged in a row is an empty cell), as
// Lightning's CSVLogger. When a new metric name appears the file is rewritten whole, atomically, with the wider
// header; otherwise each row is appended with one write, so a reader never sees half a header.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/atomic_file.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace detail {
/// Creates <save_dir>/<name>/version_<n> (n = version, or the first that does not exist when it is -1) into `dir`
/// and returns n: the run directory of a logger, as Lightning's loggers lay them out.
inline int make_version_dir(const std::string& save_dir, const std::string& name, int version, const char* who,
                            std::string& dir) {
  namespace fs = std::filesystem;
  EMBER_CHECK(version >= -1, who, ": version must be -1 (next free) or non-negative, got ", version);
  const fs::path base = fs::path(save_dir) / name;
  int v = version;
  if (v < 0) {
    std::error_code ec;
    for (v = 0; v < 100000 && fs::exists(base / ("version_" + std::to_string(v)), ec); ++v) {}
  }
  dir = (base / ("version_" + std::to_string(v))).string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  EMBER_CHECK(!ec, who, ": cannot create the directory '", dir, "': ", ec.message());
  return v;
}
}  // namespace detail

/// The options of train::CSVLogger, with the names of Lightning's CSVLogger(...) arguments: the metrics go to
/// save_dir/name/version_N/metrics.csv.
struct CSVLoggerOptions {
  std::string save_dir = "runs";  ///< the root folder of the runs (Lightning requires it)
  std::string name = "default";   ///< the experiment's folder under save_dir (Lightning's default: "lightning_logs")
  int version = -1;  ///< -1: the first version_N that does not exist yet (Lightning's None)
};

/// Writes metrics to save_dir/name/version_N/metrics.csv, one row per logged step and one column per metric
/// (Lightning's CSVLogger).
class CSVLogger : public Logger {
 public:
  /// Creates the run's version_N folder (the next free N unless o.version is set).
  explicit CSVLogger(CSVLoggerOptions o = {}) {
    namespace fs = std::filesystem;
    version_ = detail::make_version_dir(o.save_dir, o.name, o.version, "train::CSVLogger", dir_);
    path_ = (fs::path(dir_) / "metrics.csv").string();
  }
  ~CSVLogger() override { close(); }
  CSVLogger(const CSVLogger&) = delete;
  CSVLogger& operator=(const CSVLogger&) = delete;

  /// The run's folder, save_dir/name/version_N (Lightning's log_dir).
  const std::string& log_dir() const { return dir_; }
  /// The N of version_N (give it to a second logger of the same run: {.version = first.version()}).
  int version() const { return version_; }
  /// The CSV file's path.
  const std::string& path() const { return path_; }

  void log_metrics(const Metrics& m, std::int64_t step) override {
    bool widened = false;
    for (const auto& [k, v] : m) {
      bool known = false;
      for (const auto& c : columns_) known = known || c == k;
      if (!known) {
        columns_.push_back(k);
        widened = true;
      }
    }
    std::vector<std::string> row(columns_.size());
    for (std::size_t i = 0; i < columns_.size(); ++i)
      if (const auto v = m.get(columns_[i])) row[i] = number(*v);
    rows_.push_back({step, std::move(row)});
    if (widened || !f_) rewrite();
    else append(line(rows_.back()));
  }
  void finalize() override { close(); }

 private:
  struct Row {
    std::int64_t step;
    std::vector<std::string> cells;
  };
  static std::string number(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }
  std::string header() const {
    std::string h = "step";
    for (const auto& c : columns_) {  // (appended piecewise: g++ 12 warns falsely on "," + string)
      h += ',';
      h += quote(c);
    }
    h += '\n';
    return h;
  }
  static std::string quote(const std::string& s) {
    if (s.find_first_of(",\"\n") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  }
  std::string line(const Row& r) const {
    std::string l = std::to_string(r.step);
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      l += ',';
      if (i < r.cells.size()) l += r.cells[i];
    }
    l += '\n';
    return l;
  }
  void rewrite() {
    close();
    std::string all = header();
    for (const auto& r : rows_) all += line(r);
    atomic_write(path_, std::span(reinterpret_cast<const unsigned char*>(all.data()), all.size()));
    f_ = std::fopen(path_.c_str(), "ab");
    EMBER_CHECK(f_ != nullptr, "train::CSVLogger: cannot open '", path_, "' to append: ", std::strerror(errno));
  }
  void append(const std::string& l) {
    const bool ok = std::fwrite(l.data(), 1, l.size(), f_) == l.size() && std::fflush(f_) == 0;
    EMBER_CHECK(ok, "train::CSVLogger: writing '", path_, "' failed: ", std::strerror(errno));
  }
  void close() {
    if (f_) std::fclose(f_);
    f_ = nullptr;
  }

  std::string dir_, path_;
  int version_ = 0;
  std::vector<std::string> columns_;
  std::vector<Row> rows_;
  std::FILE* f_ = nullptr;
};

}  // namespace ember::train
