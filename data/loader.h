// Batch sources for the training loop: a threaded JPEG loader and a synthetic one.
//
// ImageLoader: `workers` threads each build whole batches (read, decode the crop, augment, write
// into the batch tensor). At most `prefetch` batches exist at once beyond the one being consumed,
// so memory is bounded by the prefetch depth whatever the dataset size. Batches are delivered in
// order; every augmentation draws from a random stream seeded by (seed, epoch, sample index), so
// an epoch's batches are identical whatever the thread count or timing.
//
// Undecodable files (zero-byte, truncated, not an image) are skipped: one warning line per file,
// counted in SkipLog, and the batch is delivered without them (it is at most that much smaller).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "data/decode.h"
#include "data/image_folder.h"
#include "data/transforms.h"
#include "data/jpeg_index.h"

namespace aiacc::data {

struct Batch {
  // [B, 3, S, S] float32 normalized, NCHW strides or channels-last strides; with
  // LoaderOptions::bytes, uint8 0..255 with channels-last strides (data/device_input.h finishes it).
  at::Tensor images;
  at::Tensor labels;  // [B] int64
  int64_t index = 0;  // position in the epoch
  // The images' sample indices in the folder, in batch order (undecodable ones left out); empty
  // for sources without a folder.
  std::vector<int64_t> samples;
};

// What changes between epochs under a progressive-resizing recipe.
struct EpochSpec {
  int64_t epoch = 0;
  int image_size = 224;
  int batch_size = 32;
  double scale_min = 0.08;  // random-resized-crop minimum area fraction (train only)
  // Batches of this epoch already consumed (a run resumed in the middle of an epoch): next()
  // starts at batch first_batch, which is the batch an uninterrupted epoch would deliver there
  // (the same samples, the same augmentation: both are functions of seed, epoch and sample
  // index). Clamped to the epoch's batch count; startEpoch still returns the whole count.
  int64_t first_batch = 0;
  // An elastic job whose world changed within this epoch: the world that began at batch
  // segment_batch shares out the epoch's order from position segment_offset on (the samples the
  // earlier worlds consumed: data/sampler.h). Batch numbers stay the epoch's: next() starts at
  // max(first_batch, segment_batch), and startEpoch returns segment_batch + this world's batches.
  int64_t segment_offset = 0;
  int64_t segment_batch = 0;
  // > 0 (training): this world's part of the epoch is consumed in steps of global_batch samples
  // that the world need not divide (--elastic-batch keep-global, data/sampler.h ShardSpec): this
  // rank's batches are batch_size = rankBatch(global_batch, rank, world) samples each. 0: every
  // rank's batch is batch_size, a step batch_size x world.
  int64_t global_batch = 0;
};

// Thread-safe record of skipped files: warns once per file, counts unique files.
class SkipLog {
 public:
  void record(const std::string& path, const std::string& reason);
  int64_t count() const;
  std::vector<std::string> paths() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> paths_;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // Starts an epoch at batch spec.first_batch; returns the number of batches the whole epoch has
  // (the first next() returns batch first_batch, with Batch::index first_batch).
  virtual int64_t startEpoch(const EpochSpec& spec) = 0;
  // The next batch of the current epoch, or nullopt when the epoch is done. Rethrows errors
  // raised on worker threads.
  virtual std::optional<Batch> next() = 0;
  virtual int64_t numClasses() const = 0;
  // Samples in this rank's shard per epoch.
  virtual int64_t shardSize() const = 0;
  // Samples in an epoch, all ranks together (what EpochSpec::global_batch steps through); 0 for
  // sources that cannot change their world (in-memory batches).
  virtual int64_t epochSize() const { return 0; }
  // From the next startEpoch on, this source is rank `rank` of `world` (an elastic job's new
  // world). Sources that cannot (in-memory batches) refuse with an InputError.
  virtual void reshard(int rank, int world);
  // The JPEG entropy index cache this source builds as it decodes (data/jpeg_index.h); null for
  // sources without one (in-memory and synthetic batches, a loader with jpeg_index_bytes 0).
  virtual const JpegIndexCache* jpegIndex() const { return nullptr; }
};

struct LoaderOptions {
  bool train = true;             // random-resized-crop + flip + shuffle; else center crop
  int workers = 2;               // decode threads
  int prefetch = 4;              // batches in flight ahead of the consumer
  CropParams crop;               // scale_min is overridden per epoch by EpochSpec
  double crop_fraction = 0.875;  // val: short side resized to size / crop_fraction
  ResizeMode resize = ResizeMode::kTorchvision;
  bool channels_last = false;
  // GPU input path: uint8 HWC batches (a quarter of the bytes to copy), normalized on the
  // device; in page-locked memory when pin_memory (needs CUDA), so the copy is asynchronous.
  bool bytes = false;
  bool pin_memory = false;
  uint64_t seed = 0;
  int rank = 0;
  int world = 1;
  // Whose Huffman decoder entropy-decodes the JPEGs (data/decode.h; the same pixels either way).
  // kProcessDefault follows the process-wide switch (EntropyHook::enable, aiacc_bench) and the
  // gate; the trainer passes kLibjpegTurbo (--libjpeg-huffman) or the gate's choice,
  // huffmanTakeover().decoder() (data/entropy_gate.h).
  HuffmanDecoder huffman = HuffmanDecoder::kProcessDefault;
  // Memory for JPEG entropy indexes (data/jpeg_index.h), built as files are first decoded; after
  // that, only each crop's MCUs are entropy-decoded. 0: no indexes.
  size_t jpeg_index_bytes = 0;
  // The largest image decoded (data/decode.h: kDefaultMaxImagePixels); a larger one is a counted skip.
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  // startEpoch touches the epoch's batch buffers (as many as can be in flight) before the workers
  // start, so their first-touch page faults fall there rather than in the first batches
  // (aiacc_bench data's timed passes).
  bool prefault_buffers = false;
};

class ImageLoader : public BatchSource {
 public:
  ImageLoader(ImageFolder folder, LoaderOptions options, std::shared_ptr<SkipLog> skips);
  ~ImageLoader() override;
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  int64_t startEpoch(const EpochSpec& spec) override;
  std::optional<Batch> next() override;
  int64_t numClasses() const override { return static_cast<int64_t>(folder_.classes.size()); }
  int64_t shardSize() const override;
  int64_t epochSize() const override { return static_cast<int64_t>(folder_.samples.size()); }
  void reshard(int rank, int world) override;
  // The JPEG index cache, null without one (LoaderOptions::jpeg_index_bytes 0).
  const JpegIndexCache* jpegIndex() const override { return jpeg_index_.get(); }

 private:
  void stopWorkers();
  void workerLoop();
  Batch buildBatch(int64_t k);
  // A batch buffer of the given shape: a recycled one the consumer has released (only the pool
  // still references it), else a new one. Saves the mmap/munmap and page faults of a fresh
  // multi-megabyte allocation per batch.
  at::Tensor takeBuffer(at::IntArrayRef shape, at::ScalarType dtype);

  const ImageFolder folder_;
  const LoaderOptions opt_;
  int rank_, world_;  // opt_'s, until reshard
  std::shared_ptr<SkipLog> skips_;
  std::unique_ptr<JpegIndexCache> jpeg_index_;

  // Current epoch (written by startEpoch while no worker runs).
  EpochSpec spec_;
  std::vector<int64_t> indices_;
  int64_t num_batches_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_claim_ = 0;  // next batch a worker will build
  int64_t consumed_ = 0;    // batches handed to the consumer
  bool cancel_ = false;
  std::exception_ptr error_;
  std::map<int64_t, Batch> ready_;
  std::vector<at::Tensor> pool_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

// Random tensors, generated once per shape and handed out at full speed: throughput runs
// without I/O (--data synthetic).
class SyntheticSource : public BatchSource {
 public:
  // drop_last: training (full batches only); otherwise the last batch is partial (evaluation).
  SyntheticSource(int64_t images_per_epoch, int64_t classes, bool channels_last, uint64_t seed, int rank, int world,
                  bool drop_last = true);
  int64_t startEpoch(const EpochSpec& spec) override;
  std::optional<Batch> next() override;
  int64_t numClasses() const override { return classes_; }
  int64_t shardSize() const override { return images_ / world_; }
  int64_t epochSize() const override { return images_; }
  void reshard(int rank, int world) override;
  // This rank's samples of the current world's part of the epoch (after segment_offset).
  int64_t segmentShard() const;
  // Generates the batch on `device` from now on (no host-to-device copy per step).
  void setDevice(at::Device device) { device_ = device; }

 private:
  at::Device device_ = at::kCPU;
  int64_t images_, classes_;
  bool channels_last_;
  uint64_t seed_;
  int rank_, world_;
  bool drop_last_;
  int64_t num_batches_ = 0, served_ = 0, batch_size_ = 0;
  int64_t segment_offset_ = 0, segment_batch_ = 0, global_batch_ = 0;
  Batch batch_;
};

}  // namespace aiacc::data
