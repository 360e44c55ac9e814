#include "aiacc/comm/reduce_ops.h"

#include <cstdint>
#include <cstring>

#include "aiacc/comm/half.h"

namespace aiacc::comm {
namespace {

// c = a + b elementwise (c may alias a): the signature Gloo's reduction functions have, so
// GlooTransport and the shared-memory transport use the same functions. Written here rather
// than taken from gloo/math.h so that builds without Gloo have them too.
//
// The sum runs two 16-byte vectors per iteration (GCC/Clang vector extensions: SSE2 on x86-64,
// NEON on arm64, no flags and no dispatch), loaded and stored with memcpy so any alignment and
// the in-place case (c == a) are fine. Lane arithmetic is the scalar arithmetic, so results are
// bitwise those of the plain loop. At -O2 GCC 12 leaves the plain loop scalar (it would need an
// alias check), one element per iteration: that made the fp32 sum, the hot loop of every CPU
// allreduce, slower than the AVX fp16 sum, and its speed hostage to where the linker put it.
template <typename T>
void elementSum(void* c, const void* a, const void* b, size_t n) {
  typedef T Vec __attribute__((vector_size(16)));
  constexpr size_t kLanes = sizeof(Vec) / sizeof(T);
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  size_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    Vec x0, x1, y0, y1;
    std::memcpy(&x0, x + i, sizeof(Vec));
    std::memcpy(&x1, x + i + kLanes, sizeof(Vec));
    std::memcpy(&y0, y + i, sizeof(Vec));
    std::memcpy(&y1, y + i + kLanes, sizeof(Vec));
    x0 += y0;
    x1 += y1;
    std::memcpy(out + i, &x0, sizeof(Vec));
    std::memcpy(out + i + kLanes, &x1, sizeof(Vec));
  }
  for (; i < n; ++i) out[i] = static_cast<T>(x[i] + y[i]);
}

template <typename T>
void bitwiseOr(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] | y[i];
}

}  // namespace

ReduceFn reduceFunction(at::ScalarType type, ReduceOp op) {
  const bool sum = op == ReduceOp::kSum;
  switch (type) {
    case at::kFloat: AIACC_CHECK(sum, "float reductions support sum only"); return &elementSum<float>;
    case at::kDouble: AIACC_CHECK(sum, "double reductions support sum only"); return &elementSum<double>;
    case at::kHalf:
      AIACC_CHECK(sum, "half reductions support sum only");
      return &sumHalf;  // F16C, fp32 arithmetic per step
    case at::kBFloat16: AIACC_CHECK(sum, "bfloat16 reductions support sum only"); return &sumBf16;
    case at::kLong:
      return sum ? static_cast<ReduceFn>(&elementSum<int64_t>) : static_cast<ReduceFn>(&bitwiseOr<int64_t>);
    case at::kInt:
      return sum ? static_cast<ReduceFn>(&elementSum<int32_t>) : static_cast<ReduceFn>(&bitwiseOr<int32_t>);
    case at::kByte:
      return sum ? static_cast<ReduceFn>(&elementSum<uint8_t>) : static_cast<ReduceFn>(&bitwiseOr<uint8_t>);
    default: AIACC_THROW(Error, "reduction: unsupported dtype ", type);
  }
}

}  // namespace aiacc::comm
