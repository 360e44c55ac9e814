// Image transforms, with torchvision's semantics where torchvision defines them.
//
// Train: random-resized-crop (area fraction in [scale_min, scale_max], aspect ratio log-uniform
// in [ratio_min, ratio_max], 10 attempts then a center-crop fallback: exactly torchvision's
// RandomResizedCrop.get_params), horizontal flip with probability 1/2, normalize with ImageNet
// mean/std. Val: resize the short side to size/crop_fraction (0.875 -> 256 for 224), center crop
// size. Val is computed as the equivalent crop box in original pixels (side = crop_fraction *
// short side) resized to size x size, which lets the decoder skip everything outside it.
#pragma once

#include <cstdint>

#include "data/decode.h"

namespace aiacc::data {

// Deterministic, portable random numbers (splitmix64 seeding + xoshiro256**): identical
// sequences on every platform and standard library, so shuffles and crops are reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform(double lo, double hi);    // [lo, hi)
  int64_t randint(int64_t lo, int64_t hi);  // [lo, hi), hi > lo
 private:
  uint64_t s_[4];
};

// Mixes several values into one seed (for per-sample streams: seed, epoch, index).
uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c = 0);

struct CropParams {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
};

// torchvision RandomResizedCrop.get_params for an image of width x height.
Box randomResizedCropBox(int width, int height, const CropParams& p, Rng& rng);

// The val transform's crop in original pixels: a centered square of side crop_fraction times
// the short side (resize-short-side-then-center-crop, expressed before the resize).
Box centerCropBox(int width, int height, double crop_fraction);

enum class Layout { kNCHW, kNHWC };

// ImageNet statistics, in 0..1 units.
inline constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

// Resizes crop to size x size (bilinear; area averaging when shrinking by 2x or more, like an
// antialiased resize), optionally mirrors it, normalizes, and writes 3*size*size floats to out in
// CHW (kNCHW) or HWC (kNHWC) order.
void resizeNormalize(const RgbImage& crop, int size, bool flip, Layout layout, float* out);

// The same resize and mirror without the normalization: 3*size*size bytes, HWC order. For the
// GPU input path, which copies a quarter of the bytes and normalizes on the device
// (data/device_input.h).
void resizeToBytes(const RgbImage& crop, int size, bool flip, uint8_t* out);

}  // namespace aiacc::data
