#include "data/transforms.h"

#include <algorithm>
#include <cmath>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define AIACC_PLANAR_SIMD 1
#endif

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

ValCrop torchvisionValCrop(int width, int height, int size, double crop_fraction) {
  // torchvision 0.14: Resize(R) makes the short side R and the long side int(R * long / short);
  // CenterCrop(size) starts at int(round((side - size) / 2)). Python rounds half to even, as
  // nearbyint does in the default rounding mode.
  const int r = static_cast<int>(std::nearbyint(size / crop_fraction));
  const bool portrait = width <= height;
  const int short_side = portrait ? width : height, long_side = portrait ? height : width;
  const int long_resized = static_cast<int>(static_cast<int64_t>(r) * long_side / short_side);
  const int rw = portrait ? r : long_resized, rh = portrait ? long_resized : r;
  const int left = static_cast<int>(std::nearbyint((rw - size) / 2.0));
  const int top = static_cast<int>(std::nearbyint((rh - size) / 2.0));
  const double sx = static_cast<double>(width) / rw, sy = static_cast<double>(height) / rh;
  const SampleWindow w{left * sx, top * sy, (left + size) * sx, (top + size) * sy};
  // Pillow's taps reach max(scale, 1) source pixels either side of a sample's center, rounded.
  const int mx = static_cast<int>(std::ceil(std::max(sx, 1.0))) + 2;
  const int my = static_cast<int>(std::ceil(std::max(sy, 1.0))) + 2;
  ValCrop v;
  v.decode.x = std::max(0, static_cast<int>(std::floor(w.x0)) - mx);
  v.decode.y = std::max(0, static_cast<int>(std::floor(w.y0)) - my);
  v.decode.w = std::min(width, static_cast<int>(std::ceil(w.x1)) + mx) - v.decode.x;
  v.decode.h = std::min(height, static_cast<int>(std::ceil(w.y1)) + my) - v.decode.y;
  v.window = {w.x0 - v.decode.x, w.y0 - v.decode.y, w.x1 - v.decode.x, w.y1 - v.decode.y};
  return v;
}

namespace {
// Into `resized` (size x size, 8UC3): allocated when empty, else written in place.
void resizeFlip(const RgbImage& crop, int size, bool flip, ResizeFilter filter,
                const std::optional<SampleWindow>& window, cv::Mat& resized) {
  const SampleWindow w = window ? *window
                                : SampleWindow{0, 0, static_cast<double>(crop.width), static_cast<double>(crop.height)};
  if (filter == ResizeFilter::kPillow) {
    if (resized.empty()) resized.create(size, size, CV_8UC3);
    thread_local std::vector<uint8_t> scratch;  // the horizontal pass's rows, reused per thread
    resampleBilinear(crop, w, size, size, flip, resized.ptr<uint8_t>(0), scratch);
    return;
  }
  cv::Mat src(crop.height, crop.width, CV_8UC3, const_cast<uint8_t*>(crop.row(0)), crop.rowBytes());
  if (window) {
    const int x0 = std::clamp(static_cast<int>(std::lround(w.x0)), 0, crop.width - 1);
    const int y0 = std::clamp(static_cast<int>(std::lround(w.y0)), 0, crop.height - 1);
    const int x1 = std::clamp(static_cast<int>(std::lround(w.x1)), x0 + 1, crop.width);
    const int y1 = std::clamp(static_cast<int>(std::lround(w.y1)), y0 + 1, crop.height);
    src = src(cv::Rect(x0, y0, x1 - x0, y1 - y0));
  }
  const bool shrink2x = src.cols >= 2 * size && src.rows >= 2 * size;
  cv::resize(src, resized, cv::Size(size, size), 0, 0, shrink2x ? cv::INTER_AREA : cv::INTER_LINEAR);
  if (flip) cv::flip(resized, resized, 1);
}
}  // namespace

void resizeToBytes(const RgbImage& crop, int size, bool flip, uint8_t* out, ResizeFilter filter,
                   const std::optional<SampleWindow>& window) {
  cv::Mat dst(size, size, CV_8UC3, out);
  resizeFlip(crop, size, flip, filter, window, dst);
}

#ifdef AIACC_PLANAR_SIMD
namespace {
// Byte shuffles that split 16 interleaved RGB pixels (48 bytes, three 16-byte loads) into 16 R,
// 16 G and 16 B bytes, in order or mirrored: lane j takes pixel j (or 15 - j) of the block.
struct PlanarMasks {
  alignas(16) uint8_t m[2][3][3][16];  // [mirrored][channel][load]
  PlanarMasks() {
    for (int f = 0; f < 2; ++f)
      for (int c = 0; c < 3; ++c)
        for (int load = 0; load < 3; ++load)
          for (int j = 0; j < 16; ++j) {
            const int pos = 3 * (f ? 15 - j : j) + c;  // byte of the block this lane wants
            m[f][c][load][j] = pos / 16 == load ? static_cast<uint8_t>(pos % 16) : 0x80;
          }
  }
};
const PlanarMasks kPlanar;

// The whole 16-pixel blocks of one row to planar floats: r/g/b[x] = v * scale[c] + shift[c] for
// the byte v of output column x (source column x, or size-1-x mirrored). Exactly the scalar
// expression (a multiply, then an add, in float), so the result equals the table path bit for
// bit. Returns the first column it did not write.
__attribute__((target("ssse3"))) int rowBlocksToPlanarSsse3(const uint8_t* row, int size, bool flip, const float* scale,
                                                            const float* shift, float* const dst[3]) {
  const int f = flip ? 1 : 0;
  __m128i mask[3][3];
  for (int c = 0; c < 3; ++c)
    for (int l = 0; l < 3; ++l) mask[c][l] = _mm_load_si128(reinterpret_cast<const __m128i*>(kPlanar.m[f][c][l]));
  const __m128i zero = _mm_setzero_si128();
  int x = 0;
  for (; x + 16 <= size; x += 16) {
    const uint8_t* src = row + 3 * (flip ? size - 16 - x : x);
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    for (int c = 0; c < 3; ++c) {
      const __m128i bytes = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, mask[c][0]),
                                                      _mm_shuffle_epi8(v1, mask[c][1])),
                                         _mm_shuffle_epi8(v2, mask[c][2]));
      const __m128i lo = _mm_unpacklo_epi8(bytes, zero), hi = _mm_unpackhi_epi8(bytes, zero);
      const __m128i words[4] = {_mm_unpacklo_epi16(lo, zero), _mm_unpackhi_epi16(lo, zero),
                                _mm_unpacklo_epi16(hi, zero), _mm_unpackhi_epi16(hi, zero)};
      const __m128 sc = _mm_set1_ps(scale[c]), sh = _mm_set1_ps(shift[c]);
      for (int q = 0; q < 4; ++q) {
        _mm_storeu_ps(dst[c] + x + 4 * q, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(words[q]), sc), sh));
      }
    }
  }
  return x;
}
const bool kHaveSsse3 = __builtin_cpu_supports("ssse3");
}  // namespace
#endif

namespace {
// Per channel: scale and shift of the normalization, and the float for each byte value computed
// with that same expression (v * scale + shift), so table and arithmetic agree bit for bit.
struct NormalizeTables {
  float scale[3], shift[3], lut[3][256];
  NormalizeTables() {
    for (int c = 0; c < 3; ++c) {
      scale[c] = 1.0f / (255.0f * kStd[c]);
      shift[c] = -kMean[c] / kStd[c];
      for (int v = 0; v < 256; ++v) lut[c][v] = static_cast<float>(v) * scale[c] + shift[c];
    }
  }
};
const NormalizeTables kNorm;
}  // namespace

void resizeNormalize(const RgbImage& crop, int size, bool flip, Layout layout, float* out, ResizeFilter filter,
                     const std::optional<SampleWindow>& window) {
  cv::Mat resized;
  resizeFlip(crop, size, /*flip=*/false, filter, window, resized);  // mirrored below, for free
  // Three table reads per pixel beat the arithmetic on the interleaved bytes (the compiler
  // cannot vectorize stride-3 loads), and reading the row backwards mirrors it at no cost.
  // Planar output (NCHW, the CPU default) goes through byte shuffles where the CPU has them
  // (SSSE3): 16 pixels at a time, the same arithmetic; the table finishes the row.
  const auto& lut = kNorm.lut;
  const size_t plane = static_cast<size_t>(size) * size;
  // Source pixel of output column x: x, or size-1-x when mirrored.
  const int first = flip ? size - 1 : 0;
  const int step = flip ? -1 : 1;
  for (int y = 0; y < size; ++y) {
    const uint8_t* row = resized.ptr<uint8_t>(y);
    if (layout == Layout::kNHWC) {
      float* o = out + static_cast<size_t>(y) * size * 3;
      for (int x = 0; x < size; ++x) {
        const uint8_t* p = row + 3 * (first + step * x);
        o[3 * x + 0] = lut[0][p[0]];
        o[3 * x + 1] = lut[1][p[1]];
        o[3 * x + 2] = lut[2][p[2]];
      }
    } else {
      float* const r = out + static_cast<size_t>(y) * size;
      float* const dst[3] = {r, r + plane, r + 2 * plane};
      int x = 0;
#ifdef AIACC_PLANAR_SIMD
      if (kHaveSsse3) x = rowBlocksToPlanarSsse3(row, size, flip, kNorm.scale, kNorm.shift, dst);
#endif
      for (; x < size; ++x) {
        const uint8_t* p = row + 3 * (first + step * x);
        dst[0][x] = lut[0][p[0]];
        dst[1][x] = lut[1][p[1]];
        dst[2][x] = lut[2][p[2]];
      }
    }
  }
}

std::optional<ResizeMode> resizeModeFromName(const std::string& name) {
  if (name == "torchvision") return ResizeMode::kTorchvision;
  if (name == "dct") return ResizeMode::kTorchvisionDct;
  if (name == "fast") return ResizeMode::kFast;
  return std::nullopt;
}

}  // namespace aiacc::data

#undef AIACC_PLANAR_SIMD  // (the unity build: not into the next source)
