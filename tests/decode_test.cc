#include "data/decode.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <opencv2/core.hpp>
#ifdef AIACC_HAVE_IMGCODECS  // the golden decoder, and the fallback's own formats
#include <opencv2/imgcodecs.hpp>
#endif
#include <opencv2/imgproc.hpp>

#include "data/jpeg_index.h"
#include "data/transforms.h"
#include "tests/test_util.h"

namespace aiacc::data {
namespace {

// A smooth, asymmetric test picture (gradients plus a block), so crops are distinguishable.
RgbImage testPicture(int w, int h) {
  RgbImage img;
  img.width = w;
  img.height = h;
  img.pixels.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &img.pixels[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(255 * x / w);
      p[1] = static_cast<uint8_t>(255 * y / h);
      p[2] = (x > w / 3 && x < w / 2 && y > h / 4 && y < h / 2) ? 220 : 40;
    }
  }
  return img;
}

int maxAbsDiff(const RgbImage& a, const RgbImage& b) {
  EXPECT_EQ(a.width, b.width);
  EXPECT_EQ(a.height, b.height);
  if (a.pixels.size() != b.pixels.size()) return 1000;
  int m = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) m = std::max(m, std::abs(a.pixels[i] - b.pixels[i]));
  return m;
}

RgbImage cropOf(const RgbImage& img, Box b) {
  RgbImage out;
  out.width = b.w;
  out.height = b.h;
  for (int y = b.y; y < b.y + b.h; ++y) {
    const uint8_t* row = &img.pixels[(static_cast<size_t>(y) * img.width + b.x) * 3];
    out.pixels.insert(out.pixels.end(), row, row + b.w * 3);
  }
  return out;
}

// libjpeg-turbo's encoder, for what the tests' own encodeJpeg does not make: other subsampling,
// progressive scans, grayscale and CMYK input (pixels in turbojpeg's `format`); empty on failure.
std::vector<uint8_t> turboJpeg(const uint8_t* pixels, int w, int h, int format, int samp, int flags = 0) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  const int rc = tjCompress2(tj, pixels, w, 0, h, format, &buf, &len, samp, 90, flags);
  std::vector<uint8_t> out;
  if (rc == 0) out.assign(buf, buf + len);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

#ifdef AIACC_HAVE_IMGCODECS
TEST(Decode, FullDecodeMatchesOpenCV) {
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(173, 121), 92);
  const RgbImage ours = decodeFull(jpg.data(), jpg.size());
  cv::Mat bgr = cv::imdecode(cv::Mat(1, static_cast<int>(jpg.size()), CV_8UC1, const_cast<uint8_t*>(jpg.data())),
                             cv::IMREAD_COLOR);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  RgbImage ref{rgb.cols, rgb.rows, std::vector<uint8_t>(rgb.data, rgb.data + rgb.total() * 3)};
  EXPECT_LE(maxAbsDiff(ours, ref), 1);
}
#endif

TEST(Decode, RegionDecodeEqualsCropOfFullDecode) {
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(320, 240), 90);
  const RgbImage full = decodeFull(jpg.data(), jpg.size());
  for (Box b : {Box{0, 0, 320, 240}, Box{37, 51, 150, 99}, Box{200, 17, 120, 223}, Box{3, 190, 300, 50}}) {
    // Output as large as the crop: DCT scale stays 8/8, so pixels must agree with the full decode.
    DecodedCrop dc = decodeCrop(
        jpg.data(), jpg.size(), [&](int, int) { return b; }, b.w, b.h);
    EXPECT_EQ(dc.scale_num, 8);
    EXPECT_EQ(dc.path, DecodePath::kJpegRegion);
    EXPECT_LE(maxAbsDiff(dc.crop, cropOf(full, b)), 2) << b.x << "," << b.y << " " << b.w << "x" << b.h;
  }
}

// Progressive JPEGs and every chroma subsampling occur in ImageNet; region decoding must agree
// with a full decode for all of them.
TEST(Decode, RegionDecodeHandlesProgressiveAndSubsampling) {
  const RgbImage pic = testPicture(203, 157);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> files;
  for (auto [name, samp] : {std::pair<const char*, int>{"444", TJSAMP_444},
                            {"422", TJSAMP_422},
                            {"440", TJSAMP_440},
                            {"420", TJSAMP_420},
                            {"gray", TJSAMP_GRAY}}) {
    files.emplace_back(name, turboJpeg(pic.pixels.data(), pic.width, pic.height, TJPF_RGB, samp));
    ASSERT_FALSE(files.back().second.empty()) << name;
  }
  files.emplace_back("progressive",
                     turboJpeg(pic.pixels.data(), pic.width, pic.height, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE));
  ASSERT_FALSE(files.back().second.empty());
  for (const auto& [name, jpg] : files) {
    const RgbImage full = decodeFull(jpg.data(), jpg.size());
    const Box b{45, 33, 101, 87};
    DecodedCrop dc = decodeCrop(
        jpg.data(), jpg.size(), [&](int, int) { return b; }, b.w, b.h);
    EXPECT_EQ(dc.path, DecodePath::kJpegRegion) << name;
    EXPECT_LE(maxAbsDiff(dc.crop, cropOf(full, b)), 2) << name;
  }
}

TEST(Decode, ChoosesSmallestSufficientDctScale) {
  EXPECT_EQ(chooseDctScale(400, 400, 50, 50), 1);
  EXPECT_EQ(chooseDctScale(400, 400, 51, 51), 2);
  EXPECT_EQ(chooseDctScale(400, 300, 128, 128), 4);  // 300*3/8 = 112.5 < 128 <= 150
  EXPECT_EQ(chooseDctScale(100, 100, 224, 224), 8);  // never upscale past 8/8
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(480, 360), 90);
  DecodedCrop dc = decodeCrop(
      jpg.data(), jpg.size(),
      [](int w, int h) {
    return Box{0, 0, w, h};
      },
      64, 64);
  EXPECT_EQ(dc.scale_num, 2);  // 360*2/8 = 90 >= 64, 360/8 = 45 < 64
  EXPECT_EQ(dc.crop.width, 120);
  EXPECT_EQ(dc.crop.height, 90);
  EXPECT_EQ(dc.orig_width, 480);
  // The scaled decode is a faithful downscale of the full picture.
  const RgbImage full = decodeFull(jpg.data(), jpg.size());
  cv::Mat small;
  cv::resize(cv::Mat(360, 480, CV_8UC3, const_cast<uint8_t*>(full.pixels.data())), small, cv::Size(120, 90), 0, 0,
             cv::INTER_AREA);
  RgbImage ref{120, 90, std::vector<uint8_t>(small.data, small.data + small.total() * 3)};
  EXPECT_LE(maxAbsDiff(dc.crop, ref), 40);  // edges of the block differ; colors agree
  double mean = 0;
  for (size_t i = 0; i < ref.pixels.size(); ++i) mean += std::abs(ref.pixels[i] - dc.crop.pixels[i]);
  EXPECT_LT(mean / ref.pixels.size(), 2.0);
}

TEST(Decode, GrayscaleBecomesThreeChannels) {
  std::vector<uint8_t> gray(50 * 70);
  for (int y = 0; y < 50; ++y)
    for (int x = 0; x < 70; ++x) gray[static_cast<size_t>(y * 70 + x)] = static_cast<uint8_t>(3 * x + y);
  const std::vector<uint8_t> jpg = turboJpeg(gray.data(), 70, 50, TJPF_GRAY, TJSAMP_GRAY);
  const RgbImage img = decodeFull(jpg.data(), jpg.size());
  ASSERT_EQ(img.width, 70);
  ASSERT_EQ(img.height, 50);
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    ASSERT_EQ(img.pixels[i], img.pixels[i + 1]);
    ASSERT_EQ(img.pixels[i], img.pixels[i + 2]);
  }
  EXPECT_NEAR(img.pixels[(10 * 70 + 20) * 3], 3 * 20 + 10, 3);
}

#ifdef AIACC_HAVE_IMGCODECS
TEST(Decode, CmykJpegFallsBackToOpenCV) {
  const int w = 64, h = 48;
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < cmyk.size(); i += 4) {
    cmyk[i] = 0;        // C
    cmyk[i + 1] = 255;  // M
    cmyk[i + 2] = 255;  // Y
    cmyk[i + 3] = 0;    // K  -> red (Adobe inverted or not, a strong primary either way)
  }
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  ASSERT_EQ(tjCompress2(tj, cmyk.data(), w, 0, h, TJPF_CMYK, &buf, &len, TJSAMP_444, 95, 0), 0);
  std::vector<uint8_t> jpg(buf, buf + len);
  tjFree(buf);
  tjDestroy(tj);
  DecodedCrop dc = decodeCrop(
      jpg.data(), jpg.size(),
      [](int ww, int hh) {
    return Box{0, 0, ww, hh};
      },
      32, 32);
  EXPECT_EQ(dc.path, DecodePath::kFallback);
  EXPECT_EQ(dc.crop.width, w);
  EXPECT_EQ(dc.crop.height, h);
  EXPECT_EQ(dc.crop.pixels.size(), static_cast<size_t>(w) * h * 3);
  // With an index (a 4-component baseline scan is indexable): the same fallback, the same box, the
  // picker called once.
  auto ix = JpegIndex::build(jpg.data(), jpg.size());
  ASSERT_NE(ix, nullptr);
  int picks = 0;
  DecodedCrop di = decodeCrop(
      jpg.data(), jpg.size(),
      [&](int, int) {
    ++picks;
    return Box{8, 8, 40, 30};
      },
      16, 16, ix.get());
  EXPECT_EQ(picks, 1);
  EXPECT_EQ(di.path, DecodePath::kFallback);
  EXPECT_EQ(di.crop.width, 40);
  EXPECT_EQ(di.crop.height, 30);
}

TEST(Decode, PngUnderJpegNameFallsBackExactly) {
  RgbImage pic = testPicture(40, 30);
  cv::Mat rgb(30, 40, CV_8UC3, pic.pixels.data()), bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  std::vector<uint8_t> png;
  cv::imencode(".png", bgr, png);
  DecodedCrop dc = decodeCrop(
      png.data(), png.size(),
      [](int, int) {
    return Box{5, 6, 20, 10};
      },
      8, 8);
  EXPECT_EQ(dc.path, DecodePath::kFallback);
  EXPECT_EQ(maxAbsDiff(dc.crop, cropOf(pic, Box{5, 6, 20, 10})), 0);  // lossless
}
#else
// Built without imgcodecs (the GPU host's bundle), what only OpenCV decodes is a DecodeError,
// which the loader counts as a skipped file, never a crash or a silent black picture.
TEST(Decode, WithoutImgcodecsACmykJpegIsADecodeError) {
  std::vector<uint8_t> cmyk(64 * 48 * 4, 128);
  const std::vector<uint8_t> jpg = turboJpeg(cmyk.data(), 64, 48, TJPF_CMYK, TJSAMP_444);
  ASSERT_FALSE(jpg.empty());
  EXPECT_THROW(decodeCrop(
                   jpg.data(), jpg.size(),
                   [](int w, int h) {
    return Box{0, 0, w, h};
                   },
                   32, 32),
               DecodeError);
}
#endif

// The benchmark's floor (aiacc_bench data --entropy-only) walks the whole file: it reports the
// image's height, and refuses what is not a JPEG.
TEST(Decode, EntropyOnlyWalksTheWholeImage) {
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(200, 150), 90);
  EXPECT_EQ(entropyDecodeOnly(jpg.data(), jpg.size()), 150);
  EXPECT_EQ(entropyDecodeOnly(jpg.data(), jpg.size(), 40), 150);  // rows 0..39 only
  EXPECT_EQ(jpegDimensions(jpg.data(), jpg.size()), std::make_pair(200, 150));
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  EXPECT_THROW(entropyDecodeOnly(png.data(), png.size()), DecodeError);
  EXPECT_THROW(jpegDimensions(png.data(), png.size()), DecodeError);
}

TEST(Decode, BadFilesRaiseDecodeError) {
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(200, 150), 90);
  const std::vector<uint8_t> truncated(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2));
  const std::vector<uint8_t> empty;
  const std::string text = "this is not an image at all";
  const std::vector<uint8_t> junk(text.begin(), text.end());
  std::vector<uint8_t> corrupt = jpg;  // valid markers, garbage entropy-coded data header
  for (size_t i = 2; i < 40 && i < corrupt.size(); ++i) corrupt[i] = 0x00;
  auto whole = [](int w, int h) { return Box{0, 0, w, h}; };
  EXPECT_THROW(decodeCrop(truncated.data(), truncated.size(), whole, 64, 64), DecodeError);
  EXPECT_THROW(decodeCrop(empty.data(), empty.size(), whole, 64, 64), DecodeError);
  EXPECT_THROW(decodeCrop(junk.data(), junk.size(), whole, 64, 64), DecodeError);
  EXPECT_THROW(decodeCrop(corrupt.data(), corrupt.size(), whole, 64, 64), DecodeError);
}

TEST(Decode, ReadFileReturnsTheBytesOrRaisesDecodeError) {
  test::TempDir dir;
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(64, 48), 90);
  test::writeFile(dir / "a.JPEG", jpg);
  test::writeFile(dir / "empty.JPEG", {});
  EXPECT_EQ(readFile(dir / "a.JPEG"), jpg);
  EXPECT_TRUE(readFile(dir / "empty.JPEG").empty());
  EXPECT_THROW(readFile(dir / "missing.JPEG"), DecodeError);
  EXPECT_THROW(readFile(dir.path()), DecodeError);  // a directory, not a file
}

}  // namespace
}  // namespace aiacc::data

namespace aiacc::data {
namespace {

// packed = false reads rows in place (a strided crop): the same pixels, and the same network
// input after resize + normalize.
TEST(Decode, StridedCropsHoldTheSamePixels) {
  const std::vector<uint8_t> jpg = encodeJpeg(testPicture(301, 217), 90);
  const Box boxes[] = {{0, 0, 301, 217}, {37, 21, 150, 120}, {200, 100, 101, 117}, {5, 190, 60, 27}};
  for (const Box& b : boxes) {
    for (int S : {24, 64, 160}) {
      const auto pick = [&](int, int) { return b; };
      DecodedCrop p = decodeCrop(jpg.data(), jpg.size(), pick, S, S);
      DecodedCrop s = decodeCrop(jpg.data(), jpg.size(), pick, S, S, nullptr, /*packed=*/false);
      ASSERT_EQ(p.crop.stride, 0u);
      ASSERT_EQ(s.crop.width, p.crop.width);
      ASSERT_EQ(s.crop.height, p.crop.height);
      for (int y = 0; y < p.crop.height; ++y) {
        ASSERT_EQ(std::memcmp(s.crop.row(y), p.crop.row(y), static_cast<size_t>(p.crop.width) * 3), 0) << "row " << y;
      }
      std::vector<float> a(static_cast<size_t>(3) * S * S), c(a.size());
      resizeNormalize(p.crop, S, true, Layout::kNCHW, a.data());
      resizeNormalize(s.crop, S, true, Layout::kNCHW, c.data());
      EXPECT_EQ(a, c);
    }
  }
}

}  // namespace
}  // namespace aiacc::data
