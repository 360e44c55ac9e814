// Deterministic sample dataset: an ImageNet-layout folder of procedurally drawn JPEGs with real,
// learnable class structure, so `scripts/run.sh` can show training to a target without ImageNet.
//
// Class k draws shape k % shapes (disc, square, triangle, ring, cross; shapes <= 5) in hue family
// k / shapes (hues spread evenly around the wheel), at a random position, size and rotation, over a noisy background of
// random brightness with distractor strokes; image sizes vary (and so do aspect ratios), so the
// decoder's DCT scaling and cropping are exercised as on photos.
#pragma once

#include <cstdint>
#include <string>

namespace aiacc::data {

struct SampleSpec {
  int classes = 20;
  int shapes = 5;  // 1: classes differ by hue only (learned in a few steps; fast tests)
  int train_per_class = 100;
  int val_per_class = 25;
  int min_side = 64;  // image sides are drawn from [min_side, max_side]
  int max_side = 112;
  int quality = 90;  // JPEG quality
  uint64_t seed = 1;
};

// Writes DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG. Same spec, same bytes. Writes into
// a temporary sibling folder and renames it into place, so an interrupted run never leaves a
// half-written dataset that looks complete. Throws if DIR already exists.
void makeSampleDataset(const std::string& dir, const SampleSpec& spec);

// Class folder name for class k, e.g. "c07_triangle_h1".
std::string sampleClassName(int k, int shapes);

}  // namespace aiacc::data
