// ember — packed record files: many small records (encoded samples) in one file with an index, written once and
// read with random access through mmap. Each record carries a CRC-32C; truncated or corrupt files give errors.
//
// Layout (little-endian):
//   header  "EMBERREC" | u32 version = 1 | u32 flags = 0                                  16 bytes
//   records, back to back
//   index   per record: u64 offset (from the file's start) | u64 size | u32 crc32c(record) | u32 0                 24 bytes each
//   footer  u64 index offset | u64 record count | u32 crc32c(index) | u32 version | "EMBEREND"   32 bytes
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/detail/crc32c.hpp"

namespace ember::data {

namespace detail {
inline constexpr char kRecordMagic[8] = {'E', 'M', 'B', 'E', 'R', 'R', 'E', 'C'};
inline constexpr char kRecordEndMagic[8] = {'E', 'M', 'B', 'E', 'R', 'E', 'N', 'D'};
inline constexpr std::uint32_t kRecordVersion = 1;
inline constexpr std::size_t kRecordHeader = 16, kRecordEntry = 24, kRecordFooter = 32;

inline void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace detail

/// Writes a record file: write() each record, then close() (or let the destructor do it) to add the index.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "wb");
    EMBER_CHECK(f_ != nullptr, "RecordWriter: cannot create '", path, "': ", std::strerror(errno));
    unsigned char h[detail::kRecordHeader] = {};
    std::memcpy(h, detail::kRecordMagic, 8);
    detail::put_u32(h + 8, detail::kRecordVersion);
    put(h, sizeof(h));
  }
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  ~RecordWriter() {
    if (f_) {
      try {
        close();
      } catch (...) {  // a destructor must not throw; call close() to see write errors
      }
    }
  }

  /// Appends one record; returns its index.
  std::size_t write(std::span<const unsigned char> record) {
    EMBER_CHECK(f_ != nullptr, "RecordWriter: write after close of '", path_, "'");
    unsigned char e[detail::kRecordEntry] = {};
    detail::put_u64(e, offset_);
    detail::put_u64(e + 8, record.size());
    detail::put_u32(e + 16, detail::crc32c(record.data(), record.size()));
    index_.insert(index_.end(), e, e + sizeof(e));
    put(record.data(), record.size());
    return count_++;
  }
  std::size_t write(const void* data, std::size_t n) {
    return write(std::span<const unsigned char>(static_cast<const unsigned char*>(data), n));
  }

  /// Writes the index and footer, flushes and syncs the file.
  void close() {
    if (!f_) return;
    const std::uint64_t index_offset = offset_;
    put(index_.data(), index_.size());
    unsigned char footer[detail::kRecordFooter] = {};
    detail::put_u64(footer, index_offset);
    detail::put_u64(footer + 8, count_);
    detail::put_u32(footer + 16, detail::crc32c(index_.data(), index_.size()));
    detail::put_u32(footer + 20, detail::kRecordVersion);
    std::memcpy(footer + 24, detail::kRecordEndMagic, 8);
    put(footer, sizeof(footer));
    const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
    const int err = errno;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    EMBER_CHECK(ok && closed, "RecordWriter: finishing '", path_, "' failed: ", std::strerror(err));
  }
  std::size_t size() const { return count_; }

 private:
  void put(const void* p, std::size_t n) {
    if (n == 0) return;
    EMBER_CHECK(std::fwrite(p, 1, n, f_) == n, "RecordWriter: writing '", path_, "' failed: ", std::strerror(errno));
    offset_ += n;
  }
  std::string path_;
  std::FILE* f_ = nullptr;
  std::uint64_t offset_ = 0;
  std::uint64_t count_ = 0;
  std::vector<unsigned char> index_;
};

/// Random access to the records of a record file held in memory (the reader's mapping, or any buffer). The
/// constructor validates the header, footer and index (offsets in range, records back to back, index checksum);
/// record(i) checks the record's checksum.
class RecordView {
 public:
  RecordView() = default;
  RecordView(std::span<const unsigned char> file, std::string name) : file_(file), name_(std::move(name)) {
    const std::size_t n = file.size();
    EMBER_CHECK(n >= detail::kRecordHeader + detail::kRecordFooter, "RecordReader: '", name_, "' is ", n,
                " bytes, too short for a record file (at least ", detail::kRecordHeader + detail::kRecordFooter,
                "); truncated?");
    EMBER_CHECK(std::memcmp(file.data(), detail::kRecordMagic, 8) == 0, "RecordReader: '", name_,
                "' is not a record file (no EMBERREC magic)");
    const std::uint32_t version = detail::get_u32(file.data() + 8);
    EMBER_CHECK(version == detail::kRecordVersion, "RecordReader: '", name_, "' has format version ", version,
                ", this reader reads version ", detail::kRecordVersion);
    const unsigned char* footer = file.data() + n - detail::kRecordFooter;
    EMBER_CHECK(std::memcmp(footer + 24, detail::kRecordEndMagic, 8) == 0, "RecordReader: '", name_,
                "' does not end with the record-file footer: the file is truncated (the writer did not finish, or "
                "the copy was cut) or corrupt");
    const std::uint64_t index_offset = detail::get_u64(footer), count = detail::get_u64(footer + 8);
    const std::uint64_t data_end = n - detail::kRecordFooter;
    EMBER_CHECK(index_offset >= detail::kRecordHeader && index_offset <= data_end && count <= (data_end - index_offset) / detail::kRecordEntry &&
                    index_offset + count * detail::kRecordEntry == data_end,
                "RecordReader: '", name_, "': the footer's index (offset ", index_offset, ", ", count,
                " records) does not fit the file of ", n, " bytes; the file is corrupt");
    const unsigned char* index = file.data() + index_offset;
    EMBER_CHECK(detail::crc32c(index, count * detail::kRecordEntry) == detail::get_u32(footer + 16),
                "RecordReader: '", name_, "': the index checksum does not match; the file is corrupt");
    std::uint64_t at = detail::kRecordHeader;
    for (std::uint64_t i = 0; i < count; ++i) {
      const unsigned char* e = index + i * detail::kRecordEntry;
      const std::uint64_t off = detail::get_u64(e), size = detail::get_u64(e + 8);
      EMBER_CHECK(off == at && size <= index_offset - off, "RecordReader: '", name_, "': index entry ", i,
                  " (offset ", off, ", size ", size, ") is not inside the record area; the file is corrupt");
      at = off + size;
    }
    EMBER_CHECK(at == index_offset, "RecordReader: '", name_, "': the records end at byte ", at,
                " but the index starts at ", index_offset, "; the file is corrupt");
    index_ = index;
    count_ = std::size_t(count);
  }

  std::size_t size() const { return count_; }

  /// Record i, after checking its CRC-32C (pass verify = false to skip the check).
  std::span<const unsigned char> record(std::size_t i, bool verify = true) const {
    EMBER_CHECK(i < count_, "RecordReader: record ", i, " is out of range for '", name_, "' with ", count_,
                " records");
    const unsigned char* e = index_ + i * detail::kRecordEntry;
    const std::uint64_t off = detail::get_u64(e), size = detail::get_u64(e + 8);
    const std::span<const unsigned char> r = file_.subspan(std::size_t(off), std::size_t(size));
    if (verify)
      EMBER_CHECK(detail::crc32c(r.data(), r.size()) == detail::get_u32(e + 16), "RecordReader: record ", i, " of '",
                  name_, "' is corrupt (CRC-32C mismatch)");
    return r;
  }
  std::span<const unsigned char> operator[](std::size_t i) const { return record(i); }
  const std::string& name() const { return name_; }

 private:
  std::span<const unsigned char> file_;
  std::string name_;
  const unsigned char* index_ = nullptr;
  std::size_t count_ = 0;
};

/// A read-only record file mapped into memory. A cheap handle: copies share the mapping (DataLoader workers read
/// it concurrently; the page cache is shared with every process reading the same file).
class RecordReader {
 public:
  explicit RecordReader(const std::string& path) : map_(std::make_shared<Mapping>(path)) {
    view_ = RecordView(map_->bytes(), path);
  }
  std::size_t size() const { return view_.size(); }
  std::span<const unsigned char> record(std::size_t i, bool verify = true) const { return view_.record(i, verify); }
  std::span<const unsigned char> operator[](std::size_t i) const { return view_.record(i); }
  const std::string& path() const { return view_.name(); }

 private:
  struct Mapping {
    void* p = nullptr;
    std::size_t n = 0;
    explicit Mapping(const std::string& path) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      EMBER_CHECK(fd >= 0, "RecordReader: cannot open '", path, "': ", std::strerror(errno));
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        EMBER_CHECK(false, "RecordReader: cannot stat '", path, "': ", std::strerror(err));
      }
      n = std::size_t(st.st_size);
      if (n > 0) {
        p = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0);
        const int err = errno;
        ::close(fd);
        EMBER_CHECK(p != MAP_FAILED, "RecordReader: cannot map '", path, "': ", std::strerror(err));
      } else {
        ::close(fd);
      }
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    ~Mapping() {
      if (p && p != MAP_FAILED) ::munmap(p, n);
    }
    std::span<const unsigned char> bytes() const {
      return {static_cast<const unsigned char*>(p), n};
    }
  };
  std::shared_ptr<Mapping> map_;
  RecordView view_;
};

}  // namespace ember::data
