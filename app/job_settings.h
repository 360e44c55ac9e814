// What every rank of a job must share, as settings for comm::agreeAcrossRanks (comm/agreement.h):
// each option that shapes the sequence of collectives (their count, order, dtypes, channels,
// buckets), the steps per epoch, and a fingerprint of the dataset. Compared before the first
// step, so that ranks started differently stop within seconds with a message naming the first
// differing rank and option. Paths are not compared (each node may mount the data elsewhere);
// what they hold is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "app/checkpoint.h"
#include "app/config.h"
#include "app/flags.h"
#include "aiacc/comm/agreement.h"

namespace aiacc::app {

// The distribution options (after the recipe) and the node layout.
comm::Settings distSettings(const DistSpec& d, const comm::WorldInfo& world);

// The dataset in one line: class count and a hash of the class names, files per split.
std::string datasetFingerprint(const std::vector<std::string>& classes, size_t train_files, size_t val_files);

// The training options that decide how many steps run, when collectives happen between them
// (evaluations, checkpoints, the stop at a target), where a resumed run starts, the steps of
// each epoch (from this rank's training shard of `shard_size` images), and the optimizer and
// schedule every rank applies to the averaged gradient.
comm::Settings trainSettings(const Config& c, const std::string& dataset, int64_t shard_size,
                             const TrainingState& resumed);

}  // namespace aiacc::app
