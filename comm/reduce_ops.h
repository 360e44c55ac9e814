// The elementwise reductions every transport applies: one function per (dtype, op), with the
// signature Gloo's algorithms take (out, a, b, n elements; out may alias a).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

#include "aiacc/comm/transport.h"

namespace aiacc::comm {

using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// Sum for float/double/half/bfloat16/uint8/int32/int64; bitwise or for the integer types.
// Throws for other combinations.
ReduceFn reduceFunction(at::ScalarType type, ReduceOp op);

}  // namespace aiacc::comm
