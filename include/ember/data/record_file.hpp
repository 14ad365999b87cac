// ember — packed record files: many small records (encoded samples) in one file with an index, written once and
// read with random access through mmap. Each record carries a CRC-32C; truncated or corrupt files give errors.
//
// Layout (little-endian):
//   header  "EMBERREC" | u32 version = 1 | u32 flags = 0                                  16 bytes
//   records, back to back
//   index   per record: u64 offset (from the file's start) | u64 size | u32 crc32c(record) | u32 0                 24 bytes each
//   footer  u64 index offset | u64 record count | u32 crc32c(index) | u32 version | "EMBEREND"   32 bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/detail/crc32c.hpp"
#include "ember/data/detail/mapped_file.hpp"
#include "ember/data/detail/staged_file.hpp"

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

/// Writes a record file: write() each record, then close() to add the index and put the file in place.
///
/// The records go to a temporary file next to `path` (core/atomic_file.hpp), renamed over `path` by close(): until
/// then `path` keeps its previous content, and readers that have the previous file open or mapped (RecordReader)
/// keep reading it even after the rename. A writer destroyed without close() (an exception, an early return)
/// abandons the file: the temporary file is removed and `path` is untouched, so a record file at `path` is always
/// complete. A failed write abandons it too.
class RecordWriter {
 public:
  /// Starts a record file that close() will put at `path`.
  explicit RecordWriter(const std::string& path) : file_(path, "RecordWriter") {
    unsigned char h[detail::kRecordHeader] = {};
    std::memcpy(h, detail::kRecordMagic, 8);
    detail::put_u32(h + 8, detail::kRecordVersion);
    file_.put(h, sizeof(h));
  }
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  /// Abandons an unfinished file (see the class comment); call close() to keep it.
  ~RecordWriter() = default;

  /// Appends one record; returns its index.
  std::size_t write(std::span<const unsigned char> record) {
    unsigned char e[detail::kRecordEntry] = {};
    detail::put_u64(e, file_.offset());
    detail::put_u64(e + 8, record.size());
    detail::put_u32(e + 16, detail::crc32c(record.data(), record.size()));
    file_.put(record.data(), record.size());
    index_.insert(index_.end(), e, e + sizeof(e));
    return count_++;
  }
  /// Appends the n bytes at `data` as one record; returns its index.
  std::size_t write(const void* data, std::size_t n) {
    return write(std::span<const unsigned char>(static_cast<const unsigned char*>(data), n));
  }

  /// Writes the index and footer, syncs the file and renames it over the destination. On error the destination is
  /// untouched and the temporary file removed. Does nothing after close() or discard().
  void close() {
    if (!file_.is_open()) return;
    const std::uint64_t index_offset = file_.offset();
    file_.put(index_.data(), index_.size());
    unsigned char footer[detail::kRecordFooter] = {};
    detail::put_u64(footer, index_offset);
    detail::put_u64(footer + 8, count_);
    detail::put_u32(footer + 16, detail::crc32c(index_.data(), index_.size()));
    detail::put_u32(footer + 20, detail::kRecordVersion);
    std::memcpy(footer + 24, detail::kRecordEndMagic, 8);
    file_.put(footer, sizeof(footer));
    file_.commit();
  }
  /// Abandons the file: the temporary file is removed and the destination is untouched.
  void discard() noexcept { file_.discard(); }
  /// The records written so far.
  std::size_t size() const { return count_; }

 private:
  detail::StagedFile file_;  // the temporary file, closed after close(), discard() or a failure
  std::uint64_t count_ = 0;
  std::vector<unsigned char> index_;
};

/// Random access to the records of a record file held in memory (the reader's mapping, or any buffer). The
/// constructor validates the header, footer and index (offsets in range, records back to back, index checksum);
/// record(i) checks the record's checksum.
class RecordView {
 public:
  RecordView() = default;
  /// A view of the record file in `file` (validated; an error naming `name` when it is not a complete one).
  RecordView(std::span<const unsigned char> file, std::string name) : file_(file), name_(std::move(name)) {
    const std::size_t n = file.size();
    EMBER_CHECK(n >= detail::kRecordHeader + detail::kRecordFooter, "RecordReader: ", q(), " is ", n,
                " bytes, too short for a record file (at least ", detail::kRecordHeader + detail::kRecordFooter,
                "); truncated?");
    EMBER_CHECK(std::memcmp(file.data(), detail::kRecordMagic, 8) == 0, "RecordReader: ", q(),
                " is not a record file (it starts with ",
                ember::detail::quote_untrusted(std::string_view(reinterpret_cast<const char*>(file.data()), 8)),
                ", expected \"EMBERREC\")");
    const std::uint32_t version = detail::get_u32(file.data() + 8);
    EMBER_CHECK(version == detail::kRecordVersion, "RecordReader: ", q(), " has format version ", version,
                ", this reader reads version ", detail::kRecordVersion);
    const std::uint32_t flags = detail::get_u32(file.data() + 12);
    EMBER_CHECK(flags == 0, "RecordReader: ", q(), " has header flags ", flags, "; version ", detail::kRecordVersion,
                " defines none (expected 0): the file is corrupt or from a newer writer");
    const unsigned char* footer = file.data() + n - detail::kRecordFooter;
    EMBER_CHECK(std::memcmp(footer + 24, detail::kRecordEndMagic, 8) == 0, "RecordReader: ", q(),
                " does not end with the record-file footer: the file is truncated (the writer did not finish, or "
                "the copy was cut) or corrupt");
    const std::uint32_t footer_version = detail::get_u32(footer + 20);
    EMBER_CHECK(footer_version == version, "RecordReader: ", q(), ": the footer gives format version ",
                footer_version, ", the header ", version, "; the file is corrupt");
    const std::uint64_t index_offset = detail::get_u64(footer), count = detail::get_u64(footer + 8);
    const std::uint64_t data_end = n - detail::kRecordFooter;
    EMBER_CHECK(index_offset >= detail::kRecordHeader && index_offset <= data_end && count <= (data_end - index_offset) / detail::kRecordEntry &&
                    index_offset + count * detail::kRecordEntry == data_end,
                "RecordReader: ", q(), ": the footer's index (offset ", index_offset, ", ", count,
                " records) does not fit the file of ", n, " bytes; the file is corrupt");
    const unsigned char* index = file.data() + index_offset;
    EMBER_CHECK(detail::crc32c(index, count * detail::kRecordEntry) == detail::get_u32(footer + 16),
                "RecordReader: ", q(), ": the index checksum does not match; the file is corrupt");
    std::uint64_t at = detail::kRecordHeader;
    for (std::uint64_t i = 0; i < count; ++i) {
      const unsigned char* e = index + i * detail::kRecordEntry;
      const std::uint64_t off = detail::get_u64(e), size = detail::get_u64(e + 8);
      EMBER_CHECK(off == at && size <= index_offset - off, "RecordReader: ", q(), ": index entry ", i,
                  " (offset ", off, ", size ", size, ") is not inside the record area; the file is corrupt");
      EMBER_CHECK(detail::get_u32(e + 20) == 0, "RecordReader: ", q(), ": index entry ", i,
                  " has a non-zero reserved field; the file is corrupt or from a newer writer");
      at = off + size;
    }
    EMBER_CHECK(at == index_offset, "RecordReader: ", q(), ": the records end at byte ", at,
                " but the index starts at ", index_offset, "; the file is corrupt");
    index_ = index;
    count_ = std::size_t(count);
  }

  /// The number of records.
  std::size_t size() const { return count_; }

  /// Record i, after checking its CRC-32C (pass verify = false to skip the check).
  std::span<const unsigned char> record(std::size_t i, bool verify = true) const {
    EMBER_CHECK(i < count_, "RecordReader: record ", i, " is out of range for ", q(), " with ", count_,
                " records");
    const unsigned char* e = index_ + i * detail::kRecordEntry;
    const std::uint64_t off = detail::get_u64(e), size = detail::get_u64(e + 8);
    const std::span<const unsigned char> r = file_.subspan(std::size_t(off), std::size_t(size));
    if (verify)
      EMBER_CHECK(detail::crc32c(r.data(), r.size()) == detail::get_u32(e + 16), "RecordReader: record ", i, " of ",
                  q(), " is corrupt (CRC-32C mismatch)");
    return r;
  }
  /// record(i), checked.
  std::span<const unsigned char> operator[](std::size_t i) const { return record(i); }
  /// The name errors give the file (its path, for a reader).
  const std::string& name() const { return name_; }

 private:
  // The name, escaped for an error message (a file name may come from a hostile folder).
  std::string q() const { return ember::detail::quote_untrusted(name_, 4096); }

  std::span<const unsigned char> file_;
  std::string name_;
  const unsigned char* index_ = nullptr;
  std::size_t count_ = 0;
};

/// A read-only record file mapped into memory. A cheap handle: copies share the mapping (DataLoader workers read
/// it concurrently; the page cache is shared with every process reading the same file).
class RecordReader {
 public:
  /// Maps the record file at `path` and validates it (see RecordView).
  explicit RecordReader(const std::string& path)
      : map_(std::make_shared<const detail::MappedFile>(path, "RecordReader")) {
    view_ = RecordView(map_->bytes(), path);
  }
  /// The number of records.
  std::size_t size() const { return view_.size(); }
  /// Record i, after checking its CRC-32C (verify = false skips the check); valid while a handle lives.
  std::span<const unsigned char> record(std::size_t i, bool verify = true) const { return view_.record(i, verify); }
  /// record(i), checked.
  std::span<const unsigned char> operator[](std::size_t i) const { return view_.record(i); }
  /// The file's path.
  const std::string& path() const { return view_.name(); }

 private:
  std::shared_ptr<const detail::MappedFile> map_;
  RecordView view_;
};

}  // namespace ember::data
