// Checkpoints: model parameters and buffers, optimizer state, and the TrainingState
// (app/training_state.h: position in the epoch, scales, history, settings, RNG).
//
// The optimizer state is written by parameter position (app/optim_state.h), so a checkpoint moves
// between LibTorch versions (1.13 and 2.x, either way); format-2 and format-3 files (without the
// mid-epoch position and history) are still read.
//
// encodeCheckpoint serializes into memory (the snapshot, taken on the training thread: the bytes
// can then be written anywhere, on any thread); saveCheckpoint writes them atomically
// (common/atomic_file.h), so a crash or a full disk mid-write leaves the previous file intact. A
// checkpoint that cannot be read raises IoError naming it; nothing falls back to a silent fresh
// start.
#pragma once

#include <cstdint>
#include <string>

#include "app/training_state.h"

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class SGD;
}
}  // namespace torch

namespace aiacc::app {

std::string encodeCheckpoint(torch::nn::Module& model, torch::optim::SGD& optimizer, const TrainingState& state);

// Restores model and optimizer from `bytes` (onto the model's device) and returns the state.
// `name` (a path) is what errors name.
TrainingState decodeCheckpoint(const std::string& bytes, const std::string& name, torch::nn::Module& model,
                               torch::optim::SGD& optimizer);

void saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer,
                    const TrainingState& state);

// InputError when `path` does not exist; IoError when it cannot be read or decoded.
TrainingState loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer);

}  // namespace aiacc::app
