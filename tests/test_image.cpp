// Image decoding (data/image.hpp): JPEG pixels equal libjpeg-turbo's own decoder (djpeg) at full size, DCT-scaled
// and cropped; PNG pixels equal the expected 8-bit RGB of every colour type; every hostile file is an ember::Error
// naming the file, and the decoder stays usable after it. Fixtures: tests/fixtures/gen_images.py.
#include <doctest/doctest.h>

#include <ember/data/image.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include "image_helpers.hpp"

using namespace ember;
using ember_test::bytes_of;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(EMBER_TEST_FIXTURES) + "/images/";

// A binary PPM (P6) or PGM (P5) as written by djpeg and gen_images.py.
struct Pnm {
  std::int64_t width = 0, height = 0;
  int channels = 0;
  std::vector<std::uint8_t> px;
};
Pnm read_pnm(const std::string& path) {
  const std::vector<unsigned char> b = bytes_of(path);
  std::size_t at = 0;
  auto token = [&] {
    while (at < b.size() && (b[at] == ' ' || b[at] == '\n' || b[at] == '\r' || b[at] == '\t')) ++at;
    std::string t;
    while (at < b.size() && !(b[at] == ' ' || b[at] == '\n' || b[at] == '\r' || b[at] == '\t')) t += char(b[at++]);
    return t;
  };
  Pnm p;
  const std::string magic = token();
  REQUIRE((magic == "P6" || magic == "P5"));
  p.channels = magic == "P6" ? 3 : 1;
  p.width = std::stoll(token());
  p.height = std::stoll(token());
  REQUIRE(token() == "255");
  ++at;  // the single whitespace after maxval
  const std::size_t n = std::size_t(p.width * p.height * p.channels);
  REQUIRE(b.size() - at == n);
  p.px.assign(b.begin() + std::ptrdiff_t(at), b.end());
  return p;
}

// The decoded window's pixels, rows packed.
std::vector<std::uint8_t> pixels(const data::DecodedImage& d) {
  std::vector<std::uint8_t> v;
  for (std::int64_t r = 0; r < d.height; ++r)
    v.insert(v.end(), d.data + r * d.stride, d.data + r * d.stride + d.width * d.channels);
  return v;
}

// Compares a decode with a reference image; counts the samples that differ.
std::size_t mismatches(const data::DecodedImage& d, const Pnm& ref) {
  REQUIRE(d.width == ref.width);
  REQUIRE(d.height == ref.height);
  REQUIRE(d.channels == ref.channels);
  const std::vector<std::uint8_t> got = pixels(d);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += got[i] != ref.px[i];
  return bad;
}

std::string error_of(data::ImageDecoder& dec, const std::vector<unsigned char>& file, const std::string& name,
                     data::DecodeWindow w = {}) {
  try {
    dec.open(file, name);
    dec.decode(w);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("decode_image: JPEG pixels equal djpeg's (baseline 4:2:0, 4:2:2, 4:4:4, progressive, greyscale)") {
  data::ImageDecoder dec;
  for (const char* name : {"baseline420", "baseline422", "baseline444", "progressive", "gray"}) {
    CAPTURE(name);
    const std::string base = kDir + "decode/" + name;
    const std::vector<unsigned char> file = bytes_of(base + ".jpg");
    const Pnm full = read_pnm(base + ".full.pnm");
    const data::ImageInfo& info = dec.open(file, base + ".jpg");
    CHECK(info.format == data::ImageFormat::jpeg);
    CHECK(info.width == 64);
    CHECK(info.height == 48);
    CHECK(info.progressive == (std::string(name) == "progressive"));
    const int c = full.channels;
    CHECK(mismatches(dec.decode({.channels = c}), full) == 0);
    for (int s : {2, 4, 8}) {
      CAPTURE(s);
      const Pnm ref = read_pnm(base + ".s" + std::to_string(s) + ".pnm");
      dec.open(file, name);
      const data::DecodedImage d = dec.decode({.channels = c, .scale_denom = s});
      CHECK(d.full_width == ref.width);
      CHECK(mismatches(d, ref) == 0);
    }
    // djpeg -crop 30x20+21+13: libjpeg widens the window left to an MCU boundary; so does the decoder.
    const Pnm crop = read_pnm(base + ".crop.pnm");
    dec.open(file, name);
    const data::DecodedImage d = dec.decode({.channels = c, .x0 = 21, .y0 = 13, .width = 30, .height = 20});
    CHECK(d.x0 <= 21);
    CHECK(d.x0 + d.width >= 51);
    CHECK(d.y0 == 13);
    CHECK(mismatches(d, crop) == 0);
    // The window holds the full decode's pixels, but for its first column when that is not the image's: libjpeg's
    // fancy chroma upsampling replicates the window's edge instead of reading the column left of it.
    std::size_t bad = 0;
    for (std::int64_t y = 0; y < d.height; ++y)
      for (std::int64_t x = d.x0 > 0 ? c : 0; x < d.width * c; ++x)
        bad += d.data[y * d.stride + x] != full.px[std::size_t(((y + d.y0) * full.width + d.x0) * c + x)];
    CHECK(bad == 0);
  }
}

TEST_CASE("decode_image: greyscale JPEGs to RGB and colour JPEGs to greyscale") {
  data::ImageDecoder dec;
  const Pnm g = read_pnm(kDir + "decode/gray.full.pnm");
  dec.open(bytes_of(kDir + "decode/gray.jpg"), "gray.jpg");
  const std::vector<std::uint8_t> rgb = pixels(dec.decode({.channels = 3}));
  REQUIRE(rgb.size() == g.px.size() * 3);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.px.size(); ++i)
    bad += rgb[3 * i] != g.px[i] || rgb[3 * i + 1] != g.px[i] || rgb[3 * i + 2] != g.px[i];
  CHECK(bad == 0);
  // A colour JPEG's greyscale is libjpeg's luma (its Y channel), as djpeg -grayscale writes it.
  for (const char* name : {"baseline420", "baseline444"}) {
    CAPTURE(name);
    const std::vector<unsigned char> file = bytes_of(kDir + "decode/" + name + ".jpg");
    dec.open(file, name);
    CHECK(mismatches(dec.decode({.channels = 1}), read_pnm(kDir + "decode/" + name + ".gray.pnm")) == 0);
  }
}

TEST_CASE("decode_image: CMYK JPEGs (Adobe) decode to Pillow's RGB") {
  data::ImageDecoder dec;
  const std::vector<unsigned char> file = bytes_of(kDir + "decode/cmyk.jpg");  // alive until decode() returns
  const data::ImageInfo& info = dec.open(file, "cmyk.jpg");
  CHECK(info.channels == 4);
  CHECK(mismatches(dec.decode(), read_pnm(kDir + "decode/cmyk.expected.ppm")) == 0);
}

TEST_CASE("decode_image: PNG of every colour type and bit depth to 8-bit RGB") {
  data::ImageDecoder dec;
  for (const char* name : {"gray1", "gray2", "gray4", "gray8", "gray16", "rgb8", "rgb16", "rgba8", "gray_alpha8",
                           "palette", "palette_trns", "interlaced"}) {
    CAPTURE(name);
    const std::string base = kDir + "decode/" + name;
    const std::vector<unsigned char> file = bytes_of(base + ".png");
    const Pnm ref = read_pnm(base + ".expected.ppm");
    const data::ImageInfo& info = dec.open(file, base + ".png");
    CHECK(info.format == data::ImageFormat::png);
    CHECK(info.progressive == (std::string(name) == "interlaced"));
    CHECK(mismatches(dec.decode(), ref) == 0);
    // A window of rows is those rows of the whole image.
    dec.open(file, name);
    const data::DecodedImage d = dec.decode({.y0 = 9, .height = 17});
    CHECK(d.y0 == 9);
    REQUIRE(d.height == 17);
    std::size_t bad = 0;
    for (std::int64_t y = 0; y < 17; ++y)
      for (std::int64_t x = 0; x < d.width * 3; ++x)
        bad += d.data[y * d.stride + x] != ref.px[std::size_t((y + 9) * ref.width * 3 + x)];
    CHECK(bad == 0);
    // Greyscale: PIL's convert("L") of the RGB pixels (for greyscale files, the grey values themselves).
    dec.open(file, name);
    const std::vector<std::uint8_t> g = pixels(dec.decode({.channels = 1}));
    REQUIRE(g.size() * 3 == ref.px.size());
    bad = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      bad += g[i] != data::detail::rgb_to_luma(ref.px[3 * i], ref.px[3 * i + 1], ref.px[3 * i + 2]);
    CHECK(bad == 0);
  }
}

TEST_CASE("decode_image: the format comes from the content, not the name") {
  data::ImageDecoder dec;
  const std::vector<unsigned char> jpeg = bytes_of(kDir + "decode/jpeg_named.png"),
                                   png = bytes_of(kDir + "decode/png_named.jpg");
  CHECK(dec.open(jpeg, "jpeg_named.png").format == data::ImageFormat::jpeg);
  CHECK(mismatches(dec.decode(), read_pnm(kDir + "decode/baseline444.full.pnm")) == 0);
  CHECK(dec.open(png, "png_named.jpg").format == data::ImageFormat::png);
  CHECK(mismatches(dec.decode(), read_pnm(kDir + "decode/rgb8.expected.ppm")) == 0);
}

TEST_CASE("decode_image: every hostile file is an ember::Error naming it, and the decoder stays usable") {
  data::ImageDecoder dec;
  const std::vector<unsigned char> good = bytes_of(kDir + "decode/baseline420.jpg");
  const Pnm ref = read_pnm(kDir + "decode/baseline420.full.pnm");
  const std::vector<unsigned char> good_png = bytes_of(kDir + "decode/rgba8.png");
  const Pnm ref_png = read_pnm(kDir + "decode/rgba8.expected.ppm");
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kDir + "hostile")) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 30);
  for (const fs::path& p : files) {
    CAPTURE(p.filename().string());
    const std::string msg = error_of(dec, bytes_of(p.string()), p.string());
    CHECK_MESSAGE(!msg.empty(), "decoded without an error");
    CHECK(msg.find(p.filename().string()) != std::string::npos);
    // A window of columns through every row fails too (the cropped, scaled path reads the same data).
    CHECK(!error_of(dec, bytes_of(p.string()), p.string(), {.scale_denom = 2, .x0 = 1, .width = 2}).empty());
    dec.open(good, "good.jpg");
    CHECK(mismatches(dec.decode(), ref) == 0);
    dec.open(good_png, "good.png");
    CHECK(mismatches(dec.decode(), ref_png) == 0);
  }
  // The decompression bombs are refused on their header, by the pixel limit.
  for (const char* f : {"jpeg_bomb_60000.jpg", "png_bomb_60000.png"}) {
    CAPTURE(f);
    const std::string msg = error_of(dec, bytes_of(kDir + "hostile/" + f), f);
    CHECK(msg.find("max_pixels") != std::string::npos);
    CHECK(msg.find("60000x60000") != std::string::npos);
  }
  CHECK(error_of(dec, bytes_of(kDir + "hostile/png_huge_iccp.png"), "iccp").find("limit") != std::string::npos);
  CHECK(error_of(dec, bytes_of(kDir + "hostile/text_named.jpg"), "t.jpg").find("neither a JPEG nor a PNG") !=
        std::string::npos);
}

TEST_CASE("decode_image: the pixel and file limits are options") {
  const std::vector<unsigned char> file = bytes_of(kDir + "decode/baseline420.jpg");
  data::ImageDecoder small({.max_pixels = 64 * 48 - 1});
  CHECK_THROWS_WITH_AS(small.open(file, "x.jpg"), doctest::Contains("64x48"), Error);
  data::ImageDecoder exact({.max_pixels = 64 * 48});
  CHECK(exact.open(file, "x.jpg").width == 64);
  data::ImageDecoder tiny_file({.max_file_bytes = 100});
  CHECK_THROWS_WITH_AS(tiny_file.open(file, "x.jpg"), doctest::Contains("max_file_bytes"), Error);
  // A progressive file's scans are counted (a file of thousands of tiny scans keeps libjpeg busy for minutes).
  const std::vector<unsigned char> prog = bytes_of(kDir + "decode/progressive.jpg");
  data::ImageDecoder few_scans({.max_jpeg_scans = 2});
  few_scans.open(prog, "p.jpg");
  CHECK_THROWS_WITH_AS(few_scans.decode(), doctest::Contains("max_jpeg_scans"), Error);
  data::ImageDecoder enough({.max_jpeg_scans = 100});
  enough.open(prog, "p.jpg");
  CHECK(enough.decode().width == 64);
  data::ImageDecoder png_small({.max_pixels = 100});
  CHECK_THROWS_AS(png_small.open(bytes_of(kDir + "decode/rgb8.png"), "x.png"), Error);
}

TEST_CASE("decode_image: buffers are reused from image to image") {
  data::ImageDecoder dec;
  const std::vector<unsigned char> file = bytes_of(kDir + "decode/progressive.jpg");
  dec.open(file, "a");
  const std::uint8_t* first = dec.decode().data;
  for (int i = 0; i < 3; ++i) {
    dec.open(file, "a");
    CHECK(dec.decode().data == first);
  }
}

TEST_CASE("read_image: files, missing files and folders") {
  const Tensor<std::uint8_t> t = data::read_image(kDir + "decode/baseline444.jpg");
  CHECK(t.shape() == Shape{48, 64, 3});
  const Pnm ref = read_pnm(kDir + "decode/baseline444.full.pnm");
  CHECK(std::equal(ref.px.begin(), ref.px.end(), t.data()));
  CHECK(data::read_image(kDir + "decode/gray8.png", 1).shape() == Shape{48, 64, 1});
  CHECK_THROWS_WITH_AS(data::read_image(kDir + "decode/no such file.jpg"), doctest::Contains("no such file.jpg"),
                       Error);
  CHECK_THROWS_WITH_AS(data::read_image(kDir + "decode"), doctest::Contains("not a regular file"), Error);
}

TEST_CASE("jpeg_scale_for: the largest DCT scale that keeps the target size") {
  CHECK(data::jpeg_scale_for(2560, 1440, 224, 224) == 4);  // 640x360
  CHECK(data::jpeg_scale_for(500, 375, 224, 224) == 1);     // 1/2 would be 187 rows
  CHECK(data::jpeg_scale_for(500, 448, 224, 224) == 2);
  CHECK(data::jpeg_scale_for(4000, 4000, 224, 224) == 8);
  CHECK(data::jpeg_scale_for(100, 100, 224, 224) == 1);
}
