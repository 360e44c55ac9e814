// The trainer's batch layout (Trainer::State, app/trainer_state.h): the job's global batch and
// this rank's share of it (--elastic-batch), the steps an epoch has, the planned steps, and the
// fraction of an epoch a position stands for.
#include <algorithm>

#include "app/trainer_state.h"
#include "data/sampler.h"

namespace aiacc::app {

int64_t Trainer::State::globalBatch(const Stage& st, int w) const {
  const bool keep_global = cfg.elastic_batch == ElasticBatch::kKeepGlobal && pos.batch_world > 0;
  return static_cast<int64_t>(st.batch_size) * (keep_global ? pos.batch_world : w);
}

int64_t Trainer::State::rankBatchSize(const Stage& st) const {
  // (At least one image each: setupModel refused a MAX larger than the global batch.)
  return data::rankBatch(globalBatch(st), rank, world);
}

int64_t Trainer::State::stepsPerEpoch(const Stage& st) const {
  const int64_t global = globalBatch(st);
  // Where the world divides the global batch the ranks' shards are the even ones.
  if (global == static_cast<int64_t>(st.batch_size) * world) return train->shardSize() / st.batch_size;
  return train->epochSize() / global;
}

int64_t Trainer::State::plannedSteps() const {
  int64_t steps = 0;
  for (int e = 0; e < cfg.epochs; ++e) steps += stepsPerEpoch(stageAt(cfg, e));
  if (cfg.max_steps > 0) steps = std::min(steps, cfg.max_steps);
  return steps;
}

double Trainer::State::epochFraction(int64_t batches, int64_t nb, int64_t global_batch) const {
  if (pos.segment_offset == 0) return static_cast<double>(batches) / static_cast<double>(std::max<int64_t>(nb, 1));
  // The world changed within the epoch: by the samples of the epoch's order consumed.
  const double done = static_cast<double>(pos.segment_offset + (batches - pos.segment_batch) * global_batch);
  const double all = static_cast<double>(pos.segment_offset + (nb - pos.segment_batch) * global_batch);
  return all > 0 ? done / all : 0.0;
}

}  // namespace aiacc::app
