// fp16 gradient transfer kernels (CPU): conversion with scaling, and the fp16 sum Gloo runs at
// every ring step. Vectorized with F16C/AVX where the CPU has them (checked at run time),
// scalar otherwise; each pairwise sum is computed in fp32 and rounded once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace aiacc::comm {

// out[i] = half(in[i] * scale)
void floatToHalf(const float* in, uint16_t* out, size_t n, float scale);

// out[i] = float(in[i]) * scale; returns false if any value is inf or nan.
bool halfToFloat(const uint16_t* in, float* out, size_t n, float scale);

// c[i] = half(float(a[i]) + float(b[i])): the reduce function handed to Gloo (n elements).
void sumHalf(void* c, const void* a, const void* b, size_t n);

// bfloat16 (fp32's exponent, 8-bit mantissa): the same three, rounding to nearest even. Plain
// loops the compiler vectorizes (bf16 is the top half of an fp32).
void floatToBf16(const float* in, uint16_t* out, size_t n, float scale);
bool bf16ToFloat(const uint16_t* in, float* out, size_t n, float scale);
void sumBf16(void* c, const void* a, const void* b, size_t n);

}  // namespace aiacc::comm
