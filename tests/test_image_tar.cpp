// WebDataset tar shards (data/tar.hpp, data/image_tar.hpp): archives written by GNU tar (gnu, ustar, pax formats)
// and Python's tarfile list the members tarfile lists and group into the samples the Python webdataset package
// yields (tests/fixtures/gen_tar.py wrote both); a shard of an ImageFolder's images gives the folder's batches for 0,
// 1 and 2 workers; brace patterns expand as the shell's; truncated, corrupt and hostile archives are errors naming
// the file and the byte offset, and bad shards are errors naming the shard and the sample.
#include <doctest/doctest.h>

#include <ember/data/dataloader.hpp>
#include <ember/data/image_folder.hpp>
#include <ember/data/image_records.hpp>
#include <ember/data/image_tar.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "image_helpers.hpp"

using namespace ember;
using ember_test::bytes_of;
using ember_test::image_batches;
using ember_test::expect_error;
namespace tr = ember::data::transforms;

namespace {
const std::string kImages = std::string(EMBER_TEST_FIXTURES) + "/images/";
const std::string kTar = kImages + "tar/";

// expected.txt: per shard, tarfile's regular members and webdataset's samples.
struct Expected {
  std::vector<std::pair<std::uint64_t, std::string>> members;           // size, name
  std::vector<std::tuple<std::int64_t, std::string, std::string>> samples;  // label, field, key
};
std::map<std::string, Expected> expected() {
  std::map<std::string, Expected> out;
  std::ifstream f(kTar + "expected.txt");
  REQUIRE(f.good());
  std::string line, shard;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("split\t", 0) == 0) continue;
    const std::size_t a = line.find(' ');
    const std::string kind = line.substr(0, a), rest = line.substr(a + 1);
    if (kind == "shard") {
      shard = rest;
      continue;
    }
    const std::size_t b = rest.find(' ');
    if (kind == "member") {
      out[shard].members.emplace_back(std::stoull(rest.substr(0, b)), rest.substr(b + 1));
    } else {
      REQUIRE(kind == "sample");
      const std::size_t c = rest.find(' ', b + 1);
      out[shard].samples.emplace_back(std::stoll(rest.substr(0, b)), rest.substr(b + 1, c - b - 1),
                                      rest.substr(c + 1));
    }
  }
  return out;
}

std::vector<std::string> names(const data::TarView& t) {
  std::vector<std::string> n;
  for (const data::TarMember& m : t.members()) n.push_back(m.name);
  return n;
}

// Header k (0-based, counting every 512-byte header block) of an archive, as found by walking it.
std::size_t header_at(const std::vector<unsigned char>& a, std::size_t k) {
  std::size_t pos = 0;
  for (std::size_t i = 0; i < k; ++i) {
    std::uint64_t size = 0;
    REQUIRE(data::detail::tar_number(a.data() + pos + 124, 12, size));
    const char type = char(a[pos + 156]);
    pos += 512 + ((type >= '1' && type <= '6') ? 0 : (size + 511) / 512 * 512);
  }
  return pos;
}
// Rewrites header `h`'s checksum field to match its bytes (so that a test edits one field and nothing else is wrong).
void fix_checksum(std::vector<unsigned char>& a, std::size_t h) {
  std::memset(a.data() + h + 148, ' ', 8);
  unsigned sum = 0;
  for (std::size_t i = 0; i < 512; ++i) sum += a[h + i];
  std::snprintf(reinterpret_cast<char*>(a.data() + h + 148), 8, "%06o", sum);
  a[h + 155] = ' ';
}
void set_field(std::vector<unsigned char>& a, std::size_t h, std::size_t off, std::size_t n, const std::string& v) {
  std::memset(a.data() + h + off, 0, n);
  std::memcpy(a.data() + h + off, v.data(), std::min(n, v.size()));
  fix_checksum(a, h);
}

}  // namespace

TEST_CASE("TarReader: the members of GNU tar's gnu/ustar/pax archives and tarfile's are tarfile's") {
  const auto want = expected();
  for (const char* shard : {"gnu.tar", "ustar.tar", "pax.tar", "python.tar", "folder.tar"}) {
    CAPTURE(shard);
    REQUIRE(want.count(shard) == 1);
    const data::TarReader tar(kTar + shard);
    const Expected& e = want.at(shard);
    REQUIRE(tar.size() == e.members.size());
    for (std::size_t i = 0; i < tar.size(); ++i) {
      CHECK(tar.members()[i].name == e.members[i].second);
      CHECK(tar.members()[i].size == e.members[i].first);
      CHECK(tar.data(tar.members()[i]).size() == e.members[i].first);
    }
  }
  // The bytes are the file's: the JPEG in gnu.tar is images/folder/B/x.jpg.
  const data::TarReader gnu(kTar + "gnu.tar");
  const std::vector<unsigned char> jpg = bytes_of(kImages + "folder/B/x.jpg");
  bool found = false;
  for (const data::TarMember& m : gnu.members())
    if (m.name == "./s0000.jpg") {
      const auto d = gnu.data(m);
      CHECK(std::vector<unsigned char>(d.begin(), d.end()) == jpg);
      found = true;
    }
  CHECK(found);
}

TEST_CASE("WebDataset: the samples of each shard are the webdataset package's") {
  const auto want = expected();
  for (const char* shard : {"gnu.tar", "ustar.tar", "pax.tar", "python.tar", "folder.tar"}) {
    CAPTURE(shard);
    const data::WebDataset ds({kTar + shard});
    const Expected& e = want.at(shard);
    REQUIRE(ds.size() == e.samples.size());
    std::int64_t max_label = 0;
    for (std::size_t i = 0; i < ds.size(); ++i) {
      const auto& [label, field, key] = e.samples[i];
      CHECK(ds.target(i) == label);
      CHECK(ds.key(i) == key + "." + field);
      CHECK(ds.source()->name(i) == kTar + shard + "#" + key + "." + field);
      CHECK(ds.get(i).target == label);
      max_label = std::max(max_label, label);
    }
    CHECK(ds.num_classes() == max_label + 1);
    CHECK(ds.num_shards() == 1);
    CHECK(ds.skipped() == 0);
  }
  // Several shards: a brace pattern, a list, a folder (every *.tar, sorted).
  const data::WebDataset three({kTar + "{gnu,ustar,pax}.tar"});
  CHECK(three.num_shards() == 3);
  CHECK(three.size() == want.at("gnu.tar").samples.size() * 2 + want.at("pax.tar").samples.size());
  CHECK(three.key(three.size() - 1) == "./ünï/日本.jpg");
  const data::WebDataset two({kTar + "python.tar", kTar + "folder.tar"}, {.num_classes = 10});
  CHECK(two.size() == want.at("python.tar").samples.size() + want.at("folder.tar").samples.size());
  CHECK(two.num_classes() == 10);
}

TEST_CASE("WebDataset: a shard of an ImageFolder's images gives the folder's batches for 0, 1 and 2 workers") {
  const data::ImageFolder folder(kImages + "folder");
  const data::WebDataset shard({kTar + "folder.tar"});
  REQUIRE(shard.size() == folder.size());
  std::vector<unsigned char> scratch;
  for (std::size_t i = 0; i < shard.size(); ++i) {
    CAPTURE(i);
    CHECK(shard.target(i) == folder.target(i));
    const auto b = shard.source()->bytes(i, scratch);
    CHECK(std::vector<unsigned char>(b.begin(), b.end()) == bytes_of(folder.path(i)));
  }
  const std::vector<data::Batch> want = image_batches(folder, 0);
  for (int workers : {0, 1, 2}) {
    CAPTURE(workers);
    ember_test::check_same_batches(image_batches(shard, workers), want);
  }
  // The shard order visits every sample once.
  std::vector<std::size_t> order = data::ShardShuffleSampler{.seed = 1, .block = 4, .window = 2}.indices(shard.size(), 0);
  std::sort(order.begin(), order.end());
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == i);
}

TEST_CASE("WebDataset: member names split into key and field, and metadata names, as webdataset's rules do") {
  std::ifstream f(kTar + "expected.txt");
  std::string line;
  int cases = 0;
  while (std::getline(f, line)) {
    if (line.rfind("split\t", 0) != 0) continue;
    std::vector<std::string> col;
    for (std::size_t at = 0;;) {
      const std::size_t tab = line.find('\t', at);
      col.push_back(line.substr(at, tab == std::string::npos ? tab : tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    REQUIRE(col.size() == 5);
    CAPTURE(col[1]);
    std::string_view key, field;
    const bool split = data::detail::webdataset_split(col[1], key, field);
    CHECK(split == (col[2] != "-"));
    if (split && col[2] != "-") {
      CHECK(key == col[2]);
      CHECK(field == col[3]);
    }
    CHECK(data::detail::webdataset_meta(col[1]) == (col[4] == "meta"));
    ++cases;
  }
  CHECK(cases >= 20);
}

TEST_CASE("expand_braces: ranges with the ends' zero padding, lists, combinations, as the shell expands them") {
  using V = std::vector<std::string>;
  CHECK(data::expand_braces("train.tar") == V{"train.tar"});
  CHECK(data::expand_braces("s-{000..003}.tar") == V{"s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"});
  CHECK(data::expand_braces("{8..11}") == V{"8", "9", "10", "11"});
  CHECK(data::expand_braces("{08..11}") == V{"08", "09", "10", "11"});
  CHECK(data::expand_braces("{3..1}") == V{"3", "2", "1"});
  CHECK(data::expand_braces("{-1..1}") == V{"-1", "0", "1"});
  CHECK(data::expand_braces("{-01..1}") == V{"-01", "000", "001"});
  CHECK(data::expand_braces("{a,b}-{1..2}") == V{"a-1", "a-2", "b-1", "b-2"});
  CHECK(data::expand_braces("{a,,b}") == V{"a", "", "b"});
  CHECK(data::expand_braces("x{y}z") == V{"x{y}z"});
  CHECK(data::expand_braces("x{1..y}z") == V{"x{1..y}z"});
  CHECK(data::expand_braces("open{1..2") == V{"open{1..2"});
  expect_error(__LINE__, [] { data::expand_braces("{0..99999999999}"); }, {"expand_braces", "more than"});
  expect_error(__LINE__, [] { data::expand_braces("{0..99}-{0..99}", 1000); }, {"more than 1000"});
  expect_error(__LINE__, [] { data::expand_braces("{-9223372036854775807..9223372036854775807}"); },
               {"more than"});
}

TEST_CASE("TarView: truncated, corrupt and hostile archives are errors naming the file and the byte offset") {
  const std::vector<unsigned char> good = bytes_of(kTar + "gnu.tar");
  const data::TarView full(good, "gnu.tar");
  const std::vector<std::string> all = names(full);
  REQUIRE(all.size() == 12);
  auto view = [](const std::vector<unsigned char>& a, data::TarLimits l = {}) {
    return [a, l] { data::TarView(a, "hostile.tar", l); };
  };

  // Cut anywhere: an error, or (cut between members) a prefix of the members, every one inside the bytes.
  std::size_t errors = 0, prefixes = 0;
  for (std::size_t cut = 1; cut < good.size(); cut += (cut % 512 == 0 ? 1 : 97)) {
    CAPTURE(cut);
    const std::vector<unsigned char> a(good.begin(), good.begin() + std::ptrdiff_t(cut));
    try {
      const data::TarView t(a, "cut.tar");
      const std::vector<std::string> n = names(t);
      REQUIRE(n.size() <= all.size());
      CHECK(std::equal(n.begin(), n.end(), all.begin()));
      for (const data::TarMember& m : t.members()) CHECK(m.offset + m.size <= cut);
      ++prefixes;
    } catch (const ember::Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("cut.tar") != std::string::npos);
      CHECK(msg.find("truncated") != std::string::npos);
      ++errors;
    }
  }
  CHECK(errors > 20);
  CHECK(prefixes > 5);

  // A flipped byte in a later header (a regular file's): its checksum no longer matches.
  std::size_t k2 = 2;
  while (good[header_at(good, k2) + 156] != '0') ++k2;
  const std::size_t h2 = header_at(good, k2);
  std::vector<unsigned char> a = good;
  a[h2 + 10] ^= 0x20;
  const std::string at2 = "the header at byte " + std::to_string(h2);
  expect_error(__LINE__, view(a), {"hostile.tar", at2.c_str(), "is corrupt", "checksum"});
  // Not a tar file at all.
  expect_error(__LINE__, view(bytes_of(kImages + "folder/B/x.jpg")), {"hostile.tar", "is not a tar file"});
  expect_error(__LINE__, view({}), {"hostile.tar", "is empty"});
  // A size that runs past the end; one that is not octal; GNU base-256 (read) and negative base-256 (refused).
  a = good;
  set_field(a, h2, 124, 12, "77777777777");
  expect_error(__LINE__, view(a), {"declares 8589934591 bytes", "truncated"});
  a = good;
  set_field(a, h2, 124, 12, "12x");
  expect_error(__LINE__, view(a), {"size field", "not a size"});
  a = good;
  {
    std::uint64_t size = 0;
    REQUIRE(data::detail::tar_number(good.data() + h2 + 124, 12, size));
    std::string b256(12, '\0');
    b256[0] = char(0x80);
    b256[10] = char(size >> 8);
    b256[11] = char(size & 0xff);
    set_field(a, h2, 124, 12, b256);
    CHECK(names(data::TarView(a, "b256.tar")) == all);
    b256[0] = char(0xff);
    set_field(a, h2, 124, 12, b256);
    expect_error(__LINE__, view(a), {"not a size"});
    b256.assign(12, char(0xff));
    b256[0] = char(0x80);
    set_field(a, h2, 124, 12, b256);
    expect_error(__LINE__, view(a), {"not a size"});
  }
  // A trailing partial block that is not zeros.
  a = good;
  a.resize(full.members().back().offset + 512 + 100, 0);
  a.back() = 1;
  expect_error(__LINE__, view(a), {"ends inside a header", "truncated"});
  // Sparse and multi-volume members are refused; an extension header with no member after it is truncation.
  a = good;
  set_field(a, h2, 156, 1, "S");
  expect_error(__LINE__, view(a), {"sparse"});
  set_field(a, h2, 156, 1, "M");
  expect_error(__LINE__, view(a), {"multi-volume"});
  std::size_t kl = 0;
  while (good[header_at(good, kl) + 156] != 'L') ++kl;
  a = good;
  a.resize(header_at(good, kl + 1));  // the GNU long name, then the end of the file
  expect_error(__LINE__, view(a), {"ends after an extended header", "truncated"});

  // Limits: the member count, a GNU long name, a pax path, a pax header's size.
  expect_error(__LINE__, view(good, {.max_members = 11}), {"more than 11 files", "max_members"});
  expect_error(__LINE__, view(good, {.max_name_bytes = 100}), {"GNU long name", "max_name_bytes"});
  const std::vector<unsigned char> pax = bytes_of(kTar + "pax.tar");
  expect_error(__LINE__, view(pax, {.max_name_bytes = 60}), {"pax path", "max_name_bytes"});
  expect_error(__LINE__, view(pax, {.max_extended_header_bytes = 20}), {"pax header", "max_extended_header_bytes"});
  CHECK(data::TarView(pax, "pax.tar").size() == 14);
  // Malformed pax records: a length past the header, a length that is not a number, a record without "=".
  std::size_t x = 0;
  while (pax[x + 156] != 'x') x += 512;
  std::uint64_t xsize = 0;
  REQUIRE(data::detail::tar_number(pax.data() + x + 124, 12, xsize));
  const std::pair<std::string, const char*> records[] = {
      {"999 path=a\n", "malformed record"}, {"1x path=a\n", "malformed record"}, {"9 pathx\n", "without key=value"}};
  for (const auto& r : records) {
    const std::string& rec = r.first;  // not a structured binding: clang 14 cannot capture one (CAPTURE)
    const char* why = r.second;
    CAPTURE(rec);
    REQUIRE(rec.size() < xsize);
    a = pax;
    std::memset(a.data() + x + 512, '\n', std::size_t(xsize));
    std::memcpy(a.data() + x + 512, rec.data(), rec.size());
    expect_error(__LINE__, view(a), {"pax header at byte", why});
  }
}

TEST_CASE("WebDataset: bad shards are errors naming the shard and the sample") {
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_duplicate.tar"}); },
               {"bad_duplicate.tar#k\"", "field \"jpg\" twice"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_no_label.tar"}); },
               {"bad_no_label.tar#b\"", "has no cls field (it has jpg)", "skip_incomplete"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_no_image.tar"}); },
               {"bad_no_image.tar#a\"", "has no jpg/jpeg/png field (it has webp, cls)"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_label.tar"}); }, {"the label \"one\"", "whole number"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_negative_label.tar"}); }, {"the label \"-1\""});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "bad_empty.tar"}); }, {"hold no samples"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "folder.tar"}, {.num_classes = 3}); },
               {"has label 3", "num_classes is 3"});
  expect_error(__LINE__, [] { data::WebDataset({kTar + "missing-{0..1}.tar"}); },
               {"WebDataset: cannot open", "missing-0.tar"});
  expect_error(__LINE__, [] { data::WebDataset({kImages + "folder"}); }, {"no *.tar files in"});
  expect_error(__LINE__, [] { data::WebDataset(std::vector<std::string>{}); }, {"no shards given"});
  {  // classes.txt is untrusted too: a bound on its lines
    ember_test::TempDir d;
    std::filesystem::copy_file(kTar + "python.tar", d / "s.tar");
    std::ofstream(d / "classes.txt") << std::string((std::size_t(1) << 20) + 1, '\n');
    expect_error(__LINE__, [&] { data::WebDataset({d.path.string()}); },
                 {"classes.txt", "names more than 1048576 classes"});
  }
  const data::WebDataset some({kTar + "bad_no_label.tar"}, {.skip_incomplete = true});
  CHECK(some.size() == 2);
  CHECK(some.skipped() == 1);
  CHECK(some.key(1) == "c.jpg");
  CHECK(some.target(1) == 2);
  expect_error(__LINE__, [&] { some.target(2); }, {"index 2 is out of range for 2 samples"});
}

TEST_CASE("TarWriter: what it writes, TarView and GNU tar read back: short, ustar-split, pax and unicode names") {
  ember_test::TempDir d;
  const std::string path = d / "w.tar";
  const std::string split = std::string(120, 'p') + "/" + std::string(30, 'n') + ".jpg";  // ustar prefix + name
  const std::string pax = std::string(200, 'q') + ".png";                                  // no "/" to split at
  const std::string deep = "a/" + std::string(200, 'b') + "/c.cls";                       // prefix too long
  const std::vector<std::string> want = {"k.jpg", std::string(100, 'x'), split, pax, deep, "ünï/日本.cls", "e"};
  std::vector<std::vector<unsigned char>> bodies;
  {
    data::TarWriter w(path);
    for (std::size_t i = 0; i < want.size(); ++i) {
      std::vector<unsigned char> b(std::vector<std::size_t>{3, 512, 513, 0, 1, 1024, 700}[i]);
      for (std::size_t k = 0; k < b.size(); ++k) b[k] = static_cast<unsigned char>(k * 7 + i);
      w.add(want[i], b);
      bodies.push_back(b);
    }
    CHECK(w.size() == want.size());
    CHECK(!std::filesystem::exists(path));  // in place only at close()
    w.close();
  }
  REQUIRE(std::filesystem::exists(path));
  CHECK(std::filesystem::file_size(path) % 10240 == 0);
  const data::TarReader r(path);
  REQUIRE(r.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(r.members()[i].name == want[i]);
    const auto b = r.data(r.members()[i]);
    CHECK(std::vector<unsigned char>(b.begin(), b.end()) == bodies[i]);
  }
  // GNU tar, an independent reader, lists the same names and extracts the same bytes.
  if (std::system("tar --version > /dev/null 2>&1") == 0) {
    std::FILE* p = ::popen(("tar -tf '" + path + "'").c_str(), "r");
    REQUIRE(p);
    std::vector<std::string> listed;
    char buf[4096];
    std::string cur;
    while (std::fgets(buf, sizeof(buf), p)) {
      cur += buf;
      if (!cur.empty() && cur.back() == '\n') listed.push_back(cur.substr(0, cur.size() - 1)), cur.clear();
    }
    CHECK(::pclose(p) == 0);
    CHECK(listed == want);
    const std::string out = d / "x";
    std::filesystem::create_directories(out);
    REQUIRE(std::system(("tar -xf '" + path + "' -C '" + out + "'").c_str()) == 0);
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(bytes_of(out + "/" + want[i]) == bodies[i]);
  } else {
    MESSAGE("GNU tar not found: the cross-check with tar is skipped");
  }
  // Bad names; a writer dropped without close() leaves nothing.
  {
    data::TarWriter w(d / "bad.tar");
    expect_error(__LINE__, [&] { w.add("", std::span<const unsigned char>()); }, {"TarWriter", "not a name"});
    expect_error(__LINE__, [&] { w.add(std::string("a\0b", 3), std::span<const unsigned char>()); }, {"no NUL"});
    expect_error(__LINE__, [&] { w.add(std::string(5000, 'a'), std::span<const unsigned char>()); }, {"5000 bytes"});
  }
  CHECK(!std::filesystem::exists(d / "bad.tar"));
  CHECK(std::distance(std::filesystem::directory_iterator(d.path), std::filesystem::directory_iterator()) == 2);
}

TEST_CASE("pack_images as WebDataset shards: the folder's images, labels, class names and batches") {
  const data::ImageFolder folder(kImages + "folder");
  ember_test::TempDir d;
  const std::string dir = d / "wds";
  const data::PackImagesResult r = data::pack_images(
      folder, dir, {.format = data::PackImagesOptions::Format::webdataset, .shard_bytes = 4000, .shuffle = false});
  CHECK(r.images == folder.size());
  CHECK(r.shards >= 3);
  const data::WebDataset ds({dir});
  CHECK(ds.num_shards() == r.shards);
  CHECK(ds.classes() == folder.classes());
  CHECK(ds.num_classes() == std::int64_t(folder.classes().size()));
  REQUIRE(ds.size() == folder.size());
  std::vector<unsigned char> scratch;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    CAPTURE(i);
    CHECK(ds.target(i) == folder.target(i));
    const auto b = ds.source()->bytes(i, scratch);
    CHECK(std::vector<unsigned char>(b.begin(), b.end()) == bytes_of(folder.path(i)));
    const std::string ext = folder.path(i).substr(folder.path(i).rfind('.') + 1);
    const bool png = ext == "png" || ext == "PNG";
    CHECK(ds.key(i).substr(8) == (png ? ".png" : ".jpg"));
  }
  ember_test::check_same_batches(image_batches(folder, 0), image_batches(ds, 2));
}
