#include "data/transforms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "data/sampler.h"

namespace aiacc::data {
namespace {

TEST(Transforms, RandomResizedCropBoxesAreValid) {
  Rng rng(7);
  CropParams p;  // torchvision defaults
  int fallbacks = 0;
  for (int i = 0; i < 5000; ++i) {
    const int w = static_cast<int>(rng.randint(8, 800)), h = static_cast<int>(rng.randint(8, 800));
    const Box b = randomResizedCropBox(w, h, p, rng);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_GT(b.w, 0);
    ASSERT_GT(b.h, 0);
    ASSERT_LE(b.x + b.w, w);
    ASSERT_LE(b.y + b.h, h);
    const double area = static_cast<double>(b.w) * b.h / (static_cast<double>(w) * h);
    const double ratio = static_cast<double>(b.w) / b.h;
    const bool centered = b.x == (w - b.w) / 2 && b.y == (h - b.h) / 2;
    if (area > 0.999 || (centered && (b.w == w || b.h == h))) {
      ++fallbacks;
      continue;
    }
    // Rounding of w and h to integers moves area and ratio slightly off the sampled values.
    const double slack = 2.0 / std::min(b.w, b.h) + 2.0 / std::min(w, h);
    ASSERT_GE(area, p.scale_min * (1 - 2 * slack) - 1e-9) << w << "x" << h;
    ASSERT_GE(ratio, p.ratio_min * (1 - slack));
    ASSERT_LE(ratio, p.ratio_max * (1 + slack));
  }
  EXPECT_LT(fallbacks, 1000);
}

TEST(Transforms, RandomResizedCropFallbackClampsRatio) {
  // A 1000x10 strip: no box of area >= 8% and ratio <= 4/3 fits, so torchvision falls back to
  // the whole-height center crop with ratio clamped to 4/3.
  Rng rng(1);
  CropParams p;
  const Box b = randomResizedCropBox(1000, 10, p, rng);
  EXPECT_EQ(b.h, 10);
  EXPECT_EQ(b.w, 13);  // round(10 * 4/3)
  EXPECT_EQ(b.x, (1000 - 13) / 2);
  EXPECT_EQ(b.y, 0);
}

TEST(Transforms, CenterCropIsResizeThenCropInOriginalPixels) {
  // 500x375 at size 224: resize short side to 256 (x 0.6827), center crop 224 <=> a centered
  // square of 0.875 * 375 = 328 px.
  const Box b = centerCropBox(500, 375, 0.875);
  EXPECT_EQ(b.w, 328);
  EXPECT_EQ(b.h, 328);
  EXPECT_EQ(b.x, (500 - 328) / 2);
  EXPECT_EQ(b.y, (375 - 328) / 2);
}

TEST(Transforms, NormalizeAndFlipMath) {
  const int S = 4;
  RgbImage img{S, S, std::vector<uint8_t>(S * S * 3)};
  for (int y = 0; y < S; ++y)
    for (int x = 0; x < S; ++x) {
      uint8_t* p = &img.pixels[(y * S + x) * 3];
      p[0] = static_cast<uint8_t>(10 * x);
      p[1] = 128;
      p[2] = 255;
    }
  std::vector<float> chw(3 * S * S), hwc(3 * S * S), flipped(3 * S * S), hwc_flipped(3 * S * S);
  resizeNormalize(img, S, false, Layout::kNCHW, chw.data());
  resizeNormalize(img, S, false, Layout::kNHWC, hwc.data());
  resizeNormalize(img, S, true, Layout::kNCHW, flipped.data());
  resizeNormalize(img, S, true, Layout::kNHWC, hwc_flipped.data());
  for (int y = 0; y < S; ++y)
    for (int x = 0; x < S; ++x)
      for (int c = 0; c < 3; ++c) {
        const float v = chw[c * S * S + y * S + x];
        const uint8_t raw = img.pixels[(y * S + x) * 3 + c];
        EXPECT_NEAR(v, (raw / 255.0f - kMean[c]) / kStd[c], 1e-5);
        EXPECT_EQ(v, hwc[(y * S + x) * 3 + c]);
        EXPECT_EQ(flipped[c * S * S + y * S + x], chw[c * S * S + y * S + (S - 1 - x)]);
        EXPECT_EQ(hwc_flipped[(y * S + x) * 3 + c], chw[c * S * S + y * S + (S - 1 - x)]);
      }
}

// Planar output (16 pixels at a time where the CPU has byte shuffles, the rest one by one)
// equals the interleaved output bit for bit, mirrored or not, and the formula within rounding.
TEST(Transforms, PlanarAndInterleavedNormalizeAgreeExactly) {
  for (int S : {37, 64}) {
    RgbImage img{S, S, std::vector<uint8_t>(static_cast<size_t>(S) * S * 3)};
    for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
    for (bool flip : {false, true}) {
      std::vector<float> chw(3 * S * S), hwc(3 * S * S);
      resizeNormalize(img, S, flip, Layout::kNCHW, chw.data());
      resizeNormalize(img, S, flip, Layout::kNHWC, hwc.data());
      for (int y = 0; y < S; ++y)
        for (int x = 0; x < S; ++x)
          for (int c = 0; c < 3; ++c) {
            const float v = chw[c * S * S + y * S + x];
            ASSERT_EQ(v, hwc[(y * S + x) * 3 + c]) << S << " " << flip << " " << y << " " << x << " " << c;
            const uint8_t raw = img.pixels[(y * S + (flip ? S - 1 - x : x)) * 3 + c];
            ASSERT_NEAR(v, (raw / 255.0f - kMean[c]) / kStd[c], 1e-5);
          }
    }
  }
}

TEST(Transforms, ResizeKeepsConstantColor) {
  RgbImage img{37, 23, std::vector<uint8_t>(37 * 23 * 3)};
  for (size_t i = 0; i < img.pixels.size(); i += 3) {
    img.pixels[i] = 200;
    img.pixels[i + 1] = 100;
    img.pixels[i + 2] = 50;
  }
  for (int S : {8, 16, 64}) {
    std::vector<float> out(3 * S * S);
    resizeNormalize(img, S, false, Layout::kNCHW, out.data());
    for (int c = 0; c < 3; ++c) {
      const float want = ((c == 0 ? 200 : c == 1 ? 100 : 50) / 255.0f - kMean[c]) / kStd[c];
      for (int i = 0; i < S * S; ++i) ASSERT_NEAR(out[c * S * S + i], want, 1e-5);
    }
  }
}

// An elastic job's epoch in segments: 3 ranks consume 4 global batches of 2 per rank (24
// positions of the order), then 2 ranks share out the rest. Together: every sample once, less a
// tail smaller than the last world; the first segment is exactly the unsegmented shard's start.
TEST(Sampler, SegmentsOfAnEpochUnderChangingWorldsSeeEachSampleOnce) {
  const int64_t n = 101;
  std::vector<int> seen(n, 0);
  ShardSpec s;
  s.seed = 7;
  s.world = 3;
  for (int r = 0; r < 3; ++r) {
    s.rank = r;
    const std::vector<int64_t> whole = shardIndices(n, 2, s);
    for (size_t i = 0; i < 8; ++i) ++seen[static_cast<size_t>(whole[i])];  // 4 batches of 2
  }
  s.offset = 24;
  s.world = 2;
  size_t second = 0;
  for (int r = 0; r < 2; ++r) {
    s.rank = r;
    const std::vector<int64_t> rest = shardIndices(n, 2, s);
    EXPECT_EQ(rest.size(), static_cast<size_t>((n - 24) / 2));
    second += rest.size();
    for (int64_t i : rest) ++seen[static_cast<size_t>(i)];
  }
  int once = 0;
  for (int c : seen) {
    EXPECT_LE(c, 1);
    once += c;
  }
  EXPECT_EQ(once, 24 + static_cast<int>(second));
  EXPECT_EQ(n - once, (n - 24) % 2) << "only the tail smaller than the world is left";
  s.offset = n + 1;
  EXPECT_THROW(shardIndices(n, 2, s), Error);
}

// --elastic-batch keep-global: the rest of an epoch consumed in steps of one global batch (15)
// that the world (2, then 4) need not divide. Rank r takes rankBatch(15, r, world) positions of
// each step (8 + 7, then 4 + 4 + 4 + 3), each step's positions are exactly the order's next 15,
// and the last partial step is dropped. Where the world divides the global batch, the shards
// are the strided layout's, cut to whole steps: a job that never changed world is unchanged.
TEST(Sampler, AGlobalBatchIsSharedUnevenlyStepByStep) {
  const int64_t n = 107, G = 15, offset = 11;
  EXPECT_EQ(rankBatch(15, 0, 2), 8);
  EXPECT_EQ(rankBatch(15, 1, 2), 7);
  EXPECT_EQ(rankBatch(15, 3, 4), 3);
  EXPECT_EQ(rankBatch(16, 3, 4), 4);
  ShardSpec s;
  s.seed = 9;
  const std::vector<int64_t> order = shardIndices(n, 3, s);  // world 1, no offset: the order itself
  s.offset = offset;
  s.global_batch = G;
  for (int world : {2, 4}) {
    s.world = world;
    std::vector<std::vector<int64_t>> shards;
    for (int r = 0; r < world; ++r) {
      s.rank = r;
      shards.push_back(shardIndices(n, 3, s));
      EXPECT_EQ(static_cast<int64_t>(shards.back().size()), (n - offset) / G * rankBatch(G, r, world));
    }
    for (int64_t k = 0; k < (n - offset) / G; ++k) {  // step k: the ranks' batches k, together
      std::multiset<int64_t> step, expected(order.begin() + offset + k * G, order.begin() + offset + (k + 1) * G);
      for (int r = 0; r < world; ++r) {
        const int64_t b = rankBatch(G, r, world);
        step.insert(shards[static_cast<size_t>(r)].begin() + k * b,
                    shards[static_cast<size_t>(r)].begin() + (k + 1) * b);
      }
      EXPECT_EQ(step, expected) << "world " << world << " step " << k;
    }
  }
  // World 3 divides 15: the strided shards of batch 5, whole steps only.
  s.world = 3;
  for (int r = 0; r < 3; ++r) {
    s.rank = r;
    s.global_batch = G;
    const std::vector<int64_t> stepped = shardIndices(n, 3, s);
    s.global_batch = 0;
    const std::vector<int64_t> strided = shardIndices(n, 3, s);
    ASSERT_EQ(stepped.size(), static_cast<size_t>((n - offset) / G * 5));
    EXPECT_TRUE(std::equal(stepped.begin(), stepped.end(), strided.begin())) << "rank " << r;
  }
  s.global_batch = 2;  // fewer positions a step than ranks
  EXPECT_THROW(shardIndices(n, 3, s), Error);
}

TEST(Sampler, ShardsAreDisjointCompleteEqualAndEpochDependent) {
  const int64_t n = 103;
  for (int world : {1, 2, 3, 4, 8}) {
    ShardSpec s;
    s.world = world;
    s.seed = 42;
    std::vector<int> seen(n, 0);
    size_t size0 = 0;
    for (int r = 0; r < world; ++r) {
      s.rank = r;
      const auto idx = shardIndices(n, 5, s);
      if (r == 0) size0 = idx.size();
      EXPECT_EQ(idx.size(), size0) << "equal counts";
      EXPECT_EQ(static_cast<int64_t>(idx.size()), n / world);
      for (int64_t i : idx) ++seen[i];
    }
    int total = 0;
    for (int c : seen) {
      EXPECT_LE(c, 1) << "disjoint";
      total += c;
    }
    EXPECT_EQ(total, n / world * world) << "complete up to the n % world remainder";
  }
  ShardSpec s;
  s.world = 2;
  s.seed = 42;
  EXPECT_EQ(shardIndices(n, 3, s), shardIndices(n, 3, s)) << "deterministic";
  EXPECT_NE(shardIndices(n, 3, s), shardIndices(n, 4, s)) << "epoch-dependent";
  s.seed = 43;
  ShardSpec s42 = s;
  s42.seed = 42;
  EXPECT_NE(shardIndices(n, 3, s), shardIndices(n, 3, s42)) << "seed-dependent";
  // Evaluation: no shuffle, every sample exactly once across ranks.
  ShardSpec e;
  e.world = 4;
  e.shuffle = false;
  e.equal_shards = false;
  std::vector<int> seen(n, 0);
  for (int r = 0; r < 4; ++r) {
    e.rank = r;
    for (int64_t i : shardIndices(n, 0, e)) ++seen[i];
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_EQ(batchCount(10, 4, true), 2);
  EXPECT_EQ(batchCount(10, 4, false), 3);
}

}  // namespace
}  // namespace aiacc::data

namespace aiacc::data {
namespace {

// The AVX2 resampling gives the scalar loops' bytes (which follow Pillow's arithmetic), for
// shrinking and enlarging, odd widths (the vector groups' tails), windows and mirroring.
TEST(Resample, SimdEqualsScalar) {
  Rng rng(17);
  std::vector<uint8_t> scratch;
  for (int t = 0; t < 60; ++t) {
    RgbImage src;
    src.width = static_cast<int>(rng.randint(5, 400));
    src.height = static_cast<int>(rng.randint(5, 300));
    src.pixels.resize(static_cast<size_t>(src.width) * src.height * 3);
    for (auto& p : src.pixels) p = static_cast<uint8_t>(rng.next());
    const int out_w = static_cast<int>(rng.randint(1, 240)), out_h = static_cast<int>(rng.randint(1, 240));
    SampleWindow w{0, 0, static_cast<double>(src.width), static_cast<double>(src.height)};
    if (t % 2)
      w = {rng.uniform(0, src.width / 3.0), rng.uniform(0, src.height / 3.0), rng.uniform(src.width / 2.0, src.width),
           rng.uniform(src.height / 2.0, src.height)};
    const bool flip = t % 3 == 0;
    std::vector<uint8_t> a(static_cast<size_t>(out_w) * out_h * 3), b(a.size());
    resampleBilinear(src, w, out_w, out_h, flip, a.data(), scratch, /*simd=*/true);
    resampleBilinear(src, w, out_w, out_h, flip, b.data(), scratch, /*simd=*/false);
    ASSERT_EQ(a, b) << src.width << "x" << src.height << " -> " << out_w << "x" << out_h << " flip " << flip;
  }
}

// A known case by hand (and PIL's Image.resize((2, 1), BILINEAR) on the same row: [71, 126]):
// halving [0, 100, 200, 60] takes Pillow's triangle of support 2 around centers 1 and 3, its taps
// from int(center - 2 + 0.5) to int(center + 2 + 0.5) clipped to the row: pixels 0..2 weighing
// 0.75, 0.75, 0.25 -> (75 + 50) / 1.75 = 71.4 -> 71; pixels 1..3 weighing 0.25, 0.75, 0.75 ->
// (25 + 150 + 45) / 1.75 = 125.7 -> 126.
TEST(Resample, HalvingMatchesPillowsTriangleByHand) {
  RgbImage src;
  src.width = 4;
  src.height = 1;
  for (int v : {0, 100, 200, 60}) src.pixels.insert(src.pixels.end(), {uint8_t(v), uint8_t(v), uint8_t(v)});
  std::vector<uint8_t> out(6), scratch;
  resampleBilinear(src, {0, 0, 4, 1}, 2, 1, false, out.data(), scratch);
  EXPECT_EQ(out[0], 71);
  EXPECT_EQ(out[3], 126);
}

}  // namespace
}  // namespace aiacc::data
