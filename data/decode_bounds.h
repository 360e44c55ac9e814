// Decompression bombs: the bounds an image's header claims are held to before any memory is sized
// from them, by decodeCrop (data/decode.h) and the JPEG index (data/jpeg_index.h). Pure functions
// of the header's claims and the file's size; each returns why a claim is refused, or "" when it
// is within bounds (decodeCrop throws that reason as a DecodeError, the loader's counted skip).
//
// An image is refused when its header claims
//   - more than max_pixels pixels (width x height): by default PIL's own refusal point,
//     2 x Image.MAX_IMAGE_PIXELS = 178,956,970 (aiacc_train --max-image-pixels sets it);
//   - or, for a Huffman-coded JPEG, more 8x8 blocks than its file has bits: every block codes its
//     DC difference in one bit at least, so such a file is truncated or crafted (a 677-byte file
//     claiming 30000 x 30000 pixels). An arithmetic-coded JPEG, which can code a block in less,
//     may claim 512 blocks a byte (1/64 bit each), a thousand times the densest valid file;
//   - or, for a PNG, more than 8 x 1032 pixels a byte (deflate's largest ratio, 1 bit a pixel).
// A progressive JPEG of more than kMaxScans scans (each scan visits every block) is refused as its
// next scan starts, as TurboJPEG does. So a hostile Huffman JPEG of N bytes decodes at most 8N
// blocks in at most 500 scans, what a valid file of N bytes at the densest coding costs, and a
// larger claim costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace aiacc::data {

inline constexpr int64_t kDefaultMaxImagePixels = 178956970;
inline constexpr int64_t kHuffmanBlocksPerByte = 8;
inline constexpr int64_t kArithBlocksPerByte = 512;
inline constexpr int64_t kPngPixelsPerByte = 8 * 1032;
inline constexpr int kMaxScans = 500;

// width x height above max_pixels (overflow-checked: a PNG's sides are up to 2^32 - 1 each).
std::string pixelRefusal(int64_t width, int64_t height, int64_t max_pixels);

// A JPEG of width x height claiming blocks 8x8 blocks (over every component) in bytes bytes.
std::string jpegBlockRefusal(int64_t width, int64_t height, uint64_t blocks, bool arith_code, uint64_t bytes);

// A PNG's width and height from its IHDR chunk; {0, 0} when data is not a PNG.
std::pair<int64_t, int64_t> pngDimensions(const uint8_t* data, size_t size);

// A PNG of width x height in size bytes: the pixel limit, then the deflate ratio.
std::string pngRefusal(int64_t width, int64_t height, size_t size, int64_t max_pixels);

}  // namespace aiacc::data
