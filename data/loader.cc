#include "data/loader.h"

#include <glog/logging.h>

#include <algorithm>

#include "data/decode.h"
#include "data/sampler.h"

namespace aiacc::data {

void SkipLog::record(const std::string& path, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (paths_.insert(path).second) {
    LOG(WARNING) << "skipping unreadable image '" << path << "': " << reason;
  }
}

int64_t SkipLog::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(paths_.size());
}

std::vector<std::string> SkipLog::paths() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {paths_.begin(), paths_.end()};
}

ImageLoader::ImageLoader(ImageFolder folder, LoaderOptions options, std::shared_ptr<SkipLog> skips)
    : folder_(std::move(folder)), opt_(options), rank_(options.rank), world_(options.world), skips_(std::move(skips)) {
  AIACC_CHECK_INPUT(opt_.workers >= 1, "--workers must be at least 1 (got ", opt_.workers, ")");
  AIACC_CHECK_INPUT(opt_.prefetch >= 1, "prefetch depth must be at least 1");
  if (!skips_) skips_ = std::make_shared<SkipLog>();
  if (opt_.jpeg_index_bytes > 0) {
    jpeg_index_ = std::make_unique<JpegIndexCache>(folder_.samples.size(), opt_.jpeg_index_bytes);
  }
}

ImageLoader::~ImageLoader() { stopWorkers(); }

int64_t ImageLoader::shardSize() const {
  const int64_t n = static_cast<int64_t>(folder_.samples.size());
  return opt_.train ? n / world_ : (n - rank_ + world_ - 1) / world_;
}

void BatchSource::reshard(int, int) {
  AIACC_THROW(InputError, "this data source cannot change its world (an elastic job needs a folder or synthetic data)");
}

void ImageLoader::reshard(int rank, int world) {
  AIACC_CHECK(world >= 1 && rank >= 0 && rank < world, "reshard to rank ", rank, " of ", world);
  stopWorkers();  // the next startEpoch starts them again
  rank_ = rank;
  world_ = world;
}

void ImageLoader::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

int64_t ImageLoader::startEpoch(const EpochSpec& spec) {
  stopWorkers();
  AIACC_CHECK_INPUT(spec.batch_size >= 1 && spec.image_size >= 8, "batch size ", spec.batch_size, " / image size ",
                    spec.image_size, " out of range");
  spec_ = spec;
  ShardSpec shard;
  shard.rank = rank_;
  shard.world = world_;
  shard.offset = spec.segment_offset;
  shard.shuffle = opt_.train;
  shard.equal_shards = opt_.train;
  shard.seed = opt_.seed;
  if (opt_.train) shard.global_batch = spec.global_batch;
  indices_ = shardIndices(static_cast<int64_t>(folder_.samples.size()), spec.epoch, shard);
  num_batches_ = spec.segment_batch + batchCount(static_cast<int64_t>(indices_.size()), spec.batch_size, opt_.train);
  const int64_t first = std::clamp<int64_t>(spec.first_batch, spec.segment_batch, num_batches_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    next_claim_ = first;
    consumed_ = first;
    cancel_ = false;
    error_ = nullptr;
    ready_.clear();
  }
  if (opt_.prefault_buffers && num_batches_ > 0) {
    const int64_t B = spec.batch_size, S = spec.image_size;
    const bool nhwc = opt_.channels_last || opt_.bytes;
    const std::vector<int64_t> shape = nhwc ? std::vector<int64_t>{B, S, S, 3} : std::vector<int64_t>{B, 3, S, S};
    std::vector<at::Tensor> held;  // distinct buffers while held; back to the pool after
    for (int i = 0; i < opt_.prefetch + opt_.workers + 1; ++i) {
      held.push_back(takeBuffer(shape, opt_.bytes ? at::kByte : at::kFloat));
      held.back().zero_();
    }
  }
  const int n = static_cast<int>(std::min<int64_t>(opt_.workers, std::max<int64_t>(num_batches_ - first, 1)));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { workerLoop(); });
  return num_batches_;
}

void ImageLoader::workerLoop() {
  for (;;) {
    int64_t k;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return cancel_ || next_claim_ >= num_batches_ || next_claim_ < consumed_ + opt_.prefetch; });
      if (cancel_ || next_claim_ >= num_batches_) return;
      k = next_claim_++;
    }
    try {
      Batch b = buildBatch(k);
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace(k, std::move(b));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

at::Tensor ImageLoader::takeBuffer(at::IntArrayRef shape, at::ScalarType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : pool_) {
    // Free when the pool holds the only handle to the tensor (use_count) and no view of it
    // exists either (a view is another TensorImpl on the same storage). A pinned buffer's
    // asynchronous copy to the GPU has finished by then: the trainer drops a batch only after
    // reading the step's loss, which waits for the stream that copied it.
    if (t.use_count() == 1 && t.storage().use_count() == 1 && t.sizes() == shape && t.scalar_type() == dtype) {
      return t;
    }
  }
  // Bounded: at most the batches that can be alive at once (in flight + held by the consumer).
  if (pool_.size() > static_cast<size_t>(opt_.prefetch + opt_.workers + 2)) {
    pool_.erase(pool_.begin());
  }
  pool_.push_back(at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(opt_.pin_memory)));
  return pool_.back();
}

Batch ImageLoader::buildBatch(int64_t k) {
  const int S = spec_.image_size;
  const int64_t begin = (k - spec_.segment_batch) * spec_.batch_size;  // in this world's shard
  const int64_t end = std::min<int64_t>(begin + spec_.batch_size, static_cast<int64_t>(indices_.size()));
  const int64_t B = end - begin;
  const bool nhwc = opt_.channels_last || opt_.bytes;
  at::Tensor images = opt_.bytes ? takeBuffer({B, S, S, 3}, at::kByte)
                      : nhwc     ? takeBuffer({B, S, S, 3}, at::kFloat)
                                 : takeBuffer({B, 3, S, S}, at::kFloat);
  at::Tensor labels = at::empty({B}, at::TensorOptions().dtype(at::kLong).pinned_memory(opt_.pin_memory));
  float* base = opt_.bytes ? nullptr : images.data_ptr<float>();
  uint8_t* base_bytes = opt_.bytes ? images.data_ptr<uint8_t>() : nullptr;
  int64_t* lab = labels.data_ptr<int64_t>();
  const size_t per_image = static_cast<size_t>(3) * S * S;
  std::vector<int64_t> good;
  good.reserve(static_cast<size_t>(B));
  CropParams crop = opt_.crop;
  crop.scale_min = spec_.scale_min;
  for (int64_t i = 0; i < B; ++i) {
    const int64_t idx = indices_[static_cast<size_t>(begin + i)];
    const Sample& s = folder_.samples[static_cast<size_t>(idx)];
    Rng rng(mixSeed(opt_.seed, static_cast<uint64_t>(spec_.epoch), static_cast<uint64_t>(idx)));
    try {
      const std::vector<uint8_t> bytes = readFile(s.path);
      CropPicker pick;
      std::optional<ValCrop> val_crop;  // torchvision's val geometry, once the picker has the size
      if (opt_.train) {
        pick = [&](int w, int h) { return randomResizedCropBox(w, h, crop, rng); };
      } else if (filterOf(opt_.resize) == ResizeFilter::kPillow) {
        pick = [&](int w, int h) {
          val_crop = torchvisionValCrop(w, h, S, opt_.crop_fraction);
          return val_crop->decode;
        };
      } else {
        pick = [&](int w, int h) { return centerCropBox(w, h, opt_.crop_fraction); };
      }
      // The file's index when it has one; on its first decode, the decode builds it.
      bool build_index = false;
      const JpegIndex* ix = jpeg_index_ ? jpeg_index_->find(static_cast<size_t>(idx), &build_index) : nullptr;
      IndexBuild build;
      if (build_index) build.cols_per_checkpoint = jpeg_index_->colsPerCheckpoint();
      // Without DCT scaling, an output size no scale reaches: the crop decodes at full size.
      const int decode_for = dctScaling(opt_.resize) ? S : kFullResolution;
      DecodedCrop dc = decodeCrop(bytes.data(), bytes.size(), pick, decode_for, decode_for, ix, /*packed=*/false,
                                  build_index ? &build : nullptr, opt_.huffman, opt_.max_image_pixels);
      if (build_index && !build.deferred) jpeg_index_->offer(static_cast<size_t>(idx), std::move(build.index));
      std::optional<SampleWindow> window;
      if (val_crop) {  // in the decoded crop's pixels (a DCT-scaled crop is smaller than its box)
        const double fx = static_cast<double>(dc.crop.width) / dc.box.w,
                     fy = static_cast<double>(dc.crop.height) / dc.box.h;
        const SampleWindow& w = val_crop->window;
        window = SampleWindow{w.x0 * fx, w.y0 * fy, w.x1 * fx, w.y1 * fy};
      }
      const bool flip = opt_.train && rng.uniform(0.0, 1.0) < 0.5;
      if (opt_.bytes) {
        resizeToBytes(dc.crop, S, flip, base_bytes + static_cast<size_t>(i) * per_image, filterOf(opt_.resize), window);
      } else {
        resizeNormalize(dc.crop, S, flip, nhwc ? Layout::kNHWC : Layout::kNCHW,
                        base + static_cast<size_t>(i) * per_image, filterOf(opt_.resize), window);
      }
      lab[i] = s.label;
      good.push_back(i);
    } catch (const DecodeError& e) {
      skips_->record(s.path, e.what());
    }
  }
  if (static_cast<int64_t>(good.size()) < B) {
    at::Tensor keep = at::tensor(good, at::kLong);
    images = images.index_select(0, keep);
    labels = labels.index_select(0, keep);
  }
  Batch out;
  out.images = nhwc ? images.permute({0, 3, 1, 2}) : images;
  out.labels = labels;
  out.index = k;
  out.samples.reserve(good.size());
  for (const int64_t i : good) out.samples.push_back(indices_[static_cast<size_t>(begin + i)]);
  return out;
}

std::optional<Batch> ImageLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (consumed_ >= num_batches_) return std::nullopt;
  cv_.wait(lock, [&] { return error_ != nullptr || ready_.count(consumed_) > 0; });
  if (error_) {
    std::exception_ptr e = error_;
    lock.unlock();
    stopWorkers();
    std::rethrow_exception(e);
  }
  auto it = ready_.find(consumed_);
  Batch b = std::move(it->second);
  ready_.erase(it);
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

SyntheticSource::SyntheticSource(int64_t images_per_epoch, int64_t classes, bool channels_last, uint64_t seed, int rank,
                                 int world, bool drop_last)
    : images_(images_per_epoch), classes_(classes), channels_last_(channels_last), seed_(seed), rank_(rank),
      world_(world), drop_last_(drop_last) {
  AIACC_CHECK_INPUT(classes_ >= 2, "synthetic data needs at least 2 classes");
}

int64_t SyntheticSource::startEpoch(const EpochSpec& spec) {
  const int64_t B = spec.batch_size, S = spec.image_size;
  if (!batch_.images.defined() || batch_.images.size(0) != B || batch_.images.size(2) != S ||
      batch_.images.device() != device_) {
    at::Generator gen = at::detail::createCPUGenerator(mixSeed(seed_, static_cast<uint64_t>(rank_)));
    batch_.images = at::randn({B, 3, S, S}, gen, at::kFloat);
    if (channels_last_) batch_.images = batch_.images.contiguous(at::MemoryFormat::ChannelsLast);
    batch_.labels = at::randint(0, classes_, {B}, gen, at::kLong);
    batch_.images = batch_.images.to(device_);  // no-op on the CPU; else once, not per step
    batch_.labels = batch_.labels.to(device_);
  }
  segment_offset_ = spec.segment_offset;
  segment_batch_ = spec.segment_batch;
  global_batch_ = drop_last_ ? spec.global_batch : 0;
  batch_size_ = B;
  num_batches_ = spec.segment_batch + batchCount(segmentShard(), B, drop_last_);
  served_ = std::clamp<int64_t>(spec.first_batch, spec.segment_batch, num_batches_);
  return num_batches_;
}

std::optional<Batch> SyntheticSource::next() {
  if (served_ >= num_batches_) return std::nullopt;
  Batch b = batch_;
  const int64_t left = segmentShard() - (served_ - segment_batch_) * batch_size_;
  if (left < batch_size_) {  // partial last batch (evaluation only)
    b.images = b.images.narrow(0, 0, left);
    b.labels = b.labels.narrow(0, 0, left);
  }
  b.index = served_++;
  return b;
}

int64_t SyntheticSource::segmentShard() const {
  const int64_t rest = images_ - std::min(images_, segment_offset_);
  if (global_batch_ > 0) return rest / global_batch_ * batch_size_;  // batch_size_: this rank's share of a step
  return rest / world_;
}

void SyntheticSource::reshard(int rank, int world) {
  AIACC_CHECK(world >= 1 && rank >= 0 && rank < world, "reshard to rank ", rank, " of ", world);
  rank_ = rank;
  world_ = world;
}

}  // namespace aiacc::data
