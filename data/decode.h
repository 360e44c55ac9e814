// Image decoding for the input pipeline.
//
// JPEG files go through libjpeg-turbo, decoding only what the crop needs:
//   1. the header gives the image size; the caller's picker chooses the crop box in original
//      pixel coordinates (random-resized-crop, center crop, ...);
//   2. the smallest DCT scale num/8 in {1/8, 2/8, 4/8, 8/8} (the scales with SIMD IDCTs) at
//      which the scaled crop still has at least the output's width and height is chosen, so a
//      500 px photo cropped to 128 px decodes at 1/4 or 1/2 size, several times cheaper than a
//      full decode;
//   3. only the crop's columns (jpeg_crop_scanline, widened to iMCU boundaries) and rows
//      (jpeg_skip_scanlines above, stop below) are decoded;
//   4. the Huffman decoding is aiacc's (data/entropy_hook.h): what lies outside the crop is walked
//      without values, or, with the file's JPEG index (data/jpeg_index.h), not touched at all.
// Files libjpeg-turbo cannot take (PNG or other formats under a .JPEG name, CMYK/YCCK JPEGs;
// both occur in real ImageNet) are decoded whole by OpenCV when it was built with imgcodecs.
// Grayscale becomes 3-channel RGB. A zero-byte, truncated or undecodable file raises
// DecodeError; the loader turns that into a counted skip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "aiacc/common/error.h"
#include "data/decode_bounds.h"

namespace aiacc::data {

class DecodeError : public Error {
 public:
  explicit DecodeError(const std::string& what) : Error(what) {}
};

// A rectangle in pixel coordinates: columns [x, x+w), rows [y, y+h).
struct Box {
  int x = 0, y = 0, w = 0, h = 0;
};

// Interleaved 8-bit RGB. Rows packed (3 * width bytes apart, from pixels[0]) unless stride is
// set: then pixel (0, 0) is at pixels[offset] and rows are stride bytes apart (decodeCrop with
// packed = false, which reads the decoder's rows in place instead of copying them).
struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;
  size_t offset = 0;
  size_t stride = 0;  // 0: packed
  size_t rowBytes() const { return stride ? stride : static_cast<size_t>(width) * 3; }
  const uint8_t* row(int y) const { return pixels.data() + offset + static_cast<size_t>(y) * rowBytes(); }
};

// Picks the crop box given the original image's width and height.
using CropPicker = std::function<Box(int width, int height)>;

enum class DecodePath { kJpegRegion, kJpegIndex, kFallback };

// Whose Huffman decoder entropy-decodes a JPEG in decodeCrop:
//   kProcessDefault  aiacc's where EntropyHook::enabled() (the --libjpeg-huffman switch) and the
//                    process's gate (data/entropy_gate.h, huffmanTakeover()) allow it;
//   kLibjpegTurbo    libjpeg-turbo's;
//   kAiacc           aiacc's whatever the switch and the gate (the gate's self-check).
// aiacc's decoder takes only the files it can (data/entropy_hook.h); the others, and those whose
// data it finds invalid, are decoded by libjpeg-turbo's.
enum class HuffmanDecoder { kProcessDefault, kLibjpegTurbo, kAiacc };

class JpegIndex;

struct DecodedCrop {
  RgbImage crop;       // the crop box's pixels, at DCT scale scale_num/8
  int orig_width = 0;  // full image size, before scaling
  int orig_height = 0;
  Box box;            // crop box chosen by the picker, original coordinates
  int scale_num = 8;  // DCT scale numerator (denominator 8)
  DecodePath path = DecodePath::kJpegRegion;
  bool aiacc_huffman = false;  // aiacc's Huffman decoder gave the coefficients (else libjpeg-turbo's)
};

// Asks decodeCrop for the file's JPEG index (data/jpeg_index.h) when it has none: our Huffman
// decoder builds it as a by-product of the decode, walking the MCUs below the crop besides;
// where it does not decode the file, JpegIndex::build does. When more than max_rest_below of the
// image's rows lie below the crop, the build is deferred to a later decode of the file (whose
// random crop ends lower), so that no decode pays for walking much more than it decodes (a file
// that cannot be indexed is found out on a decode that would build).
struct IndexBuild {
  int cols_per_checkpoint = 2;
  double max_rest_below = 0.1;       // (0.25: the first epoch about 8% slower, the index sooner complete)
  std::unique_ptr<JpegIndex> index;  // out: null when the file cannot be indexed, or deferred
  bool deferred = false;             // out
  IndexBuild();
  ~IndexBuild();
};

// An output size for decodeCrop that no DCT scale reaches: the crop decodes at full size.
inline constexpr int kFullResolution = 1 << 30;

// Decompression bombs: decodeCrop refuses with a DecodeError (the loader's counted skip), before
// it allocates anything for pixels, an image whose header claims more than max_pixels pixels
// (kDefaultMaxImagePixels by default, PIL's refusal point), more blocks than a JPEG's bytes can
// code, or more pixels than a PNG's bytes can expand to; data/decode_bounds.h states the bounds.

// Decodes the crop of an encoded image (file bytes) that will be resized to out_w x out_h.
// With an index of the file (data/jpeg_index.h), only the crop's MCUs (plus a margin) are
// entropy-decoded, from a small extract of the file; the pixels are the same (path kJpegIndex).
// packed = false allows a strided crop (RgbImage::stride), which saves a copy of every row.
// build (optional, without index): also builds the file's index.
// huffman: whose Huffman decoder (see HuffmanDecoder); the pixels are the same either way.
// max_pixels: the largest image it decodes (see kDefaultMaxImagePixels).
DecodedCrop decodeCrop(const uint8_t* data, size_t size, const CropPicker& pick, int out_w, int out_h,
                       const JpegIndex* index = nullptr, bool packed = true, IndexBuild* build = nullptr,
                       HuffmanDecoder huffman = HuffmanDecoder::kProcessDefault,
                       int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes the whole image at full size (tests, tools).
RgbImage decodeFull(const uint8_t* data, size_t size);

// Entropy-decodes the rows [0, rows) of a baseline JPEG (every row when rows < 0), rounded up to
// whole iMCU rows, and discards them (no inverse DCT, no colour conversion): the floor under
// decodeCrop's time for a crop whose last row is rows - 1, since the Huffman data above a crop's
// last row must be decoded whatever the crop or DCT scale. For aiacc_bench data --entropy-only
// and --breakdown. aiacc's Huffman decoder as decodeCrop's kProcessDefault. Returns the image's
// height.
int entropyDecodeOnly(const uint8_t* data, size_t size, int rows = -1);

// Width and height from a JPEG's header. Throws DecodeError when it is not a readable JPEG.
std::pair<int, int> jpegDimensions(const uint8_t* data, size_t size);

// Smallest DCT scale numerator n in {1, 2, 4, 8} such that ceil(crop_w*n/8) >= out_w and
// ceil(crop_h*n/8) >= out_h; 8 when even full size is smaller than the output.
int chooseDctScale(int crop_w, int crop_h, int out_w, int out_h);

// Reads a whole file. Throws DecodeError when it cannot be read.
std::vector<uint8_t> readFile(const std::string& path);

enum class JpegSampling { k420, k444 };

// Encodes RGB pixels as a baseline JPEG (TurboJPEG), 4:2:0 unless told, at the given quality.
std::vector<uint8_t> encodeJpeg(const RgbImage& image, int quality, JpegSampling sampling = JpegSampling::k420);

}  // namespace aiacc::data
