// ember — atomic file replacement: a reader (or a restart after a crash) sees either the previous file or the
// complete new one, never a partial write. POSIX: write a temporary file in the same folder, fsync it, rename it
// over the target (atomic within a file system), fsync the folder so the rename itself is durable. Readers that
// have the previous file open (or mapped) keep it: the rename replaces the directory entry, not the file.
//
// Temporary files are named `.<name>.tmp-<pid>-<n>` next to `<name>`. A writer killed between creating and renaming its
// temporary file (SIGKILL, power loss) leaves it behind; the next save to the same path removes such stale files of
// writers that no longer run (kill(pid, 0) reports ESRCH). A folder replaced whole (pack_images's output) is staged
// under the same pattern, and its writer removes stale staging folders the same way. Only names of exactly that pattern
// for that destination are touched, and never one whose process is alive (or might be: a pid that exists but belongs to
// another user counts as alive). The check assumes the writers of one path share a pid namespace (one host, one
// container); a writer on another host writing into the same shared folder could lose its temporary file.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "ember/config.hpp"

namespace ember {

namespace detail {
/// Test hook: called with the temporary file's path after it is written and synced, before the rename.
inline std::function<void(const std::string&)> atomic_write_before_rename;

inline std::string atomic_file_errno_text(int e) { return std::strerror(e); }

/// The prefix of the temporary files for `target`'s file name: ".<name>.tmp-".
inline std::string atomic_temp_prefix(const std::filesystem::path& target) {
  std::string s = ".";  // appended, not "." + string&& (g++ 12's -Wrestrict false positive at -O3)
  s += target.filename().string();
  s += ".tmp-";
  return s;
}

/// A new name beside `target` for its temporary file (or staging folder): `.<name>.tmp-<pid>-<n>`, n counting up
/// within this process, so that names are unique within it (a leftover of an earlier process with the same pid is
/// possible: create the file or folder exclusively and ask again on EEXIST).
inline std::string atomic_temp_path(const std::filesystem::path& target) {
  static std::atomic<unsigned long long> counter{0};
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::string s = (dir / atomic_temp_prefix(target)).string();
  s += std::to_string(::getpid());
  s += '-';
  s += std::to_string(counter++);
  return s;
}

/// Makes the entries of folder `dir` durable (fsync of the folder: renames into or within it survive a power
/// cut). Best effort where a folder cannot be opened.
inline void atomic_sync_folder(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// If `name` is exactly `prefix` + <pid> + "-" + <counter> (decimal digits, pid > 0), returns the pid.
inline std::optional<pid_t> atomic_temp_pid(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = name.substr(prefix.size());
  const std::size_t dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 9 || dash + 1 == rest.size()) return std::nullopt;
  std::int64_t pid = 0;
  for (std::size_t i = 0; i < dash; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return std::nullopt;
    pid = pid * 10 + (rest[i] - '0');
  }
  for (std::size_t i = dash + 1; i < rest.size(); ++i)
    if (rest[i] < '0' || rest[i] > '9') return std::nullopt;
  if (pid <= 0) return std::nullopt;
  return static_cast<pid_t>(pid);
}

/// Removes the temporary files that killed writers left for `target` (see the top of this file); with `folders`,
/// their staging folders too (with what they hold). Best effort: a folder that cannot be listed or an entry that
/// cannot be removed is left as it is. Links are never followed or removed. Returns how many entries it removed.
EMBER_HEADER_INLINE std::size_t remove_stale_temp_files(const std::filesystem::path& target, bool folders = false);
#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE std::size_t remove_stale_temp_files(const std::filesystem::path& target,
                                                                   bool folders) {
  namespace fs = std::filesystem;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = atomic_temp_prefix(target);
  const pid_t self = ::getpid();
  std::size_t removed = 0;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::optional<pid_t> pid = atomic_temp_pid(name, prefix);
    if (!pid || *pid == self) continue;  // not ours to judge; our own in-flight files are alive by definition
    if (::kill(*pid, 0) == 0 || errno != ESRCH) continue;  // alive, or alive under another user (EPERM)
    std::error_code st_ec;
    const fs::file_status st = fs::symlink_status(it->path(), st_ec);
    if (fs::is_regular_file(st)) {
      if (::unlink(it->path().c_str()) == 0) ++removed;
    } else if (folders && fs::is_directory(st)) {
      if (fs::remove_all(it->path(), st_ec) != static_cast<std::uintmax_t>(-1) && !st_ec) ++removed;
    }
  }
  return removed;
}
#endif
}  // namespace detail

/// A file written under a temporary name next to `path` and renamed over `path` by commit(): until then `path`
/// keeps its previous content (readers that have it open keep the old file even after the commit). Destroying an
/// AtomicFile that was not committed removes the temporary file. Creating one first removes the stale temporary
/// files that killed writers left for the same path (see the top of this file).
///
/// For streaming writers: write() appends; or write to fd() directly (if it is wrapped in a FILE*, flush it before
/// commit() and do not fclose it: commit() syncs and closes the descriptor).
class AtomicFile {
 public:
  /// Creates the temporary file for `path`. `who` names the caller in error messages.
  EMBER_HEADER_INLINE explicit AtomicFile(std::string path, std::string who = "atomic_write");
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { discard(); }

  /// The destination.
  const std::string& path() const { return path_; }
  /// The temporary file being written.
  const std::string& temp_path() const { return tmp_; }
  /// The temporary file's descriptor (-1 after commit() or discard()).
  int fd() const { return fd_; }

  /// Appends `n` bytes to the temporary file.
  EMBER_HEADER_INLINE void write(const void* data, std::size_t n);
  /// Appends `bytes` to the temporary file.
  void write(std::span<const unsigned char> bytes) { write(bytes.data(), bytes.size()); }

  /// Syncs and closes the temporary file and renames it over path(), then syncs the folder. On error the
  /// temporary file is removed and path() is untouched.
  EMBER_HEADER_INLINE void commit();

  /// Abandons the write: closes and removes the temporary file (no-op after commit()).
  void discard() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (!tmp_.empty()) {
      ::unlink(tmp_.c_str());
      tmp_.clear();
    }
  }

 private:
  std::string path_, who_, tmp_;
  int fd_ = -1;
};

#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE AtomicFile::AtomicFile(std::string path, std::string who)
    : path_(std::move(path)), who_(std::move(who)) {
  namespace fs = std::filesystem;
  const fs::path target(path_);
  EMBER_CHECK(!path_.empty() && target.has_filename(), who_, ": '", path_, "' does not name a file");
  detail::remove_stale_temp_files(target);
  // A leftover of an earlier process that had the same pid (EEXIST) is skipped rather than overwritten.
  for (int attempt = 0;; ++attempt) {
    tmp_ = detail::atomic_temp_path(target);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ >= 0 || errno != EEXIST || attempt >= 64) break;
  }
  EMBER_CHECK(fd_ >= 0, who_, ": cannot create '", tmp_, "' (to replace '", path_, "'): ",
              detail::atomic_file_errno_text(errno));
}

EMBER_COLD EMBER_HEADER_INLINE void AtomicFile::write(const void* data, std::size_t n) {
  EMBER_CHECK(fd_ >= 0, who_, ": write to '", path_, "' after commit or discard");
  auto p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    EMBER_CHECK(w > 0, who_, ": writing '", tmp_, "' failed: ", detail::atomic_file_errno_text(errno));
    p += w;
    n -= std::size_t(w);
  }
}

EMBER_COLD EMBER_HEADER_INLINE void AtomicFile::commit() {
  EMBER_CHECK(fd_ >= 0, who_, ": commit of '", path_, "' after commit or discard");
  try {
    EMBER_CHECK(::fsync(fd_) == 0, who_, ": fsync of '", tmp_, "' failed: ", detail::atomic_file_errno_text(errno));
    const int fd = std::exchange(fd_, -1);
    EMBER_CHECK(::close(fd) == 0, who_, ": closing '", tmp_, "' failed: ", detail::atomic_file_errno_text(errno));
    if (detail::atomic_write_before_rename) detail::atomic_write_before_rename(tmp_);
    EMBER_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, who_, ": renaming '", tmp_, "' to '", path_,
                "' failed: ", detail::atomic_file_errno_text(errno));
  } catch (...) {
    discard();
    throw;
  }
  tmp_.clear();
  // Make the rename durable: sync the directory entry (best effort where directories cannot be opened).
  detail::atomic_sync_folder(std::filesystem::path(path_).parent_path());
}
#endif

/// Replaces `path` with `bytes` atomically and durably (temporary file + fsync + rename + fsync of the folder).
/// On any error the previous file is untouched and the temporary file is removed. Stale temporary files of killed
/// writers for the same path are removed first (see AtomicFile).
EMBER_HEADER_INLINE void atomic_write(const std::string& path, std::span<const unsigned char> bytes);
#if EMBER_HEADER_BODIES
EMBER_COLD EMBER_HEADER_INLINE void atomic_write(const std::string& path, std::span<const unsigned char> bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}
#endif

}  // namespace ember
