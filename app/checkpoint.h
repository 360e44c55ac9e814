// Checkpoints: model parameters and buffers, optimizer state, and the training position.
//
// The optimizer state is written by parameter position (app/optim_state.h), so a checkpoint moves
// between LibTorch versions (1.13 and 2.x, either way); format-2 files (torch::optim's own layout)
// are still read.
//
// Written atomically (common/atomic_file.h): to a temporary file in the same folder, fsynced, then
// renamed over the old one, so a crash or a full disk mid-write leaves the previous checkpoint
// intact. A file that cannot be
// read raises IoError naming it; the trainer never falls back to a silent fresh start.
#pragma once

#include <cstdint>
#include <string>

namespace torch {
namespace nn {
class Module;
}
namespace optim {
class SGD;
}
}  // namespace torch

namespace aiacc::app {

struct TrainPosition {
  int64_t epochs_done = 0;            // completed epochs
  int64_t step = 0;                   // optimizer steps taken
  int64_t images_seen = 0;            // training images, all ranks
  double elapsed_s = 0;               // wall seconds already spent (time to target continues from here)
  double train_s = 0;                 // of which in training steps
  double loss_scale = 0;              // the AMP loss scaler's scale (0: no scaler)
  int64_t loss_scale_good_steps = 0;  // finite steps since its last change
};

void saveCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer,
                    const TrainPosition& pos);

TrainPosition loadCheckpoint(const std::string& path, torch::nn::Module& model, torch::optim::SGD& optimizer);

}  // namespace aiacc::app
