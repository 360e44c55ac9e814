// The JPEG entropy index on any bytes (data/jpeg_index.h): a build at a checkpoint spacing of 1 to
// 3 MCUs (chosen by the first byte),
// the build our Huffman decoder makes along a decode, a seek through a built index (aiacc's
// decoder) and an extract decoded by libjpeg-turbo's. A file the index cannot take is refused
// (null); anything else must decode or end in a DecodeError.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "data/decode.h"
#include "data/jpeg_index.h"
#include "fuzz/fuzz_util.h"

using namespace aiacc::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr int64_t kMaxPixels = int64_t{1} << 22;
  const CropPicker center = [](int w, int h) { return Box{w / 4, h / 4, std::max(1, w / 2), std::max(1, h / 2)}; };
  const int k = size ? 1 + data[0] % 3 : 2;
  std::unique_ptr<JpegIndex> ix = JpegIndex::build(data, size, k);
  try {
    IndexBuild build;
    build.cols_per_checkpoint = k;
    build.max_rest_below = 1.0;
    decodeCrop(data, size, center, 40, 40, nullptr, true, &build, HuffmanDecoder::kAiacc, kMaxPixels);
    if (!ix) ix = std::move(build.index);
  } catch (const DecodeError& e) {
    aiacc::fuzz::checkOneLine(e.what());
  }
  if (!ix) return 0;
  for (HuffmanDecoder huffman : {HuffmanDecoder::kAiacc, HuffmanDecoder::kLibjpegTurbo}) {
    try {
      decodeCrop(data, size, center, 40, 40, ix.get(), false, nullptr, huffman, kMaxPixels);
    } catch (const DecodeError& e) {
      aiacc::fuzz::checkOneLine(e.what());
    }
  }
  std::vector<uint8_t> piece;
  const int r0 = ix->mcusY() / 3, c0 = ix->mcusX() / 2 / ix->colsPerCheckpoint() * ix->colsPerCheckpoint();
  ix->extract(data, size, r0, ix->mcusY(), c0, ix->mcusX(), piece);
  return 0;
}
