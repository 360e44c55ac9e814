#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

namespace aiacc::data {
namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform(double lo, double hi) {
  const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  return lo + (hi - lo) * u;
}

int64_t Rng::randint(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo);
  return lo + static_cast<int64_t>(next() % span);
}

uint64_t mixSeed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a;
  uint64_t h = splitmix64(x);
  x = h ^ b;
  h = splitmix64(x);
  x = h ^ c;
  return splitmix64(x);
}

Box randomResizedCropBox(int width, int height, const CropParams& p, Rng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(p.ratio_min), log_hi = std::log(p.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(p.scale_min, p.scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = static_cast<int>(std::lround(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::lround(std::sqrt(target_area / aspect)));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = static_cast<int>(rng.randint(0, height - h + 1));
      const int x = static_cast<int>(rng.randint(0, width - w + 1));
      return {x, y, w, h};
    }
  }
  // Fallback to a whole-image center crop with the ratio clamped into range.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < p.ratio_min) {
    h = static_cast<int>(std::lround(w / p.ratio_min));
  } else if (in_ratio > p.ratio_max) {
    w = static_cast<int>(std::lround(h * p.ratio_max));
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

Box centerCropBox(int width, int height, double crop_fraction) {
  const int side = std::max(1, static_cast<int>(std::lround(crop_fraction * std::min(width, height))));
  return {(width - side) / 2, (height - side) / 2, side, side};
}

namespace {
// Into `resized`: allocated when empty, else written in place (it must be size x size, 8UC3).
void resizeFlip(const RgbImage& crop, int size, bool flip, cv::Mat& resized) {
  cv::Mat src(crop.height, crop.width, CV_8UC3, const_cast<uint8_t*>(crop.pixels.data()));
  const bool shrink2x = crop.width >= 2 * size && crop.height >= 2 * size;
  cv::resize(src, resized, cv::Size(size, size), 0, 0,
             shrink2x ? cv::INTER_AREA : cv::INTER_LINEAR);
  if (flip) cv::flip(resized, resized, 1);
}
}  // namespace

void resizeToBytes(const RgbImage& crop, int size, bool flip, uint8_t* out) {
  cv::Mat dst(size, size, CV_8UC3, out);
  resizeFlip(crop, size, flip, dst);
}

void resizeNormalize(const RgbImage& crop, int size, bool flip, Layout layout, float* out) {
  cv::Mat resized;
  resizeFlip(crop, size, /*flip=*/false, resized);  // mirrored below, for free
  // One table per channel: the float for each byte value, computed with the same expression
  // (v * scale + shift) a per-pixel loop would use, so the result is bit for bit the same.
  // Three table reads per pixel beat the arithmetic on the interleaved bytes (the compiler
  // cannot vectorize stride-3 loads), and reading the row backwards mirrors it at no cost.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const float scale = 1.0f / (255.0f * kStd[c]);
    const float shift = -kMean[c] / kStd[c];
    for (int v = 0; v < 256; ++v) lut[c][v] = static_cast<float>(v) * scale + shift;
  }
  const size_t plane = static_cast<size_t>(size) * size;
  for (int y = 0; y < size; ++y) {
    const uint8_t* row = resized.ptr<uint8_t>(y);
    // Source pixel of output column x: x, or size-1-x when mirrored.
    const int first = flip ? size - 1 : 0;
    const int step = flip ? -1 : 1;
    if (layout == Layout::kNHWC) {
      float* o = out + static_cast<size_t>(y) * size * 3;
      for (int x = 0; x < size; ++x) {
        const uint8_t* p = row + 3 * (first + step * x);
        o[3 * x + 0] = lut[0][p[0]];
        o[3 * x + 1] = lut[1][p[1]];
        o[3 * x + 2] = lut[2][p[2]];
      }
    } else {
      float* r = out + static_cast<size_t>(y) * size;
      float* g = r + plane;
      float* b = g + plane;
      for (int x = 0; x < size; ++x) {
        const uint8_t* p = row + 3 * (first + step * x);
        r[x] = lut[0][p[0]];
        g[x] = lut[1][p[1]];
        b[x] = lut[2][p[2]];
      }
    }
  }
}

}  // namespace aiacc::data
