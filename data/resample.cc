#include "data/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "aiacc/common/error.h"

namespace aiacc::data {
namespace {

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t clip8(int32_t v) {
  v >>= kResampleBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

// Pillow's precompute_coeffs and normalize_coeffs_8bpc, for the bilinear filter (support 1).
ResampleTaps resampleTaps(int in_size, double in0, double in1, int out_size) {
  AIACC_CHECK(in_size > 0 && out_size > 0 && in1 > in0, "resample ", in_size, " [", in0, ", ", in1, ") -> ", out_size);
  const double scale = (in1 - in0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;
  ResampleTaps t;
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size) * t.ksize, 0);
  std::vector<double> k(static_cast<size_t>(t.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation, as Pillow's (int) cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    xmax = std::min(xmax, t.ksize);
    double ww = 0;
    for (int x = 0; x < xmax; ++x) {
      k[static_cast<size_t>(x)] = triangle((x + xmin - center + 0.5) * ss);
      ww += k[static_cast<size_t>(x)];
    }
    int32_t* w = &t.weights[static_cast<size_t>(xx) * t.ksize];
    for (int x = 0; x < std::max(xmax, 0); ++x) {
      const double v = ww != 0 ? k[static_cast<size_t>(x)] / ww : k[static_cast<size_t>(x)];
      w[x] = static_cast<int32_t>(v * (1 << kResampleBits) + (v < 0 ? -0.5 : 0.5));
    }
    t.first[static_cast<size_t>(xx)] = xmin;
    t.count[static_cast<size_t>(xx)] = std::max(xmax, 0);
  }
  return t;
}

namespace {

constexpr int32_t kHalf = 1 << (kResampleBits - 1);

// One source row through the horizontal taps into RGB bytes, output columns [j0, out_w) (column j
// from the taps of j itself, or of out_w - 1 - j mirrored).
void horizontalRow(const uint8_t* in, const ResampleTaps& h, int out_w, bool flip, uint8_t* o, int j0 = 0) {
  for (int j = j0; j < out_w; ++j) {
    const int xx = flip ? out_w - 1 - j : j;
    const int32_t* w = &h.weights[static_cast<size_t>(xx) * h.ksize];
    const uint8_t* p = in + 3 * h.first[static_cast<size_t>(xx)];
    int32_t r = kHalf, g = kHalf, b = kHalf;
    for (int x = 0, n = h.count[static_cast<size_t>(xx)]; x < n; ++x, p += 3) {
      r += p[0] * w[x];
      g += p[1] * w[x];
      b += p[2] * w[x];
    }
    o[3 * j] = clip8(r);
    o[3 * j + 1] = clip8(g);
    o[3 * j + 2] = clip8(b);
  }
}

void verticalRow(const uint8_t* rows, size_t row_bytes, int n, const int32_t* w, size_t len, int32_t* acc, uint8_t* o) {
  std::fill(acc, acc + len, kHalf);
  for (int y = 0; y < n; ++y) {
    const uint8_t* t = rows + static_cast<size_t>(y) * row_bytes;
    const int32_t wy = w[y];
    for (size_t c = 0; c < len; ++c) acc[c] += t[c] * wy;
  }
  for (size_t c = 0; c < len; ++c) o[c] = clip8(acc[c]);
}

#if defined(__x86_64__)
// The same arithmetic, 8 output pixels at a time. Taps transposed per group of 8 columns: for
// tap k, each lane's byte offset of its source pixel (clamped inside the row; lanes past their
// tap count weigh 0) and weight. A 32-bit gather loads a pixel's R, G, B (and the next byte).
struct GatherTaps {
  int groups = 0;
  std::vector<int> taps;                // per group: the largest tap count among its lanes
  std::vector<int32_t> offset, weight;  // [group][k][8]
};

GatherTaps gatherTaps(const ResampleTaps& h, int in_w, int out_w, bool flip) {
  GatherTaps g;
  g.groups = out_w / 8;
  g.taps.resize(static_cast<size_t>(g.groups));
  g.offset.reserve(static_cast<size_t>(g.groups) * h.ksize * 8);
  g.weight.reserve(g.offset.capacity());
  for (int grp = 0; grp < g.groups; ++grp) {
    int most = 0;
    for (int l = 0; l < 8; ++l) {
      const int j = grp * 8 + l, xx = flip ? out_w - 1 - j : j;
      most = std::max(most, h.count[static_cast<size_t>(xx)]);
    }
    g.taps[static_cast<size_t>(grp)] = most;
    for (int k = 0; k < most; ++k) {
      for (int l = 0; l < 8; ++l) {
        const int j = grp * 8 + l, xx = flip ? out_w - 1 - j : j;
        const bool live = k < h.count[static_cast<size_t>(xx)];
        g.offset.push_back(3 * std::min(h.first[static_cast<size_t>(xx)] + k, in_w - 1));
        g.weight.push_back(live ? h.weights[static_cast<size_t>(xx) * h.ksize + k] : 0);
      }
    }
  }
  return g;
}

// Writes 8 pixels (lanes r, g, b in 0..255) as 24 interleaved bytes at o, and 8 bytes of
// garbage after them (the caller's buffer has room; the next store overwrites them).
__attribute__((target("avx2"))) inline void storeRgb8(__m256i r, __m256i g, __m256i b, uint8_t* o) {
  const __m256i pix = _mm256_or_si256(r, _mm256_or_si256(_mm256_slli_epi32(g, 8), _mm256_slli_epi32(b, 16)));
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,  //
                                        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const __m256i packed = _mm256_shuffle_epi8(pix, pack);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(packed));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 12), _mm256_extracti128_si256(packed, 1));
}

__attribute__((target("avx2"))) inline __m256i finish(__m256i acc) {
  return _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(acc, kResampleBits), _mm256_setzero_si256()),
                          _mm256_set1_epi32(255));
}

// in: a row with at least one readable byte after its last pixel.
__attribute__((target("avx2"))) void horizontalRowAvx2(const uint8_t* in, const GatherTaps& g, uint8_t* o) {
  const __m256i half = _mm256_set1_epi32(kHalf), byte = _mm256_set1_epi32(0xFF);
  const int32_t* off = g.offset.data();
  const int32_t* wt = g.weight.data();
  for (int grp = 0; grp < g.groups; ++grp) {
    __m256i r = half, gg = half, b = half;
    for (int k = 0, n = g.taps[static_cast<size_t>(grp)]; k < n; ++k, off += 8, wt += 8) {
      const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(in),
                                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(off)), 1);
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wt));
      r = _mm256_add_epi32(r, _mm256_mullo_epi32(_mm256_and_si256(v, byte), w));
      gg = _mm256_add_epi32(gg, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 8), byte), w));
      b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 16), byte), w));
    }
    storeRgb8(finish(r), finish(gg), finish(b), o + 24 * grp);
  }
}

__attribute__((target("avx2"))) void verticalRowAvx2(const uint8_t* rows, size_t row_bytes, int n, const int32_t* w,
                                                     size_t len, uint8_t* o) {
  size_t c = 0;
  for (; c + 8 <= len; c += 8) {
    __m256i acc = _mm256_set1_epi32(kHalf);
    for (int y = 0; y < n; ++y) {
      const __m128i t = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(rows + static_cast<size_t>(y) * row_bytes +
                                                                         c));
      acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(t), _mm256_set1_epi32(w[y])));
    }
    const __m256i v = finish(acc);
    const __m256i p16 = _mm256_packus_epi32(v, v);     // per lane: 4 words, twice
    const __m256i p8 = _mm256_packus_epi16(p16, p16);  // per lane: 4 bytes, four times
    const uint32_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(p8)));
    const uint32_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(p8, 1)));
    std::memcpy(o + c, &lo, 4);
    std::memcpy(o + c + 4, &hi, 4);
  }
  for (; c < len; ++c) {
    int32_t acc = kHalf;
    for (int y = 0; y < n; ++y) acc += rows[static_cast<size_t>(y) * row_bytes + c] * w[y];
    o[c] = clip8(acc);
  }
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");
#endif

}  // namespace

void resampleBilinear(const RgbImage& src, const SampleWindow& win, int out_w, int out_h, bool flip, uint8_t* out,
                      std::vector<uint8_t>& scratch, bool simd) {
  const ResampleTaps h = resampleTaps(src.width, win.x0, win.x1, out_w);
  const ResampleTaps v = resampleTaps(src.height, win.y0, win.y1, out_h);
  // Rows the vertical pass reads.
  const int row0 = v.first.front();
  const int row1 = v.first.back() + v.count.back();
  const size_t tmp_row = static_cast<size_t>(out_w) * 3;
  scratch.resize(static_cast<size_t>(row1 - row0) * tmp_row + 32);  // + the vector stores' overhang
#if defined(__x86_64__)
  simd = simd && kHaveAvx2;
  const GatherTaps g = simd ? gatherTaps(h, src.width, out_w, flip) : GatherTaps{};
#else
  simd = false;
#endif
  // Horizontal pass into 8-bit rows (Pillow's intermediate image), mirrored here when flip.
  for (int y = row0; y < row1; ++y) {
    uint8_t* o = scratch.data() + static_cast<size_t>(y - row0) * tmp_row;
#if defined(__x86_64__)
    // The gather reads one byte past a row's last pixel: inside the buffer except, perhaps, on
    // its last row.
    if (simd && y + 1 < src.height) {
      horizontalRowAvx2(src.row(y), g, o);
      horizontalRow(src.row(y), h, out_w, flip, o, 8 * g.groups);  // the columns past the last group of 8
      continue;
    }
#endif
    horizontalRow(src.row(y), h, out_w, flip, o);
  }
  // Vertical pass: each output row a weighted sum of intermediate rows.
  std::vector<int32_t> acc(simd ? 0 : tmp_row);
  for (int i = 0; i < out_h; ++i) {
    const int32_t* w = &v.weights[static_cast<size_t>(i) * v.ksize];
    const uint8_t* rows = scratch.data() + static_cast<size_t>(v.first[static_cast<size_t>(i)] - row0) * tmp_row;
    const int n = v.count[static_cast<size_t>(i)];
    uint8_t* o = out + static_cast<size_t>(i) * tmp_row;
#if defined(__x86_64__)
    if (simd) {
      verticalRowAvx2(rows, tmp_row, n, w, tmp_row, o);
      continue;
    }
#endif
    verticalRow(rows, tmp_row, n, w, tmp_row, acc.data(), o);
  }
}

}  // namespace aiacc::data
