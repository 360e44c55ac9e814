// Crafted JPEGs (data/decode.h, data/jpeg_entropy.h): an over-subscribed Huffman table that the
// scan never uses, and decompression bombs, each refused or decoded as libjpeg-turbo does, never
// with memory written out of bounds or spent on a header's claim. The ASan configuration runs
// these (label "data"); before the fix the first wrote up to 128 KB past a 512-entry table.
#include <gtest/gtest.h>

#include "data/decode.h"
#include "data/jpeg_entropy.h"
#include "data/jpeg_index.h"
#include "data/loader.h"
#include "data/sample_gen.h"
#include "tests/jpeg_test_util.h"
#include "tests/test_util.h"

namespace aiacc::data {
namespace {

// A DHT segment for AC table 3 (which no encoder's scan uses) with 2 codes of length 1 and 100
// of length 2: 102 codes where 2 + 4 fit.
std::vector<uint8_t> overSubscribedDht() {
  std::vector<uint8_t> seg = {0xFF, 0xC4, 0, 0, 0x13, 2, 100};
  seg.resize(seg.size() + 14, 0);  // lengths 3 to 16: none
  for (int s = 0; s < 102; ++s) seg.push_back(static_cast<uint8_t>(s));
  const size_t len = seg.size() - 2;
  seg[2] = static_cast<uint8_t>(len >> 8);
  seg[3] = static_cast<uint8_t>(len & 0xFF);
  return seg;
}

std::vector<uint8_t> withSegmentAfterSoi(const std::vector<uint8_t>& jpg, const std::vector<uint8_t>& seg) {
  std::vector<uint8_t> out(jpg.begin(), jpg.begin() + 2);
  out.insert(out.end(), seg.begin(), seg.end());
  out.insert(out.end(), jpg.begin() + 2, jpg.end());
  return out;
}

// jpg with its frame's size set to width x height.
std::vector<uint8_t> withFrameSize(std::vector<uint8_t> jpg, int width, int height) {
  for (size_t p = 2; p + 9 < jpg.size();) {
    const uint8_t m = jpg[p + 1];
    if (m == 0xC0 || m == 0xC1 || m == 0xC2) {
      jpg[p + 5] = static_cast<uint8_t>(height >> 8);
      jpg[p + 6] = static_cast<uint8_t>(height & 0xFF);
      jpg[p + 7] = static_cast<uint8_t>(width >> 8);
      jpg[p + 8] = static_cast<uint8_t>(width & 0xFF);
      return jpg;
    }
    p += 2 + static_cast<size_t>(jpg[p + 2] << 8 | jpg[p + 3]);
  }
  ADD_FAILURE() << "no frame header";
  return jpg;
}

DecodedCrop decodeWhole(const std::vector<uint8_t>& jpg, HuffmanDecoder huffman,
                        int64_t max_pixels = kDefaultMaxImagePixels) {
  return decodeCrop(
      jpg.data(), jpg.size(),
      [](int w, int h) {
    return Box{0, 0, w, h};
      },
      kFullResolution, kFullResolution, nullptr, true, nullptr, huffman, max_pixels);
}

std::string decodeErrorOf(const std::vector<uint8_t>& jpg, int64_t max_pixels = kDefaultMaxImagePixels) {
  try {
    decodeWhole(jpg, HuffmanDecoder::kAiacc, max_pixels);
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "(decoded)";
}

TEST(HostileJpeg, AnOverSubscribedHuffmanTableIsRefusedBeforeAnyWrite) {
  const std::vector<uint8_t> seg = overSubscribedDht();
  jpeg::Huffman t;
  EXPECT_FALSE(t.build(seg.data() + 5, seg.data() + 21));
  EXPECT_FALSE(t.present);
  for (uint16_t e : t.fast) ASSERT_EQ(e, 0) << "the fast table was written";
  // A complete code (2 of length 1) and one with room left both build.
  const uint8_t full[16] = {2}, partial[16] = {1, 1};
  const uint8_t symbols[2] = {0, 1};
  EXPECT_TRUE(t.build(full, symbols));
  EXPECT_TRUE(t.build(partial, symbols));
  const uint8_t three_of_one[16] = {3};
  EXPECT_FALSE(t.build(three_of_one, symbols));
}

TEST(HostileJpeg, AnUnusedOverSubscribedTableDecodesAsLibjpegTurboDoes) {
  for (const test::Picture& pic : test::samplings()) {
    SCOPED_TRACE(pic.name);
    const std::vector<uint8_t> jpg = test::encode(test::texture(pic.w, pic.h, 3), pic.o);
    const std::vector<uint8_t> bad = withSegmentAfterSoi(jpg, overSubscribedDht());
    const DecodedCrop want = decodeWhole(jpg, HuffmanDecoder::kLibjpegTurbo);
    for (HuffmanDecoder h : {HuffmanDecoder::kAiacc, HuffmanDecoder::kLibjpegTurbo}) {
      const DecodedCrop got = decodeWhole(bad, h);
      EXPECT_TRUE(got.crop.pixels == want.crop.pixels);
    }
    EXPECT_EQ(JpegIndex::build(bad.data(), bad.size()), nullptr);
    EXPECT_NE(JpegIndex::build(jpg.data(), jpg.size()), nullptr);
  }
}

TEST(HostileJpeg, ADecompressionBombIsRefusedFromItsHeader) {
  const std::vector<uint8_t> jpg = test::encode(test::texture(16, 16, 5), test::EncodeOptions{});
  // 30000 x 30000 in a file of a few hundred bytes: above the pixel limit.
  std::string e = decodeErrorOf(withFrameSize(jpg, 30000, 30000));
  EXPECT_TRUE(test::contains(e, "image of 30000x30000 pixels, above the limit of 178956970 (--max-image-pixels)")) << e;
  // 13000 x 13000 is within it, but 4.0 million blocks (4:2:0: 1625^2 luma, 813^2 per chroma)
  // cannot be coded in the file's bits.
  e = decodeErrorOf(withFrameSize(jpg, 13000, 13000));
  EXPECT_TRUE(test::contains(e, "JPEG claims 13000x13000 pixels (3962563 blocks) in " + std::to_string(jpg.size()) +
                                    " bytes: truncated or crafted"))
      << e;
  // The same checks hold for a progressive file and through the index.
  test::EncodeOptions progressive;
  progressive.progressive = true;
  const std::vector<uint8_t> pj = test::encode(test::texture(16, 16, 5), progressive);
  EXPECT_TRUE(test::contains(decodeErrorOf(withFrameSize(pj, 13000, 13000)), "truncated or crafted"));
  // The limit is the caller's: a 16x16 image is refused at 255 pixels, decoded at 256.
  EXPECT_TRUE(test::contains(decodeErrorOf(jpg, 255), "image of 16x16 pixels, above the limit of 255")) << e;
  EXPECT_EQ(decodeWhole(jpg, HuffmanDecoder::kAiacc, 256).crop.width, 16);
}

// [start, end) of jpg's last scan: its SOS segment and the entropy-coded data after it.
std::pair<size_t, size_t> lastScan(const std::vector<uint8_t>& jpg) {
  size_t sos = 0;
  for (size_t p = 2; p + 4 <= jpg.size();) {
    const uint8_t m = jpg[p + 1];
    if (m == 0xD9) break;
    const size_t len = static_cast<size_t>(jpg[p + 2] << 8 | jpg[p + 3]);
    if (m != 0xDA) {
      p += 2 + len;
      continue;
    }
    sos = p;
    p += 2 + len;
    while (p + 1 < jpg.size() && !(jpg[p] == 0xFF && jpg[p + 1] != 0 && (jpg[p + 1] < 0xD0 || jpg[p + 1] > 0xD7))) ++p;
  }
  return {sos, jpg.size() - 2};  // up to the EOI
}

TEST(HostileJpeg, AProgressiveJpegOfTooManyScansIsRefused) {
  test::EncodeOptions progressive;
  progressive.progressive = true;
  const std::vector<uint8_t> jpg = test::encode(test::texture(64, 48, 9), progressive);
  const auto [a, b] = lastScan(jpg);
  ASSERT_GT(a, 0u);
  // The last scan 500 times more: 500 + about 10 scans, each of which visits every block.
  std::vector<uint8_t> many(jpg.begin(), jpg.begin() + static_cast<long>(b));
  for (int i = 0; i < 500; ++i)
    many.insert(many.end(), jpg.begin() + static_cast<long>(a), jpg.begin() + static_cast<long>(b));
  many.insert(many.end(), {0xFF, 0xD9});
  const std::string e = decodeErrorOf(many);
  EXPECT_TRUE(test::contains(e, "more than 500 scans")) << e;
  EXPECT_EQ(decodeWhole(jpg, HuffmanDecoder::kAiacc).crop.width, 64);
}

TEST(HostileJpeg, OnlyJpegAndPngReachOpenCvAndAPngHeaderIsBounded) {
  const std::string ppm = "P6\n30000 30000\n255\n" + std::string(64, 'x');
  std::string e = decodeErrorOf(std::vector<uint8_t>(ppm.begin(), ppm.end()));
  EXPECT_TRUE(test::contains(e, "not a JPEG or PNG")) << e;
  auto png = [](uint32_t w, uint32_t h) {
    std::vector<uint8_t> f = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    for (uint32_t v : {w, h}) {
      for (int s = 24; s >= 0; s -= 8) f.push_back(static_cast<uint8_t>(v >> s));
    }
    f.insert(f.end(), {8, 2, 0, 0, 0, 0, 0, 0, 0});
    return f;
  };
  e = decodeErrorOf(png(0xFFFFFFFFu, 0xFFFFFFFFu));  // the product overflows int64
  EXPECT_TRUE(test::contains(e, "image of 4294967295x4294967295 pixels, above the limit")) << e;
  e = decodeErrorOf(png(10000, 10000));
  EXPECT_TRUE(test::contains(e, "PNG claims 10000x10000 pixels in 33 bytes: truncated or crafted")) << e;
}

TEST(HostileJpeg, ABombInADatasetIsACountedSkip) {
  test::TempDir d;
  const std::string cls = test::twoClassDataset(d / "ds");
  const std::vector<uint8_t> good = readFile(cls + "/train_00000.JPEG");
  test::writeFile(cls + "/bomb.JPEG", withFrameSize(good, 30000, 30000));
  test::writeFile(cls + "/dht.JPEG", withSegmentAfterSoi(good, overSubscribedDht()));
  ImageNetLayout l = scanImageNet(d / "ds");
  ASSERT_EQ(l.train.samples.size(), 10u);
  auto skips = std::make_shared<SkipLog>();
  LoaderOptions o;
  o.train = false;
  o.jpeg_index_bytes = 1 << 20;
  ImageLoader ld(l.train, o, skips);
  int64_t images = 0;
  ld.startEpoch(EpochSpec{0, 16, 4, 0.08});
  while (auto b = ld.next()) images += b->labels.numel();
  EXPECT_EQ(images, 9) << "the file with the unused bad table decodes";
  EXPECT_EQ(skips->paths(), std::vector<std::string>{cls + "/bomb.JPEG"});
}

TEST(DecodeBounds, AJpegMayClaimEightBlocksAByteOr512Arithmetic) {
  EXPECT_EQ(jpegBlockRefusal(8, 8, 800, false, 100), "");
  EXPECT_EQ(jpegBlockRefusal(8, 8, 801, false, 100),
            "JPEG claims 8x8 pixels (801 blocks) in 100 bytes: truncated or crafted");
  EXPECT_EQ(jpegBlockRefusal(8, 8, 51200, true, 100), "");
  EXPECT_NE(jpegBlockRefusal(8, 8, 51201, true, 100), "");
  // No product is formed: the largest claim against the largest size is still decided.
  EXPECT_NE(jpegBlockRefusal(1, 1, UINT64_MAX, false, UINT64_MAX / 8), "");
  EXPECT_EQ(jpegBlockRefusal(1, 1, UINT64_MAX - 7, false, UINT64_MAX / 8), "");
  EXPECT_EQ(jpegBlockRefusal(1, 1, 0, false, 0), "");
  EXPECT_NE(jpegBlockRefusal(1, 1, 1, false, 0), "");
}

TEST(DecodeBounds, PixelsAreBoundedWithoutOverflow) {
  EXPECT_EQ(pixelRefusal(13377, 13377, kDefaultMaxImagePixels), "");
  EXPECT_EQ(pixelRefusal(13377, 13378, kDefaultMaxImagePixels),
            "image of 13377x13378 pixels, above the limit of 178956970 (--max-image-pixels): a decompression bomb?");
  // A PNG's sides go to 2^32 - 1: their product overflows int64, whatever the limit.
  const int64_t side = (int64_t{1} << 32) - 1;
  EXPECT_NE(pixelRefusal(side, side, INT64_MAX), "");
  EXPECT_NE(pixelRefusal(1, side, 1000), "");
  EXPECT_EQ(pngRefusal(1032, 8, 1, kDefaultMaxImagePixels), "");
  EXPECT_EQ(pngRefusal(1032, 9, 1, kDefaultMaxImagePixels),
            "PNG claims 1032x9 pixels in 1 bytes: truncated or crafted");
  EXPECT_NE(pngRefusal(side, side, 1 << 30, kDefaultMaxImagePixels).find("--max-image-pixels"), std::string::npos);
}

}  // namespace
}  // namespace aiacc::data
