#include "data/tensor_source.h"

#include <algorithm>

#include "aiacc/common/error.h"

namespace aiacc::data {

TensorBatches::TensorBatches(at::Tensor images, at::Tensor labels, int rank, int world, bool train, int64_t classes)
    : images_(std::move(images)), labels_(std::move(labels)), rank_(rank), world_(world), train_(train),
      classes_(classes) {
  AIACC_CHECK_INPUT(images_.dim() == 4 && images_.size(1) == 3 && images_.scalar_type() == at::kFloat,
                    "TensorBatches: images must be a float [N, 3, S, S] tensor, got ", images_.sizes());
  AIACC_CHECK_INPUT(labels_.dim() == 1 && labels_.size(0) == images_.size(0) && labels_.scalar_type() == at::kLong,
                    "TensorBatches: labels must be an int64 [N] tensor matching ", images_.size(0), " images");
  AIACC_CHECK_INPUT(world_ >= 1 && rank_ >= 0 && rank_ < world_, "TensorBatches: rank ", rank_, " of ", world_);
  if (classes_ <= 0) classes_ = labels_.numel() > 0 ? labels_.max().item<int64_t>() + 1 : 1;
}

int64_t TensorBatches::shardSize() const {
  const int64_t n = images_.size(0);
  if (train_) return n / world_;
  // Evaluation: this rank's parts of every global batch of the current epoch (next() below).
  const int64_t global = batch_ * world_;
  int64_t count = 0;
  for (int64_t begin = 0; begin < n; begin += global) {
    const int64_t len = std::min(global, n - begin);
    count += len * (rank_ + 1) / world_ - len * rank_ / world_;
  }
  return count;
}

int64_t TensorBatches::startEpoch(const EpochSpec& spec) {
  AIACC_CHECK_INPUT(spec.image_size == images_.size(2) && spec.image_size == images_.size(3), "TensorBatches holds ",
                    images_.size(2), "x", images_.size(3), " images; the epoch asks for ", spec.image_size);
  AIACC_CHECK_INPUT(spec.batch_size >= 1, "batch size ", spec.batch_size);
  batch_ = spec.batch_size;
  const int64_t global = batch_ * world_, n = images_.size(0);
  num_batches_ = train_ ? n / global : (n + global - 1) / global;
  served_ = std::clamp<int64_t>(spec.first_batch, 0, num_batches_);
  return num_batches_;
}

std::optional<Batch> TensorBatches::next() {
  if (served_ >= num_batches_) return std::nullopt;
  const int64_t global = batch_ * world_;
  const int64_t begin = served_ * global, end = std::min(begin + global, images_.size(0));
  // Rank r's part of [begin, end): the r-th of world near-equal contiguous pieces.
  const int64_t len = end - begin;
  const int64_t lo = begin + len * rank_ / world_, hi = begin + len * (rank_ + 1) / world_;
  Batch b;
  b.images = images_.narrow(0, lo, hi - lo);
  b.labels = labels_.narrow(0, lo, hi - lo);
  b.index = served_++;
  return b;
}

}  // namespace aiacc::data
