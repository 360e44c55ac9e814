// JPEG test pictures: a textured image and a libjpeg encoder with the options the decoder tests
// vary (sampling, grayscale, optimized tables, progressive, restart markers, quality).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "data/decode.h"
#include "data/sample_gen.h"
#include "data/transforms.h"

// In aiacc::test beside test_util.h's helpers: a namespace aiacc::data::test would hide
// aiacc::test from every data test that follows in a unity build.
namespace aiacc::test {

using data::RgbImage;
using data::Rng;

struct EncodeOptions {
  int h0 = 2, v0 = 2;  // luma sampling factors (chroma 1x1): 2x2 is 4:2:0, 2x1 4:2:2, 1x1 4:4:4
  bool gray = false;
  bool optimize = false;  // Huffman tables fitted to the image (may lack DC categories)
  bool progressive = false;
  int restart_rows = 0;
  int quality = 90;
};

// A textured picture: gradients, a block and per-pixel noise, so the entropy-coded data is
// large, varied and full of FF bytes that need stuffing.
inline RgbImage texture(int w, int h, uint64_t seed) {
  Rng rng(seed);
  RgbImage img{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3)};
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &img.pixels[(static_cast<size_t>(y) * w + x) * 3];
      const int n = static_cast<int>(rng.randint(-40, 41));
      p[0] = static_cast<uint8_t>(std::clamp(255 * x / w + n, 0, 255));
      p[1] = static_cast<uint8_t>(std::clamp(255 * y / h - n, 0, 255));
      p[2] = static_cast<uint8_t>(std::clamp(((x / 9 + y / 7) % 3) * 100 + n / 2, 0, 255));
    }
  }
  return img;
}

inline std::vector<uint8_t> encode(const RgbImage& img, const EncodeOptions& o) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  jpeg_mem_dest(&c, &buf, &len);
  c.image_width = static_cast<JDIMENSION>(img.width);
  c.image_height = static_cast<JDIMENSION>(img.height);
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, o.quality, TRUE);
  if (o.gray) {
    jpeg_set_colorspace(&c, JCS_GRAYSCALE);
  } else {
    c.comp_info[0].h_samp_factor = o.h0;
    c.comp_info[0].v_samp_factor = o.v0;
  }
  c.optimize_coding = o.optimize ? TRUE : FALSE;
  c.restart_in_rows = o.restart_rows;
  if (o.progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&img.pixels[static_cast<size_t>(c.next_scanline) * img.width * 3]);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::vector<uint8_t> out(buf, buf + len);
  free(buf);
  return out;
}

// A picture to encode: its options and size.
struct Picture {
  const char* name;
  EncodeOptions o;
  int w, h;
};

// One picture per chroma sampling the decoders handle, grayscale, and a tiny one.
inline std::vector<Picture> samplings() {
  return {
      {"4:2:0", {2, 2}, 333, 250}, {"4:2:2", {2, 1}, 301, 217},          {"4:4:4", {1, 1}, 250, 203},
      {"4:4:0", {1, 2}, 227, 260}, {"4:1:1-like 4x1", {4, 1}, 270, 140}, {"grayscale", {1, 1, true}, 241, 199},
      {"tiny", {2, 2}, 19, 13},
  };
}

// A sample dataset at root of two classes, four training JPEGs and one validation JPEG each;
// returns the first class's training folder, where tests add bad files beside good ones.
inline std::string twoClassDataset(const std::string& root) {
  data::SampleSpec spec;
  spec.classes = 2;
  spec.train_per_class = 4;
  spec.val_per_class = 1;
  data::makeSampleDataset(root, spec);
  return root + "/train/c00_disc_h0";
}

}  // namespace aiacc::test
