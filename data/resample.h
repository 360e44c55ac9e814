// Bilinear resampling as torchvision does it on PIL images (Pillow's ImagingResample): a
// triangle filter whose support widens with the downscale factor (an antialiased resize), two
// separable passes (horizontal, then vertical) in Pillow's 22-bit fixed point with the
// intermediate rounded to 8 bits, taps clipped at the source's edges. Given the same source
// pixels the output equals Pillow's byte for byte (tests/transforms_stats_test.cc compares it
// with torchvision's RandomResizedCrop, Resize and CenterCrop).
//
// OpenCV's INTER_LINEAR instead takes 2 taps whatever the scale: shrinking by 1.5x it skips a
// third of the source pixels (aliasing: thin strokes vanish or break up); INTER_AREA averages
// boxes. Both are faster, and both give a network different pictures from the ones a PyTorch
// user trains on (ResizeFilter::kFast keeps them, as an option).
#pragma once

#include <cstdint>
#include <vector>

#include "data/decode.h"

namespace aiacc::data {

// The part of a source image an output samples, in source pixel coordinates (fractional):
// output pixel (i, j) centers on (x0 + (j + 0.5) * (x1 - x0) / out_w, y0 + (i + 0.5) * ...).
// The whole source: {0, 0, width, height}. A window reaching past an edge is clipped there, as
// Pillow clips its taps.
struct SampleWindow {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

// One pass's filter taps: for output k, count[k] weights from source index first[k] on, in
// Pillow's fixed point (weights sum to about 1 << kResampleBits).
struct ResampleTaps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out][ksize]
};
inline constexpr int kResampleBits = 22;

ResampleTaps resampleTaps(int in_size, double in0, double in1, int out_size);

// Resamples `window` of src (interleaved RGB) to out_w x out_h interleaved RGB bytes at out
// (rows out_w * 3 bytes apart), mirrored left-right when flip. scratch: reusable buffer. simd:
// AVX2 where the CPU has it (the same bytes; false: the scalar loops, for tests).
void resampleBilinear(const RgbImage& src, const SampleWindow& window, int out_w, int out_h, bool flip, uint8_t* out,
                      std::vector<uint8_t>& scratch, bool simd = true);

}  // namespace aiacc::data
