#include "data/loader.h"
#include "data/tensor_source.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "data/device_input.h"
#include "data/entropy_gate.h"
#include "data/entropy_hook.h"
#include "data/sample_gen.h"
#include "tests/jpeg_test_util.h"
#include "tests/test_util.h"

namespace aiacc::data {
namespace {

SampleSpec tinySpec() {
  SampleSpec spec;
  spec.classes = 4;
  spec.train_per_class = 6;
  spec.val_per_class = 2;
  spec.min_side = 40;
  spec.max_side = 90;
  return spec;
}

// A tiny generated dataset shared by the loader tests (4 classes x 6 train, x 2 val).
class LoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    makeSampleDataset(*dir_ / "ds", tinySpec());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string root() { return *dir_ / "ds"; }
  static test::TempDir* dir_;
};
test::TempDir* LoaderTest::dir_ = nullptr;

std::vector<Batch> epochOf(BatchSource& src, const EpochSpec& spec) {
  std::vector<Batch> out;
  src.startEpoch(spec);
  while (auto b = src.next()) out.push_back(*b);
  return out;
}

TEST_F(LoaderTest, SampleDatasetIsDeterministic) {
  test::TempDir other;
  const SampleSpec spec = tinySpec();
  makeSampleDataset(other / "ds", spec);
  ImageNetLayout a = scanImageNet(root()), b = scanImageNet(other / "ds");
  ASSERT_EQ(a.train.samples.size(), 24u);
  ASSERT_EQ(a.val.samples.size(), 8u);
  EXPECT_EQ(a.train.classes, b.train.classes);
  for (size_t i = 0; i < a.train.samples.size(); ++i) {
    EXPECT_EQ(readFile(a.train.samples[i].path), readFile(b.train.samples[i].path));
  }
  EXPECT_THROW(makeSampleDataset(root(), spec), InputError);  // refuses to overwrite
}

TEST_F(LoaderTest, BatchesHaveShapesLabelsAndAreThreadCountInvariant) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.seed = 3;
  o.workers = 1;
  ImageLoader one(l.train, o, nullptr);
  o.workers = 3;
  o.prefetch = 2;
  o.prefault_buffers = true;  // (touched in startEpoch: the same batches)
  ImageLoader three(l.train, o, nullptr);
  const EpochSpec spec{1, 32, 5, 0.3};
  auto a = epochOf(one, spec), b = epochOf(three, spec);
  ASSERT_EQ(a.size(), 4u);  // 24 / 5, last partial batch dropped
  ASSERT_EQ(b.size(), 4u);
  std::vector<int> label_hist(4, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].images.sizes(), (std::vector<int64_t>{5, 3, 32, 32}));
    EXPECT_TRUE(a[i].images.equal(b[i].images)) << "batch " << i;
    EXPECT_TRUE(a[i].labels.equal(b[i].labels));
    for (int64_t k = 0; k < 5; ++k) ++label_hist[a[i].labels[k].item<int64_t>()];
    // Normalized values: roughly zero-mean, unit-scale.
    EXPECT_LT(a[i].images.abs().max().item<float>(), 3.0f);
  }
  int total = 0;
  for (int h : label_hist) total += h;
  EXPECT_EQ(total, 20);
  // Another epoch shuffles differently.
  auto c = epochOf(one, EpochSpec{2, 32, 5, 0.3});
  EXPECT_FALSE(a[0].labels.equal(c[0].labels) && a[1].labels.equal(c[1].labels) && a[0].images.equal(c[0].images));
}

// An epoch started at batch k (a run resumed in the middle of it) delivers exactly the batches
// k.. of the uninterrupted epoch: the same samples, the same augmentation, the same indexes;
// every source, a start past the end delivers nothing.
TEST_F(LoaderTest, EpochStartedMidwayDeliversTheRestOfTheSameEpoch) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.seed = 11;
  o.workers = 2;
  o.prefetch = 2;
  ImageLoader loader(l.train, o, nullptr);
  const EpochSpec whole{3, 32, 5, 0.3};
  const std::vector<Batch> full = epochOf(loader, whole);
  ASSERT_EQ(full.size(), 4u);
  for (int64_t k : {1, 3, 4, 9}) {
    EpochSpec rest = whole;
    rest.first_batch = k;
    EXPECT_EQ(loader.startEpoch(rest), 4) << "the whole epoch's count";
    std::vector<Batch> tail;
    while (auto b = loader.next()) tail.push_back(*b);
    ASSERT_EQ(tail.size(), static_cast<size_t>(std::max<int64_t>(0, 4 - k))) << "from batch " << k;
    for (size_t i = 0; i < tail.size(); ++i) {
      const Batch& want = full[static_cast<size_t>(k) + i];
      EXPECT_EQ(tail[i].index, want.index);
      EXPECT_TRUE(tail[i].images.equal(want.images)) << "batch " << want.index;
      EXPECT_TRUE(tail[i].labels.equal(want.labels)) << "batch " << want.index;
    }
  }
  SyntheticSource syn(100, 10, false, 1, 0, 2);
  EpochSpec s{0, 16, 8, 0.08};
  s.first_batch = 4;
  EXPECT_EQ(syn.startEpoch(s), 6);
  int64_t n = 0;
  while (auto b = syn.next()) EXPECT_EQ(b->index, 4 + n++);
  EXPECT_EQ(n, 2);
  TensorBatches tb(at::zeros({12, 3, 8, 8}), at::arange(12, at::kLong), 0, 1, true);
  EpochSpec t{0, 8, 4, 0.08};
  t.first_batch = 2;
  EXPECT_EQ(tb.startEpoch(t), 3);
  auto b = tb.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->labels[0].item<int64_t>(), 8);
  EXPECT_FALSE(tb.next().has_value());
}

// An elastic job's world changes after batch 1 of an epoch (3 ranks of 2 images per batch ->
// 2 ranks): the new world's batches are numbered on from 2, take the rest of the epoch's order,
// and carry each image's sample index; with those of the first world's batches 0 and 1, every
// sample of the 24 once (less the tail smaller than the world), and a sample decodes to the
// same picture in either world (augmentation is a function of the seed, epoch and sample).
TEST_F(LoaderTest, ReshardedEpochSharesOutTheRestAndSeesEachSampleOnce) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.seed = 5;
  o.workers = 1;
  const EpochSpec first{1, 32, 2, 0.3};
  std::vector<int> seen(24, 0);
  std::map<int64_t, at::Tensor> pictures;
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    o.world = 3;
    ImageLoader loader(l.train, o, nullptr);
    const std::vector<Batch> batches = epochOf(loader, first);
    for (size_t b = 0; b < 2; ++b) {
      ASSERT_EQ(batches[b].samples.size(), 2u);
      for (size_t i = 0; i < 2; ++i) {
        ++seen[static_cast<size_t>(batches[b].samples[i])];
        pictures[batches[b].samples[i]] = batches[b].images[static_cast<int64_t>(i)];
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    o.rank = 0;  // made for another world, then resharded
    o.world = 3;
    ImageLoader loader(l.train, o, nullptr);
    loader.reshard(r, 2);
    EpochSpec rest = first;
    rest.segment_offset = 12;  // 2 batches x 2 images x 3 ranks
    rest.segment_batch = 2;
    rest.first_batch = 2;
    EXPECT_EQ(loader.startEpoch(rest), 2 + 6 / 2) << "(24 - 12) / 2 ranks = 6 images, 3 batches of 2";
    int64_t k = 2;
    while (auto b = loader.next()) {
      EXPECT_EQ(b->index, k++);
      for (size_t i = 0; i < b->samples.size(); ++i) ++seen[static_cast<size_t>(b->samples[i])];
    }
    EXPECT_EQ(k, 5);
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
  // The same sample in the second world is the same picture as in the first.
  o.rank = 0;
  o.world = 3;
  ImageLoader again(l.train, o, nullptr);
  again.reshard(1, 2);
  EpochSpec rest = first;
  rest.segment_offset = 0;
  const Batch b = epochOf(again, rest)[0];
  for (size_t i = 0; i < b.samples.size(); ++i) {
    const auto it = pictures.find(b.samples[i]);
    ASSERT_NE(it, pictures.end()) << "positions 1 and 3 of the order were in the first world's batches";
    EXPECT_TRUE(it->second.equal(b.images[static_cast<int64_t>(i)]));
  }
  TensorBatches tb(at::zeros({12, 3, 8, 8}), at::arange(12, at::kLong), 0, 1, true);
  EXPECT_THROW(tb.reshard(0, 2), InputError);
}

// LoaderOptions::huffman picks the Huffman decoder for this loader alone (no process-wide
// switch): libjpeg-turbo's takes no decode over, aiacc's (where the gate allows) does, and the
// batches are the same.
TEST_F(LoaderTest, HuffmanDecoderIsALoaderOption) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.seed = 7;
  o.huffman = HuffmanDecoder::kLibjpegTurbo;
  ImageLoader theirs(l.train, o, nullptr);
  o.huffman = huffmanTakeover().decoder();
  ImageLoader ours(l.train, o, nullptr);
  const EpochSpec spec{1, 24, 4, 0.08};
  const EntropyHook::Counts before = EntropyHook::counts();
  auto a = epochOf(theirs, spec);
  const EntropyHook::Counts middle = EntropyHook::counts();
  EXPECT_EQ(middle.installed, before.installed) << "libjpeg-turbo's decoder: no takeover";
  auto b = epochOf(ours, spec);
  const EntropyHook::Counts after = EntropyHook::counts();
  if (huffmanTakeover().enabled) {
    EXPECT_GT(after.installed, middle.installed) << "aiacc's decoder";
  }
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].images.equal(b[i].images)) << "batch " << i;
    EXPECT_TRUE(a[i].labels.equal(b[i].labels));
  }
}

// JPEG entropy indexes (built along the decodes, used after) change no pixel.
TEST_F(LoaderTest, JpegIndexesChangeNoBatch) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.seed = 5;
  o.workers = 2;
  ImageLoader plain(l.train, o, nullptr);
  o.jpeg_index_bytes = 16 << 20;
  ImageLoader indexed(l.train, o, nullptr);
  EXPECT_EQ(plain.jpegIndex(), nullptr);
  ASSERT_NE(indexed.jpegIndex(), nullptr);
  for (int64_t epoch : {1, 2, 3}) {
    const EpochSpec spec{epoch, 24, 4, 0.08};
    auto a = epochOf(plain, spec), b = epochOf(indexed, spec);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(a[i].images.equal(b[i].images)) << "epoch " << epoch << " batch " << i;
      EXPECT_TRUE(a[i].labels.equal(b[i].labels));
    }
  }
  // A file is indexed on a decode whose crop ends in the image's bottom tenth (IndexBuild): in
  // three epochs, a good part of the files.
  EXPECT_GE(indexed.jpegIndex()->indexedFiles(), l.train.samples.size() / 4);
  EXPECT_LE(indexed.jpegIndex()->indexedFiles(), l.train.samples.size());
  EXPECT_EQ(indexed.jpegIndex()->refusedFiles(), 0u);
  EXPECT_GT(indexed.jpegIndex()->bytes(), 0u);
  // A spent budget: files decode without an index.
  o.jpeg_index_bytes = 1;
  ImageLoader tight(l.train, o, nullptr);
  auto c = epochOf(tight, EpochSpec{1, 24, 4, 0.08});
  auto d = epochOf(plain, EpochSpec{1, 24, 4, 0.08});
  for (size_t i = 0; i < c.size(); ++i) EXPECT_TRUE(c[i].images.equal(d[i].images));
  EXPECT_LE(tight.jpegIndex()->indexedFiles(), 2u);  // the first file(s) overran it
}

// Batch buffers are recycled, but never while a consumer still holds the batch.
TEST_F(LoaderTest, HeldBatchesAreNeverOverwritten) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.workers = 2;
  o.prefetch = 2;
  ImageLoader ld(l.train, o, nullptr);
  std::vector<Batch> held;
  std::vector<at::Tensor> copies;
  for (int epoch = 0; epoch < 2; ++epoch) {
    ld.startEpoch(EpochSpec{epoch, 16, 1, 0.3});  // 24 batches: many more than the pool
    while (auto b = ld.next()) {
      copies.push_back(b->images.clone());
      held.push_back(*b);
      if (held.size() % 5 == 0) held.erase(held.begin());  // release some: they get recycled
    }
  }
  const size_t first = copies.size() - held.size();
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(held[i].images.equal(copies[first + i])) << "held batch " << i << " was overwritten";
  }
}

TEST_F(LoaderTest, ShardsSplitTheEpochAcrossRanks) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.world = 2;
  o.train = false;  // val: every image exactly once across ranks
  int64_t seen = 0;
  for (int r = 0; r < 2; ++r) {
    o.rank = r;
    ImageLoader ld(l.val, o, nullptr);
    for (auto& b : epochOf(ld, EpochSpec{0, 24, 3, 0.08})) seen += b.labels.numel();
  }
  EXPECT_EQ(seen, 8);
}

TEST_F(LoaderTest, ChannelsLastHasNhwcStrides) {
  ImageNetLayout l = scanImageNet(root());
  LoaderOptions o;
  o.train = false;
  ImageLoader nchw(l.val, o, nullptr);
  o.channels_last = true;
  ImageLoader nhwc(l.val, o, nullptr);
  auto a = epochOf(nchw, EpochSpec{0, 16, 4, 0.08});
  auto b = epochOf(nhwc, EpochSpec{0, 16, 4, 0.08});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(b[0].images.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(a[0].images.equal(b[0].images));
}

// The GPU input path (uint8 batches, normalized on the device) gives the float path's values,
// train augmentation included, in either memory format. Here the "device" is the CPU: the same
// ATen code runs on CUDA (tests/gpu_test.cc compares the two devices).
TEST_F(LoaderTest, BytesNormalizedOnDeviceEqualTheFloatPath) {
  ImageNetLayout l = scanImageNet(root());
  for (bool channels_last : {false, true}) {
    LoaderOptions o;
    o.channels_last = channels_last;
    o.seed = 3;
    ImageLoader floats(l.train, o, nullptr);
    o.bytes = true;
    ImageLoader bytes(l.train, o, nullptr);
    auto a = epochOf(floats, EpochSpec{1, 24, 5, 0.2});
    auto b = epochOf(bytes, EpochSpec{1, 24, 5, 0.2});
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(b[i].images.scalar_type(), at::kByte);
      EXPECT_EQ(b[i].images.sizes(), a[i].images.sizes());
      const at::Tensor x = imagesOnDevice(b[i].images, at::kCPU, channels_last);
      EXPECT_EQ(x.scalar_type(), at::kFloat);
      EXPECT_TRUE(x.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous));
      EXPECT_LE((x - a[i].images).abs().max().item<float>(), 1e-6f) << "batch " << i;
      EXPECT_TRUE(labelsOnDevice(b[i].labels, at::kCPU).equal(a[i].labels));
    }
  }
}

TEST_F(LoaderTest, BadFilesAreSkippedAndCounted) {
  test::TempDir d;
  const std::string cls = test::twoClassDataset(d / "ds");
  test::writeText(cls + "/zero.JPEG", "");
  test::writeText(cls + "/text.JPEG", "plain text, not an image");
  const std::vector<uint8_t> good = readFile(cls + "/train_00000.JPEG");
  test::writeFile(cls + "/trunc.JPEG",
                  std::vector<uint8_t>(good.begin(), good.begin() + static_cast<long>(good.size() / 2)));
  ImageNetLayout l = scanImageNet(d / "ds");
  ASSERT_EQ(l.train.samples.size(), 11u);
  auto skips = std::make_shared<SkipLog>();
  LoaderOptions o;
  o.train = false;
  ImageLoader ld(l.train, o, skips);
  int64_t images = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (auto& b : epochOf(ld, EpochSpec{epoch, 16, 4, 0.08})) {
      images += b.labels.numel();
      EXPECT_EQ(b.images.size(0), b.labels.size(0));
    }
  }
  EXPECT_EQ(images, 2 * 8);
  EXPECT_EQ(skips->count(), 3) << "three bad files, counted once each over two epochs";
}

TEST(Synthetic, FullSpeedRandomBatches) {
  SyntheticSource s(100, 10, false, 1, 0, 2);
  EXPECT_EQ(s.startEpoch(EpochSpec{0, 24, 8, 0.08}), 6);  // 50 per rank / 8
  auto b = s.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->images.sizes(), (std::vector<int64_t>{8, 3, 24, 24}));
  EXPECT_LT(b->labels.max().item<int64_t>(), 10);
}

}  // namespace
}  // namespace aiacc::data

namespace aiacc::data {
namespace {

// Each rank takes its contiguous part of every global batch; together the ranks see every row
// once, in order, and shardSize() counts what next() hands out.
TEST(TensorBatches, RanksSplitEachGlobalBatchAndCountTheirRows) {
  const int64_t n = 11;
  const at::Tensor images = at::zeros({n, 3, 8, 8});
  const at::Tensor labels = at::arange(n, at::kLong);
  EpochSpec spec;
  spec.image_size = 8;
  spec.batch_size = 2;  // per rank: global batches of 6
  for (const bool train : {true, false}) {
    std::vector<std::vector<std::vector<int64_t>>> per_rank(3);  // [rank][batch] -> labels
    for (int r = 0; r < 3; ++r) {
      TensorBatches src(images, labels, r, 3, train);
      EXPECT_EQ(src.startEpoch(spec), train ? 1 : 2);
      int64_t rows = 0;
      while (auto b = src.next()) {
        per_rank[static_cast<size_t>(r)].emplace_back();
        for (int64_t i = 0; i < b->labels.numel(); ++i)
          per_rank[static_cast<size_t>(r)].back().push_back(b->labels[i].item<int64_t>());
        rows += b->labels.numel();
      }
      // As ImageLoader's: training counts the shard (whole batches of it are served), evaluation
      // every row served.
      if (train) {
        EXPECT_EQ(src.shardSize(), n / 3);
        EXPECT_EQ(rows, src.shardSize() / spec.batch_size * spec.batch_size) << "rank " << r;
      } else {
        EXPECT_EQ(src.shardSize(), rows) << "rank " << r;
      }
    }
    std::vector<int64_t> seen;  // step by step, rank by rank
    for (size_t k = 0; k < per_rank[0].size(); ++k) {
      for (const auto& r : per_rank) seen.insert(seen.end(), r[k].begin(), r[k].end());
    }
    std::vector<int64_t> want(static_cast<size_t>(train ? 6 : n));
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(seen, want) << (train ? "train" : "val");
  }
}

}  // namespace
}  // namespace aiacc::data
