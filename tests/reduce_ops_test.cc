// The elementwise reductions every CPU transport applies (comm/reduce_ops.h), against the plain
// scalar loop: every length across the vector width and its tail, unaligned pointers, out of
// place and in place (out == a), wrap-around of the small integer types, and IEEE specials.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "aiacc/comm/reduce_ops.h"

namespace aiacc::comm {
namespace {

template <typename T>
T valueAt(size_t i, int salt) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(std::sin(static_cast<double>(i * 7 + salt)) * 1000.0);
  } else {
    return static_cast<T>(i * 37u + static_cast<unsigned>(salt) * 101u);
  }
}

// Runs fn over n elements at element offset `shift` (so the pointers are unaligned for shift
// not a multiple of the vector width) and compares byte for byte with `expect(x, y)`.
template <typename T, typename Expect>
void checkAgainstScalar(ReduceFn fn, Expect expect) {
  for (size_t n = 0; n <= 70; ++n) {
    for (size_t shift = 0; shift < 4; ++shift) {
      std::vector<T> a(n + shift + 1), b(n + shift + 1), out(n + shift + 1, T(1));
      for (size_t i = 0; i < a.size(); ++i) {
        a[i] = valueAt<T>(i, 1);
        b[i] = valueAt<T>(i, 2);
      }
      std::vector<T> want(n);
      for (size_t i = 0; i < n; ++i) want[i] = expect(a[shift + i], b[shift + i]);
      fn(out.data() + shift, a.data() + shift, b.data() + shift, n);
      ASSERT_EQ(std::memcmp(out.data() + shift, want.data(), n * sizeof(T)), 0) << "n=" << n << " shift=" << shift;
      EXPECT_EQ(out[n + shift], T(1)) << "wrote past the end, n=" << n;
      if (shift > 0) {
        EXPECT_EQ(out[shift - 1], T(1)) << "wrote before the start, n=" << n;
      }
      fn(a.data() + shift, a.data() + shift, b.data() + shift, n);  // in place, as the ring does
      ASSERT_EQ(std::memcmp(a.data() + shift, want.data(), n * sizeof(T)), 0) << "in place, n=" << n;
    }
  }
}

template <typename T>
T plainSum(T x, T y) {
  return static_cast<T>(x + y);
}

TEST(ReduceOps, SumsEqualThePlainLoopForEveryLengthAlignmentAndAliasing) {
  checkAgainstScalar<float>(reduceFunction(at::kFloat, ReduceOp::kSum), plainSum<float>);
  checkAgainstScalar<double>(reduceFunction(at::kDouble, ReduceOp::kSum), plainSum<double>);
  checkAgainstScalar<int32_t>(reduceFunction(at::kInt, ReduceOp::kSum), plainSum<int32_t>);
  checkAgainstScalar<int64_t>(reduceFunction(at::kLong, ReduceOp::kSum), plainSum<int64_t>);
  checkAgainstScalar<uint8_t>(reduceFunction(at::kByte, ReduceOp::kSum), plainSum<uint8_t>);
}

TEST(ReduceOps, BitwiseOrEqualsThePlainLoop) {
  auto orOf = [](auto x, auto y) { return static_cast<decltype(x)>(x | y); };
  checkAgainstScalar<int32_t>(reduceFunction(at::kInt, ReduceOp::kBitwiseOr), orOf);
  checkAgainstScalar<int64_t>(reduceFunction(at::kLong, ReduceOp::kBitwiseOr), orOf);
  checkAgainstScalar<uint8_t>(reduceFunction(at::kByte, ReduceOp::kBitwiseOr), orOf);
}

TEST(ReduceOps, ByteSumWrapsAndFloatSpecialsPropagate) {
  std::vector<uint8_t> a(40, 200), b(40, 100), c(40);
  reduceFunction(at::kByte, ReduceOp::kSum)(c.data(), a.data(), b.data(), c.size());
  for (uint8_t v : c) EXPECT_EQ(v, 44);  // 300 mod 256

  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(16, 1.0f), y(16, 2.0f), z(16);
  x[3] = inf;
  y[3] = -inf;  // inf + -inf: NaN
  x[9] = std::nanf("");
  x[12] = -0.0f;
  y[12] = -0.0f;
  x[15] = std::numeric_limits<float>::max();
  y[15] = std::numeric_limits<float>::max();
  reduceFunction(at::kFloat, ReduceOp::kSum)(z.data(), x.data(), y.data(), z.size());
  EXPECT_TRUE(std::isnan(z[3]));
  EXPECT_TRUE(std::isnan(z[9]));
  EXPECT_TRUE(std::signbit(z[12]));
  EXPECT_EQ(z[12], 0.0f);
  EXPECT_EQ(z[15], inf);
  EXPECT_EQ(z[0], 3.0f);
}

}  // namespace
}  // namespace aiacc::comm
