// ember — atomic file replacement: a reader (or a restart after a crash) sees either the previous file or the
// complete new one, never a partial write. POSIX: write a temporary file in the same folder, fsync it, rename it
// over the target (atomic within a file system), fsync the folder so the rename itself is durable.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>

#include "ember/config.hpp"

namespace ember::io {

namespace detail {
/// Test hook: called with the temporary file's path after it is written and synced, before the rename.
inline std::function<void(const std::string&)> atomic_write_before_rename;

inline std::string errno_text(int e) { return std::strerror(e); }

inline void write_all(int fd, const unsigned char* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    EMBER_CHECK(w > 0, "atomic_write: writing '", path, "' failed: ", errno_text(errno));
    p += w;
    n -= std::size_t(w);
  }
}
}  // namespace detail

/// Replaces `path` with `bytes` atomically and durably (temporary file + fsync + rename + fsync of the folder).
/// On any error the previous file is untouched and the temporary file is removed.
inline void atomic_write(const std::string& path, std::span<const unsigned char> bytes) {
  namespace fs = std::filesystem;
  static std::atomic<unsigned> counter{0};
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                                  std::to_string(counter++)))
                              .string();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  EMBER_CHECK(fd >= 0, "atomic_write: cannot create '", tmp, "' (to replace '", path, "'): ",
              detail::errno_text(errno));
  try {
    detail::write_all(fd, bytes.data(), bytes.size(), tmp);
    EMBER_CHECK(::fsync(fd) == 0, "atomic_write: fsync of '", tmp, "' failed: ", detail::errno_text(errno));
    EMBER_CHECK(::close(fd) == 0, "atomic_write: closing '", tmp, "' failed: ", detail::errno_text(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  try {
    if (detail::atomic_write_before_rename) detail::atomic_write_before_rename(tmp);
    EMBER_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "atomic_write: renaming '", tmp, "' to '", path,
                "' failed: ", detail::errno_text(errno));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable: sync the directory entry (best effort where directories cannot be opened).
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace ember::io
