// ember — train::ProgressBar: one live line per epoch on a terminal (redrawn at most refresh_per_second times a
// second), plain lines at a fixed interval when the output is a file or a pipe (CI logs), and a summary line when
// the epoch ends. It shows the epoch, batches done of the total, batches/s, samples/s, the epoch's mean loss so far,
// the share of time spent waiting for data, elapsed time and an estimate of what is left. No dependency: ANSI
// "erase line" on terminals, nothing at all otherwise.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <unistd.h>

#include "ember/train/metrics.hpp"

namespace ember::train {

/// The options of train::ProgressBar (TrainerOptions::progress), Lightning's TQDMProgressBar role; its refresh_rate
/// counts batches, ember's limits are in time.
struct ProgressOptions {
  bool enabled = true;                 ///< false: the bar prints nothing
  double refresh_per_second = 10;      ///< terminal: the most redraws per second
  double plain_interval_seconds = 15;  ///< not a terminal: one line per this many seconds
  int tty = -1;                        ///< -1: ask isatty(); 0 or 1: as if the output were (not) a terminal
  std::FILE* out = nullptr;            ///< stdout by default
  std::function<double()> clock{};       ///< seconds; a steady clock by default (tests pass a fake one)
};

/// What the loop has done so far in the current epoch.
struct ProgressStats {
  std::int64_t batches = 0;     ///< batches done
  std::int64_t samples = 0;     ///< samples done
  double loss = 0;              ///< the epoch's mean training loss so far
  double data_wait_seconds = 0; ///< time spent waiting for the loader this epoch
};

namespace detail {
/// "m:ss" below an hour, else "h:mm:ss".
inline std::string format_clock(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const auto t = std::int64_t(s + 0.5);
  char buf[32];
  if (t < 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600), (long long)(t / 60 % 60),
                     (long long)(t % 60));
  return buf;
}
}  // namespace detail

/// The Trainer's progress bar (Lightning's TQDMProgressBar): the epoch, batch, rate, ETA and latest metrics, redrawn
/// in place on a terminal and printed as plain lines otherwise.
class ProgressBar {
 public:
  /// A bar writing to o.out (stdout by default); whether that is a terminal is detected unless o.tty says.
  explicit ProgressBar(ProgressOptions o = {}) : o_(std::move(o)) {
    if (!o_.out) o_.out = stdout;
    if (!o_.clock) o_.clock = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
    tty_ = o_.tty >= 0 ? o_.tty == 1 : ::isatty(::fileno(o_.out)) == 1;
  }
  /// Whether the bar draws at all.
  bool enabled() const { return o_.enabled; }
  /// Whether it redraws in place (a terminal) rather than printing lines.
  bool is_tty() const { return tty_; }

  /// `epoch` counts from 0; `max_epochs` and `total_batches` are -1 when unknown.
  void start_epoch(std::int64_t epoch, std::int64_t max_epochs, std::int64_t total_batches) {
    epoch_ = epoch;
    max_epochs_ = max_epochs;
    total_ = total_batches;
    t0_ = last_ = last_batch_ = o_.clock();
    live_ = false;
  }

  /// Called after every batch; draws only when the refresh interval has passed.
  void update(const ProgressStats& s) {
    if (!o_.enabled) return;
    const double now = o_.clock();
    last_batch_ = now;
    const double every = tty_ ? 1.0 / std::max(o_.refresh_per_second, 1e-3) : o_.plain_interval_seconds;
    if (now - last_ < every) return;
    last_ = now;
    emit(status(s, now, false), false);
  }

  /// The epoch's last line: the totals (rates up to the last batch: validation is not training time) and `extra`
  /// (validation metrics).
  void end_epoch(const ProgressStats& s, const Metrics& extra) {
    if (!o_.enabled) return;
    std::string line = status(s, last_batch_ > t0_ ? last_batch_ : o_.clock(), true);
    for (const auto& [k, v] : extra) line += "  " + k + " " + format_value(v);
    emit(line, true);
  }

  /// A line of its own (a callback's message), printed above the live line.
  void message(const std::string& text) {
    if (!o_.enabled) return;
    if (tty_ && live_) std::fputs("\r\x1b[K", o_.out);
    std::fputs(text.c_str(), o_.out);
    std::fputc('\n', o_.out);
    live_ = false;
    std::fflush(o_.out);
  }

 private:
  std::string status(const ProgressStats& s, double now, bool done) const {
    const double el = std::max(now - t0_, 1e-9);
    const double its = double(s.batches) / el, sps = double(s.samples) / el;
    char buf[256];
    std::string line = "epoch " + std::to_string(epoch_ + 1);
    if (max_epochs_ > 0) line += "/" + std::to_string(max_epochs_);
    line += "  " + std::to_string(s.batches);
    if (total_ > 0) line += "/" + std::to_string(total_);
    if (tty_ && total_ > 0 && !done) {
      constexpr int w = 20;
      const int fill = int(std::min<std::int64_t>(w, s.batches * w / total_));
      line += " [" + std::string(std::size_t(fill), '#') + std::string(std::size_t(w - fill), '.') + "]";
    }
    std::snprintf(buf, sizeof buf, "  %.1f it/s  %.0f samples/s  loss %s  data %.1f%%", its, sps,
                  format_value(s.loss).c_str(), 100.0 * std::clamp(s.data_wait_seconds / el, 0.0, 1.0));
    line += buf;
    if (done) {
      line += "  " + detail::format_clock(el);
    } else {
      line += "  " + detail::format_clock(el);
      if (total_ > 0 && s.batches > 0) line += " < " + detail::format_clock(double(total_ - s.batches) / its);
    }
    return line;
  }

  void emit(const std::string& line, bool final_line) {
    if (tty_) {
      std::fputs("\r\x1b[K", o_.out);
      std::fputs(line.c_str(), o_.out);
      if (final_line) std::fputc('\n', o_.out);
      live_ = !final_line;
    } else {
      std::fputs(line.c_str(), o_.out);
      std::fputc('\n', o_.out);
    }
    std::fflush(o_.out);
  }

  ProgressOptions o_;
  bool tty_ = false, live_ = false;
  std::int64_t epoch_ = 0, max_epochs_ = -1, total_ = -1;
  double t0_ = 0, last_ = 0, last_batch_ = 0;
};

}  // namespace ember::train
