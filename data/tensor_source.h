// TensorBatches: a BatchSource over images already in memory (a tensor [N, 3, S, S] and its
// labels), served in order without augmentation. For programs whose data is not a folder of
// JPEGs, and for tests that feed the trainer the same batches as a PyTorch reference.
//
// Data parallel: each step consumes one global batch of batch_size x world consecutive rows;
// rank r takes the r-th contiguous part of it (so the world's ranks together see exactly the
// rows a single process with the global batch would). Training drops a partial last global
// batch; evaluation keeps it, split as evenly as it goes (every row exactly once).
#pragma once

#include <ATen/ATen.h>

#include "data/loader.h"

namespace aiacc::data {

class TensorBatches : public BatchSource {
 public:
  // images: [N, 3, S, S] float (normalized as the model expects); labels: [N] int64 in
  // [0, classes). classes 0: the largest label + 1.
  TensorBatches(at::Tensor images, at::Tensor labels, int rank, int world, bool train, int64_t classes = 0);

  // spec.image_size must be S; spec.batch_size is per rank.
  int64_t startEpoch(const EpochSpec& spec) override;
  std::optional<Batch> next() override;
  int64_t numClasses() const override { return classes_; }
  // Training: N / world, as ImageLoader's shard (an epoch serves its whole batches).
  // Evaluation: the rows next() hands this rank in an epoch of the last started batch size.
  int64_t shardSize() const override;

 private:
  at::Tensor images_, labels_;
  int rank_, world_;
  bool train_;
  int64_t classes_;
  int64_t batch_ = 1, num_batches_ = 0, served_ = 0;
};

}  // namespace aiacc::data
