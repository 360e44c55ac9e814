#include "aiacc/comm/half.h"

#include <cpuid.h>
#include <immintrin.h>

#include <c10/util/Half.h>
#include <cmath>
#include <cstring>

namespace aiacc::comm {
namespace {

// CPUID leaf 1's F16C bit (ECX 29), beside AVX with the OS's support of its state: clang 14's
// __builtin_cpu_supports knows no "f16c", so the bit is read directly (the same in GCC).
bool hasF16c() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  }();
  return ok;
}

float toFloat(uint16_t bits) {
  c10::Half h;
  h.x = bits;
  return static_cast<float>(h);
}

// Scalar versions: the fallback without F16C, and the tails of the vector loops.
void floatToHalfScalar(const float* in, uint16_t* out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = c10::Half(in[i] * scale).x;
}

bool halfToFloatScalar(const uint16_t* in, float* out, size_t n, float scale) {
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float v = toFloat(in[i]);
    finite = finite && std::isfinite(v);
    out[i] = v * scale;
  }
  return finite;
}

void sumHalfScalar(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = c10::Half(toFloat(a[i]) + toFloat(b[i])).x;
}

__attribute__((target("avx,f16c"))) void floatToHalfF16c(const float* in, uint16_t* out, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(in + i), s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  floatToHalfScalar(in + i, out + i, n - i, scale);
}

__attribute__((target("avx,f16c"))) bool halfToFloatF16c(const uint16_t* in, float* out, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  // x - x is 0 for finite x and nan for inf/nan: accumulate it, test once at the end.
  __m256 probe = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    probe = _mm256_add_ps(probe, _mm256_sub_ps(v, v));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(v, s));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, probe);
  bool finite = true;
  for (float l : lanes) finite = finite && l == 0.0f;
  return halfToFloatScalar(in + i, out + i, n - i, scale) && finite;
}

__attribute__((target("avx,f16c"))) void sumHalfF16c(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i),
                     _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  sumHalfScalar(c + i, a + i, b + i, n - i);
}

}  // namespace

void floatToHalf(const float* in, uint16_t* out, size_t n, float scale) {
  if (hasF16c()) return floatToHalfF16c(in, out, n, scale);
  floatToHalfScalar(in, out, n, scale);
}

bool halfToFloat(const uint16_t* in, float* out, size_t n, float scale) {
  if (hasF16c()) return halfToFloatF16c(in, out, n, scale);
  return halfToFloatScalar(in, out, n, scale);
}

void sumHalf(void* c, const void* a, const void* b, size_t n) {
  auto* cc = static_cast<uint16_t*>(c);
  const auto* aa = static_cast<const uint16_t*>(a);
  const auto* bb = static_cast<const uint16_t*>(b);
  if (hasF16c()) return sumHalfF16c(cc, aa, bb, n);
  sumHalfScalar(cc, aa, bb, n);
}

namespace {
inline uint16_t bf16Round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) return 0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

void floatToBf16(const float* in, uint16_t* out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16Round(in[i] * scale);
}

bool bf16ToFloat(const uint16_t* in, float* out, size_t n, float scale) {
  uint16_t all_exp = 0x7f80;
  for (size_t i = 0; i < n; ++i) {
    all_exp &= static_cast<uint16_t>(((in[i] & 0x7f80) == 0x7f80) ? 0 : 0x7f80);  // 0 once any inf/nan
    out[i] = bf16Value(in[i]) * scale;
  }
  return all_exp != 0;
}

void sumBf16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = bf16Round(bf16Value(x[i]) + bf16Value(y[i]));
}

}  // namespace aiacc::comm
