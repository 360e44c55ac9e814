#include "data/decode_bounds.h"

#include <cstring>

#include "aiacc/common/error.h"

namespace aiacc::data {

std::string pixelRefusal(int64_t width, int64_t height, int64_t max_pixels) {
  int64_t pixels = 0;
  if (width >= 0 && height >= 0 && !__builtin_mul_overflow(width, height, &pixels) && pixels <= max_pixels) return "";
  return strCat("image of ", width, "x", height, " pixels, above the limit of ", max_pixels,
                " (--max-image-pixels): a decompression bomb?");
}

std::string jpegBlockRefusal(int64_t width, int64_t height, uint64_t blocks, bool arith_code, uint64_t bytes) {
  const uint64_t per_byte = arith_code ? kArithBlocksPerByte : kHuffmanBlocksPerByte;
  if (blocks / per_byte < bytes || (blocks / per_byte == bytes && blocks % per_byte == 0)) return "";
  return strCat("JPEG claims ", width, "x", height, " pixels (", blocks, " blocks) in ", bytes,
                " bytes: truncated or crafted");
}

std::pair<int64_t, int64_t> pngDimensions(const uint8_t* data, size_t size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size < 24 || std::memcmp(data, kSignature, 8) != 0 || std::memcmp(data + 12, "IHDR", 4) != 0) return {0, 0};
  auto be32 = [](const uint8_t* p) {
    return static_cast<int64_t>(p[0]) << 24 | static_cast<int64_t>(p[1]) << 16 | static_cast<int64_t>(p[2]) << 8 | p[3];
  };
  return {be32(data + 16), be32(data + 20)};
}

std::string pngRefusal(int64_t width, int64_t height, size_t size, int64_t max_pixels) {
  std::string why = pixelRefusal(width, height, max_pixels);
  uint64_t most = 0;  // the pixels size bytes can expand to; width * height <= max_pixels here
  if (why.empty() && !__builtin_mul_overflow(static_cast<uint64_t>(kPngPixelsPerByte), size, &most) &&
      static_cast<uint64_t>(width * height) > most) {
    why = strCat("PNG claims ", width, "x", height, " pixels in ", size, " bytes: truncated or crafted");
  }
  return why;
}

}  // namespace aiacc::data
