#include "data/entropy_gate.h"

#include "aiacc/common/error.h"
#include "data/jpeg_index.h"

#include <cstdio>  // jpeglib.h needs FILE
#include <jpeglib.h>

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

namespace aiacc::data {
namespace {

std::string versionName(int v) { return strCat(v / 1000000, ".", v / 1000 % 1000, ".", v % 1000); }

std::string testedList() {
  std::string s;
  for (int v : kTestedLibjpegTurboVersions) s += (s.empty() ? "" : ", ") + versionName(v);
  return s;
}

// The built-in image: gradients, an edge every few pixels and hashed noise, so that its blocks
// have AC coefficients of many sizes (long codes, several value categories). 72x56 leaves a
// partial MCU column and row in 4:2:0 (16x16 MCUs) and 4:4:4 (8x8) alike.
RgbImage builtInImage() {
  constexpr int kW = 72, kH = 56;
  RgbImage img{kW, kH, std::vector<uint8_t>(static_cast<size_t>(kW) * kH * 3)};
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      for (int c = 0; c < 3; ++c) {
        uint32_t h = static_cast<uint32_t>(x) * 73856093u ^ static_cast<uint32_t>(y) * 19349663u ^
                     static_cast<uint32_t>(c + 1) * 83492791u;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        const int noise = static_cast<int>(h % 61) - 30;
        const int base = c == 0 ? 255 * x / kW : c == 1 ? 255 * y / kH : ((x / 7 + y / 5) % 3) * 110;
        img.pixels[(static_cast<size_t>(y) * kW + x) * 3 + c] = static_cast<uint8_t>(std::clamp(base + noise, 0, 255));
      }
    }
  }
  return img;
}

// One decode of the self-check: a box of the built-in image for an output size (which picks the
// DCT scale), with or without the file's index.
struct Case {
  const char* what;
  Box box;  // w == 0: the whole image
  int out_w, out_h;
  bool indexed;
};

}  // namespace

int compiledLibjpegTurboVersion() {
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
  return LIBJPEG_TURBO_VERSION_NUMBER;
#else
  return 0;
#endif
}

std::string huffmanTakeoverAllowed(int version_number) {
  if (std::find(std::begin(kTestedLibjpegTurboVersions), std::end(kTestedLibjpegTurboVersions), version_number) !=
      std::end(kTestedLibjpegTurboVersions)) {
    return "";
  }
  if (version_number <= 0) {
    return strCat("libjpeg-turbo version unknown (jconfig.h defines no LIBJPEG_TURBO_VERSION_NUMBER); tested: ",
                  testedList());
  }
  return strCat("libjpeg-turbo ", versionName(version_number), " (", version_number, ") is not in the tested list (",
                testedList(), ")");
}

std::string huffmanTakeoverSelfCheck(const SelfCheckTamper& tamper) {
  const RgbImage image = builtInImage();
  const Case cases[] = {
      {"whole at 8/8", {}, kFullResolution, kFullResolution, false},
      {"box 19,21 37x29 at 8/8", {19, 21, 37, 29}, kFullResolution, kFullResolution, false},
      {"box 19,21 37x29 at 2/8", {19, 21, 37, 29}, 10, 8, false},
      {"box 19,21 37x29 at 1/8", {19, 21, 37, 29}, 4, 3, false},
      {"box 33,9 30x40 at 4/8, indexed", {33, 9, 30, 40}, 15, 20, true},
      {"box 33,9 30x40 at 8/8, indexed", {33, 9, 30, 40}, kFullResolution, kFullResolution, true},
  };
  for (const JpegSampling sampling : {JpegSampling::k420, JpegSampling::k444}) {
    const char* sname = sampling == JpegSampling::k420 ? "4:2:0" : "4:4:4";
    const std::vector<uint8_t> jpg = encodeJpeg(image, 90, sampling);
    const std::unique_ptr<JpegIndex> index = JpegIndex::build(jpg.data(), jpg.size(), 2);
    for (const Case& c : cases) {
      const auto pick = [&c](int w, int h) { return c.box.w > 0 ? c.box : Box{0, 0, w, h}; };
      const JpegIndex* ix = c.indexed ? index.get() : nullptr;
      const DecodedCrop want = decodeCrop(jpg.data(), jpg.size(), pick, c.out_w, c.out_h, ix, true, nullptr,
                                          HuffmanDecoder::kLibjpegTurbo);
      DecodedCrop got = decodeCrop(jpg.data(), jpg.size(), pick, c.out_w, c.out_h, ix, true, nullptr,
                                   HuffmanDecoder::kAiacc);
      const std::string where = strCat("the built-in ", sname, " image, ", c.what);
      if (!got.aiacc_huffman) return strCat("self-check: aiacc's Huffman decoder did not take ", where);
      if (tamper) tamper(got.crop);
      const auto& a = want.crop.pixels;
      const auto& b = got.crop.pixels;
      if (got.scale_num != want.scale_num || got.crop.width != want.crop.width || got.crop.height != want.crop.height ||
          a.size() != b.size()) {
        return strCat("self-check mismatch: ", where, ": ", got.crop.width, "x", got.crop.height, " at ", got.scale_num,
                      "/8 with aiacc's Huffman decoder, ", want.crop.width, "x", want.crop.height, " at ",
                      want.scale_num, "/8 with libjpeg-turbo's");
      }
      const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
      if (diff.first != a.end()) {
        return strCat("self-check mismatch: ", where, ": byte ", diff.first - a.begin(), " of ", a.size(), " is ",
                      static_cast<int>(*diff.second), " with aiacc's Huffman decoder, ", static_cast<int>(*diff.first),
                      " with libjpeg-turbo's");
      }
    }
  }
  return "";
}

HuffmanTakeover checkHuffmanTakeover(int version_number, const SelfCheckTamper& tamper) {
  HuffmanTakeover r;
  r.version_number = version_number;
  r.reason = huffmanTakeoverAllowed(version_number);
  if (!r.reason.empty()) return r;  // an untested layout: not even the self-check runs on it
  try {
    r.reason = huffmanTakeoverSelfCheck(tamper);
  } catch (const std::exception& e) {
    r.reason = strCat("self-check error: ", e.what());
  }
  r.enabled = r.reason.empty();
  return r;
}

const HuffmanTakeover& huffmanTakeover() {
  // The one cached result (a function-local static: initialized once, concurrent callers wait).
  static const HuffmanTakeover result = [] {
    HuffmanTakeover r = checkHuffmanTakeover(compiledLibjpegTurboVersion());
    if (!r.enabled) {
      LOG(WARNING) << "aiacc data: JPEG Huffman decoding stays with libjpeg-turbo (aiacc's decoder is off): "
                   << r.reason;
    }
    return r;
  }();
  return result;
}

}  // namespace aiacc::data
