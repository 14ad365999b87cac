// ember — a whole file mapped read-only into memory: the storage of the record readers (data/record_file.hpp) and
// the tar shard readers (data/tar.hpp). Copies of a reader share one mapping; the page cache is shared with every
// process reading the same file.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "ember/config.hpp"

namespace ember::data::detail {

/// The file at `path`, mapped read-only (an empty file maps to an empty span). Errors name `who` and the file.
class MappedFile {
 public:
  MappedFile(const std::string& path, const char* who) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // O_NONBLOCK: a FIFO fails below, not hangs
    const int open_err = errno;
    EMBER_CHECK(fd >= 0, who, ": cannot open ", ember::detail::quote_untrusted(path, 4096), ": ",
                std::strerror(open_err));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      EMBER_CHECK(false, who, ": cannot stat ", ember::detail::quote_untrusted(path, 4096), ": ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      EMBER_CHECK(false, who, ": ", ember::detail::quote_untrusted(path, 4096), " is not a regular file");
    }
    n_ = std::size_t(st.st_size);
    if (n_ > 0) {
      p_ = ::mmap(nullptr, n_, PROT_READ, MAP_PRIVATE, fd, 0);
      const int err = errno;
      ::close(fd);
      EMBER_CHECK(p_ != MAP_FAILED, who, ": cannot map ", ember::detail::quote_untrusted(path, 4096), ": ",
                  std::strerror(err));
    } else {
      ::close(fd);
    }
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() {
    if (p_ && p_ != MAP_FAILED) ::munmap(p_, n_);
  }
  /// The file's bytes, valid while this object lives.
  std::span<const unsigned char> bytes() const { return {static_cast<const unsigned char*>(p_), n_}; }

 private:
  void* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace ember::data::detail
