// ember — tar archives read in place: the member list of a tar file held in memory (a mapped shard), each regular
// file's bytes a view of that memory (no copy, no extraction). The reader of WebDataset shards
// (data/image_tar.hpp), with WebDataset's rules for member names (detail::webdataset_split); the format is POSIX
// ustar and its two extensions that every writer in use produces: GNU (long names in 'L' members, base-256 sizes)
// and POSIX pax (path and size in 'x' headers).
//
//   data::TarReader tar("train-000000.tar");
//   for (const data::TarMember& m : tar.members()) use(m.name, tar.data(m));
//
// What a member header holds is read as Python's tarfile reads it (the reader of WebDataset's Python loader): the
// checksum may be the unsigned or the signed byte sum; numbers are octal text (leading spaces, NUL or space
// terminated) or GNU base-256; the archive ends at its first all-zero block or at the end of the file; a ustar
// name is prefix + "/" + name. Only regular files ('0', NUL, '7') are members; links, folders, devices and FIFOs are
// passed over (their data is never followed), and so are vendor types, whose data is skipped by their size. Pax
// global headers ('g') are read and ignored. Deliberate differences: a corrupt header after the first one is an
// error (tarfile ends the archive there without a word, dropping the rest); sparse members (GNU 'S' or pax
// GNU.sparse.*) and multi-volume continuations ('M') are refused, not reassembled.
//
// The file is untrusted: every size is checked against the bytes that are there before it is used, the checksum of
// every header is verified, and names, extended headers and the member count are bounded (TarLimits), so a hostile
// archive costs an ember::Error naming the file and the byte offset, never a large allocation or a read outside the
// file.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/config.hpp"
#include "ember/data/detail/mapped_file.hpp"
#include "ember/data/detail/staged_file.hpp"

namespace ember::data {

/// Bounds on what a tar file may declare (files are untrusted).
struct TarLimits {
  std::size_t max_members = std::size_t(1) << 24;            ///< regular files in one archive
  std::size_t max_name_bytes = 4096;                         ///< one member's name (PATH_MAX)
  std::size_t max_extended_header_bytes = std::size_t(1) << 20;  ///< one pax header or GNU long-name member
};

/// A regular file in a tar archive: its full name and where its bytes lie.
struct TarMember {
  std::string name;           ///< as stored: pax path, GNU long name, or ustar prefix + "/" + name
  std::uint64_t offset = 0;   ///< of the first data byte, from the archive's start
  std::uint64_t size = 0;     ///< data bytes
  std::uint64_t header = 0;   ///< offset of the member's (first) header block, for error messages
};

namespace detail {
inline constexpr std::size_t kTarBlock = 512;

// A NUL-terminated field of at most n bytes.
inline std::string_view tar_string(const unsigned char* p, std::size_t n) {
  const void* z = std::memchr(p, 0, n);
  return {reinterpret_cast<const char*>(p), z ? std::size_t(static_cast<const unsigned char*>(z) - p) : n};
}

// A numeric field (tarfile's nti): GNU base-256 when the first byte is 0x80 (0xff, negative, is refused), else octal
// text up to the first NUL, surrounding spaces allowed, empty meaning 0. False when it is neither.
inline bool tar_number(const unsigned char* p, std::size_t n, std::uint64_t& out) {
  out = 0;
  if (p[0] == 0x80) {
    for (std::size_t i = 1; i < n; ++i) {
      if (out > (~std::uint64_t(0) >> 8)) return false;
      out = (out << 8) | p[i];
    }
    return true;
  }
  if (p[0] == 0xff) return false;
  std::string_view s = tar_string(p, n);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  for (char c : s) {
    if (c < '0' || c > '7' || out > (~std::uint64_t(0) >> 3)) return false;
    out = (out << 3) | std::uint64_t(c - '0');
  }
  return true;
}

inline bool tar_zero_block(const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i]) return false;
  return true;
}

/// webdataset's base_plus_ext: key = name up to the first "." of its last component (or, when that component starts
/// with ".", of the whole name), field = the rest. False when the name has no such ".".
inline bool webdataset_split(std::string_view name, std::string_view& key, std::string_view& field) {
  // The regex ^((?:.*/|)[^.]+)[.]([^/]*)$ tries the start after each "/", the last first, then the name's start.
  std::size_t start = name.size();
  for (;;) {
    const std::size_t slash = start == 0 ? std::string_view::npos : name.rfind('/', start - 1);
    const std::size_t s = slash == std::string_view::npos ? 0 : slash + 1;
    if (s < name.size() && name[s] != '.') {
      const std::size_t dot = name.find('.', s);
      if (dot != std::string_view::npos && name.find('/', dot + 1) == std::string_view::npos) {
        key = name.substr(0, dot);
        field = name.substr(dot + 1);
        return true;
      }
    }
    if (s == 0) return false;
    start = s - 1;
  }
}
/// webdataset's metadata rule: a name whose first component is "__...__" is not part of a sample.
inline bool webdataset_meta(std::string_view name) {
  const std::string_view first = name.substr(0, name.find('/'));
  return first.size() >= 4 && first.substr(0, 2) == "__" && first.substr(first.size() - 2) == "__";
}
}  // namespace detail

/// The members of a tar archive held in memory (see the file comment); validated when constructed.
class TarView {
 public:
  /// An archive of no members.
  TarView() = default;
  /// Lists the regular files of the archive in `file`; errors name `name`.
  TarView(std::span<const unsigned char> file, std::string name, TarLimits limits = {})
      : file_(file), name_(std::move(name)) {
    using detail::kTarBlock;
    const std::size_t n = file.size();
    EMBER_CHECK(n > 0, "TarReader: ", q(), " is empty (0 bytes), not a tar archive");
    std::optional<std::string> next_name;  // from a GNU 'L' member or a pax 'x' header, for the next member
    std::optional<std::uint64_t> next_size;
    std::uint64_t ext_at = 0;               // the first header of the member being assembled
    bool pending = false;                   // an extension header waits for its member
    std::size_t pos = 0;
    while (pos < n) {
      const std::size_t left = n - pos;
      const unsigned char* h = file.data() + pos;
      if (left < kTarBlock) {
        EMBER_CHECK(detail::tar_zero_block(h, left), "TarReader: ", q(), " ends inside a header (", left,
                    " bytes at byte ", pos, " are not a whole 512-byte block): the file is truncated");
        break;
      }
      if (detail::tar_zero_block(h, kTarBlock)) break;  // the end-of-archive marker
      check_header(h, pos);
      if (!pending) ext_at = pos;
      const char type = char(h[156]);
      std::uint64_t size = 0;
      EMBER_CHECK(detail::tar_number(h + 124, 12, size), "TarReader: ", q(), ": the header at byte ", pos,
                  " has the size field ", quote_field(h + 124, 12), ", not a size");
      const bool regular = type == '0' || type == '\0' || type == '7';
      if (regular && next_size) size = *next_size;
      const std::size_t data = pos + kTarBlock;
      const bool has_data = !(type >= '1' && type <= '6');  // links, devices, folders, FIFOs: size is not data
      if (has_data)
        EMBER_CHECK(size <= n - data, "TarReader: ", q(), ": the member whose header is at byte ", pos,
                    " declares ", size, " bytes of data but only ", n - data,
                    " bytes follow its header: the file is truncated");
      const std::size_t end = has_data ? data + std::size_t((size + kTarBlock - 1) / kTarBlock * kTarBlock) : data;
      const std::span<const unsigned char> body = file.subspan(data, has_data ? std::size_t(size) : 0);
      if (type == 'x' || type == 'g') {
        EMBER_CHECK(size <= limits.max_extended_header_bytes, "TarReader: ", q(), ": the pax header at byte ", pos,
                    " is ", size, " bytes, more than the limit of ", limits.max_extended_header_bytes,
                    " (TarLimits::max_extended_header_bytes)");
        if (type == 'x') {
          read_pax(body, pos, limits, next_name, next_size);
          pending = true;
        }
      } else if (type == 'L') {
        EMBER_CHECK(size <= limits.max_name_bytes + 1, "TarReader: ", q(), ": the GNU long name at byte ", pos,
                    " is ", size, " bytes, more than the limit of ", limits.max_name_bytes,
                    " (TarLimits::max_name_bytes)");
        next_name = std::string(detail::tar_string(body.data(), body.size()));
        pending = true;
      } else if (type == 'K') {
        pending = true;  // a long link target: links are not members
      } else if (type == 'S' || type == 'M') {
        EMBER_CHECK(false, "TarReader: ", q(), ": the member at byte ", pos, " is a GNU ",
                    type == 'S' ? "sparse file" : "multi-volume continuation",
                    ", which this reader does not reassemble; write the archive without --sparse / --multi-volume");
      } else {
        if (regular) {
          std::string member = next_name ? std::move(*next_name) : header_name(h);
          EMBER_CHECK(member.size() <= limits.max_name_bytes, "TarReader: ", q(), ": the member at byte ", ext_at,
                      " has a name of ", member.size(), " bytes, more than the limit of ", limits.max_name_bytes,
                      " (TarLimits::max_name_bytes)");
          // A V7 archive marks a folder as a regular file whose name ends in '/' (tarfile reads it as one).
          if (!(type == '\0' && !member.empty() && member.back() == '/')) {
            EMBER_CHECK(members_.size() < limits.max_members, "TarReader: ", q(), " has more than ",
                        limits.max_members, " files (TarLimits::max_members)");
            members_.push_back(TarMember{std::move(member), data, size, ext_at});
          }
        }
        next_name.reset();
        next_size.reset();
        pending = false;
      }
      pos = end;
    }
    EMBER_CHECK(!pending, "TarReader: ", q(), " ends after an extended header (at byte ", ext_at,
                ") with no member for it: the file is truncated");
  }

  /// The regular files, in archive order.
  const std::vector<TarMember>& members() const { return members_; }
  /// The number of regular files.
  std::size_t size() const { return members_.size(); }
  /// A member's bytes (a view of the archive's memory).
  std::span<const unsigned char> data(const TarMember& m) const {
    return file_.subspan(std::size_t(m.offset), std::size_t(m.size));
  }
  /// The name errors give the archive (its path, for a reader).
  const std::string& name() const { return name_; }

 private:
  std::string q() const { return ember::detail::quote_untrusted(name_, 4096); }
  static std::string quote_field(const unsigned char* p, std::size_t n) {
    return ember::detail::quote_untrusted(std::string_view(reinterpret_cast<const char*>(p), n));
  }

  // The stored checksum must be the unsigned or the signed sum of the block with the checksum field as spaces.
  void check_header(const unsigned char* h, std::size_t pos) const {
    std::uint64_t stored = 0;
    const bool parsed = detail::tar_number(h + 148, 8, stored);
    std::int64_t usum = 0, ssum = 0;
    for (std::size_t i = 0; i < detail::kTarBlock; ++i) {
      const bool field = i >= 148 && i < 156;
      usum += field ? ' ' : h[i];
      ssum += field ? ' ' : static_cast<signed char>(h[i]);
    }
    if (parsed && (std::int64_t(stored) == usum || std::int64_t(stored) == ssum)) return;
    const bool ustar = std::memcmp(h + 257, "ustar", 5) == 0;
    EMBER_CHECK(pos != 0 || ustar, "TarReader: ", q(), " is not a tar file (its first block has no valid tar header: "
                "checksum field ", quote_field(h + 148, 8), ", no \"ustar\" magic)");
    EMBER_CHECK(false, "TarReader: ", q(), ": the header at byte ", pos, " is corrupt (its checksum field is ",
                quote_field(h + 148, 8), ", the block sums to ", usum, ")");
  }

  // ustar: prefix (only in POSIX "ustar\0" headers; GNU headers keep other fields there) + "/" + name.
  static std::string header_name(const unsigned char* h) {
    std::string name(detail::tar_string(h, 100));
    if (std::memcmp(h + 257, "ustar\0", 6) == 0) {
      const std::string_view prefix = detail::tar_string(h + 345, 155);
      if (!prefix.empty()) name = std::string(prefix) + "/" + name;
    }
    return name;
  }

  // Pax records: "<length> <key>=<value>\n", the length counting the whole record.
  void read_pax(std::span<const unsigned char> body, std::size_t pos, const TarLimits& limits,
                std::optional<std::string>& path, std::optional<std::uint64_t>& size) const {
    const std::string_view s(reinterpret_cast<const char*>(body.data()), body.size());
    std::size_t at = 0;
    while (at < s.size() && s[at] != '\0') {
      const std::size_t sp = s.find(' ', at);
      unsigned long long len = 0;
      const bool ok = sp != std::string_view::npos && sp > at &&
                      ember::detail::parse_uint(s.substr(at, sp - at), len, s.size() - at) && len > sp - at + 1 &&
                      s[at + std::size_t(len) - 1] == '\n';
      EMBER_CHECK(ok, "TarReader: ", q(), ": the pax header at byte ", pos, " has a malformed record at offset ", at,
                  " (", ember::detail::quote_untrusted(s.substr(at, std::min<std::size_t>(s.size() - at, 40))), ")");
      const std::string_view rec = s.substr(sp + 1, std::size_t(len) - (sp - at) - 2);
      const std::size_t eq = rec.find('=');
      EMBER_CHECK(eq != std::string_view::npos && eq > 0, "TarReader: ", q(), ": the pax header at byte ", pos,
                  " has a record without key=value at offset ", at);
      const std::string_view key = rec.substr(0, eq), value = rec.substr(eq + 1);
      if (key == "path") {
        EMBER_CHECK(value.size() <= limits.max_name_bytes, "TarReader: ", q(), ": the pax path at byte ", pos, " is ",
                    value.size(), " bytes, more than the limit of ", limits.max_name_bytes,
                    " (TarLimits::max_name_bytes)");
        path = std::string(value);
      } else if (key == "size") {
        unsigned long long v = 0;
        EMBER_CHECK(ember::detail::parse_uint(value, v, ~0ull), "TarReader: ", q(), ": the pax header at byte ", pos,
                    " gives the size ", ember::detail::quote_untrusted(value), ", not a whole number");
        size = std::uint64_t(v);
      } else if (key.substr(0, 11) == "GNU.sparse.") {
        EMBER_CHECK(false, "TarReader: ", q(), ": the member after the pax header at byte ", pos,
                    " is a sparse file, which this reader does not reassemble");
      }
      at += std::size_t(len);
    }
  }

  std::span<const unsigned char> file_;
  std::string name_;
  std::vector<TarMember> members_;
};

/// A tar file mapped read-only and listed (TarView). A cheap handle: copies share the mapping.
class TarReader {
 public:
  /// Maps the archive at `path` and lists its members.
  explicit TarReader(const std::string& path, TarLimits limits = {})
      : map_(std::make_shared<const detail::MappedFile>(path, "TarReader")),
        view_(std::make_shared<const TarView>(map_->bytes(), path, limits)) {}
  /// The regular files, in archive order.
  const std::vector<TarMember>& members() const { return view_->members(); }
  /// The number of regular files.
  std::size_t size() const { return view_->size(); }
  /// A member's bytes, valid while a handle lives.
  std::span<const unsigned char> data(const TarMember& m) const { return view_->data(m); }
  /// The archive's path.
  const std::string& path() const { return view_->name(); }

 private:
  std::shared_ptr<const detail::MappedFile> map_;
  std::shared_ptr<const TarView> view_;
};

/// Writes a tar archive that tar, Python's tarfile and webdataset read: add() each file, then close() to end the
/// archive and put it in place. Members are POSIX ustar regular files (mode 0644, owner 0, time 0); a name longer
/// than ustar holds (100 bytes, or a 155-byte prefix + "/" + 100 bytes) gets a pax header, as tarfile writes it.
/// Like RecordWriter, the archive goes to a temporary file renamed over `path` by close(); a writer destroyed
/// without close(), or after a failed write, leaves `path` untouched.
class TarWriter {
 public:
  /// Starts an archive that close() will put at `path`.
  explicit TarWriter(const std::string& path) : file_(path, "TarWriter") {}
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  /// Appends a regular file. Names are at most TarLimits::max_name_bytes, not empty, without NUL bytes.
  void add(std::string_view name, std::span<const unsigned char> data) {
    const std::string q = ember::detail::quote_untrusted(name, 4096);
    EMBER_CHECK(!name.empty() && name.size() <= TarLimits{}.max_name_bytes &&
                    name.find('\0') == std::string_view::npos,
                "TarWriter: the member name ", q, " (", name.size(), " bytes) is not a name tar can hold (1 to ",
                TarLimits{}.max_name_bytes, " bytes, no NUL)");
    std::string_view prefix, base = name;
    if (name.size() > 100) {  // a ustar split at a "/": prefix up to 155 bytes, name up to 100
      const std::size_t cut = name.size() > 256 ? std::string_view::npos : name.rfind('/', 155);
      if (cut != std::string_view::npos && cut > 0 && name.size() - cut - 1 <= 100 && name.size() - cut - 1 > 0) {
        prefix = name.substr(0, cut);
        base = name.substr(cut + 1);
      } else {
        std::string rec = " path=" + std::string(name) + "\n";
        std::size_t len = rec.size() + 1;
        while (std::to_string(len).size() + rec.size() != len) ++len;  // the length counts its own digits
        rec = std::to_string(len) + rec;
        header("PaxHeader", {}, rec.size(), 'x');
        body(std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(rec.data()), rec.size()));
        base = name.substr(name.size() - std::min<std::size_t>(name.size(), 100));  // for tools without pax
        base = base.substr(base.find('/') == std::string_view::npos ? 0 : base.find('/') + 1);
      }
    }
    header(base, prefix, data.size(), '0');
    body(data);
    ++count_;
  }
  /// add(name, the n bytes at `data`).
  void add(std::string_view name, const void* data, std::size_t n) {
    add(name, std::span<const unsigned char>(static_cast<const unsigned char*>(data), n));
  }
  /// Ends the archive (two zero blocks, then zeros to a multiple of 10240 bytes, as tar and tarfile do), syncs it
  /// and renames it over the destination. Does nothing after close() or discard().
  void close() {
    if (!file_.is_open()) return;
    const std::uint64_t end = file_.offset() + 2 * detail::kTarBlock;
    const std::size_t pad = std::size_t(2 * detail::kTarBlock + (10240 - end % 10240) % 10240);
    const std::vector<unsigned char> zeros(pad, 0);
    file_.put(zeros.data(), zeros.size());
    file_.commit();
  }
  /// Abandons the archive: the temporary file is removed and the destination is untouched.
  void discard() noexcept { file_.discard(); }
  /// The files added so far.
  std::size_t size() const { return count_; }

 private:
  void header(std::string_view name, std::string_view prefix, std::uint64_t size, char type) {
    EMBER_CHECK(size < (std::uint64_t(1) << 33), "TarWriter: a member of ", size,
                " bytes; this writer's ustar headers hold sizes below 8 GiB");
    unsigned char h[detail::kTarBlock] = {};
    const auto text = [&](std::size_t at, std::string_view v) {
      if (!v.empty()) std::memcpy(h + at, v.data(), v.size());  // (an empty view's data() may be null)
    };
    const auto octal = [&](std::size_t at, std::size_t width, std::uint64_t v) {  // width - 1 digits, then NUL
      for (std::size_t i = width - 1; i-- > 0; v >>= 3) h[at + i] = static_cast<unsigned char>('0' + (v & 7));
    };
    text(0, name);
    octal(100, 8, 0644);
    octal(108, 8, 0);
    octal(116, 8, 0);
    octal(124, 12, size);
    octal(136, 12, 0);
    h[156] = static_cast<unsigned char>(type);
    text(257, std::string_view("ustar\0" "00", 8));
    octal(329, 8, 0);
    octal(337, 8, 0);
    text(345, prefix);
    std::memset(h + 148, ' ', 8);
    std::uint64_t sum = 0;
    for (unsigned char c : h) sum += c;
    octal(148, 7, sum);  // six digits, a NUL, and the space already there
    h[154] = 0;
    file_.put(h, sizeof(h));
  }
  void body(std::span<const unsigned char> data) {
    file_.put(data.data(), data.size());
    static constexpr unsigned char zeros[detail::kTarBlock] = {};
    file_.put(zeros, (detail::kTarBlock - data.size() % detail::kTarBlock) % detail::kTarBlock);
  }

  detail::StagedFile file_;
  std::size_t count_ = 0;
};

}  // namespace ember::data
