// The data pipeline against torchvision's (scripts/golden_transforms.py writes torchvision's
// side, on JPEG files both read): random-resized-crop boxes have the same distribution (area
// fraction, aspect ratio, position: two-sample Kolmogorov-Smirnov at a 1e-4 false-alarm level);
// the train transform's outputs over many samples of the same files have the same per-channel mean
// and variance within sampling error; the crop of a given box, and the val transform's output,
// equal torchvision's within a fraction of a pixel level. Why not exactly: the resize is Pillow's
// filter and arithmetic (data/resample.h) but the pixels under it come from libjpeg-turbo's region
// decode, whose chroma upsampling at a crop's edges can differ by a level from the whole-image
// decode PIL makes (4:2:0 colour files only; grayscale and the val path agree to float rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "data/image_folder.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "data/transforms.h"
#include "models/weights.h"
#include "tests/test_util.h"

namespace aiacc::data {
namespace {

constexpr int kSize = 32;
constexpr double kMinScale = 0.35;
constexpr int kSamples = 600;

// Two-sample KS statistic sup |F_a - F_b|.
double ksStatistic(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  size_t i = 0, j = 0;
  double d = 0;
  while (i < a.size() && j < b.size()) {
    const double x = std::min(a[i], b[j]);
    while (i < a.size() && a[i] <= x) ++i;
    while (j < b.size() && b[j] <= x) ++j;
    d = std::max(d, std::abs(static_cast<double>(i) / a.size() - static_cast<double>(j) / b.size()));
  }
  return d;
}

// Critical value of the two-sample KS statistic at false-alarm level 1e-4 (c(alpha) = 2.146).
double ksCritical(size_t n, size_t m) { return 2.146 * std::sqrt(static_cast<double>(n + m) / (n * m)); }

struct BoxFeatures {
  std::vector<double> area, log_ratio, x, y;
};

// Area fraction, log aspect ratio and the box's position: its offset as a fraction of the room
// it had (0.5 where it fills the image).
void addBox(BoxFeatures& f, const Box& b, int w, int h) {
  f.area.push_back(static_cast<double>(b.w) * b.h / (static_cast<double>(w) * h));
  f.log_ratio.push_back(std::log(static_cast<double>(b.w) / b.h));
  f.x.push_back(w > b.w ? static_cast<double>(b.x) / (w - b.w) : 0.5);
  f.y.push_back(h > b.h ? static_cast<double>(b.y) / (h - b.h) : 0.5);
}

class TransformStats : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string cmd = std::string(AIACC_GOLDEN_PYTHON) + " " + test::sourceDir() +
                            "/scripts/golden_transforms.py " + dir_.path() + " " + std::to_string(kSize) + " " +
                            std::to_string(kMinScale) + " " + std::to_string(kSamples) + " 2> " + (dir_ / "err.txt");
    const int rc = std::system(cmd.c_str());
    if (WEXITSTATUS(rc) == 3) GTEST_SKIP() << "golden test skipped: " << test::readText(dir_ / "err.txt");
    ASSERT_EQ(rc, 0) << "golden_transforms.py failed: " << test::readText(dir_ / "err.txt");
    for (auto& [name, t] : models::readNamedTensors(dir_ / "golden.bin")) golden_[name] = t;
  }
  // The loader's outputs for the folder's images (sorted by name: digit, photo, small).
  ImageLoader loader(bool train) {
    LoaderOptions o;
    o.train = train;
    o.workers = 1;
    o.crop_fraction = 0.875;
    o.seed = 9;
    return ImageLoader(scanImageFolder(dir_ / (train ? "images/train" : "images/val")), o, nullptr);
  }
  test::TempDir dir_;
  std::map<std::string, at::Tensor> golden_;
};

TEST_F(TransformStats, RandomResizedCropBoxesDistributeAsTorchvisions) {
  for (const auto& [name, boxes] : golden_) {
    if (name.rfind("boxes.", 0) != 0) continue;
    int w = 0, h = 0;
    ASSERT_EQ(std::sscanf(name.c_str(), "boxes.%dx%d", &w, &h), 2);
    BoxFeatures ours, theirs;
    CropParams p;
    p.scale_min = kMinScale;
    const auto acc = boxes.accessor<int64_t, 2>();
    for (int64_t i = 0; i < boxes.size(0); ++i) {
      // As the loader draws them: a stream per (seed, epoch, sample), its first numbers.
      Rng rng(mixSeed(4, static_cast<uint64_t>(i % 7), static_cast<uint64_t>(i / 7)));
      addBox(ours, randomResizedCropBox(w, h, p, rng), w, h);
      addBox(theirs,
             Box{static_cast<int>(acc[i][0]), static_cast<int>(acc[i][1]), static_cast<int>(acc[i][2]),
                 static_cast<int>(acc[i][3])},
             w, h);
    }
    const double crit = ksCritical(ours.area.size(), theirs.area.size());
    EXPECT_LT(ksStatistic(ours.area, theirs.area), crit) << name << " area fraction";
    EXPECT_LT(ksStatistic(ours.log_ratio, theirs.log_ratio), crit) << name << " aspect ratio";
    EXPECT_LT(ksStatistic(ours.x, theirs.x), crit) << name << " x position";
    EXPECT_LT(ksStatistic(ours.y, theirs.y), crit) << name << " y position";
  }
}

// Mean and standard error of column c of a [n, 3] tensor.
std::pair<double, double> meanAndError(const at::Tensor& t, int c) {
  const at::Tensor col = t.select(1, c).to(at::kDouble);
  return {col.mean().item<double>(), col.std().item<double>() / std::sqrt(static_cast<double>(col.size(0)))};
}

TEST_F(TransformStats, TrainOutputsHaveTorchvisionsChannelStatistics) {
  ImageLoader train = loader(/*train=*/true);
  const std::vector<std::string> names = {"digit", "photo", "small"};  // the folder's (sorted) order
  std::vector<std::vector<at::Tensor>> means(3), vars(3);
  for (int e = 0; e < kSamples; ++e) {  // every epoch draws new crops and flips
    EpochSpec spec;
    spec.epoch = e;
    spec.image_size = kSize;
    spec.batch_size = 3;
    spec.scale_min = kMinScale;
    ASSERT_EQ(train.startEpoch(spec), 1);
    const Batch b = *train.next();
    ShardSpec shard;  // the loader's shuffle of the three files this epoch (a pure function)
    shard.seed = 9;
    const std::vector<int64_t> order = shardIndices(3, e, shard);
    for (int64_t i = 0; i < 3; ++i) {
      const at::Tensor img = b.images[i].to(at::kDouble);
      const auto k = static_cast<size_t>(order[static_cast<size_t>(i)]);
      means[k].push_back(img.mean({1, 2}));
      vars[k].push_back(img.var({1, 2}, /*unbiased=*/false));
    }
  }
  for (size_t k = 0; k < names.size(); ++k) {
    const at::Tensor our_mean = at::stack(means[k]), our_var = at::stack(vars[k]);
    const at::Tensor their_mean = golden_.at("mean." + names[k]), their_var = golden_.at("var." + names[k]);
    for (int c = 0; c < 3; ++c) {
      // Both are averages over kSamples independent draws: their difference has a standard error
      // of sqrt(se_a^2 + se_b^2); 4.5 of those is a 1-in-100000 false alarm for a normal statistic.
      for (const auto& [what, a, b] : {std::tuple<const char*, at::Tensor, at::Tensor>{"mean", our_mean, their_mean},
                                       {"variance", our_var, their_var}}) {
        const auto [ma, sa] = meanAndError(a, c);
        const auto [mb, sb] = meanAndError(b, c);
        EXPECT_LT(std::abs(ma - mb), 4.5 * std::hypot(sa, sb))
            << names[k] << " channel " << c << " " << what << ": aiacc " << ma << " +- " << sa << ", torchvision " << mb
            << " +- " << sb;
      }
    }
  }
}

// In 0..255 pixel levels: mean and largest |a - b| of two normalized [3, S, S] outputs.
std::pair<double, double> levelDiff(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor to_bytes = at::tensor({kStd[0], kStd[1], kStd[2]}).view({3, 1, 1}) * 255.0;
  const at::Tensor d = ((a - b) * to_bytes).abs();
  return {d.mean().item<double>(), d.max().item<double>()};
}

TEST_F(TransformStats, TrainCropOfAGivenBoxEqualsTorchvisionsWithinInterpolation) {
  for (const std::string name : {"digit", "photo", "small"}) {
    const std::vector<uint8_t> file = readFile(dir_ / ("images/train/a/" + name + ".JPEG"));
    const at::Tensor boxes = golden_.at("fixedbox." + name), want = golden_.at("fixed." + name);
    double worst = 0, sum = 0, worst_dct = 0, sum_dct = 0;
    for (int64_t i = 0; i < boxes.size(0); ++i) {
      const Box box{static_cast<int>(boxes[i][0].item<int64_t>()), static_cast<int>(boxes[i][1].item<int64_t>()),
                    static_cast<int>(boxes[i][2].item<int64_t>()), static_cast<int>(boxes[i][3].item<int64_t>())};
      for (const bool dct : {false, true}) {  // ResizeMode::kTorchvision, then kTorchvisionDct
        const int decode_for = dct ? kSize : kFullResolution;
        const DecodedCrop dc = decodeCrop(
            file.data(), file.size(), [&](int, int) { return box; }, decode_for, decode_for);
        at::Tensor out = at::empty({3, kSize, kSize});
        resizeNormalize(dc.crop, kSize, /*flip=*/false, Layout::kNCHW, out.data_ptr<float>());
        const auto [mean, max] = levelDiff(out, want[i]);
        (dct ? worst_dct : worst) = std::max(dct ? worst_dct : worst, mean);
        (dct ? sum_dct : sum) += mean;
        // Full resolution: the same decoded pixels and Pillow's arithmetic, equal but for chroma
        // upsampling at the crop's edges (libjpeg-turbo's region decode). DCT-scaled: the reduced
        // decode is a low-pass of its own (at 1/8 an 8x8 box), so fine texture differs by several
        // levels (this photo's 2 px lines: 5-11 levels on average); only gross errors fail here.
        EXPECT_LT(mean, dct ? 16.0 : 0.5)
            << name << (dct ? " (dct)" : "") << " box " << box.x << "," << box.y << " " << box.w << "x" << box.h
            << " (DCT scale " << dc.scale_num << "/8): mean |aiacc - torchvision| " << mean << " levels, max " << max;
      }
    }
    std::cout << name << ": train crops differ from torchvision's by " << sum / boxes.size(0) << " levels on average ("
              << worst << " in the worst crop); with --resize dct by " << sum_dct / boxes.size(0) << " (" << worst_dct
              << ")\n";
  }
}

TEST_F(TransformStats, ValOutputEqualsTorchvisionsWithinInterpolation) {
  ImageLoader val = loader(/*train=*/false);
  EpochSpec spec;
  spec.image_size = kSize;
  spec.batch_size = 3;
  ASSERT_EQ(val.startEpoch(spec), 1);
  const Batch b = *val.next();
  const std::vector<std::string> names = {"digit", "photo", "small"};
  for (size_t k = 0; k < names.size(); ++k) {
    const auto [mean, max] = levelDiff(b.images[static_cast<int64_t>(k)], golden_.at("val." + names[k]));
    // Resize + CenterCrop as one resampling of the decoded region, Pillow's taps and arithmetic.
    EXPECT_LT(mean, 0.05) << names[k] << ": mean |aiacc - torchvision| " << mean << " levels";
    EXPECT_LT(max, 1.0) << names[k] << ": max |aiacc - torchvision| " << max << " levels";
    std::cout << names[k] << ": val output differs from torchvision's by " << mean << " levels on average, " << max
              << " at most\n";
  }
}

}  // namespace
}  // namespace aiacc::data
