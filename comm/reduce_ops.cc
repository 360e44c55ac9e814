#include "comm/reduce_ops.h"

#include <gloo/math.h>

#include <cstdint>

#include "comm/half.h"

namespace aiacc::comm {
namespace {

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
    case at::kFloat:
      AIACC_CHECK(sum, "float reductions support sum only");
      return &gloo::sum<float>;
    case at::kDouble:
      AIACC_CHECK(sum, "double reductions support sum only");
      return &gloo::sum<double>;
    case at::kHalf:
      AIACC_CHECK(sum, "half reductions support sum only");
      return &sumHalf;  // F16C, fp32 arithmetic per step
    case at::kBFloat16:
      AIACC_CHECK(sum, "bfloat16 reductions support sum only");
      return &sumBf16;
    case at::kLong:
      return sum ? static_cast<ReduceFn>(&gloo::sum<int64_t>) : static_cast<ReduceFn>(&bitwiseOr<int64_t>);
    case at::kInt:
      return sum ? static_cast<ReduceFn>(&gloo::sum<int32_t>) : static_cast<ReduceFn>(&bitwiseOr<int32_t>);
    case at::kByte:
      return sum ? static_cast<ReduceFn>(&gloo::sum<uint8_t>) : static_cast<ReduceFn>(&bitwiseOr<uint8_t>);
    default:
      AIACC_THROW(Error, "reduction: unsupported dtype ", type);
  }
}

}  // namespace aiacc::comm
