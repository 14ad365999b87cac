// ember — train::Metrics: named scalars (a loss, an accuracy, a learning rate) in the order they were first set, as
// the Trainer, its callbacks, the progress bar and the loggers pass them around.
#pragma once

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ember::train {

/// Named scalars in first-set order: `Metrics{{"val_loss", 0.31}, {"val_acc", 0.92}}` (what Lightning's log()
/// calls produce).
class Metrics {
 public:
  using value_type = std::pair<std::string, double>;  ///< One (name, value) entry.
  Metrics() = default;                                 ///< No metrics.
  /// The entries listed, in order (a repeated name keeps its first place and its last value).
  Metrics(std::initializer_list<value_type> kv) {
    for (const auto& [k, v] : kv) set(k, v);
  }

  /// Sets `name` (keeping its place when it exists already).
  void set(const std::string& name, double v) {
    for (auto& [k, x] : items_)
      if (k == name) {
        x = v;
        return;
      }
    items_.emplace_back(name, v);
  }
  /// Sets every entry of `other`.
  void merge(const Metrics& other) {
    for (const auto& [k, v] : other) set(k, v);
  }
  /// The value of `name`, or nothing.
  std::optional<double> get(const std::string& name) const {
    for (const auto& [k, x] : items_)
      if (k == name) return x;
    return std::nullopt;
  }
  /// Whether `name` is set.
  bool contains(const std::string& name) const { return get(name).has_value(); }
  /// Whether no metric is set.
  bool empty() const { return items_.empty(); }
  /// The number of metrics.
  std::size_t size() const { return items_.size(); }
  /// Iterates the (name, value) entries in order.
  std::vector<value_type>::const_iterator begin() const { return items_.begin(); }
  /// The end of the entries.
  std::vector<value_type>::const_iterator end() const { return items_.end(); }
  /// Removes every metric.
  void clear() { items_.clear(); }
  /// "a, b, c": the names, for messages.
  std::string names() const {
    std::string s;
    for (const auto& [k, v] : items_) s += (s.empty() ? "" : ", ") + k;
    return s.empty() ? std::string("(none)") : s;
  }

 private:
  std::vector<value_type> items_;
};

/// A metric value as the progress bar and file names print it: 4 significant digits ("0.4521", "91.95", "1.2e-05").
inline std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace ember::train
