#include "data/jpeg_index.h"

#include <gtest/gtest.h>

#include "data/decode.h"
#include "data/transforms.h"
#include "tests/jpeg_test_util.h"

namespace aiacc::data {
namespace {

using test::encode;
using test::EncodeOptions;
using test::texture;

// Decodes random-resized crops of jpg with and without its index; they must agree exactly.
// Returns how many went through the index.
int expectSameCrops(const std::vector<uint8_t>& jpg, int cols_per_checkpoint, int crops, uint64_t seed) {
  std::unique_ptr<JpegIndex> ix = JpegIndex::build(jpg.data(), jpg.size(), cols_per_checkpoint);
  EXPECT_NE(ix, nullptr);
  if (!ix) return 0;
  Rng rng(seed);
  int indexed = 0;
  for (int i = 0; i < crops; ++i) {
    const int S = std::array<int, 4>{16, 40, 96, 224}[static_cast<size_t>(i % 4)];
    Rng a = rng, b = rng;  // both pickers draw the same box
    rng.next();
    const CropParams p;
    DecodedCrop want = decodeCrop(
        jpg.data(), jpg.size(), [&](int w, int h) { return randomResizedCropBox(w, h, p, a); }, S, S);
    DecodedCrop got = decodeCrop(
        jpg.data(), jpg.size(), [&](int w, int h) { return randomResizedCropBox(w, h, p, b); }, S, S, ix.get());
    indexed += got.path == DecodePath::kJpegIndex;
    EXPECT_EQ(got.box.x, want.box.x);
    EXPECT_EQ(got.box.y, want.box.y);
    EXPECT_EQ(got.scale_num, want.scale_num);
    EXPECT_EQ(got.crop.width, want.crop.width);
    EXPECT_EQ(got.crop.height, want.crop.height);
    EXPECT_TRUE(got.crop.pixels == want.crop.pixels)
        << "crop " << i << " box " << want.box.x << "," << want.box.y << " " << want.box.w << "x" << want.box.h
        << " scale " << want.scale_num << "/8";
    if (got.crop.pixels != want.crop.pixels) break;
  }
  return indexed;
}

TEST(JpegIndex, CropsDecodeToTheSamePixelsInEverySubsampling) {
  for (const test::Picture& c : test::samplings()) {
    SCOPED_TRACE(c.name);
    const std::vector<uint8_t> jpg = encode(texture(c.w, c.h, 7), c.o);
    for (int k : {1, 2, 3}) {
      SCOPED_TRACE(k);
      const int indexed = expectSameCrops(jpg, k, 40, 11 + k);
      if (c.w > 100) {
        EXPECT_GT(indexed, 20);  // most crops go through an extract
      }
    }
  }
}

TEST(JpegIndex, ExtractIsAStandaloneJpegOfTheRegion) {
  const RgbImage img = texture(200, 120, 3);
  const std::vector<uint8_t> jpg = encode(img, {});
  auto ix = JpegIndex::build(jpg.data(), jpg.size(), 2);
  ASSERT_NE(ix, nullptr);
  EXPECT_EQ(ix->mcusX(), 13);  // 200 / 16, rounded up
  EXPECT_EQ(ix->mcusY(), 8);
  std::vector<uint8_t> piece;
  // MCU rows 2..5, columns 4..13 (the right edge: a partial MCU).
  ASSERT_TRUE(ix->extract(jpg.data(), jpg.size(), 2, 6, 4, 13, piece));
  // The JPEG, then kTailPadding zeros.
  ASSERT_GT(piece.size(), JpegIndex::kTailPadding);
  EXPECT_EQ(std::count(piece.end() - JpegIndex::kTailPadding, piece.end(), 0),
            static_cast<long>(JpegIndex::kTailPadding));
  piece.resize(piece.size() - JpegIndex::kTailPadding);
  EXPECT_EQ(piece[piece.size() - 2], 0xFF);
  EXPECT_EQ(piece[piece.size() - 1], 0xD9);
  EXPECT_LT(piece.size(), jpg.size());
  const RgbImage whole = decodeFull(jpg.data(), jpg.size());
  const RgbImage part = decodeFull(piece.data(), piece.size());
  ASSERT_EQ(part.width, 200 - 64);
  ASSERT_EQ(part.height, 64);
  // Away from the extract's edges (chroma upsampling looks across them), the same pixels.
  int differ = 0;
  for (int y = 2; y < part.height - 2; ++y) {
    for (int x = 2; x < part.width - 2; ++x) {
      for (int ch = 0; ch < 3; ++ch) {
        differ += part.pixels[(static_cast<size_t>(y) * part.width + x) * 3 + ch] !=
                  whole.pixels[(static_cast<size_t>(y + 32) * whole.width + x + 64) * 3 + ch];
      }
    }
  }
  EXPECT_EQ(differ, 0);
  // Bad ranges are refused.
  EXPECT_FALSE(ix->extract(jpg.data(), jpg.size(), 2, 6, 3, 13, piece));  // c0 not a checkpoint
  EXPECT_FALSE(ix->extract(jpg.data(), jpg.size(), 5, 5, 0, 4, piece));   // no rows
  EXPECT_FALSE(ix->extract(jpg.data(), jpg.size(), 0, 9, 0, 4, piece));   // past the bottom
}

TEST(JpegIndex, OptimizedHuffmanTablesStillDecodeTheSame) {
  // Fitted tables may have no code for a DC difference an extract needs: those crops fall back
  // to the whole file, the rest use the index; every crop must match.
  EncodeOptions o;
  o.optimize = true;
  const std::vector<uint8_t> jpg = encode(texture(320, 240, 5), o);
  expectSameCrops(jpg, 2, 40, 21);
}

TEST(JpegIndex, FilesItCannotIndexAreRefused) {
  const RgbImage img = texture(160, 120, 9);
  EncodeOptions progressive;
  progressive.progressive = true;
  EncodeOptions restarts;
  restarts.restart_rows = 1;
  const std::vector<uint8_t> prog = encode(img, progressive);
  EXPECT_EQ(JpegIndex::build(prog.data(), prog.size()), nullptr);
  const std::vector<uint8_t> rst = encode(img, restarts);
  EXPECT_EQ(JpegIndex::build(rst.data(), rst.size()), nullptr);
  // Truncated data and a PNG signature: no index; garbage in the scan: no crash.
  std::vector<uint8_t> jpg = encode(img, {});
  std::vector<uint8_t> cut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  EXPECT_EQ(JpegIndex::build(cut.data(), cut.size()), nullptr);
  std::vector<uint8_t> junk = jpg;
  for (size_t i = junk.size() / 3; i < junk.size() / 3 + 64; ++i) junk[i] = 0xFF;
  JpegIndex::build(junk.data(), junk.size());
  const uint8_t png[] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  EXPECT_EQ(JpegIndex::build(png, sizeof(png)), nullptr);
  // An index does not apply to another file (decodeCrop then ignores it).
  auto ix = JpegIndex::build(jpg.data(), jpg.size());
  ASSERT_NE(ix, nullptr);
  EXPECT_TRUE(ix->matches(jpg.data(), jpg.size()));
  std::vector<uint8_t> other = encode(texture(160, 120, 10), {});
  EXPECT_FALSE(ix->matches(other.data(), other.size()));
  DecodedCrop d = decodeCrop(
      other.data(), other.size(),
      [](int, int) {
    return Box{8, 8, 60, 50};
      },
      32, 32, ix.get());
  EXPECT_EQ(d.path, DecodePath::kJpegRegion);
}

}  // namespace
}  // namespace aiacc::data
