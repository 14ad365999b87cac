// ember — Trainer checkpoints: the whole state of a run (model, optimizer, loss scaler, scheduler, the default
// generator, the epoch and the position in it, callbacks' state) in ember's one checkpoint format
// (io/checkpoint.hpp), written atomically, and ModelCheckpoint, the callback that writes them (top-k by a monitored
// metric, the last one, every n epochs or steps; Lightning's names). Includes <ember/io.hpp>; including this header
// is what lets Trainer save and resume (FitOptions::ckpt_path).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/io/any_tensor.hpp"
#include "ember/io/checkpoint.hpp"
#include "ember/io/safetensors.hpp"
#include "ember/train/callbacks.hpp"
#include "ember/train/trainer.hpp"

namespace ember::train {

namespace detail {
inline void save_training_state(const std::string& path, const TrainingState& s) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  io::save_checkpoint(path, s);
}

/// Including this header gives the Trainer its checkpoint files.
inline const bool checkpoint_io_registered = ember::detail::provide<CheckpointSavePart>(&save_training_state) &&
                                            ember::detail::provide<CheckpointLoadPart>(&io::load_checkpoint);
}  // namespace detail

/// Reads a checkpoint the Trainer wrote (to inspect it, or to take the model's weights out of it).
inline TrainingState load_checkpoint(const std::string& path) { return io::load_checkpoint(path); }

/// The options of train::ModelCheckpoint, with the names of Lightning's ModelCheckpoint(...) arguments:
/// ```
/// auto ckpt = std::make_shared<train::ModelCheckpoint>(train::ModelCheckpointOptions{
///     .dirpath = "runs/ckpt", .filename = "{epoch}-{val_loss:.3f}", .monitor = "val_loss", .save_top_k = 3});
/// ```
struct ModelCheckpointOptions {
  /// The folder the checkpoints are written to, created when missing (Lightning's default, None, is the logger's
  /// folder).
  std::string dirpath = "checkpoints";
  /// The file name without ".ckpt": {name} becomes name=<value> (epoch, step or any metric), {name:.2f} formats it.
  /// Lightning's auto_insert_metric_name=True; a '/' in the template is refused.
  std::string filename = "{epoch}-{step}";
  std::string monitor{};          ///< the metric that ranks the checkpoints; empty: the newest are kept
  Mode mode = Mode::min;          ///< min: a lower monitored value is better; max: higher
  int save_top_k = 1;           ///< how many to keep (-1: all, 0: none but last)
  bool save_last = false;       ///< also write last.ckpt, the one ckpt_path = "last" resumes from
  int every_n_epochs = 1;       ///< at the end of every n-th epoch (after its validation); 0: never
  std::int64_t every_n_train_steps = 0;  ///< every n optimizer steps instead (0: off)
  bool verbose = false;         ///< print the path of each checkpoint written
};

/// Saves checkpoints during fit and keeps the best save_top_k by `monitor` (Lightning's ModelCheckpoint).
class ModelCheckpoint : public Callback {
 public:
  /// Checkpoints as `o` says (checked: save_top_k >= -1, a non-empty filename template naming no folder).
  explicit ModelCheckpoint(ModelCheckpointOptions o = {}) : o_(std::move(o)) {
    EMBER_CHECK(o_.save_top_k >= -1, "train::ModelCheckpoint: save_top_k must be -1, 0 or positive, got ",
                o_.save_top_k);
    EMBER_CHECK(o_.every_n_epochs >= 0 && o_.every_n_train_steps >= 0, "train::ModelCheckpoint: every_n_epochs and "
                "every_n_train_steps must be non-negative");
    EMBER_CHECK(!o_.filename.empty(), "train::ModelCheckpoint: filename is empty");
    template_ = parse_template(o_.filename);
    for (const Segment& seg : template_)  // (a '/' in a field's metric name becomes '_' in the file name)
      EMBER_CHECK(seg.field || seg.text.find('/') == std::string::npos, "train::ModelCheckpoint: filename '",
                  o_.filename, "' names a folder; checkpoints are files directly in dirpath (put folders into "
                  "dirpath)");
  }

  /// The file name the template gives for these values (what the tests check). A '/' in a metric's name becomes '_'
  /// (a checkpoint is one file directly in dirpath).
  std::string format_name(std::int64_t epoch, std::int64_t step, const Metrics& m) const {
    std::string out;
    for (const Segment& seg : template_) {
      if (!seg.field) {
        out += seg.text;
        continue;
      }
      const std::string& name = seg.text;
      const std::string& spec = seg.spec;
      double v = 0;
      bool integer = false;
      if (name == "epoch") v = double(epoch), integer = true;
      else if (name == "step") v = double(step), integer = true;
      else if (const auto x = m.get(name)) v = *x;
      else EMBER_CHECK(false, "train::ModelCheckpoint: filename '", o_.filename, "' names '", name,
                       "', which is not a metric (", m.names(), ")");
      char buf[64];
      if (!spec.empty()) {
        const std::string fmt = "%" + (spec.back() == 'd' ? spec.substr(0, spec.size() - 1) + "lld" : spec);
        if (spec.back() == 'd') std::snprintf(buf, sizeof buf, fmt.c_str(), (long long)v);
        else std::snprintf(buf, sizeof buf, fmt.c_str(), v);
      } else if (integer) {
        std::snprintf(buf, sizeof buf, "%lld", (long long)v);
      } else {
        std::snprintf(buf, sizeof buf, "%.4g", v);
      }
      out += label(name) + "=" + buf;
    }
    return out;
  }

  /// The path of the best checkpoint so far (empty before the first; Lightning's best_model_path).
  const std::string& best_model_path() const { return best_path_; }
  /// The monitored value of the best checkpoint (Lightning's best_model_score).
  double best_model_score() const { return best_score_; }
  /// The path of the latest checkpoint written (Lightning's last_model_path).
  const std::string& last_model_path() const { return last_path_; }
  /// The kept checkpoints with their scores (the monitored value; the global step without a monitor).
  const std::vector<std::pair<double, std::string>>& best_k_models() const { return kept_; }

  void on_train_batch_end(Trainer& t) override {
    if (o_.every_n_train_steps > 0 && t.stepped() && t.global_step() % o_.every_n_train_steps == 0) save(t);
  }
  void on_validation_end(Trainer& t) override {
    if (!t.at_epoch_end() && epoch_due(t)) save(t);  // a mid-epoch validation; the epoch's end saves below
  }
  void on_train_epoch_end(Trainer& t) override {  // after the epoch's validation (if it had one)
    if (epoch_due(t) && (!t.has_validation() || t.validated_this_epoch())) save(t);
  }
  void on_fit_start(Trainer&) override { remove_stale_temp_files(); }
  void on_fit_end(Trainer& t) override {
    if (o_.save_last && saved_step_ != t.global_step()) write_last(t);
  }

  std::string state_key() const override { return "ModelCheckpoint{" + o_.dirpath + "," + o_.monitor + "}"; }
  void save_state(std::map<std::string, std::string>& kv) const override {
    std::string k;
    for (const auto& [s, p] : kept_) k += detail::exact(s) + "\t" + p + "\n";
    kv["kept"] = k;
    kv["best_model_path"] = best_path_;
    kv["last_model_path"] = last_path_;
  }
  void load_state(const std::map<std::string, std::string>& kv) override {
    if (kv.empty()) return;
    Saved saved = read_state(kv);
    kept_ = std::move(saved.kept);
    last_path_ = std::move(saved.last);
    refresh_best();  // best_model_path follows from the kept files
  }
  void check_state(const std::map<std::string, std::string>& kv) const override {
    if (!kv.empty()) read_state(kv);
  }
  std::string last_checkpoint() const override {
    if (!last_path_.empty()) return last_path_;
    const std::string p = last_file();
    std::error_code ec;
    return std::filesystem::exists(p, ec) ? p : std::string();
  }

 private:
  std::string last_file() const { return (std::filesystem::path(o_.dirpath) / "last.ckpt").string(); }
  std::string dir() const { return o_.dirpath.empty() ? std::string(".") : o_.dirpath; }

  // The file name template as literal text and fields ({name} or {name:spec}), parsed once.
  struct Segment {
    bool field = false;
    std::string text, spec;  // the literal text or the field's name; its format
  };
  static std::vector<Segment> parse_template(const std::string& f) {
    std::vector<Segment> out;
    for (std::size_t i = 0; i < f.size();) {
      if (f[i] != '{') {
        const std::size_t open = std::min(f.find('{', i), f.size());
        out.push_back({false, f.substr(i, open - i), {}});
        i = open;
        continue;
      }
      const std::size_t close = f.find('}', i);
      EMBER_CHECK(close != std::string::npos, "train::ModelCheckpoint: unclosed '{' in filename '", f, "'");
      const std::string field = f.substr(i + 1, close - i - 1);
      const std::size_t colon = field.find(':');
      Segment seg{true, field.substr(0, colon), colon == std::string::npos ? std::string() : field.substr(colon + 1)};
      const std::string& spec = seg.spec;
      EMBER_CHECK(spec.empty() || (spec.size() < 16 && spec.find_first_not_of("0123456789.+-#") == spec.size() - 1 &&
                                   std::string("efgd").find(spec.back()) != std::string::npos),
                  "train::ModelCheckpoint: format '", spec, "' of '", seg.text, "': use e.g. .2f, .3e, .4g or d");
      out.push_back(std::move(seg));
      i = close + 1;
    }
    return out;
  }
  // A field's name as it appears in a file name.
  static std::string label(std::string name) {
    std::replace(name.begin(), name.end(), '/', '_');
    return name;
  }
  // Whether `stem` is a name format_name can give: the template's literal text, and for each field its label, '='
  // and a printed number (letters for inf and nan, digits, '.', '+', '-').
  bool matches_template(const std::string& stem) const {
    if (stem.empty() || stem.size() > 255) return false;  // (no file name is longer)
    const std::size_t n = template_.size(), len = stem.size();
    std::vector<char> failed((n + 1) * (len + 1), 0);  // (segment, position) pairs known not to match
    auto value_char = [](char c) {
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '+' ||
             c == '-';
    };
    auto match = [&](auto& self, std::size_t i, std::size_t pos) -> bool {  // (recursion depth: the segments)
      if (i == n) return pos == len;
      char& known_bad = failed[i * (len + 1) + pos];
      if (known_bad) return false;
      const Segment& seg = template_[i];
      const std::string head = seg.field ? label(seg.text) + "=" : seg.text;
      if (stem.compare(pos, head.size(), head) == 0) {
        std::size_t p = pos + head.size();
        if (!seg.field) {
          if (self(self, i + 1, p)) return true;
        } else {
          while (p < len && value_char(stem[p]))
            if (self(self, i + 1, ++p)) return true;
        }
      }
      known_bad = 1;
      return false;
    };
    return match(match, 0, 0);
  }
  // Whether `p` names a file save() writes for top-k: dirpath joined with one name (no folder in it) that the
  // template gives, ending in ".ckpt".
  bool written_here(const std::string& p) const {
    const std::string name = std::filesystem::path(p).filename().string();
    constexpr std::size_t ext = 5;  // ".ckpt"
    return name.size() > ext && name.compare(name.size() - ext, ext, ".ckpt") == 0 &&
           (std::filesystem::path(o_.dirpath) / name).string() == p &&
           matches_template(name.substr(0, name.size() - ext));
  }

  struct Saved {
    std::vector<std::pair<double, std::string>> kept;
    std::string last;
  };
  // The checks of a saved state, for load_state and check_state. The kept files are deleted when better ones replace
  // them, so each must be one this callback writes.
  Saved read_state(const std::map<std::string, std::string>& kv) const {
    for (const char* key : {"kept", "best_model_path", "last_model_path"})
      EMBER_CHECK(kv.count(key), "train::ModelCheckpoint: the checkpoint's state of this callback has no '", key,
                  "' entry");
    Saved out;
    const std::string& text = kv.at("kept");
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t nl = text.find('\n', at), tab = text.find('\t', at);
      EMBER_CHECK(nl != std::string::npos && tab != std::string::npos && tab < nl && out.kept.size() < 100000,
                  "train::ModelCheckpoint: the checkpoint's list of kept files is malformed");
      const std::string score = text.substr(at, tab - at), path = text.substr(tab + 1, nl - tab - 1);
      double v = 0;
      EMBER_CHECK(detail::parse_double(score, v) && std::isfinite(v) && written_here(path),
                  "train::ModelCheckpoint: the checkpoint lists ", ember::detail::quote_untrusted(path), " (score ",
                  ember::detail::quote_untrusted(score), ") among its kept files; expected a .ckpt file in '",
                  o_.dirpath, "' named by the filename template '", o_.filename, "', with a finite score");
      out.kept.emplace_back(v, path);
      at = nl + 1;
    }
    const std::string& best = kv.at("best_model_path");
    EMBER_CHECK(best.empty() || std::any_of(out.kept.begin(), out.kept.end(), [&](const auto& e) {
                  return e.second == best;
                }),
                "train::ModelCheckpoint: the checkpoint's best_model_path is ", ember::detail::quote_untrusted(best),
                ", which is none of its kept files");
    out.last = kv.at("last_model_path");
    EMBER_CHECK(out.last.empty() || out.last == last_file(), "train::ModelCheckpoint: the checkpoint's "
                "last_model_path is ", ember::detail::quote_untrusted(out.last), ", expected '", last_file(),
                "' or none");
    return out;
  }

  // Deletes a kept file that a better one replaced: by its one name, inside dirpath opened once (no path is resolved
  // again, so a symlinked folder cannot lead elsewhere), and only when it is a regular file (a symlink is left alone,
  // as is anything that is not a file this callback writes).
  void remove_kept(const std::string& path) const {
    if (!written_here(path)) return;
    const std::string name = std::filesystem::path(path).filename().string();
    const int dfd = ::open(dir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    const int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) ::unlinkat(dfd, name.c_str(), 0);
    if (fd >= 0) ::close(fd);
    ::close(dfd);
  }

  // A save killed before its rename leaves its temporary file `.<name>.tmp-<pid>-<n>` in dirpath
  // (<ember/core/atomic_file.hpp>). The next save to the same name removes it, but top-k names seldom recur: so the
  // start of a run removes those of this callback's files (the template's names and last.ckpt) whose writer no longer
  // runs.
  void remove_stale_temp_files() const {
    namespace fs = std::filesystem;
    std::set<std::string> targets;
    std::error_code ec;
    for (fs::directory_iterator it(dir(), ec), end; !ec && it != end && targets.size() < 100000; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      const std::size_t t = n.rfind(".tmp-");
      if (n.size() < 2 || n[0] != '.' || t == std::string::npos || t < 2) continue;
      const std::string target = n.substr(1, t - 1);
      if (target == "last.ckpt" || written_here((fs::path(o_.dirpath) / target).string())) targets.insert(target);
    }
    for (const std::string& target : targets) ember::detail::remove_stale_temp_files(fs::path(dir()) / target);
  }

  bool epoch_due(const Trainer& t) const {
    return o_.every_n_train_steps == 0 && o_.every_n_epochs > 0 && (t.current_epoch() + 1) % o_.every_n_epochs == 0;
  }
  bool better(double a, double b) const { return o_.mode == Mode::min ? a < b : a > b; }
  void refresh_best() {
    best_path_.clear();
    for (const auto& [s, p] : kept_)
      if (best_path_.empty() || better(s, best_score_) || (o_.monitor.empty() && s >= best_score_)) {
        best_score_ = s;
        best_path_ = p;
      }
  }

  void save(Trainer& t) {
    if (saved_step_ == t.global_step() && saved_epoch_end_ == t.at_epoch_end()) return;  // nothing new since
    saved_step_ = t.global_step();
    saved_epoch_end_ = t.at_epoch_end();
    double score = double(t.global_step());
    if (!o_.monitor.empty()) {
      const auto v = t.callback_metrics().get(o_.monitor);
      EMBER_CHECK(v.has_value(), "train::ModelCheckpoint: the monitored metric '", o_.monitor, "' is not among the "
                  "metrics (", t.callback_metrics().names(), ")");
      score = *v;
    }
    if (o_.save_top_k != 0) {
      const std::int64_t epoch = t.current_epoch();
      const std::string path = (std::filesystem::path(o_.dirpath) /
                                (format_name(epoch, t.global_step(), t.callback_metrics()) + ".ckpt")).string();
      const bool nonfinite = !o_.monitor.empty() && !std::isfinite(score);
      bool keep = !nonfinite;
      if (keep && o_.save_top_k > 0 && int(kept_.size()) >= o_.save_top_k && !o_.monitor.empty()) {
        auto worst = std::max_element(kept_.begin(), kept_.end(), [&](const auto& a, const auto& b) {
          return better(a.first, b.first);
        });
        keep = better(score, worst->first);
      }
      if (keep) {
        std::erase_if(kept_, [&](const auto& e) { return e.second == path; });
        kept_.emplace_back(score, path);
        t.save_checkpoint(path);
        if (o_.verbose) t.print("saved " + path);
        while (o_.save_top_k > 0 && int(kept_.size()) > o_.save_top_k) {
          // the worst by the monitor; without one, the oldest
          auto drop = kept_.begin();
          if (!o_.monitor.empty())
            drop = std::max_element(kept_.begin(), kept_.end(),
                                    [&](const auto& a, const auto& b) { return better(a.first, b.first); });
          if (drop->second != path) remove_kept(drop->second);
          kept_.erase(drop);
        }
        refresh_best();
      }
    }
    if (o_.save_last) write_last(t);
  }

  void write_last(Trainer& t) {
    last_path_ = last_file();
    t.save_checkpoint(last_path_);
  }

  ModelCheckpointOptions o_;
  std::vector<Segment> template_;
  std::vector<std::pair<double, std::string>> kept_;
  std::string best_path_, last_path_;
  double best_score_ = 0;
  std::int64_t saved_step_ = -1;
  bool saved_epoch_end_ = false;
};

}  // namespace ember::train
