#include "data/resample.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

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
  AIACC_CHECK(in_size > 0 && out_size > 0 && in1 > in0, "resample ", in_size, " [", in0, ", ", in1, ") -> ",
              out_size);
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

void resampleBilinear(const RgbImage& src, const SampleWindow& win, int out_w, int out_h, bool flip, uint8_t* out,
                      std::vector<uint8_t>& scratch) {
  const ResampleTaps h = resampleTaps(src.width, win.x0, win.x1, out_w);
  const ResampleTaps v = resampleTaps(src.height, win.y0, win.y1, out_h);
  // Rows the vertical pass reads.
  const int row0 = v.first.front();
  const int row1 = v.first.back() + v.count.back();
  const size_t tmp_row = static_cast<size_t>(out_w) * 3;
  scratch.resize(static_cast<size_t>(row1 - row0) * tmp_row);
  constexpr int32_t kHalf = 1 << (kResampleBits - 1);
  // Horizontal pass into 8-bit rows (Pillow's intermediate image), mirrored here when flip.
  for (int y = row0; y < row1; ++y) {
    const uint8_t* in = src.row(y);
    uint8_t* o = scratch.data() + static_cast<size_t>(y - row0) * tmp_row;
    for (int j = 0; j < out_w; ++j) {
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
  // Vertical pass: each output row a weighted sum of intermediate rows.
  std::vector<int32_t> acc(tmp_row);
  for (int i = 0; i < out_h; ++i) {
    std::fill(acc.begin(), acc.end(), kHalf);
    const int32_t* w = &v.weights[static_cast<size_t>(i) * v.ksize];
    const int first = v.first[static_cast<size_t>(i)] - row0;
    for (int y = 0, n = v.count[static_cast<size_t>(i)]; y < n; ++y) {
      const uint8_t* t = scratch.data() + static_cast<size_t>(first + y) * tmp_row;
      const int32_t wy = w[y];
      for (size_t c = 0; c < tmp_row; ++c) acc[c] += t[c] * wy;
    }
    uint8_t* o = out + static_cast<size_t>(i) * tmp_row;
    for (size_t c = 0; c < tmp_row; ++c) o[c] = clip8(acc[c]);
  }
}

}  // namespace aiacc::data
