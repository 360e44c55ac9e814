// Our Huffman decoder (data/entropy_hook.h) against libjpeg-turbo's: the same pixels for every
// sampling, DCT scale, crop and table kind, and libjpeg-turbo's behaviour on damaged data.
#include "data/entropy_hook.h"

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "data/decode.h"
#include "data/jpeg_index.h"
#include "data/transforms.h"
#include "tests/jpeg_test_util.h"

namespace aiacc::data {
namespace {

using test::encode;
using test::EncodeOptions;
using test::texture;

// Decodes with our decoder on or off, restoring the switch afterwards.
DecodedCrop decodeWith(bool own, const std::vector<uint8_t>& jpg, const Box& box, int out, const JpegIndex* ix,
                       bool packed) {
  EntropyHook::enable(own);
  struct Restore {
    ~Restore() { EntropyHook::enable(true); }
  } restore;
  return decodeCrop(
      jpg.data(), jpg.size(), [&](int, int) { return box; }, out, out, ix, packed);
}

// Random-resized crops of jpg at output sizes that select every DCT scale, packed and strided,
// with and without the file's index: ours and libjpeg-turbo's decoder give the same pixels.
void expectSameAsLibjpeg(const std::vector<uint8_t>& jpg, int crops, uint64_t seed) {
  std::unique_ptr<JpegIndex> ix = JpegIndex::build(jpg.data(), jpg.size(), 2);
  const auto [W, H] = jpegDimensions(jpg.data(), jpg.size());
  Rng rng(seed);
  const CropParams p;
  for (int i = 0; i < crops; ++i) {
    const int S = std::array<int, 4>{16, 40, 96, 224}[static_cast<size_t>(i % 4)];
    const Box box = i == 0 ? Box{0, 0, W, H} : randomResizedCropBox(W, H, p, rng);
    const bool packed = i % 3 != 0;
    const JpegIndex* index = i % 2 ? ix.get() : nullptr;
    const DecodedCrop want = decodeWith(false, jpg, box, S, index, packed);
    const DecodedCrop got = decodeWith(true, jpg, box, S, index, packed);
    ASSERT_EQ(got.scale_num, want.scale_num);
    ASSERT_EQ(got.path, want.path);
    ASSERT_EQ(got.crop.width, want.crop.width);
    ASSERT_EQ(got.crop.height, want.crop.height);
    ASSERT_EQ(got.crop.offset, want.crop.offset);
    ASSERT_TRUE(got.crop.pixels == want.crop.pixels)
        << "crop " << i << " box " << box.x << "," << box.y << " " << box.w << "x" << box.h << " scale "
        << want.scale_num << "/8" << (index ? " indexed" : "") << (packed ? "" : " strided");
  }
}

TEST(EntropyHook, CropsDecodeToLibjpegTurbosPixels) {
  std::vector<test::Picture> cases = test::samplings();
  cases.push_back({"optimized tables", {2, 2, false, true}, 290, 230});
  cases.push_back({"quality 100 (long codes and values)", {2, 2, false, false, false, 0, 100}, 260, 200});
  cases.push_back({"quality 25", {2, 2, false, false, false, 0, 25}, 260, 200});
  const EntropyHook::Counts before = EntropyHook::counts();
  for (const test::Picture& c : cases) {
    SCOPED_TRACE(c.name);
    expectSameAsLibjpeg(encode(texture(c.w, c.h, 5), c.o), 48, 17);
  }
  const EntropyHook::Counts after = EntropyHook::counts();
  // Every decode with the switch on went through our decoder, and none found invalid data.
  EXPECT_EQ(after.installed - before.installed, cases.size() * 48);
  EXPECT_EQ(after.failed, before.failed);
}

TEST(EntropyHook, FilesItDoesNotTakeStayWithLibjpegTurbo) {
  const EntropyHook::Counts before = EntropyHook::counts();
  EncodeOptions progressive;
  progressive.progressive = true;
  EncodeOptions restarts;
  restarts.restart_rows = 2;
  for (const EncodeOptions& o : {progressive, restarts}) {
    expectSameAsLibjpeg(encode(texture(200, 150, 3), o), 8, 5);
  }
  EXPECT_EQ(EntropyHook::counts().installed, before.installed);
}

// Damaged scans (bytes overwritten at random places, the scan cut short): with our decoder the
// outcome is libjpeg-turbo's, the same pixels or the same error, because ours hands every file
// whose data it finds invalid back to libjpeg-turbo.
TEST(EntropyHook, DamagedDataGivesLibjpegTurbosResult) {
  const std::vector<uint8_t> good = encode(texture(240, 180, 9), EncodeOptions{});
  jpeg::Headers h;
  ASSERT_TRUE(jpeg::parseHeaders(good.data(), good.size(), h));
  const size_t scan = h.scan_at, end = good.size() - 2;  // the scan, up to EOI
  Rng rng(23);
  const EntropyHook::Counts before = EntropyHook::counts();
  int errors = 0;
  for (int t = 0; t < 60; ++t) {
    std::vector<uint8_t> bad = good;
    if (t % 3 == 2) {  // cut the scan short, keep EOI
      const size_t cut = scan + static_cast<size_t>(rng.randint(0, static_cast<int64_t>(end - scan)));
      bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(cut), bad.end() - 2);
    } else {
      for (int k = 0; k < 1 + t % 4; ++k) {
        const size_t at = scan + static_cast<size_t>(rng.randint(0, static_cast<int64_t>(end - scan)));
        bad[at] = static_cast<uint8_t>(rng.randint(0, 256));
        if (bad[at] == 0xFF) bad[at] = 0xFE;  // no new markers
      }
    }
    const Box box{static_cast<int>(rng.randint(0, 100)), static_cast<int>(rng.randint(0, 80)), 120, 90};
    const int S = t % 2 ? 32 : 100;
    std::optional<DecodedCrop> want, got;
    std::string want_err, got_err;
    try {
      want = decodeWith(false, bad, box, S, nullptr, true);
    } catch (const DecodeError& e) {
      want_err = e.what();
    }
    try {
      got = decodeWith(true, bad, box, S, nullptr, true);
    } catch (const DecodeError& e) {
      got_err = e.what();
    }
    SCOPED_TRACE(t);
    EXPECT_EQ(got_err, want_err);
    errors += !want_err.empty();
    ASSERT_EQ(got.has_value(), want.has_value());
    if (got) {
      EXPECT_TRUE(got->crop.pixels == want->crop.pixels);
    }
  }
  // The damage was found: some decodes were handed back to libjpeg-turbo.
  EXPECT_GT(EntropyHook::counts().failed, before.failed);
  std::printf("%d of 60 damaged files raised DecodeError\n", errors);
}

}  // namespace
}  // namespace aiacc::data

namespace aiacc::data {
namespace {

// The index our decoder builds along a decode (whatever rows the crop stopped at) is the one
// JpegIndex::build walks: the same extracts of every region.
TEST(EntropyHook, IndexBuiltAlongADecodeIsJpegIndexBuilds) {
  for (const test::Picture& c : test::samplings()) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> jpg = encode(texture(c.w, c.h, 3), c.o);
    const std::unique_ptr<JpegIndex> walked = JpegIndex::build(jpg.data(), jpg.size(), 2);
    ASSERT_NE(walked, nullptr);
    Rng rng(31);
    const CropParams p;
    for (int i = 0; i < 12; ++i) {
      const int S = std::array<int, 4>{16, 40, 96, 224}[static_cast<size_t>(i % 4)];
      const Box box = randomResizedCropBox(c.w, c.h, p, rng);
      IndexBuild build;
      build.max_rest_below = 1;  // never deferred
      const EntropyHook::Counts before = EntropyHook::counts();
      const DecodedCrop got = decodeCrop(
          jpg.data(), jpg.size(), [&](int, int) { return box; }, S, S, nullptr, i % 2 == 0, &build);
      ASSERT_EQ(EntropyHook::counts().installed, before.installed + 1);  // built along, not walked apart
      const DecodedCrop want = decodeWith(false, jpg, box, S, nullptr, i % 2 == 0);
      EXPECT_TRUE(got.crop.pixels == want.crop.pixels);
      ASSERT_NE(build.index, nullptr);
      const JpegIndex& ix = *build.index;
      ASSERT_EQ(ix.bytes(), walked->bytes());
      ASSERT_EQ(ix.mcusX(), walked->mcusX());
      ASSERT_EQ(ix.mcusY(), walked->mcusY());
      // Every row band, full width and a column range, from both indexes.
      for (int r0 = 0; r0 < ix.mcusY(); r0 += 1 + ix.mcusY() / 5) {
        for (int cols : {0, 1}) {
          const int c0 = cols ? 2 * (ix.mcusX() / 4 / 2) : 0;
          const int c1 = cols ? std::min(ix.mcusX(), c0 + 2) : ix.mcusX();
          std::vector<uint8_t> a, b;
          const bool ok_a = ix.extract(jpg.data(), jpg.size(), r0, ix.mcusY(), c0, c1, a);
          const bool ok_b = walked->extract(jpg.data(), jpg.size(), r0, ix.mcusY(), c0, c1, b);
          ASSERT_EQ(ok_a, ok_b);
          EXPECT_TRUE(a == b) << "rows " << r0 << ".. columns " << c0 << ".." << c1;
        }
      }
    }
  }
}

// A crop that ends high in the image defers the index to a later decode (whose crop ends lower)
// rather than walking the rows below it; one near the bottom builds it.
TEST(EntropyHook, IndexBuildIsDeferredWhenMostRowsLieBelowTheCrop) {
  const std::vector<uint8_t> jpg = encode(texture(320, 240, 4), EncodeOptions{});
  IndexBuild top;  // rows 0..59 of 240: 75% below
  decodeCrop(
      jpg.data(), jpg.size(),
      [](int, int) {
    return Box{10, 0, 100, 60};
      },
      32, 32, nullptr, true, &top);
  EXPECT_TRUE(top.deferred);
  EXPECT_EQ(top.index, nullptr);
  IndexBuild low;  // rows 180..229: 4% below
  decodeCrop(
      jpg.data(), jpg.size(),
      [](int, int) {
    return Box{10, 180, 100, 50};
      },
      32, 32, nullptr, true, &low);
  EXPECT_FALSE(low.deferred);
  ASSERT_NE(low.index, nullptr);
  IndexBuild progressive;  // not indexable: refused (not deferred) on a decode that would build
  EncodeOptions po;
  po.progressive = true;
  const std::vector<uint8_t> pj = encode(texture(320, 240, 4), po);
  decodeCrop(
      pj.data(), pj.size(),
      [](int, int) {
    return Box{10, 180, 100, 50};
      },
      32, 32, nullptr, true, &progressive);
  EXPECT_FALSE(progressive.deferred);
  EXPECT_EQ(progressive.index, nullptr);
}

// Files with tables of their own (optimized coding) between files with the standard tables: the
// per-thread table caches turn over while some entries stay in use, and every decode stays exact.
TEST(EntropyHook, TableCachesTurningOverKeepEveryDecodeExact) {
  const std::vector<uint8_t> standard = encode(texture(160, 120, 1), EncodeOptions{});
  EncodeOptions optimized;
  optimized.optimize = true;
  const Box box{8, 8, 120, 90};
  for (int i = 0; i < 24; ++i) {
    optimized.quality = 40 + 2 * i;  // a different image and tables each time
    const std::vector<uint8_t> own = encode(texture(150 + i, 110 + i, 100 + static_cast<uint64_t>(i)), optimized);
    for (const std::vector<uint8_t>* jpg : {&own, &standard}) {
      const DecodedCrop want = decodeWith(false, *jpg, box, 64, nullptr, true);
      const DecodedCrop got = decodeWith(true, *jpg, box, 64, nullptr, true);
      ASSERT_TRUE(got.crop.pixels == want.crop.pixels) << "file " << i;
    }
  }
}

}  // namespace
}  // namespace aiacc::data
