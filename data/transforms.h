// Image transforms, with torchvision's semantics where torchvision defines them.
//
// Train: random-resized-crop (area fraction in [scale_min, scale_max], aspect ratio log-uniform
// in [ratio_min, ratio_max], 10 attempts then a center-crop fallback: exactly torchvision's
// RandomResizedCrop.get_params), horizontal flip with probability 1/2, normalize with ImageNet
// mean/std. Val: torchvision's Resize(round(size / crop_fraction)) + CenterCrop(size), computed as
// one resampling of the part of the image the crop keeps (torchvisionValCrop), so the decoder
// skips everything else.
//
// The resize is Pillow's antialiased bilinear filter (data/resample.h), as torchvision applies it
// to PIL images: with the same decoded pixels, the same output bytes (tests/transforms_stats_test.cc
// checks boxes, pixel statistics and outputs against torchvision). ResizeMode::kFast keeps the
// older OpenCV resize, which aliases when it shrinks by less than 2x (scripts/convergence/bench.sh
// compares what each learns per epoch).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "data/decode.h"
#include "data/resample.h"

namespace aiacc::data {

// Deterministic, portable random numbers (splitmix64 seeding + xoshiro256**): identical
// sequences on every platform and standard library, so shuffles and crops are reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform(double lo, double hi);     // [lo, hi)
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
// the short side (resize-short-side-then-center-crop, expressed before the resize). With
// ResizeFilter::kFast.
Box centerCropBox(int width, int height, double crop_fraction);

// torchvision's val transform, Resize(R) then CenterCrop(size) with R = round(size /
// crop_fraction) (256 for 224 at 0.875), as one resampling of the original image: `window` is the
// part of the image the size x size output samples (what the resize to the short side R and the
// centered crop keep, in original pixels), relative to `decode`, the box to decode: the window
// plus the filter's reach, inside the image (so the taps Pillow clips at the image's edges are
// clipped at the same places, and no other).
struct ValCrop {
  Box decode;
  SampleWindow window;
};
ValCrop torchvisionValCrop(int width, int height, int size, double crop_fraction);

enum class Layout { kNCHW, kNHWC };

// ImageNet statistics, in 0..1 units.
inline constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

enum class ResizeFilter {
  kPillow,  // torchvision's on PIL images: antialiased bilinear, Pillow's arithmetic (data/resample.h)
  kFast,    // OpenCV: bilinear from 2 taps, area averaging when shrinking by 2x or more
};

// Resizes crop (or its `window`, default the whole crop) to size x size, optionally mirrors it,
// normalizes, and writes 3*size*size floats to out in CHW (kNCHW) or HWC (kNHWC) order.
// kFast rounds a window to whole pixels.
void resizeNormalize(const RgbImage& crop, int size, bool flip, Layout layout, float* out,
                     ResizeFilter filter = ResizeFilter::kPillow, const std::optional<SampleWindow>& window = {});

// The same resize and mirror without the normalization: 3*size*size bytes, HWC order. For the
// GPU input path, which copies a quarter of the bytes and normalizes on the device
// (data/device_input.h).
void resizeToBytes(const RgbImage& crop, int size, bool flip, uint8_t* out, ResizeFilter filter = ResizeFilter::kPillow,
                   const std::optional<SampleWindow>& window = {});

// How the loader makes a crop size x size.
enum class ResizeMode {
  // torchvision's on PIL images, the default: the crop decoded at full resolution, Pillow's
  // antialiased bilinear filter, val as Resize + CenterCrop. The same pictures (to the byte, given
  // the same decoded pixels) a PyTorch user trains on.
  kTorchvision,
  // Pillow's filter on the crop decoded at the smallest DCT scale (1/8..1) that still has the
  // output's size: several times less decoding for small outputs; close to torchvision's
  // pictures, not equal (the reduced decode is itself a low-pass).
  kTorchvisionDct,
  // Before aiacc matched torchvision: DCT-scaled decode, OpenCV's 2-tap bilinear (area averaging
  // from 2x down), val as a centered square of crop_fraction of the short side. Aliases when it
  // shrinks by less than 2x.
  kFast,
};
// "torchvision" | "dct" | "fast"; nullopt for anything else.
std::optional<ResizeMode> resizeModeFromName(const std::string& name);
inline ResizeFilter filterOf(ResizeMode m) {
  return m == ResizeMode::kFast ? ResizeFilter::kFast : ResizeFilter::kPillow;
}
inline bool dctScaling(ResizeMode m) { return m != ResizeMode::kTorchvision; }

}  // namespace aiacc::data
