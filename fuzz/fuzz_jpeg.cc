// The image path of the data loader on any bytes: decodeCrop with aiacc's Huffman decoder
// (packed and strided crops) and with libjpeg-turbo's, at DCT-scaled and full-size outputs; the
// OpenCV fallback for what is not a JPEG; the header reader; and the transforms that follow a
// decode (Pillow-style and fast resizes, normalisation and the uint8 path). Bad bytes must end in
// a DecodeError (the loader's counted skip), never a crash, a hang or a large allocation.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/decode.h"
#include "data/transforms.h"
#include "fuzz/fuzz_util.h"

namespace {

using namespace aiacc::data;

// Each run's decodes stay small: the pixel bound is what the fuzzer meets, not a 179-megapixel
// image (at kDefaultMaxImagePixels a run could take seconds and be reported as slow).
constexpr int64_t kMaxPixels = int64_t{1} << 22;

void transformsOf(const DecodedCrop& dc, int out) {
  std::vector<float> chw(static_cast<size_t>(3) * out * out);
  std::vector<uint8_t> hwc(static_cast<size_t>(3) * out * out);
  resizeNormalize(dc.crop, out, false, Layout::kNCHW, chw.data(), ResizeFilter::kPillow);
  resizeNormalize(dc.crop, out, true, Layout::kNHWC, chw.data(), ResizeFilter::kFast);
  resizeToBytes(dc.crop, out, false, hwc.data(), ResizeFilter::kPillow);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int outs[3] = {16, 40, 224};
  const uint32_t h = size ? data[size / 2] : 0;  // a crop that follows the bytes
  const CropPicker pick = [h](int w, int hgt) {
    const int bw = std::max(1, w * static_cast<int>(1 + h % 8) / 8);
    const int bh = std::max(1, hgt * static_cast<int>(1 + (h >> 3) % 8) / 8);
    return Box{static_cast<int>(h % 7) * (w - bw) / 6, static_cast<int>(h % 5) * (hgt - bh) / 4, bw, bh};
  };
  try {
    jpegDimensions(data, size);
  } catch (const DecodeError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  for (HuffmanDecoder huffman : {HuffmanDecoder::kAiacc, HuffmanDecoder::kLibjpegTurbo}) {
    const int out = outs[(h + static_cast<uint32_t>(huffman)) % 3];
    try {
      const DecodedCrop dc = decodeCrop(data, size, pick, out, out, nullptr, huffman == HuffmanDecoder::kAiacc, nullptr,
                                        huffman, kMaxPixels);
      transformsOf(dc, out);
      decodeCrop(data, size, pick, kFullResolution, kFullResolution, nullptr, false, nullptr, huffman, kMaxPixels);
    } catch (const DecodeError& e) {
      aiacc::fuzz::checkOneLine(e.what());
    }
  }
  return 0;
}
