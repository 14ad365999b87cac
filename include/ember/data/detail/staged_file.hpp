// ember — a file written through a buffer into a temporary file and put in place whole (core/atomic_file.hpp): the
// storage of the shard writers (RecordWriter in data/record_file.hpp, TarWriter in data/tar.hpp). A failed write
// abandons the file, so a destination is never left holding part of one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/core/atomic_file.hpp"

namespace ember::data::detail {

/// Bytes appended to a temporary file next to `path` (gathered into writes of 1 MiB), renamed over `path` by
/// commit(). Destroyed without commit(), or after a failed write, the temporary file is removed and `path` is
/// untouched.
class StagedFile {
 public:
  /// Starts the temporary file for `path`; errors name `who`.
  StagedFile(const std::string& path, const char* who) : path_(path), who_(who) {
    file_.emplace(path, who);
    buf_.reserve(kBuffer);
  }
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  /// Whether bytes can still be appended (not committed, discarded or failed).
  bool is_open() const { return file_.has_value(); }
  /// Appends n bytes; a failure abandons the file and rethrows.
  void put(const void* p, std::size_t n) {
    EMBER_CHECK(file_.has_value(), who_, ": write after close (or after a failed write, or discard) of ",
                ember::detail::quote_untrusted(path_, 4096));
    if (n == 0) return;
    try {
      if (buf_.size() + n > kBuffer) flush();
      if (n >= kBuffer) {
        file_->write(p, n);
      } else {
        const auto* b = static_cast<const unsigned char*>(p);
        buf_.insert(buf_.end(), b, b + n);
      }
    } catch (...) {  // the temporary file may now hold part of what was appended: abandon it
      discard();
      throw;
    }
    offset_ += n;
  }
  /// Syncs the file and renames it over the destination; on error the destination is untouched and the temporary
  /// file removed. Does nothing when the file is not open.
  void commit() {
    if (!file_) return;
    try {
      flush();
      file_->commit();  // removes the temporary file itself when it fails
    } catch (...) {
      discard();
      throw;
    }
    file_.reset();
  }
  /// Abandons the file: the temporary file is removed and the destination is untouched.
  void discard() noexcept {
    file_.reset();
    buf_.clear();
  }
  /// The bytes appended so far.
  std::uint64_t offset() const { return offset_; }
  /// The destination.
  const std::string& path() const { return path_; }

 private:
  static constexpr std::size_t kBuffer = std::size_t(1) << 20;

  void flush() {
    if (!buf_.empty()) file_->write(buf_.data(), buf_.size());
    buf_.clear();
  }

  std::string path_;
  const char* who_;
  std::optional<AtomicFile> file_;  // empty after commit(), discard() or a failure
  std::vector<unsigned char> buf_;
  std::uint64_t offset_ = 0;
};

}  // namespace ember::data::detail
